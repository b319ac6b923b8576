//! The targets file: one TOML document of `[[http]]` and `[[ssh]]` targets.
//!
//! Parsing is strict (`deny_unknown_fields`): a misspelled key in a security policy must
//! fail loudly rather than silently fall back to a default. After parsing, every target
//! is validated and normalized; each failure is a [`ConfigError`] naming the file, the
//! target and the field. [`Config::load`] also checks the files a target names
//! (`ca_file`) and applies the environment's proxy variables ([`proxy`]). What loads but needs the operator's attention (an SSH target without a
//! pinned host key) is a [`ConfigWarning`] from [`Config::warnings`].
//!
//! This file holds [`Config`], its loading and the re-exports; each concern has a file
//! of its own under `config/`: a section's types, raw TOML form and checks (`http.rs`,
//! `ssh.rs`, `witness.rs`, `results.rs`, `peer.rs`, with `job.rs`, `batch.rs` and
//! `proxy.rs` for the HTTP target's contracts and proxy), the rules fields share
//! (`field.rs`), what every target shares (`target.rs`), errors and their location
//! (`error.rs`), cautions (`warning.rs`), resolution (`resolve.rs`), the version digest
//! (`version.rs`, encoding below) and the live swap (`handle.rs`).
//!
//! Each target has a [`TargetVersion`]: a digest of its *normalized* configuration, bound
//! into every invocation's [`ConfigSnapshot`](crate::action::ConfigSnapshot) so that a
//! reload which changes a target is detected before dispatch, and the request is refused
//! unsent. Key order, whitespace and comments do not affect it.
//!
//! # Target version encoding, format version 1
//!
//! BLAKE3 in key-derivation mode with context `"postern 2026 target-config v1"` over
//! `0x01` followed by tagged fields, using the STR / OPT / LIST primitives documented in
//! [`crate::action`] (`LIST = u64le(count) ‖ count × (u64le(len) ‖ bytes)`; integers are
//! STR of their little-endian bytes; a bool is STR of one byte `0|1`; an optional group is
//! `tag ‖ 0x00` or `tag ‖ 0x01` followed by the group's own tagged fields):
//!
//! ```text
//! http: 0x02 "http", 0x40 name, 0x41 base_url (normalized), 0x42 LIST methods (sorted,
//!       deduplicated), 0x43 credential, 0x44 injection mode (`header:<lowercase name>` |
//!       `basic` | `query:<param>`), 0x45 OPT injection detail (header format | basic user
//!       | absent for query), 0x46 approval (`none`|`session`|`per_call`), 0x47 LIST
//!       idempotent_methods (sorted, deduplicated), 0x48 OPT ca_file (resolved path bytes),
//!       0x49 timeout_ms u64, 0x4a max_response_bytes u64, 0x4b max_request_body_bytes u64,
//!       0x4c follow_redirects bool,
//!       0x4d group idempotency { 0x50 header (lowercase), 0x51 scope, 0x52 retention
//!       seconds u64 },
//!       0x4e group reconcile { 0x58 method, 0x59 path, 0x5a LIST committed_status (u16 LE,
//!       sorted, deduplicated), 0x5b LIST not_applied_status (same) },
//!       then, only when the target has one, 0x76 group job { 0x70 OPT id_pointer,
//!       0x71 OPT status_pointer, 0x72 OPT state_pointer, 0x73 LIST pending, 0x74 LIST
//!       succeeded, 0x75 LIST failed (each sorted) },
//!       then, only when the target has one, 0x7f group batch { 0x80 path, 0x81 members,
//!       0x82 OPT member_id, 0x83 results, 0x84 OPT result_id, 0x85 status, 0x86 LIST
//!       applied, 0x87 LIST not_applied (sorted), 0x88 OPT partial_header (lowercase),
//!       0x89 OPT partial_pointer, 0x8a atomic bool, 0x8b group query { 0x8c method,
//!       0x8d path, 0x8e LIST committed_status, 0x8f LIST not_applied_status } }
//! ssh:  0x02 "ssh", 0x60 name, 0x61 host (normalized), 0x62 port u16, 0x63 user,
//!       0x64 credential, 0x65 OPT host_key (`<algo> <base64>`), 0x66 approval,
//!       0x67 timeout_ms u64, 0x68 max_output_bytes u64
//! added: http 0x4f allow_private (only when true), ssh 0x69 allow_private
//!        (only when true), http 0x90 proxy (`http://host:port` without credentials,
//!        only when requests go through a proxy, named in the file or taken from the
//!        environment at load), http 0x91 / ssh 0x6a require_confined (only when
//!        true). Absent fields leave a v1 digest unchanged.
//! ```
//!
//! Known-answer vectors: `tests/vectors/target_version_v1.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub mod batch;
mod error;
mod field;
mod handle;
mod http;
pub mod job;
pub mod peer;
pub mod proxy;
mod resolve;
mod results;
mod ssh;
mod target;
mod version;
mod warning;
mod witness;

use error::Ctx;
pub use error::{ConfigError, InvalidField, Problem, ResolveError, Section, TargetRef};
use field::{is_loopback, valid_name};
pub use handle::ConfigHandle;
pub use http::{HttpTarget, IdempotencyContract, Injection, ReconcileQuery};
use http::{RawHttp, check_ca_file, validate_http};
use proxy::{ProxyEnv, ProxySetting};
pub(crate) use resolve::default_port;
use resolve::same_prefix;
pub use results::{DEFAULT_RESULT_MAX_AGE, DEFAULT_RESULT_MAX_BYTES, RetentionPolicy};
use results::{RawResults, validate_results};
pub use ssh::{MAX_OUTPUT_BYTES_LIMIT, SshTarget};
use ssh::{RawSsh, validate_ssh};
pub use target::{ApprovalMode, Target};
pub use version::TargetVersion;
pub use warning::{Caution, ConfigWarning};
pub use witness::WitnessConfig;
use witness::{RawWitness, validate_witness};

const DEFAULT_TIMEOUT_MS: u64 = 30_000;
const MAX_TIMEOUT_MS: u64 = 600_000;
/// The largest payload (an HTTP body, an SSH command's stdin) any target takes. Agents
/// reach the broker through the bridge's 16 MiB line limit; 10 MiB fits in it even
/// base64-encoded (13.4 MiB), so a larger payload reaches the broker and is answered
/// PAYLOAD_LIMIT instead of being cut off as an over-long line (issue 26).
pub const MAX_PAYLOAD_BYTES: u64 = 10 * 1024 * 1024;

/// The parsed, validated targets file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub http: Vec<HttpTarget>,
    pub ssh: Vec<SshTarget>,
    /// Witnesses that cosign the journal's checkpoints (`[[witness]]`).
    pub witnesses: Vec<WitnessConfig>,
    /// How long, and how many bytes of, stored results are kept (`[results]`).
    pub results: RetentionPolicy,
    /// Brokers this one federates with (`[[peer]]`).
    pub peers: Vec<peer::PeerConfig>,
    /// The file this configuration came from.
    pub source: PathBuf,
}

// ---- the raw TOML form (each section's own raw form is in its file) --------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    http: Vec<RawHttp>,
    #[serde(default)]
    ssh: Vec<RawSsh>,
    #[serde(default)]
    witness: Vec<RawWitness>,
    #[serde(default)]
    results: Option<RawResults>,
    #[serde(default)]
    peer: Vec<peer::RawPeer>,
}

/// The `timeout_ms` of a target, of either kind, that does not set one.
fn default_timeout() -> u64 {
    DEFAULT_TIMEOUT_MS
}

// ---- loading and validation ------------------------------------------------------------

impl Config {
    /// Reads and validates the targets file, checks that every file a target refers to
    /// (`ca_file`) can be read and holds what it should, and applies this process's
    /// proxy variables (read now, not per request; see [`proxy`]).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_with(path, &ProxyEnv::from_process())
    }

    /// [`Config::load`] with the proxy variables of `env` instead of the process's.
    pub fn load_with(path: &Path, env: &ProxyEnv) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut config = Self::parse(&text, path)?;
        config.check_files()?;
        config.apply_proxy_env(env)?;
        Ok(config)
    }

    /// Gives each target without a `proxy` key the environment's proxy for its scheme,
    /// unless its host is loopback or `NO_PROXY` excludes it. A malformed variable is an
    /// error only where it would apply.
    fn apply_proxy_env(&mut self, env: &ProxyEnv) -> Result<(), ConfigError> {
        for (index, t) in self.http.iter_mut().enumerate() {
            if t.proxy != ProxySetting::Environment
                || t.base_url.host().is_none_or(|h| is_loopback(&h))
            {
                continue;
            }
            let host = t.base_url.host_str().unwrap_or_default();
            let Some((variable, proxy)) = env.proxy_for(t.base_url.scheme(), host) else {
                continue;
            };
            match proxy {
                Ok(proxy) => t.proxy = ProxySetting::Via(proxy),
                Err(problem) => {
                    let ctx = Ctx {
                        file: &self.source,
                        target: TargetRef::named(Section::Http, index, &t.name),
                    };
                    let problem = Problem::InvalidEnvironmentProxy { variable, problem };
                    return Err(ctx.err("proxy", problem));
                }
            }
        }
        Ok(())
    }

    /// Parses and validates `text` as if read from `path` (used in errors and to resolve
    /// relative `ca_file` paths). The text alone: files it names are checked by
    /// [`Config::load`].
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            file: path.to_path_buf(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let base_dir = path.parent().unwrap_or(Path::new(""));

        // Names are checked first and across both arrays: they are how snapshots, approvals
        // and the journal refer to targets, so they must be unambiguous.
        let mut names: BTreeMap<String, TargetRef> = BTreeMap::new();
        let refs = raw
            .http
            .iter()
            .enumerate()
            .map(|(i, t)| (Section::Http, i, &t.name))
            .chain(
                raw.ssh
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (Section::Ssh, i, &t.name)),
            );
        for (section, index, name) in refs {
            if !valid_name(name) {
                let target = TargetRef {
                    section,
                    index,
                    name: None,
                };
                return Err(Ctx { file: path, target }.err("name", Problem::InvalidName));
            }
            let target = TargetRef::named(section, index, name);
            if let Some(first) = names.get(name) {
                let problem = Problem::DuplicateName {
                    first: first.clone(),
                };
                return Err(Ctx { file: path, target }.err("name", problem));
            }
            names.insert(name.clone(), target);
        }

        let mut http = Vec::with_capacity(raw.http.len());
        for (index, t) in raw.http.into_iter().enumerate() {
            let target = TargetRef::named(Section::Http, index, &t.name);
            let ctx = Ctx { file: path, target };
            let t = validate_http(&ctx, t, base_dir)?;
            // Two targets claiming the same prefix would make resolution depend on file
            // order, so the tie is rejected here rather than broken silently.
            if let Some(other) = http.iter().find(|o: &&HttpTarget| same_prefix(o, &t)) {
                let problem = Problem::SamePrefix {
                    other: other.name.clone(),
                };
                return Err(ctx.err("base_url", problem));
            }
            http.push(t);
        }
        let mut ssh = Vec::with_capacity(raw.ssh.len());
        for (index, t) in raw.ssh.into_iter().enumerate() {
            let target = TargetRef::named(Section::Ssh, index, &t.name);
            ssh.push(validate_ssh(&Ctx { file: path, target }, t)?);
        }
        let witnesses = raw
            .witness
            .iter()
            .enumerate()
            .map(|(index, w)| validate_witness(path, index, w))
            .collect::<Result<_, _>>()?;
        let results = validate_results(path, raw.results)?;
        let names: Vec<&str> = http.iter().map(|t| t.name.as_str()).collect();
        let mut peers: Vec<peer::PeerConfig> = Vec::with_capacity(raw.peer.len());
        for (index, p) in raw.peer.into_iter().enumerate() {
            let target = TargetRef::named(Section::Peer, index, p.name());
            let ctx = Ctx { file: path, target };
            let p = peer::PeerConfig::check(p, &names).map_err(|(field, problem)| {
                use peer::PeerProblem as P;
                let problem = match problem {
                    P::Name => Problem::InvalidPeerName,
                    P::Key(reason) => Problem::InvalidPeerKey { reason },
                    P::Url(reason) => Problem::InvalidUrl { reason },
                    P::Unused => Problem::UnusedPeer,
                    P::Setting(reason) => Problem::InvalidPeerSetting { reason },
                    P::UnknownExport { index, name } => {
                        return ctx
                            .err(format!("{field}[{index}]"), Problem::UnknownExport { name });
                    }
                    P::DuplicateExport { index, name } => {
                        return ctx.err(
                            format!("{field}[{index}]"),
                            Problem::DuplicateExport { name },
                        );
                    }
                };
                ctx.err(field, problem)
            })?;
            if let Some(first) = peers.iter().position(|q| q.name == p.name) {
                let problem = Problem::DuplicateName {
                    first: TargetRef::named(Section::Peer, first, &p.name),
                };
                return Err(ctx.err("name", problem));
            }
            peers.push(p);
        }
        Ok(Self {
            http,
            ssh,
            witnesses,
            results,
            peers,
            source: path.to_path_buf(),
        })
    }

    /// Each `ca_file`, resolved as the HTTP channel resolves it (against the config
    /// file's directory), is readable and holds at least one PEM certificate: otherwise
    /// every request to the target would fail its TLS setup.
    fn check_files(&self) -> Result<(), ConfigError> {
        for (index, t) in self.http.iter().enumerate() {
            let Some(path) = &t.ca_file else { continue };
            let ctx = Ctx {
                file: &self.source,
                target: TargetRef::named(Section::Http, index, &t.name),
            };
            check_ca_file(&ctx, path)?;
        }
        Ok(())
    }
}
