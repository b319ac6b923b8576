//! Normalized actions, the configuration snapshot bound to an invocation, and the
//! invocation fingerprint.
//!
//! Validation and injection fail before dispatch: the broker binds the normalized request, the target configuration, the credential version, the injection
//! mode and the idempotency key to an invocation *before* authorization, approves and
//! re-verifies exactly that binding right before dispatch. [`Fingerprint`] is that
//! binding. Equivalent requests (RFC 3986 §6.2.2) must fingerprint equally, and any change
//! that could alter what the remote sees must change the fingerprint.
//!
//! The normalized types never hold raw body or stdin bytes, only their blake3 digest and
//! length, because they are stored in the journal as JSON.
//!
//! # Fingerprint encoding, format version 1
//!
//! `Fingerprint::compute` is BLAKE3 in key-derivation mode with the context string
//! `"postern 2026 invocation-fingerprint v1"`, over this byte string:
//!
//! ```text
//! 0x01                                  format version
//! then fields in exactly this order, each introduced by its one-byte tag:
//!
//! 0x02 STR  kind                        "http" or "ssh"
//! http:
//!   0x10 STR   method                   as sent, case-sensitive (RFC 9110 §9.1)
//!   0x11 STR   scheme                   "http" | "https"
//!   0x12 STR   host                     lowercase, IDNA (punycode), IPv6 in brackets
//!   0x13 OPT   port                     absent when default; else u16 little-endian (2 bytes)
//!   0x14 STR   path                     normalized, see `NormalizedHttp`
//!   0x15 PAIRS query                    original order
//!   0x16 PAIRS headers                  lowercase names, sorted by name, stable
//!   0x17 STR   body_digest              64 lowercase hex chars, as ASCII
//!   0x18 STR   body_len                 u64 little-endian (8 bytes)
//! ssh:
//!   0x20 STR   target
//!   0x21 STR   user
//!   0x22 STR   command                  raw bytes
//!   0x23 STR   stdin_digest             64 lowercase hex chars, as ASCII
//!   0x24 STR   stdin_len                u64 little-endian (8 bytes)
//! peer:                                 (a peer call binds its request's own
//!                                        fingerprint; this is never bound)
//!   0x40 STR   peer
//!   0x41 STR   request_fingerprint
//! snapshot:
//!   0x30 STR   target_id
//!   0x31 STR   target_version           "blake3:<hex>"
//!   0x32 STR   credential_id
//!   0x33 STR   credential_version
//!   0x34 STR   injection_mode
//!   0x35 OPT   idempotency_key
//!
//! STR   = u64le(len) ‖ bytes
//! OPT   = 0x00                          (absent)
//!       | 0x01 ‖ u64le(len) ‖ bytes     (present)
//! PAIRS = u64le(count) ‖ count × (u64le(len) ‖ name ‖ u64le(len) ‖ value)
//! ```
//!
//! Strings are UTF-8. The digest is shown as `blake3:` followed by 64 lowercase hex
//! digits. Known-answer vectors live in `tests/vectors/fingerprint_v1.json`; those for
//! the target version (`crate::config`) and the audit chain (`crate::audit`) beside it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use url::Url;

pub use crate::canonical::percent_encode;
use crate::canonical::{Canonical, encode_component, is_token, normalize_path, split_query};
use crate::config::{HttpTarget, SshTarget, Target, TargetVersion};
use crate::contract::Code;

/// Key-derivation context of the invocation fingerprint; bump with the format version.
const FINGERPRINT_CONTEXT: &str = "postern 2026 invocation-fingerprint v1";
const FINGERPRINT_FORMAT: u8 = 1;

/// A request that could not be normalized. `field` is a path to the part of the request
/// the caller can fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: field `{field}`: {message}")]
pub struct ActionError {
    pub code: Code,
    pub field: String,
    pub message: String,
}

impl ActionError {
    fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: Code::InvalidRequest,
            field: field.into(),
            message: message.into(),
        }
    }
}

/// An HTTP request in canonical form: equal for requests a server must treat alike.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NormalizedHttp {
    pub method: String,
    pub scheme: String,
    /// Lowercase; internationalized names in punycode; IPv6 literals in brackets.
    pub host: String,
    /// `None` when the URL used (or omitted) the scheme's default port.
    pub port: Option<u16>,
    /// RFC 3986 §6.2.2 normalized: hex digits uppercase, unreserved escapes decoded,
    /// dot-segments removed, reserved characters (including `%2F`) left encoded.
    pub path: String,
    /// Raw `name=value` pairs in original order, percent-normalized like the path.
    pub query: Vec<(String, String)>,
    /// Lowercase names, sorted by name; duplicates keep their relative order.
    #[serde(with = "header_list")]
    pub headers: Vec<(String, Vec<u8>)>,
    /// blake3 of the body, lowercase hex.
    pub body_digest: String,
    pub body_len: u64,
}

impl NormalizedHttp {
    /// Normalizes a request. `extra_query` pairs are unencoded values (the tool's `query`
    /// argument); they are percent-encoded and appended after the URL's own query.
    pub fn new(
        method: &str,
        url: &str,
        headers: &[(String, String)],
        extra_query: &[(String, String)],
        body: &[u8],
    ) -> Result<Self, ActionError> {
        if !is_token(method) {
            return Err(ActionError::invalid(
                "method",
                "not an RFC 9110 method token",
            ));
        }
        let parsed =
            Url::parse(url).map_err(|e| ActionError::invalid("url", format!("malformed: {e}")))?;
        let scheme = parsed.scheme();
        if scheme != "http" && scheme != "https" {
            return Err(ActionError {
                code: Code::InvalidTarget,
                field: "url".into(),
                message: format!("scheme `{scheme}` is not supported; use http or https"),
            });
        }
        // The broker owns credentials; a URL carrying its own would bypass injection.
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(ActionError::invalid(
                "url",
                "userinfo is not allowed in the URL",
            ));
        }
        let host = parsed
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| ActionError::invalid("url", "the URL has no host"))?;
        let path = normalize_path(parsed.path())
            .map_err(|e| ActionError::invalid("url", format!("path: {e}")))?;

        // The fragment is dropped: it is never part of an HTTP request target (RFC 9112 §3.2).
        let mut query = Vec::new();
        if let Some(raw) = parsed.query() {
            query =
                split_query(raw).map_err(|e| ActionError::invalid("url", format!("query: {e}")))?;
        }
        for (i, (name, value)) in extra_query.iter().enumerate() {
            if name.is_empty() {
                return Err(ActionError::invalid(
                    format!("query[{i}].name"),
                    "empty name",
                ));
            }
            query.push((encode_component(name), encode_component(value)));
        }

        let mut norm_headers = Vec::with_capacity(headers.len());
        for (i, (name, value)) in headers.iter().enumerate() {
            if !is_token(name) {
                return Err(ActionError::invalid(
                    format!("headers[{i}].name"),
                    "not an RFC 9110 field-name token",
                ));
            }
            // Surrounding whitespace is not part of a field value (RFC 9110 §5.5).
            let value = value.trim_matches([' ', '\t']);
            if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
                return Err(ActionError::invalid(
                    format!("headers[{i}].value"),
                    "control characters (CR, LF, NUL, ...) are not allowed (RFC 9110 §5.5)",
                ));
            }
            norm_headers.push((name.to_ascii_lowercase(), value.as_bytes().to_vec()));
        }
        // Field names are case-insensitive (RFC 9110 §5.1) and order across different names
        // carries no meaning; order among same-name fields does (RFC 9110 §5.3).
        norm_headers.sort_by(|a, b| a.0.cmp(&b.0));

        Ok(Self {
            method: method.to_owned(),
            scheme: scheme.to_owned(),
            host: host.to_owned(),
            port: parsed.port(),
            path,
            query,
            headers: norm_headers,
            body_digest: blake3::hash(body).to_hex().to_string(),
            body_len: body.len() as u64,
        })
    }

    /// The request URL in normalized form (without the extra-query distinction: all
    /// pairs are part of the query). Parsing it again yields the same normalization.
    pub fn url(&self) -> String {
        let mut out = format!("{}://{}", self.scheme, self.host);
        if let Some(port) = self.port {
            out.push_str(&format!(":{port}"));
        }
        out.push_str(&self.path);
        if !self.query.is_empty() {
            out.push('?');
            let pairs: Vec<String> = self.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&pairs.join("&"));
        }
        out
    }
}

/// An SSH command in canonical form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NormalizedSsh {
    /// The configured target name.
    pub target: String,
    pub user: String,
    #[serde(with = "byte_text")]
    pub command: Vec<u8>,
    /// blake3 of stdin, lowercase hex.
    pub stdin_digest: String,
    pub stdin_len: u64,
}

impl NormalizedSsh {
    pub fn new(
        target: &str,
        user: &str,
        command: &[u8],
        stdin: &[u8],
    ) -> Result<Self, ActionError> {
        if command.is_empty() {
            return Err(ActionError::invalid("command", "the command is empty"));
        }
        // The exec request carries a C string on most servers; a NUL would silently cut
        // the command the remote runs short of the command that was approved.
        if command.contains(&0) {
            return Err(ActionError::invalid(
                "command",
                "the command contains a NUL byte",
            ));
        }
        Ok(Self {
            target: target.to_owned(),
            user: user.to_owned(),
            command: command.to_vec(),
            stdin_digest: blake3::hash(stdin).to_hex().to_string(),
            stdin_len: stdin.len() as u64,
        })
    }
}

/// A request to a capability a peer broker exports, as this broker binds it. Its
/// invocation fingerprint is the peer request's own
/// ([`PeerRequest::fingerprint`](crate::federation::wire::PeerRequest::fingerprint)),
/// which both brokers compute and the peer's attestations name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NormalizedPeer {
    /// The peer's name in `[[peer]]`.
    pub peer: String,
    pub capability: String,
    pub method: String,
    /// Relative to the capability's base at the peer (may carry a query).
    pub path: String,
    /// `PeerRequest::fingerprint` of the request.
    pub request_fingerprint: String,
}

/// What the agent asked for, normalized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NormalizedAction {
    Http(NormalizedHttp),
    Ssh(NormalizedSsh),
    Peer(NormalizedPeer),
}

/// The configuration an invocation was validated against, bound before authorization so
/// a reload during approval cannot change what gets dispatched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigSnapshot {
    pub target_id: String,
    pub target_version: TargetVersion,
    pub credential_id: String,
    /// A non-secret version tag of the credential, never its bytes.
    pub credential_version: String,
    /// `header:<lowercase name>`, `basic`, `query:<param>` or `ssh_key`.
    pub injection_mode: String,
    pub idempotency_key: Option<String>,
}

impl ConfigSnapshot {
    pub fn for_http(
        target: &HttpTarget,
        credential_version: impl Into<String>,
        idempotency_key: Option<String>,
    ) -> Self {
        Self {
            target_id: target.name.clone(),
            target_version: target.version(),
            credential_id: target.credential.as_str().to_owned(),
            credential_version: credential_version.into(),
            injection_mode: target.inject.mode(),
            idempotency_key,
        }
    }

    /// The snapshot of `target` as configured now. An SSH target carries no key.
    pub fn of(
        target: Target<'_>,
        credential_version: impl Into<String>,
        idempotency_key: Option<String>,
    ) -> Self {
        match target {
            Target::Http(t) => Self::for_http(t, credential_version, idempotency_key),
            Target::Ssh(t) => Self::for_ssh(t, credential_version),
        }
    }

    pub fn for_ssh(target: &SshTarget, credential_version: impl Into<String>) -> Self {
        Self {
            target_id: target.name.clone(),
            target_version: target.version(),
            credential_id: target.credential.as_str().to_owned(),
            credential_version: credential_version.into(),
            injection_mode: "ssh_key".to_owned(),
            idempotency_key: None,
        }
    }
}

/// The invocation fingerprint: `blake3:<64 hex>`. See the module doc for the encoding.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// A string that is not `blake3:` followed by 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a fingerprint: expected `blake3:` followed by 64 lowercase hex digits")]
pub struct ParseFingerprintError;

impl Fingerprint {
    pub fn compute(action: &NormalizedAction, snapshot: &ConfigSnapshot) -> Self {
        let mut c = Canonical::new(FINGERPRINT_CONTEXT, FINGERPRINT_FORMAT);
        match action {
            NormalizedAction::Http(h) => {
                c.str(0x02, "http");
                c.str(0x10, &h.method);
                c.str(0x11, &h.scheme);
                c.str(0x12, &h.host);
                c.opt(0x13, h.port.map(u16::to_le_bytes).as_ref().map(|b| &b[..]));
                c.str(0x14, &h.path);
                c.pairs(
                    0x15,
                    h.query.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())),
                );
                c.pairs(
                    0x16,
                    h.headers.iter().map(|(k, v)| (k.as_bytes(), v.as_slice())),
                );
                c.str(0x17, &h.body_digest);
                c.u64(0x18, h.body_len);
            }
            NormalizedAction::Ssh(s) => {
                c.str(0x02, "ssh");
                c.str(0x20, &s.target);
                c.str(0x21, &s.user);
                c.bytes(0x22, &s.command);
                c.str(0x23, &s.stdin_digest);
                c.u64(0x24, s.stdin_len);
            }
            // A peer call binds the peer request's fingerprint as its invocation
            // fingerprint (see `NormalizedPeer`); this encoding only keeps the
            // function total.
            NormalizedAction::Peer(p) => {
                c.str(0x02, "peer");
                c.str(0x40, &p.peer);
                c.str(0x41, &p.request_fingerprint);
            }
        }
        c.str(0x30, &snapshot.target_id);
        c.str(0x31, snapshot.target_version.as_str());
        c.str(0x32, &snapshot.credential_id);
        c.str(0x33, &snapshot.credential_version);
        c.str(0x34, &snapshot.injection_mode);
        c.opt(0x35, snapshot.idempotency_key.as_deref().map(str::as_bytes));
        Self(c.finish())
    }

    pub fn parse(s: &str) -> Result<Self, ParseFingerprintError> {
        let hex_part = s.strip_prefix("blake3:").ok_or(ParseFingerprintError)?;
        // Only the lowercase form is canonical, so equal fingerprints compare equal as text.
        if hex_part.len() != 64 || hex_part.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(ParseFingerprintError);
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut out).map_err(|_| ParseFingerprintError)?;
        Ok(Self(out))
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "blake3:{}", hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

impl FromStr for Fingerprint {
    type Err = ParseFingerprintError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Fingerprint {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Bytes as JSON: a string when valid UTF-8 (readable in the journal), else an array of
/// numbers. Lossless either way.
#[derive(Deserialize)]
#[serde(untagged)]
enum ByteRepr {
    Text(String),
    Raw(Vec<u8>),
}

impl From<ByteRepr> for Vec<u8> {
    fn from(r: ByteRepr) -> Self {
        match r {
            ByteRepr::Text(s) => s.into_bytes(),
            ByteRepr::Raw(b) => b,
        }
    }
}

struct ByteText<'a>(&'a [u8]);

impl Serialize for ByteText<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(self.0) {
            Ok(text) => s.serialize_str(text),
            Err(_) => self.0.serialize(s),
        }
    }
}

mod byte_text {
    use super::{ByteRepr, ByteText};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        ByteText(v).serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        ByteRepr::deserialize(d).map(Vec::from)
    }
}

mod header_list {
    use super::{ByteRepr, ByteText};
    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        v: &[(String, Vec<u8>)],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(v.len()))?;
        for (name, value) in v {
            seq.serialize_element(&(name, ByteText(value)))?;
        }
        seq.end()
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<(String, Vec<u8>)>, D::Error> {
        let raw = Vec::<(String, ByteRepr)>::deserialize(d)?;
        Ok(raw.into_iter().map(|(k, v)| (k, Vec::from(v))).collect())
    }
}

/// Resolving an already normalized request lives with the request: the configuration
/// does not know the normalized action type.
impl crate::config::Config {
    /// [`Config::resolve_http`] for an already normalized request.
    pub fn resolve_normalized_http(
        &self,
        req: &NormalizedHttp,
    ) -> Result<&HttpTarget, crate::config::ResolveError> {
        let port = req
            .port
            .or_else(|| crate::config::default_port(&req.scheme));
        self.resolve_parts(&req.scheme, Some(&req.host), port, &req.path)
            .ok_or_else(|| crate::config::ResolveError::NoHttpTarget { url: req.url() })
    }
}
