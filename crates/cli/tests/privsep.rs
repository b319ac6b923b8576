//! Privilege separation with real OS users: the broker runs as its own user with the
//! `file` keychain, an agent user reaches only the agent (MCP) socket, and an operator
//! user answers approvals over the operator socket.
//!
//! The two-user tests need root (to create throwaway users and switch to them with
//! `setpriv`); CI runs as root. Without root they say so loudly and pass, unless
//! `POSTERN_REQUIRE_PRIVSEP_TESTS=1` (set by scripts/test.sh), where they fail. Every
//! user, group and process they create is removed by its name or PID on drop, also when
//! a test fails. The tests without users run anywhere.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use postern_console::operator::{MAX_REQUEST, OperatorClient};
use postern_tests::adversary::{Adversary, Behavior};

use support::peers::resident_bytes;
use support::{Bridge, POSTERN, target_approved};

const CANARY: &str = "pstn-privsep-canary-51c9";

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:\t0\t"))
}

/// Whether the two-user tests can run here; fails when they are required and cannot.
fn users_possible(test: &str) -> bool {
    if running_as_root() {
        return true;
    }
    let required = std::env::var_os("POSTERN_REQUIRE_PRIVSEP_TESTS").is_some_and(|v| v == "1");
    assert!(
        !required,
        "{test}: POSTERN_REQUIRE_PRIVSEP_TESTS=1 but this is not root: the privilege \
         separation tests cannot create users and did NOT run"
    );
    eprintln!(
        "\n*** {test} SKIPPED: not root, so no throwaway users; privilege separation is NOT \
         tested here ***\n"
    );
    false
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program).args(args).output().unwrap()
}

/// Throwaway system users and a group, removed on drop.
struct Accounts {
    broker: String,
    agent: String,
    operator: String,
    group: String,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl Accounts {
    fn create() -> Accounts {
        let tag = format!(
            "{}{}",
            std::process::id() % 100_000,
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let accounts = Accounts {
            broker: format!("postern-t-broker-{tag}"),
            agent: format!("postern-t-agent-{tag}"),
            operator: format!("postern-t-op-{tag}"),
            group: format!("postern-t-operators-{tag}"),
        };
        // Registered for removal before each is made, so a failure half-way cleans up.
        let add = |name: &str, extra: &[&str]| {
            let mut args = vec![
                "--system",
                "--no-create-home",
                "--user-group",
                "--shell",
                "/usr/sbin/nologin",
            ];
            args.extend_from_slice(extra);
            args.push(name);
            let out = run("useradd", &args);
            assert!(out.status.success(), "useradd {name}: {out:?}");
        };
        let out = run("groupadd", &["--system", &accounts.group]);
        assert!(out.status.success(), "groupadd: {out:?}");
        // The broker gives its operator socket to the group, which needs membership
        // (the unit's SupplementaryGroups=).
        add(&accounts.broker, &["--groups", &accounts.group]);
        add(&accounts.agent, &[]);
        add(&accounts.operator, &["--groups", &accounts.group]);
        accounts
    }

    fn id(&self, user: &str, flag: &str) -> u32 {
        let out = run("id", &[flag, user]);
        String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// `program args…` as `user`, with that user's groups and a clean environment.
    fn command_as(&self, user: &str, program: &Path) -> Command {
        let mut command = Command::new("setpriv");
        command
            .args(["--reuid", user, "--regid", user, "--init-groups", "--"])
            .arg(program)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .current_dir("/");
        command
    }
}

impl Drop for Accounts {
    fn drop(&mut self) {
        for user in [&self.broker, &self.agent, &self.operator] {
            let _ = run("userdel", &[user]);
        }
        let _ = run("groupdel", &[&self.group]);
    }
}

/// The layout a privilege-separated broker runs in, under one root-owned directory.
struct Layout {
    base: tempfile::TempDir,
}

impl Layout {
    fn path(&self, rel: &str) -> PathBuf {
        self.base.path().join(rel)
    }
    fn binary(&self) -> PathBuf {
        self.path("bin/postern")
    }
    fn data(&self) -> PathBuf {
        self.path("data")
    }
    fn agent_socket(&self) -> PathBuf {
        self.path("run/agent.sock")
    }
    fn operator_socket(&self) -> PathBuf {
        self.path("run/operator.sock")
    }
    fn key(&self) -> PathBuf {
        self.path("secrets/vault.key")
    }
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
}

/// A running daemon, killed by PID on drop; its stderr is collected.
struct Daemon {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn spawn(mut command: Command) -> Daemon {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(pipe);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                sink.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        let mut daemon = Daemon { child, stderr };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !daemon.log().contains("operator socket on") {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                panic!("the daemon exited ({status}): {}", daemon.log());
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not start: {}",
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }

    fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

/// Lays out data dir, sockets and key for `accounts.broker` and starts the daemon as it.
fn start_separated(accounts: &Accounts, base_url: &str) -> (Layout, Daemon) {
    start_separated_approving(accounts, base_url, "per_call")
}

/// [`start_separated`] with target `api` under `approval`.
fn start_separated_approving(
    accounts: &Accounts,
    base_url: &str,
    approval: &str,
) -> (Layout, Daemon) {
    let layout = Layout {
        base: tempfile::tempdir().unwrap(),
    };
    chmod(layout.base.path(), 0o755);
    let broker_uid = accounts.id(&accounts.broker, "-u");
    let broker_gid = accounts.id(&accounts.broker, "-g");
    std::fs::create_dir(layout.path("bin")).unwrap();
    std::fs::copy(POSTERN, layout.binary()).unwrap();
    chmod(&layout.path("bin"), 0o755);
    chmod(&layout.binary(), 0o755);
    for (dir, mode) in [("data", 0o700), ("run", 0o755), ("secrets", 0o700)] {
        std::fs::create_dir(layout.path(dir)).unwrap();
        chown(&layout.path(dir), broker_uid, broker_gid);
        chmod(&layout.path(dir), mode);
    }
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut key)
        .unwrap();
    std::fs::write(layout.key(), key).unwrap();
    chown(&layout.key(), broker_uid, broker_gid);
    chmod(&layout.key(), 0o400);
    std::fs::write(
        layout.path("postern.toml"),
        target_approved("api", base_url, approval),
    )
    .unwrap();
    chmod(&layout.path("postern.toml"), 0o644);
    let mut command = accounts.command_as(&accounts.broker, &layout.binary());
    command
        .arg("daemon")
        .arg("--data-dir")
        .arg(layout.data())
        .arg("--config")
        .arg(layout.path("postern.toml"))
        .arg("--socket")
        .arg(layout.agent_socket())
        .arg("--operator-socket")
        .arg(layout.operator_socket())
        .args(["--operator-group", &accounts.group])
        .args(["--agent-users", "any"])
        .args(["--keychain", "file", "--vault-key-file"])
        .arg(layout.key())
        .args(["--approval-timeout", "60"]);
    let daemon = Daemon::spawn(command);
    (layout, daemon)
}

/// `postern operator --socket S ARGS…` as `user`: (exit code, stdout JSON or null, stderr).
fn operator_as(
    accounts: &Accounts,
    user: &str,
    layout: &Layout,
    args: &[&str],
) -> (i32, Value, String) {
    let out = accounts
        .command_as(user, &layout.binary())
        .arg("operator")
        .arg("--socket")
        .arg(layout.operator_socket())
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (
        out.status.code().unwrap_or(-1),
        serde_json::from_str(&stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn store_credential(socket: &Path) {
    OperatorClient::new(socket)
        .call(
            "set_credential",
            json!({"credential": {"id": "api-key", "kind": "token", "secret": CANARY}}),
        )
        .await
        .unwrap();
}

fn http_call(id: i64, url: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "http_request", "arguments": {"url": url, "method": "GET"}}})
}

/// The operator user's first pending approval card, waited for.
async fn operator_pending_card(accounts: &Accounts, layout: &Layout) -> Value {
    pending_card(async || {
        let (code, cards, stderr) =
            operator_as(accounts, &accounts.operator, layout, &["approvals"]);
        assert_eq!(code, 0, "{stderr}");
        cards
    })
    .await
}

/// Waits for one pending approval card through `list`.
async fn pending_card(list: impl AsyncFn() -> Value) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let cards = list().await;
        if let Some(card) = cards.as_array().and_then(|c| c.first()) {
            return card.clone();
        }
        assert!(Instant::now() < deadline, "no approval card appeared");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_user_reaches_only_the_agent_socket_and_an_operator_approves() {
    if !users_possible("the_agent_user_reaches_only_the_agent_socket_and_an_operator_approves") {
        return;
    }
    let server = Adversary::start(Behavior::ok_json(r#"{"paid":true}"#))
        .await
        .unwrap();
    let accounts = Accounts::create();
    let (layout, daemon) = start_separated(&accounts, &server.base_url());
    // The operator stores the credential, the secret on stdin.
    let mut child = accounts
        .command_as(&accounts.operator, &layout.binary())
        .arg("operator")
        .arg("--socket")
        .arg(layout.operator_socket())
        .args(["set-credential", "api-key"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{CANARY}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let stored: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stored["id"], "api-key");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(CANARY));
    let (code, listed, _) = operator_as(&accounts, &accounts.operator, &layout, &["credentials"]);
    assert_eq!(code, 0);
    assert_eq!(listed[0]["id"], "api-key", "{listed}");

    // What the agent user cannot read: the data dir, the journal, the sealed vault
    // (credentials and the audit signing key), the vault key.
    let sealed: Vec<PathBuf> = std::fs::read_dir(layout.data().join("vault"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(sealed.len(), 2, "the audit key and api-key are sealed");
    let mut forbidden = vec![
        layout.data().join("journal.db"),
        layout.data().join("vault"),
        layout.key(),
    ];
    forbidden.extend(sealed.iter().cloned());
    for path in &forbidden {
        let out = accounts
            .command_as(&accounts.agent, Path::new("/bin/cat"))
            .arg(path)
            .output()
            .unwrap();
        assert!(!out.status.success(), "the agent read {}", path.display());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
            "{}: {out:?}",
            path.display()
        );
    }
    let out = accounts
        .command_as(&accounts.agent, Path::new("/bin/ls"))
        .arg(layout.data())
        .output()
        .unwrap();
    assert!(!out.status.success(), "the agent listed the data dir");
    // Nothing in the data dir holds the secret in the clear.
    assert!(postern_tests::files_containing(&layout.data(), CANARY.as_bytes()).is_empty());

    // The operator socket is closed to the agent by its file mode.
    let (code, _, stderr) = operator_as(&accounts, &accounts.agent, &layout, &["approvals"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("Permission denied"), "{stderr}");

    // The agent makes an MCP call over the agent socket; it waits for an approval.
    let mut command = accounts.command_as(&accounts.agent, &layout.binary());
    command.env("HOME", "/");
    let mut bridge = Bridge::spawn_with(command, &layout.agent_socket());
    bridge.initialize();
    assert!(bridge.send_json(&http_call(2, &server.url("/v1/pay"))));

    // The operator user sees the card and approves exactly its fingerprint.
    let card = operator_pending_card(&accounts, &layout).await;
    let id = card["invocation_id"].as_str().unwrap().to_string();
    let fingerprint = card["fingerprint"].as_str().unwrap().to_string();
    let digest = card["card_digest"].as_str().unwrap().to_string();
    assert!(server.requests().is_empty(), "nothing sent before approval");
    let (code, _, stderr) = operator_as(
        &accounts,
        &accounts.operator,
        &layout,
        &["approve", &id, &fingerprint, &digest],
    );
    assert_eq!(code, 0, "{stderr}");
    let (_, response) = bridge.recv_until_id(&json!(2), Duration::from_secs(20));
    let response = response.expect("the agent's call completes");
    assert_ne!(response["result"]["isError"], json!(true), "{response}");
    assert!(!response.to_string().contains(CANARY));
    let seen = server.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {CANARY}").as_str())
    );

    // The operator's overview says what this is; the audit chain verifies.
    let (code, overview, stderr) =
        operator_as(&accounts, &accounts.operator, &layout, &["overview"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(overview["mode"], "privilege_separated");
    assert_eq!(overview["keychain"], "file");
    let (code, verified, stderr) = operator_as(&accounts, &accounts.operator, &layout, &["verify"]);
    assert_eq!(code, 0, "{stderr} {verified}");
    assert_eq!(verified["state"], "verified");
    // The agent's session is listed for the operator.
    let (code, sessions, _) = operator_as(&accounts, &accounts.operator, &layout, &["sessions"]);
    assert_eq!(code, 0);
    assert_eq!(sessions.as_array().map(Vec::len), Some(1), "{sessions}");
    drop(bridge);
    drop(daemon);
}

// Regression: issue 26 (item 2). Sessions were keyed by the bridge's parent alone: two
// bridges that a root supervisor started as different users shared one session, and the
// second user's POST ran on the first user's session approval with no card.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridges_of_two_users_under_one_supervisor_never_share_a_session_or_its_approval() {
    if !users_possible(
        "bridges_of_two_users_under_one_supervisor_never_share_a_session_or_its_approval",
    ) {
        return;
    }
    let server = Adversary::start(Behavior::ok_json(r#"{"paid":true}"#))
        .await
        .unwrap();
    let accounts = Accounts::create();
    let (layout, daemon) = start_separated_approving(&accounts, &server.base_url(), "session");
    store_credential(&layout.operator_socket()).await;

    // This test process (root) plays the supervisor: both bridges are its children.
    let bridge_as = |user: &str| {
        let mut command = accounts.command_as(user, &layout.binary());
        command.env("HOME", "/");
        let mut bridge = Bridge::spawn_with(command, &layout.agent_socket());
        bridge.initialize();
        bridge
    };
    let mut first = bridge_as(&accounts.agent);
    assert!(first.send_json(&http_call(2, &server.url("/v1/pay"))));
    let card = operator_pending_card(&accounts, &layout).await;
    assert_eq!(card["mode"], "session", "{card}");
    let (code, _, stderr) = operator_as(
        &accounts,
        &accounts.operator,
        &layout,
        &[
            "approve",
            card["invocation_id"].as_str().unwrap(),
            card["fingerprint"].as_str().unwrap(),
            card["card_digest"].as_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let (_, answer) = first.recv_until_id(&json!(2), Duration::from_secs(20));
    assert_ne!(answer.unwrap()["result"]["isError"], json!(true));
    assert_eq!(server.requests().len(), 1);

    // Another user's bridge under the same parent asks for its own card.
    let mut second = bridge_as(&accounts.operator);
    assert!(second.send_json(&http_call(3, &server.url("/v1/pay"))));
    let card = operator_pending_card(&accounts, &layout).await;
    let operator_uid = accounts.id(&accounts.operator, "-u");
    assert_eq!(card["recorded_agent"]["uid"], json!(operator_uid), "{card}");
    assert_eq!(
        server.requests().len(),
        1,
        "nothing sent on the other user's approval"
    );
    let (code, _, stderr) = operator_as(
        &accounts,
        &accounts.operator,
        &layout,
        &[
            "deny",
            card["invocation_id"].as_str().unwrap(),
            card["fingerprint"].as_str().unwrap(),
            card["card_digest"].as_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let (_, answer) = second.recv_until_id(&json!(3), Duration::from_secs(20));
    let answer = answer.unwrap();
    assert_eq!(
        answer["result"]["structuredContent"]["error"]["code"], "APPROVAL_DENIED",
        "{answer}"
    );
    assert_eq!(server.requests().len(), 1);

    // Two sessions, each of its own user.
    let (_, sessions, _) = operator_as(&accounts, &accounts.operator, &layout, &["sessions"]);
    let ids: std::collections::BTreeSet<String> = sessions
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 2, "{sessions}");
    let agent_uid = accounts.id(&accounts.agent, "-u");
    assert!(
        ids.iter()
            .any(|s| s.starts_with(&format!("sess_u{agent_uid}_b"))),
        "{ids:?}"
    );
    assert!(
        ids.iter()
            .any(|s| s.starts_with(&format!("sess_u{operator_uid}_b"))),
        "{ids:?}"
    );
    drop((first, second));
    drop(daemon);
}

// Regression: issue 26 (item 5). A broker running as its own user cannot read another
// user's /proc/PID/exe: the session recorded `executable: null`, and the card showed the
// argv the agent chose (`exec -a "/usr/local/bin/claude-code --approved-by-security-team"`)
// as if it named the agent. The card now says what the kernel says for certain (uid,
// user name, pid, start time), that the executable is not verified and why, and gives
// the argv and the bridge's report only as claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_a_forged_argv_is_named_by_what_the_kernel_says_and_its_claims_are_labelled()
{
    if !users_possible(
        "an_agent_with_a_forged_argv_is_named_by_what_the_kernel_says_and_its_claims_are_labelled",
    ) {
        return;
    }
    const FORGED: &str = "/usr/local/bin/claude-code --approved-by-security-team";
    let server = Adversary::start(Behavior::ok_json(r#"{"ok":true}"#))
        .await
        .unwrap();
    let accounts = Accounts::create();
    let (layout, daemon) = start_separated(&accounts, &server.base_url());
    store_credential(&layout.operator_socket()).await;
    // The agent: a shell of the agent user whose argv says it is something else, which
    // starts the bridge as its child (`; exit` keeps bash from exec-ing it in place).
    let mut command = accounts.command_as(&accounts.agent, Path::new("/bin/bash"));
    command.env("HOME", "/").args([
        "-c",
        r#"exec -a "$0" /bin/bash -c '"$@"; exit $?' agent "$@""#,
        FORGED,
    ]);
    command.arg(layout.binary());
    let mut bridge = Bridge::spawn_with(command, &layout.agent_socket());
    bridge.initialize();
    assert!(bridge.send_json(&http_call(2, &server.url("/v1/items/42"))));
    let card = operator_pending_card(&accounts, &layout).await;
    let recorded = &card["recorded_agent"];
    // Known for certain.
    assert_eq!(
        recorded["uid"],
        json!(accounts.id(&accounts.agent, "-u")),
        "{card}"
    );
    assert_eq!(recorded["user_name"], json!(accounts.agent), "{card}");
    assert!(recorded["started_at_ms"].as_i64().is_some(), "{card}");
    let agent_pid = recorded["pid"].as_u64().unwrap();
    // The broker could not read the executable, and says so.
    assert_eq!(recorded["executable"], Value::Null, "{card}");
    assert_eq!(recorded["executable_verified"], json!(false), "{card}");
    assert!(
        recorded["executable_unreadable"]
            .as_str()
            .is_some_and(|why| why.contains("ermission denied")),
        "{card}"
    );
    // The bridge's report: the real program, labelled as a claim.
    let bash = std::fs::canonicalize("/bin/bash").unwrap();
    let claim = &recorded["reported_by_bridge"];
    assert_eq!(claim["parent_pid"].as_u64(), Some(agent_pid), "{card}");
    assert_eq!(
        claim["parent_executable"],
        json!(bash.to_str().unwrap()),
        "{card}"
    );
    assert_eq!(
        claim["parent_executable_blake3"],
        json!(
            blake3::hash(&std::fs::read(&bash).unwrap())
                .to_hex()
                .as_str()
        ),
        "{card}"
    );
    // The argv is there only as the process's claim.
    let live = &card["agent"]["agent"];
    assert!(live.get("command").is_none(), "{card}");
    assert!(
        live["claimed_command"]
            .as_str()
            .unwrap()
            .starts_with(FORGED),
        "{card}"
    );
    assert!(
        !recorded.to_string().contains("approved-by-security-team"),
        "{card}"
    );
    // The same in the operator's session listing.
    let (_, sessions, _) = operator_as(&accounts, &accounts.operator, &layout, &["sessions"]);
    let session = &sessions[0];
    assert_eq!(
        session["recorded"]["executable_verified"],
        json!(false),
        "{sessions}"
    );
    assert_eq!(
        session["recorded"]["user_name"],
        json!(accounts.agent),
        "{sessions}"
    );
    drop(bridge);
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loosened_operator_socket_still_refuses_the_agent_by_its_uid() {
    if !users_possible("a_loosened_operator_socket_still_refuses_the_agent_by_its_uid") {
        return;
    }
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let accounts = Accounts::create();
    let (layout, daemon) = start_separated(&accounts, &server.base_url());
    // Someone loosens the socket's mode: the peer check still holds.
    chmod(&layout.operator_socket(), 0o666);
    let (code, answer, stderr) = operator_as(&accounts, &accounts.agent, &layout, &["overview"]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(answer["error"]["code"], "OPERATOR_REFUSED", "{answer}");
    assert!(answer.get("ok").is_none_or(|ok| ok == false));
    let agent_uid = accounts.id(&accounts.agent, "-u");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !daemon.log().contains(&format!("refused uid {agent_uid}")) {
        assert!(Instant::now() < deadline, "no log line: {}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    // An approve attempt from the agent is refused the same way and changes nothing.
    let (code, answer, _) = operator_as(
        &accounts,
        &accounts.agent,
        &layout,
        &["approve", "inv_x", "fp", "blake3:00"],
    );
    assert_eq!(code, 1);
    assert_eq!(answer["error"]["code"], "OPERATOR_REFUSED");
    // The operator sees the count.
    let (code, overview, stderr) =
        operator_as(&accounts, &accounts.operator, &layout, &["overview"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(overview["operator_refusals"], 2, "{overview}");
    drop(daemon);
}

/// A same-user daemon with the file keychain (no OS keychain needed).
fn start_local(dir: &Path, base_url: &str) -> Daemon {
    std::fs::write(
        dir.join("postern.toml"),
        target_approved("api", base_url, "per_call"),
    )
    .unwrap();
    std::fs::write(dir.join("vault.key"), [9u8; 32]).unwrap();
    chmod(&dir.join("vault.key"), 0o600);
    let mut command = Command::new(POSTERN);
    command
        .arg("daemon")
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--config")
        .arg(dir.join("postern.toml"))
        .args(["--keychain", "file", "--vault-key-file"])
        .arg(dir.join("vault.key"))
        .args(["--approval-timeout", "60"]);
    Daemon::spawn(command)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_messages_sent_to_the_agent_socket_grant_nothing() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let daemon = start_local(dir.path(), &server.base_url());
    let agent_socket = dir.path().join("data/run/postern.sock");
    let operator = OperatorClient::new(dir.path().join("data/run/operator.sock"));
    store_credential(&operator.socket).await;
    let mut bridge = Bridge::spawn(&agent_socket);
    bridge.initialize();
    assert!(bridge.send_json(&http_call(2, &server.url("/v1/x"))));
    let card =
        pending_card(async || operator.call("list_approvals", Value::Null).await.unwrap()).await;
    let id = card["invocation_id"].as_str().unwrap();
    let fingerprint = card["fingerprint"].as_str().unwrap();

    // The agent side speaks the operator protocol at the agent socket, with the right
    // fingerprint in hand.
    let mut raw = std::os::unix::net::UnixStream::connect(&agent_socket).unwrap();
    raw.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    for line in [
        json!({"id": 1, "command": "answer_approval",
               "args": {"invocationId": id, "fingerprint": fingerprint, "cardDigest": card["card_digest"], "decision": "approve"}}),
        json!({"id": 2, "command": "list_approvals"}),
        json!({"id": 3, "command": "list_credentials"}),
        json!({"jsonrpc": "2.0", "id": 4, "method": "answer_approval",
               "params": {"invocationId": id, "fingerprint": fingerprint, "cardDigest": card["card_digest"], "decision": "approve"}}),
    ] {
        raw.write_all(format!("{line}\n").as_bytes()).unwrap();
    }
    let mut answered = Vec::new();
    let _ = raw.read_to_end(&mut answered);
    let answered = String::from_utf8_lossy(&answered);
    for line in answered.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
        assert!(v.get("ok").is_none(), "the agent socket answered: {line}");
        assert!(
            v.get("result").is_none(),
            "the agent socket answered: {line}"
        );
    }
    assert!(!answered.contains("api-key") && !answered.contains("\"pending\""));
    drop(raw);

    // Still pending, nothing sent; the operator denies and the agent hears so.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cards = operator.call("list_approvals", Value::Null).await.unwrap();
    assert_eq!(cards.as_array().unwrap().len(), 1, "{cards}");
    assert!(server.requests().is_empty());
    operator
        .call(
            "answer_approval",
            json!({"invocationId": id, "fingerprint": fingerprint,
                   "cardDigest": card["card_digest"], "decision": "deny"}),
        )
        .await
        .unwrap();
    let (_, response) = bridge.recv_until_id(&json!(2), Duration::from_secs(20));
    let response = response.expect("the agent's call ends");
    assert_eq!(
        response["result"]["structuredContent"]["error"]["code"], "APPROVAL_DENIED",
        "{response}"
    );
    assert!(server.requests().is_empty());
    drop(bridge);
    drop(daemon);
}

/// `tools/call` of `name` with `arguments`, as an agent's client sends it.
fn tool_call(id: i64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": name, "arguments": arguments}})
}

/// The answer to request `id`, within 20 s.
fn answer(bridge: &Bridge, id: i64) -> Value {
    let (_, response) = bridge.recv_until_id(&json!(id), Duration::from_secs(20));
    response.unwrap_or_else(|| panic!("no answer to request {id}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pauses_agents_and_the_agent_side_cannot_resume_them() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let daemon = start_local(dir.path(), &server.base_url());
    let agent_socket = dir.path().join("data/run/postern.sock");
    let operator_socket = dir.path().join("data/run/operator.sock");
    let operator = OperatorClient::new(&operator_socket);
    store_credential(&operator_socket).await;
    let cli = |action: &str| {
        let out = Command::new(POSTERN)
            .arg("operator")
            .arg("--socket")
            .arg(&operator_socket)
            .arg(action)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let paused = async || {
        operator.call("overview", Value::Null).await.unwrap()["agents_paused"]
            .as_bool()
            .unwrap()
    };
    assert!(!paused().await);
    assert_eq!(cli("pause"), json!({"paused": true}));
    assert!(paused().await);

    // Every tool that would run something is refused, before anything is recorded.
    let mut bridge = Bridge::spawn(&agent_socket);
    bridge.initialize();
    let refused = [
        (
            2,
            "http_request",
            json!({"url": server.url("/v1/x"), "method": "GET"}),
        ),
        (3, "ssh_exec", json!({"host": "web1", "command": "true"})),
        (4, "retry_invocation", json!({"invocation_id": "inv_none"})),
        (5, "poll_job", json!({"invocation_id": "inv_none"})),
    ];
    for (id, tool, arguments) in refused {
        assert!(bridge.send_json(&tool_call(id, tool, arguments)));
        let v = answer(&bridge, id);
        let content = &v["result"]["structuredContent"];
        assert_eq!(v["result"]["isError"], true, "{tool}: {v}");
        assert_eq!(content["error"]["code"], "AGENTS_PAUSED", "{tool}: {v}");
        assert_eq!(content["error"]["outcome"], "not_attempted", "{tool}: {v}");
        assert_eq!(content["error"]["retry"], "backoff", "{tool}: {v}");
        assert_eq!(content["invocation_id"], Value::Null, "{tool}: {v}");
    }
    // Reading still works.
    assert!(bridge.send_json(&tool_call(6, "list_targets", json!({}))));
    let listed = answer(&bridge, 6);
    assert!(listed["result"]["isError"] != true, "{listed}");
    assert!(server.requests().is_empty());
    let cards = operator.call("list_approvals", Value::Null).await.unwrap();
    assert_eq!(cards, json!([]), "a refused call asks nobody");

    // The agent side has no way to resume: no such tool, and the operator protocol at
    // the agent socket answers nothing.
    for (id, name) in [(7, "resume_agents"), (8, "pause_agents")] {
        assert!(bridge.send_json(&tool_call(id, name, json!({}))));
        let v = answer(&bridge, id);
        assert!(
            v.get("error").is_some() || v["result"]["isError"] == true,
            "{v}"
        );
    }
    let mut raw = std::os::unix::net::UnixStream::connect(&agent_socket).unwrap();
    raw.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    raw.write_all(b"{\"id\": 1, \"command\": \"resume_agents\"}\n")
        .unwrap();
    let mut answered = Vec::new();
    let _ = raw.read_to_end(&mut answered);
    assert!(
        !String::from_utf8_lossy(&answered).contains("\"ok\""),
        "the agent socket answered an operator command"
    );
    drop(raw);
    assert!(paused().await, "still paused");

    // The pause is in the journal with who set it, and a restart (kill -9) keeps it.
    drop(bridge);
    drop(daemon);
    let db = dir.path().join("data/journal.db");
    let records: Vec<Value> = {
        let conn =
            rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .unwrap();
        let mut stmt = conn
            .prepare(
                "SELECT invocation_id, body FROM events WHERE kind = 'AGENT_PAUSE' ORDER BY seq",
            )
            .unwrap();
        stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .unwrap()
            .map(|row| {
                let (scope, body) = row.unwrap();
                assert_eq!(scope, "journal");
                serde_json::from_str(&body).unwrap()
            })
            .collect()
    };
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["paused"], true);
    assert!(
        records[0]["operator"]
            .as_str()
            .is_some_and(|o| !o.is_empty())
    );
    let _daemon = start_local(dir.path(), &server.base_url());
    assert!(paused().await, "a restart keeps the pause");
    let mut bridge = Bridge::spawn(&agent_socket);
    bridge.initialize();
    assert!(bridge.send_json(&http_call(10, &server.url("/v1/z"))));
    let v = answer(&bridge, 10);
    assert_eq!(
        v["result"]["structuredContent"]["error"]["code"], "AGENTS_PAUSED",
        "{v}"
    );

    // The operator resumes: the same call runs (and waits for its approval).
    assert_eq!(cli("resume"), json!({"paused": false}));
    assert!(bridge.send_json(&http_call(9, &server.url("/v1/y"))));
    let card =
        pending_card(async || operator.call("list_approvals", Value::Null).await.unwrap()).await;
    operator
        .call(
            "answer_approval",
            json!({"invocationId": card["invocation_id"], "fingerprint": card["fingerprint"],
                   "cardDigest": card["card_digest"], "decision": "approve"}),
        )
        .await
        .unwrap();
    let v = answer(&bridge, 9);
    assert!(v["result"]["isError"] != true, "{v}");
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_socket_answers_bad_input_with_typed_errors_and_goes_on() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let _daemon = start_local(dir.path(), &server.base_url());
    let socket = dir.path().join("data/run/operator.sock");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "no operator group: owner only");
    let stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut write = stream.try_clone().unwrap();
    let mut lines = BufReader::new(stream);
    let mut ask = |bytes: &[u8]| -> Value {
        write.write_all(bytes).unwrap();
        write.write_all(b"\n").unwrap();
        let mut line = String::new();
        lines.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    };
    let v = ask(b"not json");
    assert_eq!(v["id"], Value::Null);
    assert_eq!(v["error"]["code"], "INVALID_INPUT");
    let v = ask(br#"{"id": 5, "command": "drop_tables"}"#);
    assert_eq!(v["id"], 5);
    assert_eq!(v["error"]["code"], "UNKNOWN_COMMAND");
    let v = ask(br#"{"id": 6, "command": "answer_approval", "args": {"bogus": 1}}"#);
    assert_eq!(v["error"]["code"], "INVALID_INPUT");
    assert_eq!(v["error"]["field"], "args");
    let v = ask(br#"{"id": 7, "command": "overview", "extra": true}"#);
    assert_eq!(v["id"], 7);
    assert_eq!(v["error"]["code"], "INVALID_INPUT");
    let long = vec![b'x'; MAX_REQUEST + 10];
    let v = ask(&long);
    assert_eq!(v["error"]["code"], "INVALID_INPUT");
    assert_eq!(v["error"]["field"], "request");
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let v = ask(deep.as_bytes());
    assert_eq!(v["error"]["code"], "INVALID_INPUT");
    let v = ask(
        br#"{"id": 8, "command": "set_credential", "args": {"credential": "pstn-leak-check-1"}}"#,
    );
    assert_eq!(v["error"]["code"], "INVALID_INPUT");
    assert!(!v.to_string().contains("pstn-leak-check-1"), "{v}");
    // The connection still works.
    let v = ask(br#"{"id": 9, "command": "overview"}"#);
    assert_eq!(v["id"], 9);
    assert_eq!(v["ok"]["mode"], "single_user");
    assert_eq!(v["ok"]["keychain"], "file");
    assert_eq!(v["ok"]["pending_approvals"], 0);
}

/// The repository root (scripts/ and packaging/ live there).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn the_installer_is_idempotent_and_its_layout_runs_a_broker_an_operator_can_reach() {
    if !users_possible(
        "the_installer_is_idempotent_and_its_layout_runs_a_broker_an_operator_can_reach",
    ) {
        return;
    }
    // The installer's names and paths, moved into a temp tree and throwaway accounts.
    let accounts = Accounts::create();
    let inst_user = format!("{}-i", accounts.broker);
    let inst_group = format!("{}-i", accounts.group);
    struct Remove(String, String);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = run("userdel", &[&self.0]);
            let _ = run("groupdel", &[&self.1]);
        }
    }
    let _remove = Remove(inst_user.clone(), inst_group.clone());
    let tree = tempfile::tempdir().unwrap();
    chmod(tree.path(), 0o711);
    let at = |rel: &str| tree.path().join(rel);
    let install = || {
        Command::new("bash")
            .arg(repo_root().join("scripts/install-system.sh"))
            .args([
                "--binary",
                POSTERN,
                "--operator",
                &accounts.operator,
                "--no-start",
            ])
            .env("POSTERN_INSTALL_USER", &inst_user)
            .env("POSTERN_INSTALL_GROUP", &inst_group)
            .env("POSTERN_INSTALL_STATE_DIR", at("var/lib/postern"))
            .env("POSTERN_INSTALL_ETC_DIR", at("etc/postern"))
            .env("POSTERN_INSTALL_BIN_DIR", at("bin"))
            .env("POSTERN_INSTALL_UNIT_DIR", at("systemd"))
            .output()
            .unwrap()
    };
    let first = install();
    assert!(first.status.success(), "{first:?}");
    let encrypted = at("etc/postern/vault.key.cred");
    let plain = at("etc/postern/vault.key");
    let key_before = std::fs::read(&encrypted)
        .or_else(|_| std::fs::read(&plain))
        .unwrap();
    let second = install();
    assert!(second.status.success(), "{second:?}");
    let key_after = std::fs::read(&encrypted)
        .or_else(|_| std::fs::read(&plain))
        .unwrap();
    assert_eq!(key_before, key_after, "a second run keeps the vault key");
    let state = at("var/lib/postern");
    let meta = std::fs::metadata(&state).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    use std::os::unix::fs::MetadataExt;
    let inst_uid = accounts.id(&inst_user, "-u");
    assert_eq!(meta.uid(), inst_uid);
    let unit = std::fs::read_to_string(at("systemd/postern.service")).unwrap();
    for line in [
        format!("User={inst_user}"),
        format!("SupplementaryGroups={inst_group}"),
        "NoNewPrivileges=yes".into(),
        "ProtectSystem=strict".into(),
        "ProtectHome=yes".into(),
        "PrivateTmp=yes".into(),
        "StateDirectory=postern".into(),
        "RuntimeDirectory=postern".into(),
    ] {
        assert!(unit.lines().any(|l| l == line), "the unit lacks {line}");
    }
    let in_group = String::from_utf8(run("id", &["-nG", &accounts.operator]).stdout).unwrap();
    assert!(
        in_group.split_whitespace().any(|g| g == inst_group),
        "{in_group}"
    );

    // Run the installed broker as systemd would: its key in $CREDENTIALS_DIRECTORY.
    let creds = at("creds");
    std::fs::create_dir(&creds).unwrap();
    let key_file = creds.join("postern-vault-key");
    if encrypted.exists() {
        let out = run(
            "systemd-creds",
            &[
                "decrypt",
                "--name=postern-vault-key",
                encrypted.to_str().unwrap(),
                key_file.to_str().unwrap(),
            ],
        );
        assert!(out.status.success(), "{out:?}");
    } else {
        assert_eq!(
            std::fs::metadata(&plain).unwrap().permissions().mode() & 0o777,
            0o400
        );
        std::fs::copy(&plain, &key_file).unwrap();
    }
    let inst_gid = accounts.id(&inst_user, "-g");
    let run_dir = at("run");
    std::fs::create_dir(&run_dir).unwrap();
    for (path, mode) in [(&key_file, 0o400), (&creds, 0o500), (&run_dir, 0o755)] {
        chown(path, inst_uid, inst_gid);
        chmod(path, mode);
    }
    let mut command = accounts.command_as(&inst_user, &at("bin/postern"));
    command
        .env("CREDENTIALS_DIRECTORY", &creds)
        .arg("daemon")
        .arg("--data-dir")
        .arg(&state)
        .arg("--config")
        .arg(state.join("postern.toml"))
        .arg("--socket")
        .arg(run_dir.join("agent.sock"))
        .arg("--operator-socket")
        .arg(run_dir.join("operator.sock"))
        .args(["--operator-group", &inst_group, "--agent-users", "any"])
        .args(["--keychain", "file"]);
    let daemon = Daemon::spawn(command);
    let out = accounts
        .command_as(&accounts.operator, &at("bin/postern"))
        .arg("operator")
        .arg("--socket")
        .arg(run_dir.join("operator.sock"))
        .arg("overview")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let overview: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(overview["mode"], "privilege_separated");
    assert_eq!(overview["keychain"], "file");
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_keychain_serves_the_offline_commands_and_refuses_an_open_key() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = start_local(dir.path(), &server.base_url());
    store_credential(&dir.path().join("data/run/operator.sock")).await;
    // A clean stop signs the final checkpoint.
    let stopped = Command::new("kill")
        .args(["-TERM", &daemon.child.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let status = daemon.child.wait().unwrap();
    assert!(status.success(), "{}", daemon.log());
    let data = dir.path().join("data");
    let key = dir.path().join("vault.key");
    let postern = |args: &[&str], key: &Path| {
        Command::new(POSTERN)
            .args(args)
            .arg("--data-dir")
            .arg(&data)
            .args(["--keychain", "file", "--vault-key-file"])
            .arg(key)
            .output()
            .unwrap()
    };
    let verified = postern(&["audit", "verify"], &key);
    assert!(verified.status.success(), "{verified:?}");
    // The CLI stores into the same sealed store.
    let out = postern_tests::run_with_stdin(
        Command::new(POSTERN)
            .args(["vault", "set", "other-key", "--data-dir"])
            .arg(&data)
            .args(["--keychain", "file", "--vault-key-file"])
            .arg(&key),
        b"pstn-second-canary\n",
    )
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(postern_tests::files_containing(&data, b"pstn-second-canary").is_empty());
    // A key others can read is refused; so is the wrong key.
    chmod(&key, 0o640);
    let refused = postern(&["audit", "verify"], &key);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("readable by its group or others"),
        "{refused:?}"
    );
    let wrong = dir.path().join("wrong.key");
    std::fs::write(&wrong, [1u8; 32]).unwrap();
    chmod(&wrong, 0o400);
    let refused = postern(&["audit", "verify"], &wrong);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("does not open with this vault key"),
        "{refused:?}"
    );
}

/// A directory like /tmp (root's, mode 1777) where any user may plant names.
fn shared_tmp() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o1777);
    dir
}

/// `program args…` run to its end as `user`, which must succeed.
fn succeed_as(accounts: &Accounts, user: &str, program: &str, args: &[&std::ffi::OsStr]) {
    let out = accounts
        .command_as(user, Path::new(program))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?} as {user}: {out:?}"
    );
}

fn owner_of_link(path: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).unwrap().uid()
}

// Regression: issue 26 (item 3). `postern daemon --socket /tmp/x/agent.sock` with /tmp/x
// another user's symlink was accepted; that user later re-pointed the link at a listener
// of their own and captured a `tools/call` meant for the broker.
#[test]
fn the_daemon_refuses_a_socket_path_through_another_users_symlink() {
    if !users_possible("the_daemon_refuses_a_socket_path_through_another_users_symlink") {
        return;
    }
    let accounts = Accounts::create();
    let attacker_uid = accounts.id(&accounts.agent, "-u");
    let tmp = shared_tmp();
    // Where the broker's socket is meant to be: root's, 0755.
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).unwrap();
    chmod(&real, 0o755);
    // The attacker plants the link, for now pointing where the broker means to be.
    let link = tmp.path().join("x");
    succeed_as(
        &accounts,
        &accounts.agent,
        "/bin/ln",
        &["-s".as_ref(), real.as_os_str(), link.as_os_str()],
    );
    assert_eq!(owner_of_link(&link), attacker_uid);
    let socket = link.join("agent.sock");

    let conf = tempfile::tempdir().unwrap();
    std::fs::write(
        conf.path().join("postern.toml"),
        target_approved("api", "http://127.0.0.1:9", "per_call"),
    )
    .unwrap();
    let key = conf.path().join("vault.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    chmod(&key, 0o600);
    let data = conf.path().join("data");
    let args: Vec<std::ffi::OsString> = vec![
        "--data-dir".into(),
        data.clone().into(),
        "--config".into(),
        conf.path().join("postern.toml").into(),
        "--socket".into(),
        socket.clone().into(),
        "--keychain".into(),
        "file".into(),
        "--vault-key-file".into(),
        key.into(),
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let (status, stderr) = support::daemon_refusal(&args);
    assert!(!status.success(), "the daemon refuses: {stderr}");
    assert!(
        stderr.contains(&format!(
            "{} is a symbolic link owned by uid {attacker_uid}",
            link.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("refusing the socket path"), "{stderr}");
    assert!(!real.join("agent.sock").exists(), "no socket was made");
    assert!(
        !data.exists(),
        "nothing is created before the path is trusted"
    );
}

/// A Unix listener that records how many bytes each connection sent, then "bytes N".
const RECORDING_LISTENER: &str = r#"
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o666)
s.listen(8)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(20)
    n = 0
    try:
        while True:
            data = c.recv(65536)
            if not data:
                break
            n += len(data)
            print("got %d" % len(data), flush=True)
    except OSError:
        pass
    print("bytes %d" % n, flush=True)
    c.close()
"#;

// Regression: issue 26 (item 3). The bridge relayed a user's whole `tools/call` to
// another user's listener reached through that user's symlink, and took its forged answer.
#[test]
fn the_bridge_sends_nothing_to_a_listener_behind_another_users_symlink() {
    if !users_possible("the_bridge_sends_nothing_to_a_listener_behind_another_users_symlink") {
        return;
    }
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        eprintln!(
            "\n*** the_bridge_sends_nothing_to_a_listener_behind_another_users_symlink \
             SKIPPED: no /usr/bin/python3 for the attacker's listener ***\n"
        );
        return;
    }
    let accounts = Accounts::create();
    let attacker = &accounts.agent;
    let attacker_uid = accounts.id(attacker, "-u");
    let tmp = shared_tmp();
    // Everything the attacker does, it does as itself: its directory, its link, its
    // listener.
    let evil = tmp.path().join("evil");
    let link = tmp.path().join("x");
    succeed_as(&accounts, attacker, "/bin/mkdir", &[evil.as_os_str()]);
    succeed_as(
        &accounts,
        attacker,
        "/bin/ln",
        &["-s".as_ref(), evil.as_os_str(), link.as_os_str()],
    );
    assert_eq!(owner_of_link(&link), attacker_uid);
    let mut listener = accounts
        .command_as(attacker, python)
        .arg("-c")
        .arg(RECORDING_LISTENER)
        .arg(evil.join("agent.sock"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = listener.stdout.take().unwrap();
    let listener = Kill(listener);
    let (tx, heard) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    assert_eq!(
        heard.recv_timeout(Duration::from_secs(10)).unwrap(),
        "ready"
    );

    // The user's bridge (this test, root) is pointed through the attacker's link.
    let socket = link.join("agent.sock");
    let mut bridge = Bridge::spawn(&socket);
    assert!(bridge.send_json(&json!({
        "jsonrpc": "2.0", "id": "init", "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "victim", "version": "1"}}
    })));
    let (_, init) = bridge.recv_until_id(&json!("init"), Duration::from_secs(10));
    assert!(bridge.send_json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})));
    assert!(bridge.send_json(&http_call(2, "https://api.example/v1/pay")));
    let (_, answer) = bridge.recv_until_id(&json!(2), Duration::from_secs(10));
    bridge.close_stdin();
    assert!(bridge.wait_exit(Duration::from_secs(10)).is_some());
    let stderr = bridge.stderr(Duration::from_secs(5));

    // What the listener heard, once the bridge is gone: not one byte.
    std::thread::sleep(Duration::from_millis(300));
    drop(listener);
    let heard: Vec<String> = heard.try_iter().collect();
    assert!(
        heard.iter().all(|l| l == "bytes 0"),
        "the attacker's listener received: {heard:?}"
    );

    // The agent is told there is no broker it can trust, and why.
    assert!(init.is_some(), "the bridge answers initialize itself");
    let answer = answer.expect("the bridge answers the call");
    let envelope = &answer["result"]["structuredContent"];
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert_eq!(envelope["error"]["code"], "BROKER_UNAVAILABLE", "{answer}");
    assert_eq!(envelope["error"]["outcome"], "not_attempted", "{answer}");
    let message = envelope["error"]["message"].as_str().unwrap();
    let why = format!(
        "{} is a symbolic link owned by uid {attacker_uid}",
        link.display()
    );
    assert!(message.contains(&why), "{message}");
    assert!(message.contains("nothing was sent"), "{message}");
    assert!(stderr.contains(&why), "stderr says so too: {stderr}");
}

// Regression: issue 26 (item 4). One agent user's connections, each holding an
// unfinished multi-megabyte line, took the daemon to gigabytes, and a thousand of them
// exhausted its descriptors so that other users' calls failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_flood_of_connections_and_unfinished_lines_leaves_other_users_served() {
    if !users_possible(
        "one_users_flood_of_connections_and_unfinished_lines_leaves_other_users_served",
    ) {
        return;
    }
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        panic!("no /usr/bin/python3 for the flooding agent");
    }
    let server = Adversary::start(Behavior::ok_json(r#"{"ok":true}"#))
        .await
        .unwrap();
    let accounts = Accounts::create();
    let (layout, daemon) = start_separated_approving(&accounts, &server.base_url(), "none");
    store_credential(&layout.operator_socket()).await;
    let before = resident_bytes(daemon.child.id());
    // The agent user opens 1,000 connections; the first 300 each send 2 MiB of a line
    // that never ends. It holds them until told to stop.
    let flood = r#"
import socket, sys, time
path = sys.argv[1]
held = []
for i in range(1000):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(True)
    try:
        s.connect(path)
    except OSError:
        s.close()
        continue
    if i < 300:
        s.settimeout(0.2)
        try:
            s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"' + b'x' * (2 * 1024 * 1024))
        except OSError:
            pass
    held.append(s)
print("flooding", len(held), flush=True)
sys.stdin.read()
"#;
    let mut flooder = accounts
        .command_as(&accounts.agent, python)
        .arg("-c")
        .arg(flood)
        .arg(layout.agent_socket())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(flooder.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("flooding"), "{line}");
    let during = resident_bytes(daemon.child.id());
    // Another user's call goes through while the flood holds.
    let mut command = accounts.command_as(&accounts.operator, &layout.binary());
    command.env("HOME", "/");
    let mut bridge = Bridge::spawn_with(command, &layout.agent_socket());
    bridge.initialize();
    assert!(bridge.send_json(&http_call(2, &server.url("/v1/items"))));
    let (_, answer) = bridge.recv_until_id(&json!(2), Duration::from_secs(30));
    let answer = answer.expect("the other user's call is answered");
    assert_ne!(answer["result"]["isError"], json!(true), "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["outcome"],
        "committed"
    );
    // The flooding user's next bridge is past its cap: the broker says so in a line
    // before closing, and the agent is told with the contract's code and retry, never
    // "may or may not have run": a request the bridge had forwarded is answered with
    // them, and later ones by the bridge's own unavailable server.
    let mut command = accounts.command_as(&accounts.agent, &layout.binary());
    command.env("HOME", "/");
    let mut refused = Bridge::spawn_with(command, &layout.agent_socket());
    assert!(
        refused.send_json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "flood", "version": "0"}}}))
    );
    let (_, answer) = refused.recv_until_id(&json!(1), Duration::from_secs(30));
    let answer = answer.expect("the refused bridge answers");
    let error = if answer.get("error").is_some() {
        answer["error"]["data"].clone()
    } else {
        assert!(
            refused.send_json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        );
        assert!(refused.send_json(&http_call(2, &server.url("/v1/items"))));
        let (others, answer) = refused.recv_until_id(&json!(2), Duration::from_secs(30));
        let Some(answer) = answer else {
            panic!(
                "the refused bridge answers the call: {others:?} {}",
                refused.stderr(Duration::from_secs(5))
            );
        };
        answer["result"]["structuredContent"]["error"].clone()
    };
    assert_eq!(error["code"], "BROKER_UNAVAILABLE", "{error}");
    assert_eq!(error["retry"], "backoff", "{error}");
    assert_eq!(error["phase"], "validation", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("64 connections"),
        "{error}"
    );
    drop(refused);
    eprintln!("daemon resident: {before} before, {during} under the flood ({line})");
    drop(flooder.stdin.take());
    let _ = flooder.kill();
    let _ = flooder.wait();
    // 300 × 2 MiB held would be 600 MiB; the broker holds at most the agent user's
    // connection cap of them, within the budget for unfinished lines.
    assert!(
        during < before + 300 * 1024 * 1024,
        "the daemon grew from {before} to {during} bytes under the flood"
    );
    drop(bridge);
    drop(daemon);
}
