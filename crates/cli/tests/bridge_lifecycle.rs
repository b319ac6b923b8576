//! How a `postern mcp` session ends and what it says when it cannot begin: the last
//! result of a session is acknowledged before the bridge exits, and a user who may not
//! reach the socket is told so (not that no broker runs).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use postern_tests::adversary::{Adversary, Behavior};
use support::{Bridge, POSTERN, start_daemon};

const SESSIONS: usize = 32;

/// One agent session: initialize, one http_request, read its response, close stdin at
/// once. Returns the invocation id and how long the bridge took to exit.
fn one_call_then_close(socket: &Path, url: &str) -> (String, Duration) {
    let mut bridge = Bridge::spawn(socket);
    bridge.initialize();
    assert!(bridge.send_json(&json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "http_request", "arguments": {"url": url, "method": "GET"}}
    })));
    let (_, reply) = bridge.recv_until_id(&json!(1), Duration::from_secs(20));
    let reply = reply.expect("the call is answered");
    let value = &reply["result"]["structuredContent"];
    assert_eq!(value["outcome"], "committed", "{reply}");
    let id = value["invocation_id"].as_str().unwrap().to_string();
    bridge.close_stdin();
    let closing = Instant::now();
    let status = bridge.wait_exit(Duration::from_secs(20));
    assert!(status.is_some(), "the bridge exits after stdin closes");
    (id, closing.elapsed())
}

/// Delivery kinds recorded per invocation: (delivered, failed).
fn deliveries(conn: &rusqlite::Connection) -> (Vec<String>, Vec<String>) {
    let ids = |kind: &str| -> Vec<String> {
        let mut stmt = conn
            .prepare("SELECT DISTINCT invocation_id FROM events WHERE kind = ?1")
            .unwrap();
        stmt.query_map([kind], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    (ids("RESULT_DELIVERED"), ids("DELIVERY_FAILED"))
}

// Regression: issue 10
#[test]
fn the_last_call_of_every_session_is_recorded_delivered_when_the_agent_closes_stdin() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime
        .block_on(Adversary::start(Behavior::ok_json("{\"ok\":true}")))
        .unwrap();
    let daemon = start_daemon(&server.base_url());
    let url = server.url("/v1/items");
    // All sessions at once, as in a load run.
    let sessions: Vec<_> = (0..SESSIONS)
        .map(|_| {
            let socket = daemon.socket.clone();
            let url = url.clone();
            std::thread::spawn(move || one_call_then_close(&socket, &url))
        })
        .collect();
    let results: Vec<(String, Duration)> =
        sessions.into_iter().map(|s| s.join().unwrap()).collect();
    let slowest = results.iter().map(|(_, d)| *d).max().unwrap();
    assert!(
        slowest < Duration::from_secs(5),
        "a bridge with nothing owed exits promptly (slowest {slowest:?})"
    );

    // Every connection has closed; the daemon records each result's fate.
    let conn = daemon.journal();
    let deadline = Instant::now() + Duration::from_secs(15);
    let (delivered, failed) = loop {
        let (delivered, failed) = deliveries(&conn);
        if delivered.len() + failed.len() >= SESSIONS || Instant::now() > deadline {
            break (delivered, failed);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    println!(
        "{SESSIONS} sessions: {} RESULT_DELIVERED, {} DELIVERY_FAILED",
        delivered.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "DELIVERY_FAILED for {failed:?}");
    for (id, _) in &results {
        assert!(delivered.contains(id), "{id} has RESULT_DELIVERED");
    }
}

// Regression: issue 10
#[test]
fn a_response_still_owed_when_stdin_closes_is_relayed_and_acknowledged() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(Adversary::start(Behavior::Stall)).unwrap();
    let daemon = start_daemon(&server.base_url());
    let mut bridge = Bridge::spawn(&daemon.socket);
    bridge.initialize();
    assert!(bridge.send_json(&json!({
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "http_request",
                   "arguments": {"url": server.url("/v1/slow"), "method": "GET"}}
    })));
    // The agent closes stdin while the call is still with the remote.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.requests().is_empty() {
        assert!(Instant::now() < deadline, "the call reaches the remote");
        std::thread::sleep(Duration::from_millis(20));
    }
    bridge.close_stdin();
    std::thread::sleep(Duration::from_millis(200));
    assert!(bridge.alive(), "the bridge waits for the response it owes");
    server.release();
    let (_, reply) = bridge.recv_until_id(&json!(7), Duration::from_secs(10));
    let reply = reply.expect("the owed response reaches the agent after stdin closed");
    let id = reply["result"]["structuredContent"]["invocation_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(bridge.wait_exit(Duration::from_secs(10)).is_some());
    let conn = daemon.journal();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (delivered, failed) = deliveries(&conn);
        assert!(failed.is_empty(), "DELIVERY_FAILED for {failed:?}");
        if delivered.contains(&id) {
            break;
        }
        assert!(Instant::now() < deadline, "RESULT_DELIVERED for {id}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An agent whose stdio are regular files, not pipes (the bridge reads pipes without
/// blocking; anything else through tokio's stdin and stdout): the session runs all the
/// same, every answer reaches the file, and the call's result is recorded delivered.
#[test]
fn a_bridge_whose_stdio_are_files_not_pipes_serves_the_session_and_acknowledges_it() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime
        .block_on(Adversary::start(Behavior::ok_json("{\"ok\":true}")))
        .unwrap();
    let daemon = start_daemon(&server.base_url());
    let dir = tempfile::tempdir().unwrap();
    let messages = [
        json!({"jsonrpc": "2.0", "id": "init", "method": "initialize",
               "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                          "clientInfo": {"name": "files", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": "http_request",
                          "arguments": {"url": server.url("/v1/items"), "method": "GET"}}}),
    ];
    let input = dir.path().join("in.jsonl");
    let text: String = messages.iter().map(|m| format!("{m}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let output = dir.path().join("out.jsonl");
    let status = Command::new(POSTERN)
        .args(["mcp", "--socket"])
        .arg(&daemon.socket)
        .stdin(std::fs::File::open(&input).unwrap())
        .stdout(std::fs::File::create(&output).unwrap())
        .status()
        .unwrap();
    assert!(status.success(), "{status:?}");
    let answers: Vec<Value> = std::fs::read_to_string(&output)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        answers
            .iter()
            .any(|a| a["id"] == "init" && a["result"].is_object())
    );
    let call = answers
        .iter()
        .find(|a| a["id"] == 1)
        .expect("the call is answered");
    let value = &call["result"]["structuredContent"];
    assert_eq!(value["outcome"], "committed", "{call}");
    assert_eq!(server.requests().len(), 1);
    let id = value["invocation_id"].as_str().unwrap().to_string();
    let conn = daemon.journal();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !deliveries(&conn).0.contains(&id) {
        assert!(Instant::now() < deadline, "RESULT_DELIVERED for {id}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:\t0\t"))
}

/// A copy of the binary user `nobody` can execute, wherever this checkout lives.
fn shared_binary() -> (tempfile::TempDir, PathBuf) {
    let shared = tempfile::tempdir().unwrap();
    let binary = shared.path().join("postern");
    std::fs::copy(POSTERN, &binary).unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    (shared, binary)
}

/// What an http_request through a bridge running as `nobody` answers, and its stderr.
fn as_nobody(binary: &Path, socket: &Path) -> (Value, String) {
    let mut command = Command::new(binary);
    command.uid(65534).gid(65534).current_dir("/");
    let mut bridge = Bridge::spawn_with(command, socket);
    bridge.initialize();
    assert!(bridge.send_json(&json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "http_request",
                   "arguments": {"url": "http://127.0.0.1:9/x", "method": "GET"}}
    })));
    let (_, reply) = bridge.recv_until_id(&json!(1), Duration::from_secs(10));
    let reply = reply.expect("the bridge answers");
    bridge.close_stdin();
    assert!(bridge.wait_exit(Duration::from_secs(10)).is_some());
    let envelope = reply["result"]["structuredContent"].clone();
    assert_eq!(reply["result"]["isError"], true, "{reply}");
    (envelope, bridge.stderr(Duration::from_secs(5)))
}

// Regression: issue 10
#[test]
fn a_user_who_may_not_reach_the_socket_is_told_permission_denied_not_that_no_broker_runs() {
    if !running_as_root() {
        eprintln!("skipped: not root, cannot run the bridge as another uid");
        return;
    }
    let (_shared, binary) = shared_binary();
    // A listening socket (no daemon needed: the kernel refuses before anyone answers).
    let dir = tempfile::tempdir().unwrap();
    // (a) The socket's directory is not searchable by the other user (0700, root's).
    let private = dir.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let hidden = private.join("postern.sock");
    let _hidden_listener = std::os::unix::net::UnixListener::bind(&hidden).unwrap();
    // (b) The directory is open, the socket itself is 0600 and root's.
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let closed = open.join("postern.sock");
    let _closed_listener = std::os::unix::net::UnixListener::bind(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o600)).unwrap();

    for socket in [&hidden, &closed] {
        let (envelope, stderr) = as_nobody(&binary, socket);
        assert_eq!(
            envelope["error"]["code"], "BROKER_UNAVAILABLE",
            "{envelope}"
        );
        assert_eq!(envelope["error"]["outcome"], "not_attempted");
        let message = envelope["error"]["message"].as_str().unwrap();
        assert!(message.contains("ermission denied"), "{message}");
        assert!(message.contains(&socket.display().to_string()), "{message}");
        assert!(message.contains("another user"), "{message}");
        assert!(
            !message.contains("No Postern broker is running"),
            "{message}"
        );
        assert!(
            stderr.contains("ermission denied"),
            "stderr says so too: {stderr}"
        );
    }

    // Nothing listening at all is still "not running".
    let (envelope, _) = as_nobody(&binary, &open.join("absent.sock"));
    let message = envelope["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("No Postern broker is running"),
        "{message}"
    );
}
