//! How a `postern mcp` session ends and what it says when it cannot begin: the last
//! result of a session is acknowledged before the bridge exits, and a user who may not
//! reach the socket is told so (not that no broker runs).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use support::{Bridge, POSTERN};

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
