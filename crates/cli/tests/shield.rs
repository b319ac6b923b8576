//! `postern shield`, tried as an attacker would: a real daemon with a credential in the
//! Secret Service, and a third-party attacker (Python, with `secret-tool` and
//! `secretstorage`) that tries every route to what Postern guards, first unconfined (the
//! control: the routes must be open there, or the test proves nothing), then inside a
//! shield with each network mode. Then a real MCP session through the shield, recorded
//! as confined, and an unconfined one refused by a `require_confined` target.
//!
//! Needs bubblewrap, Landlock scoping (Linux 6.12), python3 with secretstorage and
//! secret-tool; without them these tests say so and pass, unless
//! POSTERN_REQUIRE_SHIELD_TESTS=1 (the test command sets it, having installed them).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rmcp::ServiceExt;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

use postern_broker::provenance;
use postern_broker::record::session::Confinement;
use postern_tests::adversary::{Adversary, Behavior};
use postern_tests::agent::{self, structured};

mod support;

use support::{Daemon, POSTERN, SECRET};

const SSH_CANARY: &str = "ssh-key-canary-5f1c";
const PYTHON: &str = "/usr/bin/python3";

/// Whether this machine can run shields; panics when they are required and it cannot.
fn shields_available() -> bool {
    let missing: Vec<&str> = [
        ("bubblewrap", Path::new("/usr/bin/bwrap").is_file()),
        ("python3", Path::new(PYTHON).is_file()),
        ("secret-tool", Path::new("/usr/bin/secret-tool").is_file()),
        (
            "python3 secretstorage",
            Command::new(PYTHON)
                .args(["-c", "import secretstorage"])
                .output()
                .is_ok_and(|o| o.status.success()),
        ),
        (
            "a session bus",
            std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_some(),
        ),
    ]
    .into_iter()
    .filter(|(_, ok)| !ok)
    .map(|(what, _)| what)
    .collect();
    if missing.is_empty() {
        return true;
    }
    let message = format!("shield tests did not run: missing {}", missing.join(", "));
    assert!(
        std::env::var("POSTERN_REQUIRE_SHIELD_TESTS").as_deref() != Ok("1"),
        "{message}"
    );
    eprintln!("{message}");
    false
}

/// A user's world outside /tmp (which a shield empties, so it would prove nothing): a
/// home with an SSH key and start-up files, a project directory, the daemon's data dir,
/// and copies of `postern` and the attacker (the build may live under /tmp).
struct World {
    base: tempfile::TempDir,
    home: PathBuf,
    project: PathBuf,
    postern: PathBuf,
    attacker: PathBuf,
    daemon: Daemon,
}

impl World {
    fn new(config: &str) -> World {
        let root = if Path::new("/var/tmp").is_dir() {
            PathBuf::from("/var/tmp")
        } else {
            PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        };
        let base = tempfile::Builder::new()
            .prefix("postern-shield-")
            .tempdir_in(root)
            .unwrap();
        let home = base.path().join("home");
        for dir in [".ssh", ".config/autostart", ".claude"] {
            std::fs::create_dir_all(home.join(dir)).unwrap();
        }
        std::fs::write(home.join(".ssh/id_ed25519"), SSH_CANARY).unwrap();
        std::fs::write(home.join(".bashrc"), "# the user's\n").unwrap();
        let project = base.path().join("project");
        std::fs::create_dir_all(&project).unwrap();
        let bin = base.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let postern = bin.join("postern");
        std::fs::copy(POSTERN, &postern).unwrap();
        let attacker = bin.join("attacker.py");
        std::fs::copy(
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/shield/attacker.py"),
            &attacker,
        )
        .unwrap();
        let state = base.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        let data = tempfile::Builder::new()
            .prefix("data")
            .tempdir_in(&state)
            .unwrap();
        let daemon = support::start_daemon_in(data, config, None);
        World {
            base,
            home,
            project,
            postern,
            attacker,
            daemon,
        }
    }

    /// `postern ARGS…` as the user would run it: in the project, with the fake home.
    fn postern(&self) -> Command {
        let mut command = Command::new(&self.postern);
        command
            .current_dir(&self.project)
            .env("HOME", &self.home)
            .env("POSTERN_SOCKET", &self.daemon.socket);
        command
    }

    /// What the attacker knows: every path and address it will try.
    fn known(&self, loopback_port: u16) -> Value {
        let data_dir = self.daemon.dir.path();
        let bus = std::env::var("DBUS_SESSION_BUS_ADDRESS").unwrap();
        let bus_path = postern_mcp::daemon::shield::bus_path(&bus).unwrap_or_default();
        let keyrings = std::env::var_os("XDG_DATA_HOME")
            .map_or_else(|| self.home.join(".local/share"), PathBuf::from)
            .join("keyrings");
        json!({
            "home": self.home,
            "data_dir": data_dir,
            "config": data_dir.with_extension("toml"),
            "operator_socket": data_dir.join("run/operator.sock"),
            "anchor_dir": postern_broker::platform::anchor_dir().unwrap_or_default(),
            "keyrings_dir": keyrings,
            "bus_address": bus,
            "bus_path": bus_path,
            "display": std::env::var("DISPLAY").ok(),
            "broker_pid": self.daemon.pid(),
            "service": self.daemon.service(),
            "loopback_port": loopback_port,
        })
    }

    /// Runs the attacker, shielded with `shield` arguments or (None) unconfined.
    fn attack(&self, shield: Option<&[&str]>) -> (BTreeMap<String, Value>, Output) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let known = self.known(port).to_string();
        let output = match shield {
            Some(options) => self
                .postern()
                .arg("shield")
                .args(options)
                .arg("--")
                .arg(PYTHON)
                .arg(&self.attacker)
                .arg(&known)
                .output()
                .unwrap(),
            None => Command::new(PYTHON)
                .current_dir(&self.project)
                .env("HOME", &self.home)
                .arg(&self.attacker)
                .arg(&known)
                .output()
                .unwrap(),
        };
        assert!(
            output.status.success(),
            "attacker ({shield:?}): {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let routes: BTreeMap<String, Value> = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)));
        (routes, output)
    }
}

/// An origin behind a target that takes calls only from confined sessions, and a world
/// whose daemon serves it.
async fn confined_target() -> (Adversary, World) {
    let server = Adversary::start(Behavior::ok_json("{\"items\":[1]}"))
        .await
        .unwrap();
    let config = format!(
        "{}require_confined = true\n",
        support::config(&server.base_url())
    );
    (server, World::new(&config))
}

fn open_routes(routes: &BTreeMap<String, Value>) -> Vec<String> {
    routes
        .iter()
        .filter(|(_, r)| r["open"] == true)
        .map(|(name, r)| format!("{name}: {}", r["detail"]))
        .collect()
}

#[test]
fn every_route_out_of_a_shield_is_closed_though_each_is_open_without_one() {
    if !shields_available() {
        return;
    }
    let server_base = "http://127.0.0.1:9"; // never called here
    let world = World::new(&support::config(server_base));

    // The control: unconfined, the same attacker reaches everything.
    let (routes, control) = world.attack(None);
    let mut must_be_open = vec![
        "secret_service_socket",
        "secret_tool",
        "python_secretstorage",
        "kernel_keyrings",
        "journal",
        "data_dir",
        "targets_file",
        "operator_socket",
        "signal_broker",
        "write_bashrc",
        "write_autostart",
        "ssh_key",
        "loopback_listener",
    ];
    if std::env::var_os("DISPLAY").is_some() {
        must_be_open.extend(["x11_socket", "x11_abstract_socket"]);
    }
    // The broker is not dumpable: only root (CAP_SYS_PTRACE) reads its memory from outside.
    if std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:\t0\t"))
    {
        must_be_open.push("broker_memory");
    }
    for route in &must_be_open {
        assert_eq!(
            routes[*route]["open"], true,
            "the control run must reach {route}, or the shielded run proves nothing: {}",
            routes[*route]
        );
    }
    assert!(
        String::from_utf8_lossy(&control.stdout).contains(SECRET),
        "unconfined, secret-tool reads the credential"
    );

    // Shielded, sharing the network: only the loopback listener stays reachable.
    let (routes, shielded) = world.attack(Some(&[]));
    let open = open_routes(&routes);
    assert_eq!(
        open.len(),
        1,
        "only the network is shared in `full` mode; open: {open:#?}"
    );
    assert!(open[0].starts_with("loopback_listener"), "{open:?}");
    let stderr = String::from_utf8_lossy(&shielded.stderr);
    assert!(stderr.contains("postern: shield shd_"), "{stderr}");
    for text in [
        String::from_utf8_lossy(&shielded.stdout),
        String::from_utf8_lossy(&shielded.stderr),
    ] {
        assert!(
            !text.contains(SECRET) && !text.contains(SSH_CANARY),
            "{text}"
        );
    }
    // The user's start-up file is untouched (the control run appended once).
    let bashrc = std::fs::read_to_string(world.home.join(".bashrc")).unwrap();
    assert_eq!(bashrc.matches("an attacker was here").count(), 1);

    // broker-only: nothing at all.
    let (routes, _) = world.attack(Some(&["--network", "broker-only"]));
    let open = open_routes(&routes);
    assert!(open.is_empty(), "open in broker-only: {open:#?}");
    // The shields' sockets go with them (once the broker has seen each shield leave).
    let shields = world.daemon.dir.path().join("run/shields");
    let left = || -> Vec<PathBuf> {
        std::fs::read_dir(&shields)
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let waited = std::time::Instant::now();
    while !left().is_empty() && waited.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(left().is_empty(), "{:?}", left());
    drop(world.base);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shielded_session_is_recorded_as_confined_and_only_it_may_call_a_require_confined_target()
{
    if !shields_available() {
        return;
    }
    let (server, world) = confined_target().await;
    let request = json!({"url": server.url("/v1/items"), "method": "GET"});

    // Unconfined: refused at validation, nothing sent.
    let client = agent::connect(&world.postern, &world.daemon.socket)
        .await
        .unwrap();
    let refused = structured(
        &agent::call(&client, "http_request", request.clone())
            .await
            .unwrap(),
    );
    assert_eq!(
        refused["error"]["code"], "CONFINEMENT_REQUIRED",
        "{refused}"
    );
    assert_eq!(refused["error"]["outcome"], "not_attempted", "{refused}");
    assert_eq!(refused["error"]["phase"], "validation", "{refused}");
    assert_eq!(server.requests().len(), 0);
    client.cancel().await.unwrap();

    // Through a shield: the bridge finds the broker where it always looks (the shield's
    // own socket is bound there), and the call runs.
    let mut bridge = tokio::process::Command::new(&world.postern);
    bridge
        .current_dir(&world.project)
        .env("HOME", &world.home)
        .env("POSTERN_SOCKET", &world.daemon.socket)
        .arg("shield")
        .arg("--")
        .arg(&world.postern)
        .arg("mcp");
    let shielded = ().serve(TokioChildProcess::new(bridge).unwrap()).await.unwrap();
    let ran = structured(
        &agent::call(&shielded, "http_request", request)
            .await
            .unwrap(),
    );
    assert_eq!(ran["outcome"], "committed", "{ran}");
    assert_eq!(ran["status"], 200, "{ran}");
    shielded.cancel().await.unwrap();

    // The journal says which session was confined, and how.
    let conn = world.daemon.journal();
    let sessions = provenance::recorded_sessions(&conn, 10).unwrap();
    let kinds: Vec<&str> = sessions
        .iter()
        .map(|s| s.opened.confinement.kind())
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "shield").count(),
        1,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| **k == "none").count(),
        1,
        "{kinds:?}"
    );
    let confined = sessions
        .iter()
        .find_map(|s| match &s.opened.confinement {
            Confinement::Shield(c) => Some(c.clone()),
            Confinement::None => None,
        })
        .unwrap();
    assert!(confined.shield.starts_with("shd_"));
    assert!(confined.profile_digest.starts_with("blake3:"));
    assert_eq!(confined.network, "full");
    assert!(!confined.ssh_agent);
    assert!(
        confined.writable.contains(
            &std::fs::canonicalize(&world.project)
                .unwrap()
                .display()
                .to_string()
        )
    );

    // The operator's view names it too.
    let out = world
        .postern()
        .args(["operator", "--socket"])
        .arg(world.daemon.dir.path().join("run/operator.sock"))
        .arg("sessions")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(&confined.shield), "{text}");
}

#[test]
fn bad_input_fails_before_the_agent_starts_and_names_the_fix() {
    if !shields_available() {
        return;
    }
    let world = World::new(&support::config("http://127.0.0.1:9"));
    let marker = world.project.join("ran");
    let run = |args: &[&str], cwd: &Path| {
        world
            .postern()
            .current_dir(cwd)
            .arg("shield")
            .args(args)
            .arg("--")
            .args(["touch"])
            .arg(&marker)
            .output()
            .unwrap()
    };
    // An unknown option: the usage error, before anything.
    let out = run(&["--no-such-option"], &world.project);
    assert_eq!(out.status.code(), Some(2));
    // The home directory as the working directory would make start-up files writable.
    let out = run(&[], &world.home);
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("start-up files"));
    // A --rw path that does not exist.
    let out = run(&["--rw", "/nonexistent/dir"], &world.project);
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rw"));
    // --print shows the sandbox and starts nothing.
    let out = run(&["--print", "--network", "broker-only"], &world.project);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["profile"]["network"], "broker_only");
    assert!(
        shown["profile_digest"]
            .as_str()
            .unwrap()
            .starts_with("blake3:")
    );
    let bwrap = shown["bwrap"].to_string();
    assert!(
        bwrap.contains("--unshare-net") && bwrap.contains("--die-with-parent"),
        "{bwrap}"
    );
    // No broker: named, with what to start.
    let out = world
        .postern()
        .env("POSTERN_SOCKET", world.base.path().join("nothing.sock"))
        .args(["shield", "--", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("postern daemon"));
    assert!(!marker.exists(), "the command never ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_outside_the_sandbox_cannot_pass_as_confined_through_the_shields_socket() {
    if !shields_available() {
        return;
    }
    let (server, world) = confined_target().await;
    // A shield whose agent just waits; its socket is visible outside, to this user.
    let mut shield = world
        .postern()
        .args(["shield", "--", "sleep", "30"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let shields = world.daemon.dir.path().join("run/shields");
    let mut socket = None;
    for _ in 0..200 {
        socket = std::fs::read_dir(&shields)
            .ok()
            .and_then(|mut d| d.find_map(Result::ok))
            .map(|e| e.path());
        if socket.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let socket = socket.expect("the shield's socket");
    // Give the broker the time to register the sandbox, so the socket admits someone.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // An unconfined bridge on the shield's socket: the broker sees its namespaces and
    // drops the connection, so no call runs and no confined session is recorded.
    let request = json!({"url": server.url("/v1/items"), "method": "GET"});
    if let Ok(client) = agent::connect(&world.postern, &socket).await {
        let answer = agent::call(&client, "http_request", request).await;
        if let Ok(result) = answer {
            let value = structured(&result);
            assert_ne!(value["outcome"], "committed", "{value}");
        }
        let _ = client.cancel().await;
    }
    assert_eq!(server.requests().len(), 0, "nothing was sent");
    let conn = world.daemon.journal();
    let sessions = provenance::recorded_sessions(&conn, 10).unwrap();
    assert!(
        sessions.iter().all(|s| s.opened.confinement.is_none()),
        "{:?}",
        sessions
            .iter()
            .map(|s| &s.opened.confinement)
            .collect::<Vec<_>>()
    );
    let _ = shield.kill();
    let _ = shield.wait();
}

#[test]
fn a_terminal_resize_reaches_the_agent_in_its_own_session() {
    if !shields_available() {
        return;
    }
    use std::io::BufRead;
    let world = World::new(&support::config("http://127.0.0.1:9"));
    let mut shield = world
        .postern()
        .args(["shield", "--", "sh", "-c"])
        .arg("trap 'echo resized; exit 0' WINCH; echo ready; while :; do sleep 0.05; done")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let stdout = shield.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let next = || lines.recv_timeout(std::time::Duration::from_secs(10));
    assert_eq!(next().unwrap(), "ready");
    // What a terminal sends the foreground process group when it is resized.
    assert!(
        Command::new("kill")
            .args(["-WINCH", &shield.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let resized = next();
    let _ = shield.kill();
    let _ = shield.wait();
    assert_eq!(
        resized.as_deref(),
        Ok("resized"),
        "the agent never saw the resize"
    );
}
