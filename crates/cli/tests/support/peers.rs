//! What the peering tests share: broker A as broker B pins it (a key, its key name and a
//! signed auth), fresh nonces, where a daemon serves peers, and a process's memory.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ed25519_dalek::SigningKey;
use postern_broker::federation::wire::PeerAuth;
use postern_broker::transparency::note::{KeyAlg, VerifierKey};

use super::Daemon;

/// Broker A as B sees it: a key pinned in B's `[[peer]]`.
pub struct Asker {
    pub key: SigningKey,
    pub name: String,
}

impl Asker {
    /// The asker whose key is `seed` repeated.
    pub fn new(seed: u8) -> Asker {
        let key = SigningKey::from_bytes(&[seed; 32]);
        let name = postern_broker::audit::log_origin(&key.verifying_key());
        Asker { key, name }
    }

    /// The key as `[[peer]] key` pins it.
    pub fn pin(&self) -> String {
        VerifierKey::new(&self.name, KeyAlg::Ed25519, self.key.verifying_key())
            .unwrap()
            .encode()
    }

    /// A fresh auth for `tool` about `subject`.
    pub fn auth(&self, tool: &str, subject: &str) -> PeerAuth {
        PeerAuth::sign(&self.key, tool, &self.name, subject, now_ms(), nonce())
    }
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A nonce never used before by this process.
pub fn nonce() -> [u8; 16] {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let seed = format!("{}-{n}-{}", std::process::id(), now_ms());
    blake3::hash(seed.as_bytes()).as_bytes()[..16]
        .try_into()
        .unwrap()
}

/// Where `daemon` serves peers, from its start-up line.
pub fn peering_addr(daemon: &Daemon) -> SocketAddr {
    let line = daemon
        .stderr_line("postern: peering on ", Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no peering line: {}", daemon.stderr()));
    let url = line.trim().trim_start_matches("postern: peering on ");
    url.trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .parse()
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// Process `pid`'s resident memory (VmRSS), in bytes.
pub fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}
