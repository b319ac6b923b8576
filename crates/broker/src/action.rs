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

/// The tagged, length-prefixed canonical encoder shared by the fingerprint and the target
/// version digest. Each scalar is `tag ‖ u64le(len) ‖ bytes`; see the module doc.
pub(crate) struct Canonical {
    hasher: blake3::Hasher,
}

impl Canonical {
    /// Domain separation comes from the derive-key context; the version byte makes a
    /// future encoding change visible even under the same context.
    pub(crate) fn new(context: &str, format_version: u8) -> Self {
        let mut hasher = blake3::Hasher::new_derive_key(context);
        hasher.update(&[format_version]);
        Self { hasher }
    }

    fn len(&mut self, n: usize) {
        self.hasher.update(&(n as u64).to_le_bytes());
    }

    fn item(&mut self, b: &[u8]) {
        self.len(b.len());
        self.hasher.update(b);
    }

    pub(crate) fn bytes(&mut self, tag: u8, b: &[u8]) {
        self.hasher.update(&[tag]);
        self.item(b);
    }

    pub(crate) fn str(&mut self, tag: u8, s: &str) {
        self.bytes(tag, s.as_bytes());
    }

    pub(crate) fn u64(&mut self, tag: u8, v: u64) {
        self.bytes(tag, &v.to_le_bytes());
    }

    pub(crate) fn opt(&mut self, tag: u8, v: Option<&[u8]>) {
        self.hasher.update(&[tag]);
        match v {
            None => {
                self.hasher.update(&[0]);
            }
            Some(b) => {
                self.hasher.update(&[1]);
                self.item(b);
            }
        }
    }

    /// Starts an optional group of nested fields: `tag ‖ 0x00|0x01`; when present the
    /// caller writes the group's tagged fields next.
    pub(crate) fn presence(&mut self, tag: u8, present: bool) {
        self.hasher.update(&[tag, u8::from(present)]);
    }

    pub(crate) fn list<'a>(&mut self, tag: u8, items: impl ExactSizeIterator<Item = &'a [u8]>) {
        self.hasher.update(&[tag]);
        self.len(items.len());
        for b in items {
            self.item(b);
        }
    }

    pub(crate) fn pairs<'a>(
        &mut self,
        tag: u8,
        items: impl ExactSizeIterator<Item = (&'a [u8], &'a [u8])>,
    ) {
        self.hasher.update(&[tag]);
        self.len(items.len());
        for (k, v) in items {
            self.item(k);
            self.item(v);
        }
    }

    pub(crate) fn finish(self) -> [u8; 32] {
        *self.hasher.finalize().as_bytes()
    }
}

/// `tchar` of RFC 9110 §5.6.2; methods (§9.1) and field names (§5.1) are tokens.
pub(crate) fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// RFC 3986 percent-encoding of everything but unreserved characters (what a query
/// parameter injection sends).
pub fn percent_encode(value: &[u8]) -> String {
    let mut out = String::with_capacity(value.len() * 3);
    for &b in value {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// RFC 3986 §2.3 unreserved characters: their escapes are equivalent to themselves.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Percent-encoding normalization (RFC 3986 §6.2.2.2): decode escapes of unreserved
/// characters, uppercase the hex of the rest. Reserved characters stay encoded because
/// decoding them can change meaning (`%2F` is not `/`). Bytes that may not appear raw in
/// a URI are encoded, which keeps the function total and idempotent.
fn normalize_percent(s: &str) -> Result<String, &'static str> {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'%' {
            let hi = b.get(i + 1).and_then(|&h| (h as char).to_digit(16));
            let lo = b.get(i + 2).and_then(|&l| (l as char).to_digit(16));
            let (Some(hi), Some(lo)) = (hi, lo) else {
                return Err("malformed percent-encoding (RFC 3986 §2.1)");
            };
            let v = (hi * 16 + lo) as u8;
            if is_unreserved(v) {
                out.push(v as char);
            } else {
                push_pct(&mut out, v);
            }
            i += 3;
        } else {
            if c.is_ascii_graphic() {
                out.push(c as char);
            } else {
                push_pct(&mut out, c);
            }
            i += 1;
        }
    }
    Ok(out)
}

fn push_pct(out: &mut String, v: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(HEX[usize::from(v >> 4)] as char);
    out.push(HEX[usize::from(v & 0xf)] as char);
}

/// Percent-encodes everything but unreserved characters, so a value supplied unencoded
/// arrives as one query component and is already in normalized form.
fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if is_unreserved(b) {
            out.push(b as char);
        } else {
            push_pct(&mut out, b);
        }
    }
    out
}

/// Remove dot segments, RFC 3986 §5.2.4.
fn remove_dot_segments(path: &str) -> String {
    let mut input = path;
    let mut out: Vec<&str> = Vec::new();
    // Work on segments: `out` holds "/seg" pieces so "go up" pops one piece.
    while !input.is_empty() {
        if let Some(rest) = input
            .strip_prefix("../")
            .or_else(|| input.strip_prefix("./"))
        {
            input = rest;
        } else if input.starts_with("/./") {
            input = &input[2..];
        } else if input == "/." {
            input = "/";
        } else if input.starts_with("/../") {
            input = &input[3..];
            out.pop();
        } else if input == "/.." {
            input = "/";
            out.pop();
        } else if input == "." || input == ".." {
            input = "";
        } else {
            let start = usize::from(input.starts_with('/'));
            let end = input[start..].find('/').map_or(input.len(), |p| p + start);
            out.push(&input[..end]);
            input = &input[end..];
        }
    }
    out.concat()
}

/// RFC 3986 §6.2.2 path normalization: percent-encoding normalization, then dot-segment
/// removal (decoding `%2E` can create dot segments); an empty path becomes `/` (§6.2.3).
pub(crate) fn normalize_path(path: &str) -> Result<String, &'static str> {
    let decoded = normalize_percent(path)?;
    let out = remove_dot_segments(&decoded);
    Ok(if out.is_empty() { "/".to_owned() } else { out })
}

/// Splits a raw query into `name=value` pairs without decoding (`+` and reserved escapes
/// keep their meaning for the server). Empty pieces carry nothing and are dropped; a
/// piece without `=` is a name with an empty value, as in the WHATWG URL parser.
fn split_query(raw: &str) -> Result<Vec<(String, String)>, &'static str> {
    let mut out = Vec::new();
    for piece in raw.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = piece.split_once('=').unwrap_or((piece, ""));
        out.push((normalize_percent(k)?, normalize_percent(v)?));
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_segments_follow_rfc_3986_examples() {
        // RFC 3986 §5.2.4 worked examples.
        assert_eq!(remove_dot_segments("/a/b/c/./../../g"), "/a/g");
        assert_eq!(remove_dot_segments("mid/content=5/../6"), "mid/6");
        assert_eq!(remove_dot_segments("/.."), "/");
        assert_eq!(remove_dot_segments("/a/.."), "/");
        assert_eq!(remove_dot_segments("/a//../b"), "/a/b");
    }

    #[test]
    fn percent_normalization_decodes_only_unreserved() {
        assert_eq!(
            normalize_percent("%7e%2f%2Fa%41%3a").as_deref(),
            Ok("~%2F%2FaA%3A")
        );
        assert!(normalize_percent("%4").is_err());
        assert!(normalize_percent("%zz").is_err());
    }
}
