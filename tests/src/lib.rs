//! Shared pieces of the cross-crate tests: a fixed lifecycle that the crash child runs
//! and the parent checks, so both sides agree on what each step means.

pub mod adversary;
pub mod agent;
pub mod calls;
#[cfg(target_os = "linux")]
pub mod desktop;
pub mod disk;
pub mod peer;
pub mod proxy;
pub mod relay;

use std::path::Path;
use std::sync::Arc;

use ed25519_dalek::SigningKey;
use postern_broker::action::{ConfigSnapshot, Fingerprint, NormalizedAction, NormalizedHttp};
use postern_broker::clock::SystemClock;
use postern_broker::config::Config;
use postern_broker::contract::{ConfidenceSource, Outcome, RemoteContract, Retry};
use postern_broker::invocation::{Recorder, StepError};
use postern_broker::journal::events::{Channel, OperationFacts, ResultFacts};
use postern_broker::journal::{
    Journal, JournalError, JournalOptions, NewInvocation, ResultToStore, Settle,
};

/// Every file under `dir` (recursively) whose bytes contain `needle`: the canary checks
/// run this over a data dir to prove a secret reached no file.
pub fn files_containing(dir: &Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_containing(&path, needle));
        } else if std::fs::read(&path).is_ok_and(|bytes| {
            !needle.is_empty() && bytes.windows(needle.len()).any(|w| w == needle)
        }) {
            found.push(path);
        }
    }
    found
}

/// Runs `command` with `input` on its standard input (closed after it), and returns what
/// it printed: how a person hands a secret to `postern vault set`.
pub fn run_with_stdin(
    command: &mut std::process::Command,
    input: &[u8],
) -> std::io::Result<std::process::Output> {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input)?;
    }
    child.wait_with_output()
}

/// The audit key the crash tests sign with (a fixed test key, not a user's).
pub fn test_signing_key() -> SigningKey {
    SigningKey::from_bytes(&[42u8; 32])
}

pub fn open_journal(db: &Path) -> Result<Journal, JournalError> {
    Journal::open(
        db,
        JournalOptions::new(Arc::new(SystemClock), test_signing_key()),
    )
}

const CONFIG: &str = r#"
[[http]]
name = "payments"
base_url = "http://127.0.0.1:9/v1"
methods = ["GET", "POST"]
credential = "payments-key"
inject = { header = "Authorization", format = "Bearer {secret}" }
approval = "none"
idempotent_methods = ["GET"]
"#;

/// The durable transitions of one successful invocation, in order. The crash child
/// aborts right after step `n` (1-based); `STEPS.len()` runs to the end.
pub const STEPS: &[&str] = &[
    "ACTION_ACCEPTED",
    "PREFLIGHT_VALIDATED",
    "CREDENTIAL_AUTHORIZED",
    "ATTEMPT_STARTED",
    "DISPATCH_STARTED",
    "REQUEST_SENT",
    "REMOTE_RESPONSE_STARTED",
    "REMOTE_RESPONSE_COMPLETE",
    "RESULT_COMMITTED",
    "RESULT_DELIVERED",
];

pub const INVOCATION: &str = "inv_crash";

/// After a broker process was killed: reopens its journal, takes the newest invocation,
/// and returns what the record said before recovery and the envelope after
/// `recover_interrupted`.
pub fn recovered_after_kill(
    db: &Path,
) -> Result<
    (
        postern_broker::journal::projection::Projection,
        postern_broker::contract::Envelope,
    ),
    String,
> {
    let journal = open_journal(db).map_err(|e| e.to_string())?;
    let id = journal
        .newest_invocation()
        .map_err(|e| e.to_string())?
        .ok_or("no invocation")?;
    let before = journal.projection(&id).map_err(|e| e.to_string())?;
    journal.recover_interrupted().map_err(|e| e.to_string())?;
    let after = journal.projection(&id).map_err(|e| e.to_string())?;
    let envelope = after
        .envelope(journal.now_ms())
        .ok_or("no envelope after recovery")?;
    Ok((before, envelope))
}
pub const RESULT_BODY: &[u8] = b"{\"payment\":\"pay_123\",\"status\":\"created\"}";

#[derive(Debug)]
pub enum LifecycleError {
    Config(String),
    Journal(JournalError),
    Step(StepError),
}

impl From<JournalError> for LifecycleError {
    fn from(e: JournalError) -> Self {
        LifecycleError::Journal(e)
    }
}
impl From<StepError> for LifecycleError {
    fn from(e: StepError) -> Self {
        LifecycleError::Step(e)
    }
}

/// Runs a POST through every durable transition, calling `after(step_index)` after each.
pub fn run_lifecycle(
    journal: &Journal,
    mut after: impl FnMut(usize),
) -> Result<(), LifecycleError> {
    let config = Config::parse(CONFIG, Path::new("crash.toml"))
        .map_err(|e| LifecycleError::Config(e.to_string()))?;
    let url = "http://127.0.0.1:9/v1/payments";
    let action = NormalizedHttp::new("POST", url, &[], &[], RESULT_BODY)
        .map_err(|e| LifecycleError::Config(e.to_string()))?;
    let target = config
        .resolve_normalized_http(&action)
        .map_err(|e| LifecycleError::Config(e.to_string()))?;
    let snapshot = ConfigSnapshot::for_http(target, "v1-00000001", None);
    let fingerprint = Fingerprint::compute(&NormalizedAction::Http(action.clone()), &snapshot);
    let fp = fingerprint.to_string();

    let mut rec = Recorder::accept(
        journal,
        NewInvocation {
            invocation_id: INVOCATION.into(),
            channel: Channel::Http,
            target: target.name.clone(),
            summary: format!("POST {}", action.url()),
            session: None,
            idempotency_key: None,
            parent: None,
        },
    )?;
    after(1);
    rec.preflight(
        &fp,
        snapshot,
        OperationFacts {
            idempotent: false,
            remote_contract: RemoteContract::None,
            idempotency: None,
            reconcile_configured: false,
            source_query: None,
            batch: None,
            retry_budget: 1,
            peer: None,
        },
    )?;
    after(2);
    rec.credential_authorized("payments-key", "v1-00000001")?;
    after(3);
    rec.start_attempt("crash-child", 60_000)?;
    after(4);
    rec.dispatch_started(&fp, Some("conn-1".into()), None)?;
    after(5);
    rec.request_sent(true, true)?;
    after(6);
    rec.response_started(Some(201), None)?;
    after(7);
    rec.response_complete("blake3:response")?;
    after(8);
    rec.commit_result(
        ResultToStore {
            meta: serde_json::json!({"status": 201}),
            streams: vec![("body".into(), RESULT_BODY.to_vec())],
        },
        Settle {
            outcome: Outcome::Committed,
            code: None,
            retry: Retry::Never,
            facts: ResultFacts {
                http_status: Some(201),
                ..Default::default()
            },
            confidence: ConfidenceSource::RemoteResponse,
            redactions: 0,
        },
    )?;
    after(9);
    rec.delivered()?;
    after(10);
    Ok(())
}

/// A broker with an HTTP channel over a fresh data dir and its own keychain service
/// name, so tests never touch a user's entries.
pub mod fixture {
    use std::error::Error;
    use std::path::Path;
    use std::sync::Arc;

    use postern_broker::channel::guard::Resolver;
    use postern_broker::channel::http::HttpChannel;
    use postern_broker::config::Config;
    use postern_broker::config::ConfigHandle;
    use postern_broker::config::proxy::ProxyEnv;
    use postern_broker::journal::Journal;
    use postern_broker::vault::{CredentialKind, Keychain, KeychainBackend, Secret, Vault};

    pub type BoxError = Box<dyn Error + Send + Sync>;

    pub struct Broker {
        pub journal: Journal,
        pub channel: HttpChannel,
        pub vault: Arc<Vault>,
        pub config: ConfigHandle,
    }

    /// A keychain service name no real user has.
    pub fn test_service() -> String {
        let mut bytes = [0u8; 6];
        let _ = getrandom_fill(&mut bytes);
        format!(
            "postern-test-{}",
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )
    }

    fn getrandom_fill(bytes: &mut [u8]) -> Result<(), ()> {
        use std::time::{SystemTime, UNIX_EPOCH};
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| ())?
            .as_nanos();
        let seed = nanos ^ u128::from(std::process::id()) << 64;
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (seed >> ((i % 16) * 8)) as u8;
        }
        Ok(())
    }

    /// Opens a broker in `dir` with the targets in `config_text` (written to
    /// `dir/postern.toml`, so relative `ca_file` paths resolve inside `dir`).
    pub fn open_broker(dir: &Path, config_text: &str, service: &str) -> Result<Broker, BoxError> {
        open_broker_with(dir, config_text, service, KeychainBackend::SecretService)
    }

    /// [`open_broker`] over a chosen keychain backend (keyutils needs `keyctl session`).
    pub fn open_broker_with(
        dir: &Path,
        config_text: &str,
        service: &str,
        backend: KeychainBackend,
    ) -> Result<Broker, BoxError> {
        open_broker_resolving(dir, config_text, service, backend, Resolver::system())
    }

    /// [`open_broker_with`] whose channel resolves host names through `resolver` (a
    /// hosts-style map: a test name can resolve to a metadata address).
    pub fn open_broker_resolving(
        dir: &Path,
        config_text: &str,
        service: &str,
        backend: KeychainBackend,
        resolver: Resolver,
    ) -> Result<Broker, BoxError> {
        // Hermetic: proxy variables of the shell running the tests do not apply.
        let env = ProxyEnv::default();
        open_broker_in_env(dir, config_text, service, backend, resolver, &env)
    }

    /// [`open_broker_resolving`] with the targets file loaded under the proxy variables
    /// of `env` (as the daemon loads it under its process environment).
    pub fn open_broker_in_env(
        dir: &Path,
        config_text: &str,
        service: &str,
        backend: KeychainBackend,
        resolver: Resolver,
        env: &ProxyEnv,
    ) -> Result<Broker, BoxError> {
        let config_path = dir.join("postern.toml");
        std::fs::write(&config_path, config_text)?;
        let config = ConfigHandle::new(Config::load_with(&config_path, env)?);
        let db = dir.join("journal.db");
        let journal = crate::open_journal(&db)?;
        let vault = Arc::new(Vault::open(Keychain::new(backend, service)?, &db)?);
        let channel =
            HttpChannel::with_resolver(journal.clone(), vault.clone(), config.clone(), resolver);
        Ok(Broker {
            journal,
            channel,
            vault,
            config,
        })
    }

    impl Broker {
        pub fn set_secret(&self, id: &str, secret: &str) -> Result<(), BoxError> {
            let secret = Secret::from(secret.to_string());
            self.vault
                .set(id, CredentialKind::Token, &secret, self.journal.now_ms())?;
            Ok(())
        }

        /// Removes the keychain entries this broker created.
        pub fn forget(&self, ids: &[&str]) {
            for id in ids {
                let _ = self.vault.remove(id);
            }
        }
    }
}
/// A real OpenSSH server on 127.0.0.1 for the SSH channel tests: its own host key, user
/// keys and config in a temp dir, killed (by PID) on drop.
pub mod ssh_fixture {
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    pub const SSHD: &str = "/usr/sbin/sshd";

    pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

    /// An OpenSSH key pair made by `ssh-keygen`.
    #[derive(Debug, Clone)]
    pub struct KeyPair {
        /// The OpenSSH private key file text.
        pub private: String,
        /// `<algo> <base64>` (no comment).
        pub public: String,
        pub path: PathBuf,
    }

    /// Makes a key pair with `ssh-keygen -t <kind>` (no passphrase) at `path`.
    pub fn keygen(kind: &str, path: &Path) -> Result<KeyPair, BoxError> {
        let mut cmd = Command::new("ssh-keygen");
        cmd.args(["-q", "-N", "", "-C", "", "-t", kind]);
        if kind == "rsa" {
            cmd.args(["-b", "2048"]);
        }
        let status = cmd
            .arg("-f")
            .arg(path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()?;
        if !status.success() {
            return Err(format!("ssh-keygen -t {kind} failed: {status}").into());
        }
        let private = std::fs::read_to_string(path)?;
        let public_line = std::fs::read_to_string(path.with_extension("pub"))?;
        let public = public_line
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        Ok(KeyPair {
            private,
            public,
            path: path.to_path_buf(),
        })
    }

    /// A running `sshd -D -e` and the keys it trusts.
    pub struct Sshd {
        /// A fresh directory, removed on drop.
        pub dir: PathBuf,
        pub port: u16,
        /// `<algo> <base64>` of the server's host key, as pinned in a target.
        pub host_key: String,
        /// Authorized user keys.
        pub user_ed25519: KeyPair,
        pub user_rsa: KeyPair,
        /// A key the server does not trust.
        pub stranger: KeyPair,
        child: Child,
    }

    impl Sshd {
        /// Whether an OpenSSH server is installed; tests skip with a notice otherwise.
        pub fn available() -> bool {
            Path::new(SSHD).exists()
        }

        pub fn start() -> Result<Sshd, BoxError> {
            std::fs::create_dir_all("/run/sshd")?;
            let dir = unique_dir()?;
            let host = keygen("ed25519", &dir.join("host_ed25519"))?;
            let user_ed25519 = keygen("ed25519", &dir.join("user_ed25519"))?;
            let user_rsa = keygen("rsa", &dir.join("user_rsa"))?;
            let stranger = keygen("ed25519", &dir.join("stranger"))?;
            let authorized = dir.join("authorized_keys");
            std::fs::write(
                &authorized,
                format!("{}\n{}\n", user_ed25519.public, user_rsa.public),
            )?;
            let port = free_port()?;
            let config = dir.join("sshd_config");
            std::fs::write(
                &config,
                format!(
                    "ListenAddress 127.0.0.1\nPort {port}\nHostKey {host}\nAuthorizedKeysFile {auth}\n\
                     PidFile {pid}\nStrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\n\
                     PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                     PubkeyAuthentication yes\nLogLevel ERROR\n",
                    host = host.path.display(),
                    auth = authorized.display(),
                    pid = dir.join("sshd.pid").display(),
                ),
            )?;
            let child = Command::new(SSHD)
                .arg("-D")
                .arg("-e")
                .arg("-f")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()?;
            let mut sshd = Sshd {
                dir,
                port,
                host_key: host.public,
                user_ed25519,
                user_rsa,
                stranger,
                child,
            };
            let started = Instant::now();
            loop {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Ok(sshd);
                }
                if let Some(status) = sshd.child.try_wait()? {
                    return Err(format!("sshd exited: {status}").into());
                }
                if started.elapsed() > Duration::from_secs(10) {
                    return Err("sshd did not start listening within 10 s".into());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }

        /// The current user's name (the tests log in as whoever runs them).
        pub fn user() -> String {
            std::env::var("USER")
                .ok()
                .filter(|u| !u.is_empty())
                .or_else(|| {
                    Command::new("id")
                        .arg("-un")
                        .output()
                        .ok()
                        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                })
                .unwrap_or_else(|| "root".to_string())
        }
    }

    impl Drop for Sshd {
        fn drop(&mut self) {
            // Our own child, by PID.
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn unique_dir() -> Result<PathBuf, BoxError> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "postern-sshd-{}-{nanos}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// A port nothing listens on right now.
    pub fn free_port() -> Result<u16, BoxError> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        Ok(listener.local_addr()?.port())
    }
}
