//! End to end through the real binaries: `postern daemon` serving the broker, `postern mcp`
//! launched over stdio by an rmcp client (this test process is the agent), against the
//! adversarial HTTP server.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

use postern_broker::provenance::{self, ExecutableDigest};
use postern_tests::adversary::{Adversary, Behavior};
use postern_tests::agent::{self, Agent, is_error, structured};

mod support;

use support::{Daemon, POSTERN, SECRET};

/// Target `api` at `base/v1` with approval `approval` and a reconcile query.
fn config(base: &str, approval: &str) -> String {
    let mut text = support::target_approved("api", base, approval);
    text.push_str(
        r#"
[http.reconcile]
method = "GET"
path = "/lookup"
committed_status = [200]
not_applied_status = [404]
"#,
    );
    text
}

fn start_daemon(base: &str, approval: &str) -> Daemon {
    start_daemon_with(&config(base, approval), &[])
}

/// A daemon over `config_text`, with the HTTP token and any `extra` SSH keys stored in
/// its own keychain service.
fn start_daemon_with(config_text: &str, extra: &[(&str, &str)]) -> Daemon {
    support::start_daemon_keyed(tempfile::tempdir().unwrap(), config_text, None, extra)
}

async fn client(socket: &Path) -> Agent {
    agent::connect(Path::new(POSTERN), socket).await.unwrap()
}

async fn call(client: &Agent, tool: &str, args: Value) -> CallToolResult {
    agent::call(client, tool, args).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_through_the_bridge_returns_the_result_with_its_outcome() {
    let server = Adversary::start(Behavior::ok_json("{\"items\":[1,2]}"))
        .await
        .unwrap();
    let daemon = start_daemon(&server.base_url(), "none");
    let client = client(&daemon.socket).await;
    let tools: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(
        tools,
        [
            "http_request",
            "ssh_exec",
            "fetch_result",
            "get_invocation",
            "retry_invocation",
            "poll_job",
            "list_targets"
        ]
    );

    let result = call(
        &client,
        "http_request",
        json!({"url": server.url("/v1/items"), "method": "GET"}),
    )
    .await;
    assert!(!is_error(&result), "{result:?}");
    let value = structured(&result);
    assert_eq!(value["outcome"], "committed");
    assert_eq!(value["status"], 200);
    assert!(value["invocation_id"].as_str().unwrap().starts_with("inv_"));
    assert!(value["body"].as_str().unwrap().contains("items"));
    // The text content carries the same JSON.
    let text = format!("{:?}", result.content);
    assert!(text.contains("committed"));
    assert!(!text.contains(SECRET) && !value.to_string().contains(SECRET));

    // The bridge acknowledged the write: RESULT_DELIVERED is recorded.
    let id = value["invocation_id"].as_str().unwrap().to_string();
    let mut delivered = false;
    for _ in 0..100 {
        let inv = call(&client, "get_invocation", json!({"invocation_id": id})).await;
        if structured(&inv)["delivered"] == true {
            delivered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        delivered,
        "RESULT_DELIVERED after the bridge's acknowledgement"
    );
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_come_back_as_errors_with_the_envelope() {
    let server = Adversary::start(Behavior::ApplyThenCloseWithLookup)
        .await
        .unwrap();
    let daemon = start_daemon(&server.base_url(), "none");
    let client = client(&daemon.socket).await;

    let result = call(
        &client,
        "http_request",
        json!({"url": server.url("/v1/pay"), "method": "POST", "body": "{}"}),
    )
    .await;
    assert!(is_error(&result));
    let env = structured(&result);
    assert_eq!(env["error"]["code"], "REMOTE_OUTCOME_UNKNOWN");
    assert_eq!(env["error"]["outcome"], "unknown");
    assert_eq!(env["error"]["retry"], "reconcile");
    assert_eq!(env["evidence"]["dispatch_started"], true);

    // retry_invocation does not re-send: it returns the evidence and the manifest.
    let id = env["invocation_id"].as_str().unwrap();
    let retried = call(&client, "retry_invocation", json!({"invocation_id": id})).await;
    let value = structured(&retried);
    assert_eq!(value["manifest"]["decision"], "reconcile");
    assert_eq!(value["manifest"]["verdict"], "query_first_required");
    assert_eq!(
        value["manifest"]["source_query_predicate"]["path"],
        "/lookup"
    );
    assert_eq!(server.effects(), 1, "no second payment");

    // Another party checks the manifest with the broker's public key alone.
    let key = daemon.audit_key();
    let key = key.as_str();
    let check = |answer: &Value| {
        let file = daemon.dir.path().join("answer.json");
        std::fs::write(&file, answer.to_string()).unwrap();
        Command::new(POSTERN)
            .args(["audit", "verify-manifest", "--key", key])
            .arg(&file)
            .output()
            .unwrap()
    };
    let valid = check(&value);
    assert!(
        valid.status.success(),
        "{}",
        String::from_utf8_lossy(&valid.stderr)
    );
    let mut forged = value.clone();
    forged["manifest"]["directive"] = json!("PROCEED: resend it.");
    let refused = check(&forged);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("digest"));

    let forbidden = call(
        &client,
        "http_request",
        json!({"url": server.url("/v1/pay"), "method": "GET", "headers": {"Authorization": "Bearer mine"}}),
    )
    .await;
    let env = structured(&forbidden);
    assert_eq!(env["error"]["code"], "FORBIDDEN_HEADER");
    assert_eq!(env["error"]["phase"], "validation");
    assert_eq!(env["evidence"]["field"], "headers[0].name");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_timeout_is_retried_through_retry_invocation() {
    let server = Adversary::start(Behavior::Stall).await.unwrap();
    let daemon = start_daemon(&server.base_url(), "none");
    let client = client(&daemon.socket).await;
    let result = call(
        &client,
        "http_request",
        json!({"url": server.url("/v1/x"), "method": "GET", "timeout_ms": 300}),
    )
    .await;
    let env = structured(&result);
    assert_eq!(env["error"]["code"], "REMOTE_TIMEOUT");
    assert_eq!(env["error"]["retry"], "backoff");
    server.release();
    let retried = call(
        &client,
        "retry_invocation",
        json!({"invocation_id": env["invocation_id"]}),
    )
    .await;
    let value = structured(&retried);
    assert_eq!(value["manifest"]["verdict"], "idempotent_safe");
    assert_eq!(value["outcome"], "committed", "{value}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_bridge_leaves_the_result_stored_and_fetch_result_reads_it_without_resending() {
    let server = Adversary::start(Behavior::Stall).await.unwrap();
    let daemon = start_daemon(&server.base_url(), "none");
    // A raw bridge we can kill mid-call.
    let mut bridge = Command::new(POSTERN)
        .arg("mcp")
        .arg("--socket")
        .arg(&daemon.socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let stdin = bridge.stdin.as_mut().unwrap();
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}});
        let initialized = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
        let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"http_request","arguments":{"url": server.url("/v1/pay"),"method":"POST","body":"{}"}}});
        writeln!(stdin, "{init}\n{initialized}\n{call}").unwrap();
    }
    assert!(server.wait_for_effects(1, Duration::from_secs(10)).await);
    bridge.kill().unwrap();
    bridge.wait().unwrap();
    server.release();

    // The same agent (this process) reconnects and finds the stored result.
    let db = daemon.dir.path().join("journal.db");
    let mut id = None;
    for _ in 0..200 {
        let conn = rusqlite_ro(&db);
        let found: Option<String> = conn
            .query_row(
                "SELECT invocation_id FROM events WHERE kind = 'DELIVERY_FAILED' LIMIT 1",
                [],
                |r| r.get(0),
            )
            .ok();
        if found.is_some() {
            id = found;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let id = id.expect("the undelivered result is recorded as result_delivery");
    let client = client(&daemon.socket).await;
    let inv = structured(&call(&client, "get_invocation", json!({"invocation_id": id})).await);
    assert_eq!(inv["phase"], "result_delivery");
    assert_eq!(inv["outcome"], "committed");
    assert_eq!(inv["retry"], "fetch_result");
    let fetched = call(&client, "fetch_result", json!({"invocation_id": id})).await;
    let value = structured(&fetched);
    assert_eq!(value["response"]["status"], 200, "{value}");
    assert_eq!(server.effects(), 1, "fetching never re-sends");
    client.cancel().await.unwrap();
}

fn rusqlite_ro(db: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_in_one_session_all_complete() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let daemon = start_daemon(&server.base_url(), "none");
    let client = client(&daemon.socket).await;
    let calls = (0..8).map(|i| {
        call(
            &client,
            "http_request",
            json!({"url": server.url(&format!("/v1/{i}")), "method": "GET"}),
        )
    });
    let results = futures::future::join_all(calls).await;
    assert!(
        results
            .iter()
            .all(|r| structured(r)["outcome"] == "committed")
    );
    assert_eq!(server.requests().len(), 8);
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_tools_and_wrong_arguments_are_protocol_errors_and_the_daemon_keeps_serving() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let daemon = start_daemon(&server.base_url(), "none");
    let client = client(&daemon.socket).await;
    let unknown = client
        .call_tool(CallToolRequestParams::new("reveal_secret"))
        .await;
    assert!(unknown.is_err());
    let Value::Object(bad) = json!({"url": 5, "method": "GET"}) else {
        unreachable!()
    };
    let wrong = client
        .call_tool(CallToolRequestParams::new("http_request").with_arguments(bad))
        .await;
    assert!(wrong.is_err());
    let Value::Object(extra) =
        json!({"url": server.url("/v1/x"), "method": "GET", "approve": true})
    else {
        unreachable!()
    };
    let extra = client
        .call_tool(CallToolRequestParams::new("http_request").with_arguments(extra))
        .await;
    assert!(extra.is_err(), "unknown fields are rejected");
    // Still serving.
    let ok = call(
        &client,
        "http_request",
        json!({"url": server.url("/v1/x"), "method": "GET"}),
    )
    .await;
    assert_eq!(structured(&ok)["outcome"], "committed");
    client.cancel().await.unwrap();

    // Garbage on a raw connection does not take the daemon down.
    let mut raw = Command::new(POSTERN)
        .arg("mcp")
        .arg("--socket")
        .arg(&daemon.socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let stdin = raw.stdin.as_mut().unwrap();
        writeln!(stdin, "this is not json").unwrap();
        writeln!(stdin, "{}", "x".repeat(2 * 1024 * 1024)).unwrap();
    }
    drop(raw.stdin.take());
    let _ = raw.wait();
    let again = client_after(&daemon.socket).await;
    let ok = call(&again, "list_targets", json!({})).await;
    assert_eq!(structured(&ok)["targets"][0]["name"], "api");
    again.cancel().await.unwrap();
}

async fn client_after(socket: &Path) -> Agent {
    client(socket).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cannot_read_another_sessions_invocation() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let daemon = start_daemon(&server.base_url(), "none");
    let mine = client(&daemon.socket).await;
    let result = call(
        &mine,
        "http_request",
        json!({"url": server.url("/v1/x"), "method": "GET"}),
    )
    .await;
    let id = structured(&result)["invocation_id"]
        .as_str()
        .unwrap()
        .to_string();

    // Another agent: the bridge's parent is a different process (a shell).
    let mut command = tokio::process::Command::new("sh");
    command.arg("-c").arg(format!(
        "'{POSTERN}' mcp --socket '{}'",
        daemon.socket.display()
    ));
    let other: RunningService<RoleClient, ()> =
        ().serve(TokioChildProcess::new(command).unwrap())
            .await
            .unwrap();
    let Value::Object(args) = json!({"invocation_id": id}) else {
        unreachable!()
    };
    let read = other
        .call_tool(CallToolRequestParams::new("fetch_result").with_arguments(args))
        .await;
    assert!(read.is_err(), "another session's invocation is not visible");
    other.cancel().await.unwrap();
    mine.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_headless_daemon_queues_approvals_for_its_operator_socket() {
    use postern_console::operator::OperatorClient;
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let daemon = start_daemon(&server.base_url(), "per_call");
    let client = client(&daemon.socket).await;
    let operator = OperatorClient::new(daemon.socket.with_file_name("operator.sock"));
    let call = {
        let url = server.url("/v1/x");
        tokio::spawn(async move {
            let result = call(
                &client,
                "http_request",
                json!({"url": url, "method": "GET"}),
            )
            .await;
            client.cancel().await.unwrap();
            result
        })
    };
    let mut card = Value::Null;
    for _ in 0..500 {
        let cards = operator.call("list_approvals", Value::Null).await.unwrap();
        if let Some(c) = cards.as_array().and_then(|c| c.first()) {
            card = c.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(card["target"], "api", "a card is waiting: {card}");
    assert!(
        server.requests().is_empty(),
        "nothing is sent before an answer"
    );
    operator
        .call(
            "answer_approval",
            json!({"invocationId": card["invocation_id"], "fingerprint": card["fingerprint"],
                   "cardDigest": card["card_digest"], "decision": "deny"}),
        )
        .await
        .unwrap();
    let result = call.await.unwrap();
    assert_eq!(structured(&result)["error"]["code"], "APPROVAL_DENIED");
    assert!(server.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_broker_the_bridge_answers_broker_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let client = client(&dir.path().join("nothing.sock")).await;
    let result = call(
        &client,
        "http_request",
        json!({"url": "http://127.0.0.1:9/x", "method": "GET"}),
    )
    .await;
    assert!(is_error(&result));
    let env = structured(&result);
    assert_eq!(env["error"]["code"], "BROKER_UNAVAILABLE");
    assert_eq!(env["error"]["outcome"], "not_attempted");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_uid_cannot_reach_the_broker() {
    use std::os::unix::process::CommandExt;
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let daemon = start_daemon(&server.base_url(), "none");
    // Only meaningful when we can switch users (CI runs as root).
    if !std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:\t0\t"))
    {
        eprintln!("skipped: not root, cannot run a child as another uid");
        return;
    }
    // A copy of the binary the other user can execute wherever this checkout lives.
    use std::os::unix::fs::PermissionsExt;
    let shared = tempfile::tempdir().unwrap();
    let binary = shared.path().join("postern");
    std::fs::copy(POSTERN, &binary).unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut command = std::process::Command::new(&binary);
    command
        .arg("mcp")
        .arg("--socket")
        .arg(&daemon.socket)
        .uid(65534)
        .gid(65534);
    let mut command = tokio::process::Command::from(command);
    command.current_dir("/");
    let other: RunningService<RoleClient, ()> =
        ().serve(TokioChildProcess::new(command).unwrap())
            .await
            .unwrap();
    let result = call(
        &other,
        "http_request",
        json!({"url": server.url("/v1/x"), "method": "GET"}),
    )
    .await;
    assert_eq!(
        structured(&result)["error"]["code"],
        "BROKER_UNAVAILABLE",
        "the socket refused the other uid"
    );
    assert!(server.requests().is_empty());
    other.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_after_dispatch_keeps_the_outcome_unknown() {
    let server = Adversary::start(Behavior::Stall).await.unwrap();
    let daemon = start_daemon(&server.base_url(), "none");
    let client = client(&daemon.socket).await;
    let Value::Object(args) = json!({"url": server.url("/v1/pay"), "method": "POST", "body": "{}"})
    else {
        unreachable!()
    };
    let pending = client.call_tool(CallToolRequestParams::new("http_request").with_arguments(args));
    // Dropping the call sends notifications/cancelled once the server holds the request.
    let cancelled = tokio::select! {
        _ = pending => false,
        true = server.wait_for_effects(1, Duration::from_secs(10)) => true,
    };
    assert!(
        cancelled,
        "the request reached the server before the caller gave up"
    );
    let db = daemon.dir.path().join("journal.db");
    let mut found = None;
    for _ in 0..200 {
        let conn = rusqlite_ro(&db);
        found = conn
            .query_row(
                "SELECT invocation_id FROM events WHERE kind = 'FAILED' AND body LIKE '%CALLER_CANCELLED%'",
                [],
                |r| r.get::<_, String>(0),
            )
            .ok();
        if found.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let id = found.expect("the cancellation is recorded");
    let inv = structured(&call(&client, "get_invocation", json!({"invocation_id": id})).await);
    assert_eq!(inv["outcome"], "unknown", "the remote may still be running");
    assert_eq!(inv["code"], "CALLER_CANCELLED");
    assert_eq!(server.effects(), 1);
    client.cancel().await.unwrap();
}

/// Counts progress notifications.
#[derive(Clone, Default)]
struct ProgressCounter(std::sync::Arc<std::sync::atomic::AtomicU32>);

impl rmcp::ClientHandler for ProgressCounter {
    async fn on_progress(
        &self,
        _params: rmcp::model::ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_call_sends_progress_notifications_when_asked() {
    let server = Adversary::start(Behavior::Stall).await.unwrap();
    let daemon = start_daemon(&server.base_url(), "none");
    let counter = ProgressCounter::default();
    let mut command = tokio::process::Command::new(POSTERN);
    command.arg("mcp").arg("--socket").arg(&daemon.socket);
    let client = counter
        .clone()
        .serve(TokioChildProcess::new(command).unwrap())
        .await
        .unwrap();
    let Value::Object(args) =
        json!({"url": server.url("/v1/x"), "method": "GET", "timeout_ms": 2500})
    else {
        unreachable!()
    };
    let mut params = CallToolRequestParams::new("http_request").with_arguments(args);
    params.meta = Some(rmcp::model::RequestMetaObject::with_progress_token(
        rmcp::model::ProgressToken(rmcp::model::NumberOrString::Number(7)),
    ));
    let result = client.call_tool(params).await.unwrap();
    assert_eq!(structured(&result)["error"]["code"], "REMOTE_TIMEOUT");
    assert!(
        counter.0.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "progress while waiting"
    );
    client.cancel().await.unwrap();
}

/// A real sshd and a daemon with an HTTP target (`api`, before an origin that answers
/// `{}`) and an SSH target `web1` on it, its key stored; `None` (said) without OpenSSH.
async fn ssh_daemon() -> Option<(postern_tests::ssh_fixture::Sshd, Adversary, Daemon)> {
    use postern_tests::ssh_fixture::Sshd;
    if !Sshd::available() {
        eprintln!("skipped: no OpenSSH server installed");
        return None;
    }
    let sshd = Sshd::start().unwrap();
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let text = format!(
        "{}\n[[ssh]]\nname = \"web1\"\nhost = \"127.0.0.1\"\nport = {}\nuser = \"{}\"\n\
         credential = \"web1-key\"\nhost_key = \"{}\"\napproval = \"none\"\n",
        config(&server.base_url(), "none"),
        sshd.port,
        Sshd::user(),
        sshd.host_key
    );
    let daemon = start_daemon_with(&text, &[("web1-key", &sshd.user_ed25519.private)]);
    Some((sshd, server, daemon))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_exec_through_the_bridge_reports_the_exit_status_as_a_result() {
    let Some((sshd, _server, daemon)) = ssh_daemon().await else {
        return;
    };
    let client = client(&daemon.socket).await;
    let result = call(
        &client,
        "ssh_exec",
        json!({"host": "web1", "command": "echo hi; exit 3"}),
    )
    .await;
    let value = structured(&result);
    assert!(!is_error(&result), "{value}");
    assert_eq!(value["outcome"], "committed");
    assert_eq!(value["exit_status"], 3, "a non-zero exit is a result");
    assert_eq!(value["stdout"], "hi\n");
    assert_eq!(value["stdout_complete"], true);
    assert!(
        value["host_key_fingerprint"]
            .as_str()
            .unwrap()
            .starts_with("SHA256:")
    );
    let fetched = structured(
        &call(
            &client,
            "fetch_result",
            json!({"invocation_id": value["invocation_id"]}),
        )
        .await,
    );
    assert_eq!(fetched["exit_status"], 3);
    let key_line = sshd
        .user_ed25519
        .private
        .lines()
        .nth(1)
        .unwrap()
        .to_string();
    assert!(!value.to_string().contains(&key_line) && !fetched.to_string().contains(&key_line));
    client.cancel().await.unwrap();
}

/// Where `needle` occurs in the writable memory of process `pid` (heap, stacks, anonymous
/// maps), read through /proc/PID/mem as its owner may; the start of each region holding it.
fn found_in_memory(pid: u32, needle: &[u8]) -> Vec<String> {
    use std::io::{Read, Seek, SeekFrom};
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut found = Vec::new();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        if !perms.starts_with("rw") {
            continue;
        }
        let (start, end) = range.split_once('-').unwrap();
        let start = u64::from_str_radix(start, 16).unwrap();
        let end = u64::from_str_radix(end, 16).unwrap();
        let mut region = vec![0u8; usize::try_from(end - start).unwrap()];
        if mem.seek(SeekFrom::Start(start)).is_err() || mem.read_exact(&mut region).is_err() {
            continue;
        }
        if region.windows(needle.len()).any(|w| w == needle) {
            found.push(line.to_string());
        }
    }
    found
}

// Regression: issue 26 (item 10). Seconds after an SSH call the daemon's memory still held
// every line of the private key: the `Secret` wiped itself, the copies made to parse the
// key and to scrub the output did not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_line_of_the_private_key_is_left_in_the_daemons_memory_after_an_ssh_call() {
    let Some((sshd, _server, daemon)) = ssh_daemon().await else {
        return;
    };
    let (lines, seed) = secret_lines(&sshd.user_ed25519.private);
    assert!(!lines.is_empty());
    let client = client(&daemon.socket).await;
    for _ in 0..2 {
        let result = call(
            &client,
            "ssh_exec",
            json!({"host": "web1", "command": "true"}),
        )
        .await;
        assert!(!is_error(&result), "{}", structured(&result));
    }
    client.cancel().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let left: Vec<(String, Vec<String>)> = lines
        .iter()
        .map(|l| (l.clone(), found_in_memory(daemon.pid(), l.as_bytes())))
        .filter(|(_, regions)| !regions.is_empty())
        .collect();
    assert!(
        left.is_empty(),
        "key lines left in the daemon's memory: {left:#?}"
    );
    let raw = found_in_memory(daemon.pid(), &seed);
    assert!(
        raw.is_empty(),
        "the raw seed is in the daemon's memory: {raw:#?}"
    );
}

/// The lines of an OpenSSH ed25519 private key file that encode any byte of its secret
/// seed, and the seed. (A line that encodes only the public key's tail, the comment and
/// the padding carries nothing secret; the public key is in `authorized_keys`.)
fn secret_lines(pem: &str) -> (Vec<String>, Vec<u8>) {
    use base64::Engine;
    let body: Vec<&str> = pem
        .lines()
        .filter(|l| !l.starts_with("-----") && !l.is_empty())
        .collect();
    let blob = base64::engine::general_purpose::STANDARD
        .decode(body.concat())
        .unwrap();
    // The private section holds the 64-byte field seed ‖ public key, after a length of 64;
    // its last 32 bytes are the public key, which appears before it after a length of 32.
    let public_at = blob.windows(4).position(|w| w == [0, 0, 0, 32]).unwrap() + 4;
    let public = &blob[public_at..public_at + 32];
    let field = (0..blob.len() - 68)
        .find(|&i| blob[i..i + 4] == [0, 0, 0, 64] && &blob[i + 36..i + 68] == public)
        .unwrap()
        + 4;
    let seed = blob[field..field + 32].to_vec();
    // Line n covers characters [start, start + len) of the body, so bytes
    // [start * 3 / 4, (start + len) * 3 / 4 + 1) of the blob.
    let mut start = 0;
    let mut lines = Vec::new();
    for line in body {
        let (from, to) = (start * 3 / 4, (start + line.len()) * 3 / 4 + 1);
        if from < field + 32 && to > field {
            lines.push(line.to_string());
        }
        start += line.len();
    }
    (lines, seed)
}

fn own_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap()
}

/// This test process is the agent (it launches `postern mcp`): after its call and a
/// restart of the daemon on the same data dir, the journal still says which process
/// acted, with the blake3 of its binary, and the audit chain verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_is_recorded_before_its_first_call_and_read_back_after_a_restart() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let mut daemon = start_daemon(&server.base_url(), "none");
    let client = client(&daemon.socket).await;
    let result = call(
        &client,
        "http_request",
        json!({"url": server.url("/v1/items"), "method": "GET"}),
    )
    .await;
    assert!(!is_error(&result), "{result:?}");
    let id = structured(&result)["invocation_id"]
        .as_str()
        .unwrap()
        .to_string();
    client.cancel().await.unwrap();

    daemon.restart();
    // The restarted daemon serves a new agent connection over the same journal.
    let again = client_after(&daemon.socket).await;
    let second = call(
        &again,
        "http_request",
        json!({"url": server.url("/v1/items"), "method": "GET"}),
    )
    .await;
    assert!(!is_error(&second), "{second:?}");
    again.cancel().await.unwrap();

    let conn = daemon.journal();
    let (session, accepted_seq): (String, i64) = conn
        .query_row(
            "SELECT session_id, accepted_seq FROM invocations WHERE id = ?1",
            [&id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let recorded = provenance::recorded_session(&conn, &session)
        .unwrap()
        .expect("a SESSION_OPENED record for the agent's session");
    assert!(
        recorded.seq < u64::try_from(accepted_seq).unwrap(),
        "the session record precedes the first acceptance"
    );
    // One record per MCP session (before and after the restart), none for the bare
    // connections that only probed whether the daemon listens.
    let records: Vec<String> = conn
        .prepare("SELECT invocation_id FROM events WHERE kind = 'SESSION_OPENED'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(records, vec![provenance::session_key(&session); 2]);
    assert_eq!(recorded.connections, 2);
    // Opening the MCP session is enough: the record is written without any call.
    let idle = client_after(&daemon.socket).await;
    let mut count = 0i64;
    for _ in 0..500 {
        count = conn
            .query_row(
                "SELECT count(*) FROM events WHERE kind = 'SESSION_OPENED'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        if count == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(count, 3, "the MCP handshake records the session");
    idle.cancel().await.unwrap();
    let agent = &recorded.opened.agent;
    let exe = std::env::current_exe().unwrap();
    let independent = blake3::hash(&std::fs::read(&exe).unwrap());
    assert_eq!(agent.executable.as_deref(), exe.to_str());
    assert_eq!(
        agent.executable_digest,
        ExecutableDigest::Blake3 {
            hex: independent.to_hex().to_string()
        }
    );
    assert_eq!(agent.pid, std::process::id());
    assert_eq!(agent.uid, Some(own_uid()));
    assert_eq!(
        agent.cwd.as_deref(),
        std::env::current_dir().unwrap().to_str()
    );
    assert!(agent.started_at_ms.is_some());
    // The connecting user is part of the key (issue 26): sessions never span users.
    assert_eq!(
        session,
        format!("sess_u{}_{}_{}", own_uid(), agent.pid, agent.start_ticks)
    );
    let bridge = recorded.opened.transport.bridge_executable.as_deref();
    assert_eq!(
        bridge.map(Path::new),
        Some(std::fs::canonicalize(POSTERN).unwrap().as_path())
    );
    assert_eq!(
        recorded.opened.parent_chain.first().map(|p| p.pid),
        Some(std::os::unix::process::parent_id())
    );

    let out = Command::new(POSTERN)
        .args(["audit", "verify", "--data-dir"])
        .arg(daemon.dir.path())
        .args(["--keychain-service", daemon.service()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_202_names_its_job_and_poll_job_reads_it_until_it_settles() {
    let server = Adversary::start(Behavior::Sequence(vec![
        Behavior::respond(202, "{}").header("Location", "/v1/jobs/3"),
        Behavior::respond(202, "{}"),
        Behavior::status(303).header("Location", "/v1/exports/3"),
    ]))
    .await
    .unwrap();
    let daemon = start_daemon(&server.base_url(), "none");
    let client = client(&daemon.socket).await;
    let submitted = call(
        &client,
        "http_request",
        json!({"url": server.url("/v1/exports"), "method": "POST", "body": "{}"}),
    )
    .await;
    assert!(!is_error(&submitted), "{submitted:?}");
    let submitted = structured(&submitted);
    assert_eq!(submitted["outcome"], "committed");
    assert_eq!(submitted["status"], 202);
    let job = submitted["job"]["invocation_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(submitted["job"]["poll_with"], "poll_job");

    let first = structured(&call(&client, "poll_job", json!({"invocation_id": job})).await);
    assert_eq!(first["outcome"], "unknown");
    assert_eq!(first["code"], "JOB_PENDING");
    assert_eq!(first["evidence"]["job"]["state"], "pending");
    assert_eq!(first["poll"]["status"], 202);
    let second = structured(&call(&client, "poll_job", json!({"invocation_id": job})).await);
    assert_eq!(second["outcome"], "committed");
    assert_eq!(second["evidence"]["job"]["state"], "succeeded");
    assert_eq!(second["evidence"]["parent"]["relation"], "job");
    // Settled: answered from the record, nothing more is sent.
    let third = structured(&call(&client, "poll_job", json!({"invocation_id": job})).await);
    assert_eq!(third["outcome"], "committed");
    assert_eq!(third["poll"], Value::Null);
    assert_eq!(server.requests().len(), 3);

    // A call that queued no job is refused with a typed error.
    let plain = structured(
        &call(
            &client,
            "poll_job",
            json!({"invocation_id": third["evidence"]["job"]["last_poll"]}),
        )
        .await,
    );
    assert_eq!(plain["error"]["code"], "INVALID_REQUEST");
    client.cancel().await.unwrap();
}

/// Issue 14: through the real bridge and daemon, an agent lists a peer's capability and
/// calls it with a `peer://` URL; the peer's signed outcome comes back as the result,
/// and the agent never sees the peer's URL or key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_lists_and_calls_a_peer_capability_through_the_bridge() {
    use postern_broker::transparency::note::VerifierKey;
    use postern_tests::peer::{Step, TestPeer};

    let placeholder = ed25519_dalek::SigningKey::from_bytes(&[1u8; 32]).verifying_key();
    let peer = TestPeer::start(
        ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]),
        placeholder,
        vec![Step::Outcome {
            status: 201,
            body: "{\"charge\":\"ch_9\"}".into(),
        }],
    )
    .await
    .unwrap();
    let text = format!(
        "[[peer]]\nname = \"org-b\"\nkey = \"{}\"\nurl = \"{}\"\ntimeout_ms = 5000\n",
        peer.key_line(),
        peer.url()
    );
    let daemon = start_daemon_with(&text, &[]);
    // The peer pins this broker's key, as its operator would from `postern audit key`.
    peer.set_caller(VerifierKey::parse(&daemon.audit_key()).unwrap().key);

    let client = client(&daemon.socket).await;
    let listed = call(&client, "list_targets", json!({})).await;
    let listed = structured(&listed);
    let targets = listed["targets"].as_array().unwrap();
    let cap = targets
        .iter()
        .find(|t| t["name"] == "peer/org-b/payments")
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(cap["kind"], "peer");
    assert_eq!(cap["url"], "peer://org-b/payments/");
    let shown = listed.to_string();
    assert!(
        !shown.contains(&peer.url()),
        "the peer's URL is never shown"
    );
    assert!(!shown.contains(&peer.key_line()), "nor its key");

    let result = call(
        &client,
        "http_request",
        json!({
            "url": "peer://org-b/payments/charges",
            "method": "POST",
            "body": "{\"amount\":5}",
        }),
    )
    .await;
    assert!(!is_error(&result), "{result:?}");
    let value = structured(&result);
    assert_eq!(value["outcome"], "committed");
    assert_eq!(value["status"], 201);
    assert_eq!(value["body"], "{\"charge\":\"ch_9\"}");
    let id = value["invocation_id"].as_str().unwrap().to_string();

    let seen = peer.seen();
    assert_eq!(
        seen.calls,
        vec![id.clone()],
        "the caller invocation is the agent's"
    );
    assert_eq!(seen.runs.len(), 1);
    assert_eq!(seen.bad_auth, 0, "signed with this broker's key");

    let inv = call(&client, "get_invocation", json!({"invocation_id": id})).await;
    let inv = structured(&inv);
    let kinds: Vec<&str> = inv["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"PEER_ANSWER"), "{kinds:?}");
    assert!(
        !inv.to_string().contains(&peer.url()),
        "the record an agent reads never names the peer's URL"
    );
    assert!(!kinds.contains(&"CREDENTIAL_AUTHORIZED"), "{kinds:?}");
    client.cancel().await.unwrap();
}
