//! The canonical forms the record's digests are computed over: the tagged,
//! length-prefixed encoder shared by the request fingerprint and the target version
//! ([`Canonical`]), and the URL normalization both depend on (RFC 3986 dot segments and
//! percent-encoding, RFC 9110 tokens), and the message a signature over a digest covers
//! ([`signed_message`]). On the ground floor: it imports nothing of the engine, so the
//! configuration and the normalized action can both use it.
//!
//! Never: change an encoding without changing its format version byte (digests already
//! in journals must keep verifying).

/// What a signature over `digest` covers: the signing context (domain separation), then
/// the digest. Attestations, retry manifests and peer auths are signed this way.
pub(crate) fn signed_message(context: &[u8], digest: &str) -> Vec<u8> {
    [context, digest.as_bytes()].concat()
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
pub(crate) fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Percent-encoding normalization (RFC 3986 §6.2.2.2): decode escapes of unreserved
/// characters, uppercase the hex of the rest. Reserved characters stay encoded because
/// decoding them can change meaning (`%2F` is not `/`). Bytes that may not appear raw in
/// a URI are encoded, which keeps the function total and idempotent.
pub(crate) fn normalize_percent(s: &str) -> Result<String, &'static str> {
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

pub(crate) fn push_pct(out: &mut String, v: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(HEX[usize::from(v >> 4)] as char);
    out.push(HEX[usize::from(v & 0xf)] as char);
}

/// Percent-encodes everything but unreserved characters, so a value supplied unencoded
/// arrives as one query component and is already in normalized form.
pub(crate) fn encode_component(s: &str) -> String {
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
pub(crate) fn remove_dot_segments(path: &str) -> String {
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
pub(crate) fn split_query(raw: &str) -> Result<Vec<(String, String)>, &'static str> {
    let mut out = Vec::new();
    for piece in raw.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = piece.split_once('=').unwrap_or((piece, ""));
        out.push((normalize_percent(k)?, normalize_percent(v)?));
    }
    Ok(out)
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
