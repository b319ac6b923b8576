//! Shared pieces of the bridge and daemon tests: a real `postern daemon` over a temp data
//! dir (its keychain entries in a test-only service), and a raw `postern mcp` driven
//! byte by byte, its stdout read on a thread so a test can wait with a bound.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use postern_broker::vault::{CredentialKind, Keychain, KeychainBackend, Secret, Vault};
use postern_tests::fixture::test_service;

pub mod peers;

pub const POSTERN: &str = env!("CARGO_BIN_EXE_postern");
pub const SECRET: &str = "pstn-bridge-canary-7d2e";

/// Runs `command` to its end, which must succeed; what it printed.
pub fn succeeded(command: &mut Command) -> std::process::Output {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A running `postern daemon`, killed (by PID) on drop, its keychain entries removed.
pub struct Daemon {
    child: Child,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    service: String,
    /// The keychain entries to remove on drop.
    keys: Vec<String>,
    /// Arguments after the usual ones (kept for a restart).
    extra_args: Vec<String>,
    /// What the daemon wrote to stderr so far (read on a thread as it arrives).
    stderr: Arc<Mutex<String>>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(self.dir.path().with_extension("toml"));
        let db = self.dir.path().join("journal.db");
        if let Ok(keychain) = Keychain::new(KeychainBackend::SecretService, &self.service)
            && let Ok(vault) = Vault::open(keychain, &db)
        {
            for id in &self.keys {
                let _ = vault.remove(id);
            }
            let _ = vault.remove("postern-audit-signing");
        }
    }
}

impl Daemon {
    pub fn journal(&self) -> rusqlite::Connection {
        rusqlite::Connection::open_with_flags(
            self.dir.path().join("journal.db"),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap()
    }
}

/// One HTTP target `api` at `base/v1`, no approval.
pub fn config(base: &str) -> String {
    target("api", base)
}

/// An HTTP target `name` at `base/v1` (credential `api-key`), no approval.
pub fn target(name: &str, base: &str) -> String {
    target_approved(name, base, "none")
}

/// An HTTP target `name` at `base/v1` (credential `api-key`) with approval mode
/// `approval`.
pub fn target_approved(name: &str, base: &str, approval: &str) -> String {
    format!(
        r#"
[[http]]
name = "{name}"
base_url = "{base}/v1"
methods = ["GET", "POST"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "{approval}"
idempotent_methods = ["GET"]
timeout_ms = 5000
"#
    )
}

/// A daemon for target `api` at `base`, on the default socket in its data dir.
pub fn start_daemon(base: &str) -> Daemon {
    start_daemon_at(base, None)
}

/// A daemon for target `api` at `base`; `socket` overrides the default socket path.
pub fn start_daemon_at(base: &str, socket: Option<&Path>) -> Daemon {
    start_daemon_with(&config(base), socket)
}

/// A daemon over `config_text` (token `api-key` stored); `socket` overrides the default.
pub fn start_daemon_with(config_text: &str, socket: Option<&Path>) -> Daemon {
    start_daemon_in(tempfile::tempdir().unwrap(), config_text, socket)
}

/// A daemon whose data dir is `dir` (prepared by the caller), over `config_text`.
pub fn start_daemon_in(dir: tempfile::TempDir, config_text: &str, socket: Option<&Path>) -> Daemon {
    start_daemon_keyed(dir, config_text, socket, &[])
}

/// [`start_daemon_in`] with SSH private keys `(id, key)` stored beside the token.
pub fn start_daemon_keyed(
    dir: tempfile::TempDir,
    config_text: &str,
    socket: Option<&Path>,
    ssh_keys: &[(&str, &str)],
) -> Daemon {
    start_daemon_full(dir, config_text, socket, ssh_keys, &[])
}

/// A daemon over `config_text` (token `api-key` stored) started with `extra_args` after
/// the usual ones (`--peer-listen …`, say).
pub fn start_daemon_args(config_text: &str, extra_args: &[&str]) -> Daemon {
    start_daemon_full(
        tempfile::tempdir().unwrap(),
        config_text,
        None,
        &[],
        extra_args,
    )
}

/// [`start_daemon_args`] over the data dir `dir` (prepared by the caller).
pub fn start_daemon_dir_args(
    dir: tempfile::TempDir,
    config_text: &str,
    extra_args: &[&str],
) -> Daemon {
    start_daemon_full(dir, config_text, None, &[], extra_args)
}

fn start_daemon_full(
    dir: tempfile::TempDir,
    config_text: &str,
    socket: Option<&Path>,
    ssh_keys: &[(&str, &str)],
    extra_args: &[&str],
) -> Daemon {
    let service = test_service();
    let db = dir.path().join("journal.db");
    let keychain = Keychain::new(KeychainBackend::SecretService, &service).unwrap();
    let vault = Vault::open(keychain, &db).unwrap();
    vault
        .set(
            "api-key",
            CredentialKind::Token,
            &Secret::from(SECRET.to_string()),
            1,
        )
        .unwrap();
    let mut keys = vec!["api-key".to_string()];
    for (id, key) in ssh_keys {
        vault
            .set(
                id,
                CredentialKind::SshKey,
                &Secret::from(key.to_string()),
                1,
            )
            .unwrap();
        keys.push(id.to_string());
    }
    drop(vault);
    // The config lives beside the data dir, so the data dir holds only what the
    // daemon itself makes.
    let config_path = dir.path().with_extension("toml");
    std::fs::write(&config_path, config_text).unwrap();
    let socket = socket.map_or_else(
        || dir.path().join("run").join("postern.sock"),
        Path::to_path_buf,
    );
    let extra_args: Vec<String> = extra_args.iter().map(|a| a.to_string()).collect();
    let (child, stderr) = spawn_daemon(dir.path(), &socket, &service, &extra_args);
    Daemon {
        child,
        dir,
        socket,
        service,
        keys,
        extra_args,
        stderr,
    }
}

/// Starts `postern daemon` over the data dir `dir` (its config beside it) with
/// `extra_args`, and waits until it listens on `socket`. Its stderr is collected as it
/// arrives.
fn spawn_daemon(
    dir: &Path,
    socket: &Path,
    service: &str,
    extra_args: &[String],
) -> (Child, Arc<Mutex<String>>) {
    let mut child = Command::new(POSTERN)
        .args(["daemon", "--data-dir"])
        .arg(dir)
        .arg("--config")
        .arg(dir.with_extension("toml"))
        .arg("--socket")
        .arg(socket)
        .args(["--keychain-service", service])
        .args(extra_args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = Arc::new(Mutex::new(String::new()));
    let pipe = child.stderr.take().unwrap();
    let collected = stderr.clone();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = String::new();
        while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
            collected.lock().unwrap().push_str(&line);
            line.clear();
        }
    });
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return (child, stderr);
        }
        if let Ok(Some(status)) = child.try_wait() {
            std::thread::sleep(Duration::from_millis(100));
            panic!("the daemon exited ({status}): {}", stderr.lock().unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the daemon did not start listening within 10 s");
}

impl Daemon {
    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The keychain service the daemon's credentials and audit key live under.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// Stops the daemon (SIGKILL, by PID) and starts a new one over the same data dir,
    /// config and keychain service.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let (child, stderr) = spawn_daemon(
            self.dir.path(),
            &self.socket,
            &self.service,
            &self.extra_args,
        );
        self.child = child;
        self.stderr = stderr;
    }

    /// The daemon's broker key, as `postern audit key --json` prints it (what a peer or
    /// a manifest checker pins).
    pub fn audit_key(&self) -> String {
        let out = succeeded(
            Command::new(POSTERN)
                .args(["audit", "key", "--json", "--data-dir"])
                .arg(self.dir.path())
                .args(["--keychain-service", self.service()]),
        );
        let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
        printed["key"].as_str().unwrap().to_string()
    }

    /// `postern operator ARGS` against the daemon's operator socket, which must succeed:
    /// what it printed, as JSON (null if it printed none).
    pub fn operator(&self, args: &[&str]) -> Value {
        let out = succeeded(
            Command::new(POSTERN)
                .arg("operator")
                .arg("--socket")
                .arg(self.dir.path().join("run").join("operator.sock"))
                .args(args),
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null)
    }

    /// Replaces the daemon's configuration file with `config_text` and restarts it.
    pub fn reconfigure(&mut self, config_text: &str) {
        std::fs::write(self.dir.path().with_extension("toml"), config_text).unwrap();
        self.restart();
    }

    /// What the daemon (since its last start) wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The first stderr line containing `needle`, waiting up to `within` for it.
    pub fn stderr_line(&self, needle: &str, within: Duration) -> Option<String> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(line) = self.stderr().lines().find(|l| l.contains(needle)) {
                return Some(line.to_string());
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `postern daemon` with `args`, expected to refuse to start: its exit status and stderr.
pub fn daemon_refusal(args: &[&std::ffi::OsStr]) -> (ExitStatus, String) {
    let mut child = Command::new(POSTERN)
        .arg("daemon")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr);
            return (status, stderr);
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon neither refused nor exited within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A raw `postern mcp` process: bytes in, lines out.
pub struct Bridge {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Vec<u8>>,
    stderr: mpsc::Receiver<String>,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Bridge {
    pub fn spawn(socket: &Path) -> Bridge {
        Bridge::spawn_with(Command::new(POSTERN), socket)
    }

    /// Spawns `command` (the postern binary, perhaps configured to run as another user)
    /// as `command mcp --socket SOCKET`.
    pub fn spawn_with(mut command: Command, socket: &Path) -> Bridge {
        let mut child = command
            .arg("mcp")
            .arg("--socket")
            .arg(socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut line = Vec::new();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        if tx.send(line).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let stderr_pipe = child.stderr.take().unwrap();
        let (tx, stderr) = mpsc::channel();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr_pipe), &mut text);
            let _ = tx.send(text);
        });
        let stdin = child.stdin.take();
        Bridge {
            child,
            stdin,
            lines,
            stderr,
        }
    }

    /// Writes `bytes` as they are; false if the bridge no longer reads its stdin.
    pub fn send(&mut self, bytes: &[u8]) -> bool {
        match self.stdin.as_mut() {
            Some(stdin) => stdin.write_all(bytes).and_then(|()| stdin.flush()).is_ok(),
            None => false,
        }
    }

    /// Writes one JSON message and a newline.
    pub fn send_json(&mut self, message: &Value) -> bool {
        self.send(format!("{message}\n").as_bytes())
    }

    /// The next line the bridge writes, parsed, within `within`. A line that is not JSON
    /// comes back as a JSON string holding its lossy text.
    pub fn recv(&self, within: Duration) -> Option<Value> {
        let line = self.lines.recv_timeout(within).ok()?;
        Some(
            serde_json::from_slice(&line)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&line).into_owned())),
        )
    }

    /// Lines until the response with `id`, within `within` in all: (the others, the response).
    pub fn recv_until_id(&self, id: &Value, within: Duration) -> (Vec<Value>, Option<Value>) {
        let deadline = Instant::now() + within;
        let mut others = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.recv(left) {
                Some(message) if message.get("id") == Some(id) => return (others, Some(message)),
                Some(message) => others.push(message),
                None => break,
            }
        }
        (others, None)
    }

    /// The MCP handshake: initialize, its response, the initialized notification.
    pub fn initialize(&mut self) -> Value {
        assert!(self.send_json(&json!({
            "jsonrpc": "2.0", "id": "init", "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "bad-input", "version": "1"}}
        })));
        let (_, response) = self.recv_until_id(&json!("init"), Duration::from_secs(10));
        let response = response.expect("the bridge answers initialize");
        assert!(self.send_json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})));
        response
    }

    /// Closes the bridge's stdin (the agent is done).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits up to `within` for the process to exit.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Everything the bridge wrote to stderr (once it has exited), waiting up to `within`.
    pub fn stderr(&self, within: Duration) -> String {
        self.stderr.recv_timeout(within).unwrap_or_default()
    }
}

/// A `postern witness serve` child, SIGKILLed on drop.
pub struct Served {
    child: Child,
    pub url: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    /// SIGKILL: no shutdown path runs.
    pub fn kill_9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

/// `postern witness serve` on 127.0.0.1:0 over the witness data dir `dir`.
pub fn serve_witness(dir: &Path) -> Served {
    let mut child = Command::new(POSTERN)
        .args(["witness", "serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the witness printed no address");
    let addr = line.trim();
    assert!(
        addr.starts_with("127.0.0.1:"),
        "unexpected address line {line:?}"
    );
    Served {
        child,
        url: format!("http://{addr}"),
    }
}
