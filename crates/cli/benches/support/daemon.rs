//! What the `postern` benchmarks share: a `postern daemon` over a data dir with one
//! pre-approved HTTP target `api` at an origin, its token stored in a keychain service of
//! its own; killed and its keychain entries removed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use postern_broker::vault::{CredentialKind, Keychain, KeychainBackend, Secret, Vault};
use postern_tests::fixture::test_service;

pub struct BenchDaemon {
    child: Child,
    vault: Vault,
    /// The agent socket, `DATA/run/postern.sock`.
    pub socket: PathBuf,
}

impl BenchDaemon {
    /// Starts `postern` (the binary) as a daemon over `data`, target `api` at
    /// `origin/v1`, its token in `backend`, and waits until it listens.
    pub fn start(postern: &Path, data: &Path, backend: KeychainBackend, origin: &str) -> Self {
        let service = test_service();
        let vault = Vault::open(
            Keychain::new(backend, &service).unwrap(),
            &data.join("journal.db"),
        )
        .unwrap();
        vault
            .set(
                "api-key",
                CredentialKind::Token,
                &Secret::from("bench-secret".to_string()),
                1,
            )
            .unwrap();
        let config = data.join("postern.toml");
        std::fs::write(
            &config,
            format!(
                "[[http]]\nname = \"api\"\nbase_url = \"{origin}/v1\"\nmethods = [\"GET\"]\n\
                 credential = \"api-key\"\n\
                 inject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" }}\n\
                 approval = \"none\"\nidempotent_methods = [\"GET\"]\n"
            ),
        )
        .unwrap();
        let flag = match backend {
            KeychainBackend::Keyutils => "keyutils",
            _ => "secret-service",
        };
        let socket = data.join("run").join("postern.sock");
        let child = Command::new(postern)
            .args(["daemon", "--data-dir"])
            .arg(data)
            .arg("--config")
            .arg(&config)
            .args(["--keychain-service", &service, "--keychain", flag])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        while !socket.exists() {
            std::thread::sleep(Duration::from_millis(20));
        }
        BenchDaemon {
            child,
            vault,
            socket,
        }
    }
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = self.vault.remove("api-key");
        let _ = self.vault.remove("postern-audit-signing");
    }
}
