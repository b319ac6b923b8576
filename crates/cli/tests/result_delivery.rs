//! Result delivery end to end, through `postern daemon` and the `postern mcp` bridge:
//! large results in resumable pieces, bad cursors, and results expired by the retention
//! policy (by age and by size) answering RESULT_EXPIRED while the record keeps its
//! outcome.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use rmcp::model::CallToolResult;
use serde_json::{Value, json};

use postern_tests::adversary::{Adversary, Behavior};
use postern_tests::agent::{self, Agent, is_error, structured};

mod support;

use support::{Daemon, POSTERN};

async fn client(socket: &Path) -> Agent {
    agent::connect(Path::new(POSTERN), socket).await.unwrap()
}

async fn call(client: &Agent, tool: &str, args: Value) -> CallToolResult {
    agent::call(client, tool, args).await.unwrap()
}

/// Bytes that are not UTF-8 and do not repeat at chunk boundaries.
fn body_of(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut x: u32 = 0x9E37_79B9;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn octets(body: Vec<u8>) -> Behavior {
    Behavior::Respond {
        status: 200,
        headers: vec![("content-type".into(), "application/octet-stream".into())],
        body,
    }
}

fn daemon(base: &str, results: &str) -> Daemon {
    let mut text = support::target_approved("api", base, "none");
    text.push_str(results);
    support::start_daemon_keyed(tempfile::tempdir().unwrap(), &text, None, &[])
}

/// Checks one piece against its digest and position; returns its bytes.
fn verified(piece: &Value, expected_offset: u64) -> Vec<u8> {
    let data = base64::engine::general_purpose::STANDARD
        .decode(piece["data_base64"].as_str().unwrap())
        .unwrap();
    assert_eq!(piece["offset"], expected_offset, "{}", piece["stream"]);
    assert_eq!(piece["length"], data.len() as u64);
    assert_eq!(
        piece["piece_digest"],
        format!("blake3:{}", blake3::hash(&data).to_hex()),
        "the piece matches its digest"
    );
    data
}

async fn delivered(client: &Agent, id: &str) -> bool {
    let inv = call(client, "get_invocation", json!({"invocation_id": id})).await;
    structured(&inv)["delivered"] == true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_arrives_in_pieces_and_resumes_after_a_dropped_connection() {
    const LEN: usize = 5 * 1024 * 1024;
    let body = body_of(LEN);
    let server = Adversary::start(octets(body.clone())).await.unwrap();
    let daemon = daemon(&server.base_url(), "");
    let first_client = client(&daemon.socket).await;

    let answer = call(
        &first_client,
        "http_request",
        json!({"url": server.url("/v1/blob"), "method": "GET"}),
    )
    .await;
    assert!(!is_error(&answer), "{answer:?}");
    let value = structured(&answer);
    assert_eq!(value["outcome"], "committed");
    assert_eq!(value["status"], 200);
    assert!(
        value.get("body").is_none() && value.get("body_base64").is_none(),
        "a 5 MiB body is not sent in one message"
    );
    let id = value["invocation_id"].as_str().unwrap().to_string();
    let first = &value["delivery"];
    assert_eq!(first["total_bytes"], LEN as u64);
    assert_eq!(first["stream"], "body");
    assert_eq!(first["length"], 1024 * 1024);
    assert_eq!(first["complete"], false);
    let digest = first["digest"].as_str().unwrap().to_string();
    let mut got = verified(first, 0);
    let mut cursor = first["cursor"].as_str().unwrap().to_string();

    // A smaller piece, not aligned to the storage chunks.
    let piece = structured(
        &call(
            &first_client,
            "fetch_result",
            json!({"invocation_id": id, "cursor": cursor, "max_bytes": 100_001}),
        )
        .await,
    );
    got.extend(verified(&piece["delivery"], got.len() as u64));
    cursor = piece["delivery"]["cursor"].as_str().unwrap().to_string();

    // The next piece is read and lost with the connection.
    let lost = structured(
        &call(
            &first_client,
            "fetch_result",
            json!({"invocation_id": id, "cursor": cursor}),
        )
        .await,
    );
    assert_eq!(lost["delivery"]["complete"], false);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !delivered(&first_client, &id).await,
        "no RESULT_DELIVERED before the last piece"
    );
    first_client.cancel().await.unwrap();

    // The same agent reconnects and resumes from the last piece it verified.
    let client = client(&daemon.socket).await;
    let mut last = None;
    for _ in 0..16 {
        let piece = structured(
            &call(
                &client,
                "fetch_result",
                json!({"invocation_id": id, "cursor": cursor}),
            )
            .await,
        );
        let delivery = piece["delivery"].clone();
        assert_eq!(delivery["digest"], digest.as_str());
        got.extend(verified(&delivery, got.len() as u64));
        if delivery["complete"] == true {
            assert!(delivery["cursor"].is_null());
            last = Some(delivery);
            break;
        }
        assert_eq!(delivery["complete"], false);
        cursor = delivery["cursor"].as_str().unwrap().to_string();
    }
    assert!(last.is_some(), "the last piece says complete");
    assert_eq!(got.len(), LEN);
    assert!(got == body, "the pieces put together are the body");
    assert_eq!(
        postern_broker::journal::results::digest(&[("body".to_string(), got)]),
        digest,
        "the concatenation matches the stored digest"
    );

    let mut confirmed = false;
    for _ in 0..100 {
        if delivered(&client, &id).await {
            confirmed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        confirmed,
        "RESULT_DELIVERED after the last piece was acknowledged"
    );
    assert_eq!(server.requests().len(), 1, "reading pieces never re-sends");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_cursors_are_invalid_requests_that_keep_the_recorded_outcome() {
    let server = Adversary::start(octets(body_of(3 * 1024 * 1024)))
        .await
        .unwrap();
    let daemon = daemon(&server.base_url(), "");
    let client = client(&daemon.socket).await;
    let mut ids = Vec::new();
    let mut cursors = Vec::new();
    for _ in 0..2 {
        let value = structured(
            &call(
                &client,
                "http_request",
                json!({"url": server.url("/v1/blob"), "method": "GET"}),
            )
            .await,
        );
        ids.push(value["invocation_id"].as_str().unwrap().to_string());
        cursors.push(value["delivery"]["cursor"].as_str().unwrap().to_string());
    }
    let mut tampered = cursors[0].clone().into_bytes();
    tampered[3] = if tampered[3] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    let cases = [
        (
            json!({"invocation_id": ids[0], "cursor": "not a cursor"}),
            "cursor",
        ),
        (
            json!({"invocation_id": ids[0], "cursor": tampered}),
            "cursor",
        ),
        // A genuine cursor of another invocation.
        (
            json!({"invocation_id": ids[0], "cursor": cursors[1]}),
            "cursor",
        ),
        (
            json!({"invocation_id": ids[0], "cursor": cursors[0], "max_bytes": 0}),
            "max_bytes",
        ),
        (
            json!({"invocation_id": ids[0], "cursor": cursors[0], "max_bytes": 2_000_000}),
            "max_bytes",
        ),
    ];
    for (args, field) in cases {
        let answer = call(&client, "fetch_result", args.clone()).await;
        assert!(is_error(&answer), "{args}: {answer:?}");
        let value = structured(&answer);
        assert_eq!(value["error"]["code"], "INVALID_REQUEST", "{args}: {value}");
        assert_eq!(value["error"]["phase"], "validation");
        assert_eq!(value["error"]["retry"], "after_correction");
        assert_eq!(
            value["error"]["outcome"], "committed",
            "the read changes nothing"
        );
        assert_eq!(value["evidence"]["field"], field);
        assert!(value["error"]["message"].as_str().unwrap().contains(field));
    }
    // The genuine cursor still works after all that.
    let ok = call(
        &client,
        "fetch_result",
        json!({"invocation_id": ids[0], "cursor": cursors[0]}),
    )
    .await;
    assert!(!is_error(&ok), "{ok:?}");
    assert_eq!(structured(&ok)["delivery"]["offset"], 1024 * 1024);
    client.cancel().await.unwrap();
}

/// Waits until `seconds` have passed since `since`.
async fn wait_past(since: std::time::Instant, seconds: u64) {
    let left = Duration::from_secs(seconds).saturating_sub(since.elapsed());
    tokio::time::sleep(left + Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_older_than_max_age_answers_result_expired_and_keeps_its_outcome() {
    let server = Adversary::start(Behavior::ok_json("{\"ok\":true}"))
        .await
        .unwrap();
    let mut daemon = daemon(&server.base_url(), "\n[results]\nmax_age = \"2s\"\n");
    let agent = client(&daemon.socket).await;
    let value = structured(
        &call(
            &agent,
            "http_request",
            json!({"url": server.url("/v1/items"), "method": "GET"}),
        )
        .await,
    );
    // The result was committed before the answer came back: its age counts from no
    // later than now, however long the call took.
    let stored = std::time::Instant::now();
    let id = value["invocation_id"].as_str().unwrap().to_string();
    agent.cancel().await.unwrap();
    wait_past(stored, 2).await;
    // The retention pass runs when the broker opens (and every minute after).
    daemon.restart();

    let agent = client(&daemon.socket).await;
    let answer = call(&agent, "fetch_result", json!({"invocation_id": id})).await;
    assert!(is_error(&answer), "{answer:?}");
    let value = structured(&answer);
    assert_eq!(value["error"]["code"], "RESULT_EXPIRED", "{value}");
    assert_eq!(value["error"]["phase"], "result_delivery");
    assert_eq!(value["error"]["outcome"], "committed");
    assert_eq!(value["error"]["retry"], "never");
    let message = value["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("max_age") && message.contains("unix ms"),
        "{message}"
    );
    assert!(!message.contains("no invocation"));
    // The record still says what happened.
    let inv = structured(&call(&agent, "get_invocation", json!({"invocation_id": id})).await);
    assert_eq!(inv["outcome"], "committed", "{inv}");
    let kinds: Vec<&str> = inv["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"RESULT_EXPIRED"), "{kinds:?}");
    // Pieces of it are refused the same way.
    let piece = call(
        &agent,
        "fetch_result",
        json!({"invocation_id": id, "max_bytes": 10}),
    )
    .await;
    assert_eq!(structured(&piece)["error"]["code"], "RESULT_EXPIRED");
    agent.cancel().await.unwrap();
    assert_eq!(server.requests().len(), 1);

    // Only result rows were pruned: the audit chain still verifies.
    support::succeeded(
        std::process::Command::new(POSTERN)
            .args(["audit", "verify", "--data-dir"])
            .arg(daemon.dir.path())
            .args(["--keychain-service", daemon.service()]),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_over_max_bytes_expire_oldest_first() {
    let server = Adversary::start(octets(body_of(700 * 1024))).await.unwrap();
    let mut daemon = daemon(&server.base_url(), "\n[results]\nmax_bytes = \"1MiB\"\n");
    let agent = client(&daemon.socket).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let value = structured(
            &call(
                &agent,
                "http_request",
                json!({"url": server.url("/v1/blob"), "method": "GET"}),
            )
            .await,
        );
        assert!(value["body_base64"].is_string(), "700 KiB comes whole");
        ids.push(value["invocation_id"].as_str().unwrap().to_string());
        // Distinct storage times, so "oldest" is unambiguous.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    agent.cancel().await.unwrap();
    daemon.restart();

    let agent = client(&daemon.socket).await;
    let old = structured(&call(&agent, "fetch_result", json!({"invocation_id": ids[0]})).await);
    assert_eq!(old["error"]["code"], "RESULT_EXPIRED", "{old}");
    assert!(
        old["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_bytes")
    );
    let new = call(&agent, "fetch_result", json!({"invocation_id": ids[1]})).await;
    assert!(!is_error(&new), "the newest result is kept: {new:?}");
    assert!(structured(&new)["body_base64"].is_string());
    agent.cancel().await.unwrap();
}
