//! `[[peer]]`: another Postern broker this one federates with (seed 002).
//!
//! ```toml
//! [[peer]]
//! name = "org-b"
//! key = "postern.local/audit/…+1a2b3c4d+AQ…"   # its broker key, as `postern audit key` prints
//! url = "https://postern.org-b.example:8443"   # where this broker calls it (optional)
//! exports = ["payments"]                        # this broker's targets it may call (optional)
//! approval = "none"                             # this broker's approval for calls to it (optional)
//! timeout_ms = 60000                            # how long one call to it may take (optional)
//! transient_retries = 5                         # retries after `unavailable` or transport errors
//! unknown_retries = 3                           # retries after unattested answers
//! backoff_ms = 500                              # first backoff, doubling...
//! max_backoff_ms = 30000                        # ...up to this
//! ```
//!
//! `approval` defaults to `none`: the peer's own approver decides for its credential.
//! The retry settings are seed 002's budgets ([`Attempts`]); they are bound to each
//! invocation at preflight.
//!
//! A peer is pinned by its broker key: every request it sends and every attestation it
//! returns is checked against that key, never against anything the network says. A peer
//! needs a `url` (this broker calls it), `exports` (it calls this broker), or both.

use serde::Deserialize;
use url::Url;

use std::time::Duration;

use crate::config::ApprovalMode;
use crate::transparency::note::{KeyAlg, VerifierKey};

/// How long one call to a peer may take unless `timeout_ms` says otherwise, in ms.
pub const DEFAULT_PEER_TIMEOUT_MS: u64 = 60_000;
/// The most retries of either kind a `[[peer]]` may allow.
pub const MAX_PEER_RETRIES: u32 = 20;

pub use crate::record::peer::Attempts;

/// The `[[peer]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPeer {
    name: String,
    key: String,
    url: Option<String>,
    #[serde(default)]
    exports: Vec<String>,
    approval: Option<ApprovalMode>,
    timeout_ms: Option<u64>,
    transient_retries: Option<u32>,
    unknown_retries: Option<u32>,
    backoff_ms: Option<u64>,
    max_backoff_ms: Option<u64>,
}

/// A federated broker, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    /// A name without `/` (it appears in `peer/<name>/<capability>`).
    pub name: String,
    /// Its broker key (Ed25519), as `postern audit key` prints it.
    pub key: VerifierKey,
    /// Where this broker reaches it, if it calls it.
    pub url: Option<Url>,
    /// This broker's HTTP targets the peer may call, sorted.
    pub exports: Vec<String>,
    /// Whether a person here approves calls to the peer (default none: the peer's own
    /// approver decides for its credential).
    pub approval: ApprovalMode,
    /// How long one call to the peer may take.
    pub timeout: Duration,
    /// The retry budgets and backoff of a call to it (nothing spent yet).
    pub attempts: Attempts,
}

/// Why a `[[peer]]` table is refused: the field and the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PeerProblem {
    Name,
    Key(String),
    Url(String),
    /// Neither `url` nor `exports`: the peer could never be used.
    Unused,
    /// An export that names no `[[http]]` target.
    UnknownExport {
        index: usize,
        name: String,
    },
    DuplicateExport {
        index: usize,
        name: String,
    },
    /// A timeout, retry count or backoff out of range.
    Setting(String),
}

impl RawPeer {
    pub(super) fn name(&self) -> &str {
        &self.name
    }
}

impl PeerConfig {
    /// Checks a raw table against the HTTP target names it may export.
    pub(super) fn check(
        raw: RawPeer,
        http_targets: &[&str],
    ) -> Result<PeerConfig, (&'static str, PeerProblem)> {
        let name_ok = !raw.name.is_empty()
            && raw.name.len() <= 64
            && raw
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !name_ok {
            return Err(("name", PeerProblem::Name));
        }
        let key =
            VerifierKey::parse(&raw.key).map_err(|e| ("key", PeerProblem::Key(e.to_string())))?;
        if key.alg != KeyAlg::Ed25519 {
            return Err((
                "key",
                PeerProblem::Key("a broker key is of type 0x01 (Ed25519)".into()),
            ));
        }
        let url = match raw.url {
            None => None,
            Some(text) => {
                Some(check_url(&text).map_err(|reason| ("url", PeerProblem::Url(reason)))?)
            }
        };
        let mut exports: Vec<String> = Vec::with_capacity(raw.exports.len());
        for (index, name) in raw.exports.into_iter().enumerate() {
            if !http_targets.contains(&name.as_str()) {
                return Err(("exports", PeerProblem::UnknownExport { index, name }));
            }
            if exports.contains(&name) {
                return Err(("exports", PeerProblem::DuplicateExport { index, name }));
            }
            exports.push(name);
        }
        if url.is_none() && exports.is_empty() {
            return Err(("url", PeerProblem::Unused));
        }
        exports.sort();
        let setting = |field: &'static str, reason: String| (field, PeerProblem::Setting(reason));
        let timeout_ms = raw.timeout_ms.unwrap_or(DEFAULT_PEER_TIMEOUT_MS);
        if !(1..=600_000).contains(&timeout_ms) {
            return Err(setting("timeout_ms", "between 1 and 600000 ms".into()));
        }
        let mut attempts = Attempts::new();
        for (field, value, slot) in [
            (
                "transient_retries",
                raw.transient_retries,
                &mut attempts.transient_budget,
            ),
            (
                "unknown_retries",
                raw.unknown_retries,
                &mut attempts.unknown_budget,
            ),
        ] {
            if let Some(n) = value {
                if n > MAX_PEER_RETRIES {
                    return Err(setting(field, format!("at most {MAX_PEER_RETRIES}")));
                }
                *slot = n;
            }
        }
        if let Some(ms) = raw.backoff_ms {
            if !(1..=60_000).contains(&ms) {
                return Err(setting("backoff_ms", "between 1 and 60000 ms".into()));
            }
            attempts.base_backoff_ms = ms;
            attempts.max_backoff_ms = attempts.max_backoff_ms.max(ms);
        }
        if let Some(ms) = raw.max_backoff_ms {
            if ms < attempts.base_backoff_ms || ms > 600_000 {
                return Err(setting(
                    "max_backoff_ms",
                    "at least backoff_ms and at most 600000 ms".into(),
                ));
            }
            attempts.max_backoff_ms = ms;
        }
        Ok(PeerConfig {
            name: raw.name,
            key,
            url,
            exports,
            approval: raw.approval.unwrap_or(ApprovalMode::None),
            timeout: Duration::from_millis(timeout_ms),
            attempts,
        })
    }
}

/// https anywhere; plain http only on loopback (as for targets); no credentials, query
/// or fragment.
fn check_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|e| e.to_string())?;
    let loopback = match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => return Err("no host".into()),
    };
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => return Err("plain http is allowed only for loopback hosts".into()),
        other => return Err(format!("scheme `{other}` is not allowed; use https")),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("credentials in the URL are not allowed".into());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("a peer URL may not have a query or fragment".into());
    }
    Ok(url)
}

impl super::Config {
    /// The peer named `name`.
    pub fn peer(&self, name: &str) -> Option<&PeerConfig> {
        self.peers.iter().find(|p| p.name == name)
    }

    /// The peer whose pinned broker key is named `key_name` (its audit log origin): how
    /// a call's [`PeerAuth`](crate::federation::wire::PeerAuth) finds the entry whose
    /// key must verify it.
    pub fn peer_by_key_name(&self, key_name: &str) -> Option<&PeerConfig> {
        self.peers.iter().find(|p| p.key.name == key_name)
    }

    /// The version of what this broker exports to `peer`: a digest over the peer's name
    /// and each exported target's name and [`TargetVersion`](super::TargetVersion). Any
    /// change to what the peer may call, or to how an exported target is configured,
    /// changes it, so a peer can tell that the policy moved during its attempt.
    pub fn export_policy_version(&self, peer: &str) -> Option<String> {
        let p = self.peer(peer)?;
        let mut h = blake3::Hasher::new_derive_key("postern 2026 peer-export-policy v1");
        let mut field = |bytes: &[u8]| {
            h.update(&(bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(p.name.as_bytes());
        field(&(p.exports.len() as u64).to_le_bytes());
        for name in &p.exports {
            field(name.as_bytes());
            let version = self.http_target(name).map(|t| t.version().to_string());
            field(version.unwrap_or_default().as_bytes());
        }
        Some(format!("blake3:{}", h.finalize().to_hex()))
    }
}
