//! `[[ssh]]`: the SSH target as the broker uses it ([`SshTarget`]), its raw TOML form,
//! and the validation and normalization of its host, user and pinned host key.

use std::net::{IpAddr, Ipv6Addr};

use base64::Engine as _;
use serde::Deserialize;

use super::field::{check_credential, check_range, plain_text};
use super::{ApprovalMode, ConfigError, Ctx, MAX_TIMEOUT_MS, Problem, default_timeout};
use crate::vault::CredentialId;

const DEFAULT_MAX_OUTPUT_BYTES: u64 = 1024 * 1024;
const DEFAULT_SSH_PORT: u16 = 22;
/// The most an SSH target may let one command's output (stdout and stderr together) hold
/// in the broker's memory; issue 26 found any value accepted (350 MB in one call).
pub const MAX_OUTPUT_BYTES_LIMIT: u64 = 64 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    pub name: String,
    /// Lowercase domain (IDNA) or an IP address (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    pub user: String,
    pub credential: CredentialId,
    /// Pinned `<algo> <base64>`; `None` requires first-seen approval.
    pub host_key: Option<String>,
    pub approval: ApprovalMode,
    pub timeout_ms: u64,
    pub max_output_bytes: u64,
    /// `allow_private = true`, as for HTTP targets.
    pub allow_private: bool,
    /// `require_confined = true`, as for HTTP targets.
    pub require_confined: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSsh {
    pub(super) name: String,
    host: String,
    #[serde(default = "default_ssh_port")]
    port: u16,
    user: String,
    credential: String,
    host_key: Option<String>,
    approval: ApprovalMode,
    #[serde(default = "default_timeout")]
    timeout_ms: u64,
    #[serde(default = "default_max_output")]
    max_output_bytes: u64,
    #[serde(default)]
    allow_private: bool,
    #[serde(default)]
    require_confined: bool,
}

fn default_max_output() -> u64 {
    DEFAULT_MAX_OUTPUT_BYTES
}
fn default_ssh_port() -> u16 {
    DEFAULT_SSH_PORT
}

/// A host name (IDNA-mapped, lowercase) or an IP address; IPv6 may come bracketed.
pub(super) fn normalize_ssh_host(host: &str) -> Option<String> {
    let unbracketed = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = unbracketed.parse::<Ipv6Addr>() {
        return Some(ip.to_string());
    }
    match url::Host::parse(host).ok()? {
        url::Host::Domain(d) => Some(d),
        url::Host::Ipv4(ip) => Some(IpAddr::V4(ip).to_string()),
        url::Host::Ipv6(ip) => Some(ip.to_string()),
    }
}

/// Known host key algorithms (RFC 4253 §6.6, RFC 5656 §6.2, RFC 8709 §4, OpenSSH
/// PROTOCOL.u2f).
const HOST_KEY_ALGORITHMS: &[&str] = &[
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-ed448",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
];

/// Checks `<algo> <base64>` and that the key blob names the same algorithm: an SSH public
/// key blob starts with the length-prefixed algorithm string (RFC 4253 §6.6).
fn check_host_key(s: &str) -> Result<String, String> {
    let mut parts = s.split_whitespace();
    let (Some(algo), Some(b64), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err("expected exactly two fields".to_owned());
    };
    if !HOST_KEY_ALGORITHMS.contains(&algo) {
        return Err(format!("unknown algorithm `{algo}`"));
    }
    let blob = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("key is not base64: {e}"))?;
    let named = blob
        .get(..4)
        .and_then(|l| <[u8; 4]>::try_from(l).ok())
        .map(|l| u32::from_be_bytes(l) as usize)
        .and_then(|n| blob.get(4..4 + n));
    if named != Some(algo.as_bytes()) {
        return Err(format!("key blob is not an `{algo}` key"));
    }
    Ok(format!("{algo} {b64}"))
}

pub(super) fn validate_ssh(ctx: &Ctx<'_>, raw: RawSsh) -> Result<SshTarget, ConfigError> {
    if raw.host.is_empty() {
        return Err(ctx.err("host", Problem::Empty));
    }
    let host =
        normalize_ssh_host(&raw.host).ok_or_else(|| ctx.err("host", Problem::InvalidHost))?;
    check_range(ctx, "port", u64::from(raw.port), 1, u64::from(u16::MAX))?;
    if raw.user.is_empty() {
        return Err(ctx.err("user", Problem::Empty));
    }
    if !plain_text(&raw.user) {
        return Err(ctx.err("user", Problem::InvalidCharacters));
    }
    let credential = check_credential(ctx, raw.credential)?;
    let host_key = raw
        .host_key
        .map(|k| check_host_key(&k))
        .transpose()
        .map_err(|reason| ctx.err("host_key", Problem::InvalidHostKey { reason }))?;
    check_range(ctx, "timeout_ms", raw.timeout_ms, 1, MAX_TIMEOUT_MS)?;
    check_range(
        ctx,
        "max_output_bytes",
        raw.max_output_bytes,
        1,
        MAX_OUTPUT_BYTES_LIMIT,
    )?;
    Ok(SshTarget {
        name: raw.name,
        host,
        port: raw.port,
        user: raw.user,
        credential,
        host_key,
        approval: raw.approval,
        timeout_ms: raw.timeout_ms,
        max_output_bytes: raw.max_output_bytes,
        allow_private: raw.allow_private,
        require_confined: raw.require_confined,
    })
}
