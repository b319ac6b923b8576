//! One agent's whole path on this platform's own pieces, through the real binaries: the
//! daemon on its default endpoint (a Unix socket in the data dir on Linux and macOS, a
//! named pipe derived from it on Windows) with the platform's keychain (Secret Service,
//! macOS login keychain, Windows Credential Manager), `postern mcp` launched by this test
//! process as an agent's MCP client would, and what the journal records of the agent.
//!
//! It runs on Linux with the rest of the suite (Secret Service; skipped with
//! `POSTERN_TEST_SKIP_SECRET_SERVICE=1`), and on macOS and Windows where
//! `POSTERN_TEST_NATIVE_KEYCHAIN=1` says the user's keychain may take test entries (the
//! platforms workflow sets it); entries live under a test-only service name and are
//! removed afterwards. Every keychain entry is written, read and removed by the `postern`
//! binary itself: macOS asks the person before one program reads another's keychain
//! item, and a test must never wait on a dialog.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::json;

use postern_broker::platform::{self, UserId};
use postern_broker::provenance::{self, ExecutableDigest};
use postern_tests::adversary::{Adversary, Behavior};
use postern_tests::agent::{self, is_error, structured};
use postern_tests::fixture::test_service;

const POSTERN: &str = env!("CARGO_BIN_EXE_postern");
const SECRET: &str = "pstn-platform-canary-41c9";

fn keychain_enabled() -> bool {
    let flag = |name: &str| std::env::var_os(name).is_some_and(|v| v == "1");
    if cfg!(target_os = "linux") {
        if flag("POSTERN_TEST_SKIP_SECRET_SERVICE") {
            eprintln!("skipped: POSTERN_TEST_SKIP_SECRET_SERVICE=1");
            return false;
        }
        return true;
    }
    if !flag("POSTERN_TEST_NATIVE_KEYCHAIN") {
        eprintln!("skipped: set POSTERN_TEST_NATIVE_KEYCHAIN=1 to let it use this keychain");
        return false;
    }
    true
}

/// `postern vault …` over the data dir `data` and keychain service `service` (the
/// platform's default keychain), with `stdin` piped in.
fn vault(data: &Path, service: &str, args: &[&str], stdin: &str) -> std::process::Output {
    postern_tests::run_with_stdin(
        Command::new(POSTERN)
            .arg("vault")
            .args(args)
            .arg("--data-dir")
            .arg(data)
            .args(["--keychain-service", service]),
        stdin.as_bytes(),
    )
    .unwrap()
}

/// The daemon, killed on drop, and its keychain entries removed.
struct Daemon {
    child: Child,
    dir: tempfile::TempDir,
    service: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let data = self.data_dir();
        vault(&data, &self.service, &["rm", "api-key"], "");
        vault(
            &data,
            &self.service,
            &["rm", "--force", "postern-audit-signing"],
            "",
        );
    }
}

impl Daemon {
    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }
}

/// Starts `postern daemon` with every default this platform has (endpoint, keychain)
/// except the test's own service name and anchor, and waits until it says it listens.
fn start_daemon(base: &str) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let service = test_service();
    let stored = vault(&data, &service, &["set", "api-key"], SECRET);
    assert!(
        stored.status.success(),
        "{}",
        String::from_utf8_lossy(&stored.stderr)
    );
    let config = dir.path().join("targets.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[[http]]
name = "api"
base_url = "{base}/v1"
methods = ["GET"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "none"
timeout_ms = 5000
"#
        ),
    )
    .unwrap();
    let mut child = Command::new(POSTERN)
        .args(["daemon", "--data-dir"])
        .arg(&data)
        .arg("--config")
        .arg(&config)
        .arg("--anchor")
        .arg(dir.path().join("anchor.checkpoint"))
        .args(["--keychain-service", &service])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, seen) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let daemon = Daemon {
        child,
        dir,
        service,
    };
    let mut said = Vec::new();
    loop {
        match seen.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if line.starts_with("postern: broker listening on ") => return daemon,
            Ok(line) => said.push(line),
            Err(_) => panic!("the daemon did not start listening: {said:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_reaches_the_daemon_on_the_platform_endpoint_and_is_recorded_as_itself() {
    if !keychain_enabled() {
        return;
    }
    let server = Adversary::start(Behavior::ok_json("{\"items\":[1,2]}"))
        .await
        .unwrap();
    let daemon = start_daemon(&server.base_url());
    let endpoint = postern_mcp::default_socket(&daemon.data_dir());
    if cfg!(windows) {
        assert!(endpoint.to_string_lossy().starts_with(r"\\.\pipe\postern-"));
    } else {
        assert_eq!(endpoint, daemon.data_dir().join("run").join("postern.sock"));
    }

    // This test process is the agent: it launches the bridge over stdio.
    let client = agent::connect(Path::new(POSTERN), &endpoint).await.unwrap();
    let result = agent::call(
        &client,
        "http_request",
        json!({"url": server.url("/v1/items"), "method": "GET"}),
    )
    .await
    .unwrap();
    assert!(!is_error(&result), "{result:?}");
    let value = structured(&result);
    assert_eq!(value["outcome"], "committed");
    assert_eq!(value["status"], 200);
    assert!(!value.to_string().contains(SECRET));
    // The remote saw the credential the platform keychain held.
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.header("authorization") == Some(&format!("Bearer {SECRET}")))
    );
    let id = value["invocation_id"].as_str().unwrap().to_string();
    client.cancel().await.unwrap();

    let conn = rusqlite::Connection::open_with_flags(
        daemon.data_dir().join("journal.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let session: String = conn
        .query_row(
            "SELECT session_id FROM invocations WHERE id = ?1",
            [&id],
            |r| r.get(0),
        )
        .unwrap();
    let recorded = provenance::recorded_session(&conn, &session)
        .unwrap()
        .expect("a SESSION_OPENED record for the agent's session");
    let opened = &recorded.opened;
    assert_eq!(opened.transport.kind, platform::TRANSPORT_KIND);
    let agent = &opened.agent;
    assert_eq!(agent.pid, std::process::id());
    // The connecting user is part of the key (issue 26): sessions never span users.
    let user = postern_mcp::caller::user_tag(&platform::current_user().unwrap());
    assert_eq!(
        session,
        format!("sess_{user}_{}_{}", agent.pid, agent.start_ticks)
    );
    let exe = std::env::current_exe().unwrap();
    assert_eq!(
        agent
            .executable
            .as_deref()
            .map(|p| std::fs::canonicalize(p).unwrap()),
        Some(std::fs::canonicalize(&exe).unwrap())
    );
    let independent = blake3::hash(&std::fs::read(&exe).unwrap());
    assert_eq!(
        agent.executable_digest,
        ExecutableDigest::Blake3 {
            hex: independent.to_hex().to_string()
        }
    );
    // The agent's user, as the platform names users.
    match platform::current_user().unwrap() {
        UserId::Uid(uid) => {
            assert_eq!(agent.uid, Some(uid));
            assert_eq!(agent.sid, None);
        }
        UserId::Sid(sid) => {
            assert_eq!(agent.sid.as_deref(), Some(sid.as_str()));
            assert_eq!(agent.uid, None);
        }
    }
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let started = agent.started_at_ms.unwrap();
    assert!(
        started <= now_ms && started > now_ms - 3_600_000,
        "{started}"
    );

    // The audit chain verifies with the key the platform keychain holds.
    let out = Command::new(POSTERN)
        .args(["audit", "verify", "--data-dir"])
        .arg(daemon.data_dir())
        .args(["--keychain-service", &daemon.service])
        .arg("--anchor")
        .arg(daemon.dir.path().join("anchor.checkpoint"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
