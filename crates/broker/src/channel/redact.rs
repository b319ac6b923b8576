//! Scrubbing the injected secret from anything returned to a caller.
//!
//! A remote may echo what it received (a debug endpoint, an error page quoting the
//! request). Every encoding the broker itself used to send the secret is searched for:
//! the raw bytes, the rendered injection value, standard and URL-safe base64 with and
//! without padding, and percent-encoding. Each occurrence becomes `[REDACTED]`.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};

/// What replaces a secret.
pub const MARK: &[u8] = b"[REDACTED]";

/// Below this length a "secret" would match ordinary text; such values are still never
/// logged, but scrubbing them from results would corrupt the result instead.
pub const MIN_REDACTABLE: usize = 4;

/// The byte patterns to scrub, longest first so a rendered value is replaced whole
/// before its secret part would be.
pub struct Redactor {
    patterns: Vec<Vec<u8>>,
}

impl Redactor {
    /// Patterns for `secret` and for each rendered form the broker sent (for example
    /// `Bearer <secret>` or `user:<secret>` before base64).
    pub fn new(secret: &[u8], rendered: &[&[u8]]) -> Redactor {
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        let mut add = |bytes: &[u8]| {
            if bytes.len() >= MIN_REDACTABLE && !patterns.iter().any(|p| p == bytes) {
                patterns.push(bytes.to_vec());
            }
        };
        for value in std::iter::once(secret).chain(rendered.iter().copied()) {
            add(value);
            for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
                add(engine.encode(value).as_bytes());
            }
            add(percent_encode(value).as_bytes());
        }
        patterns.sort_by_key(|p| std::cmp::Reverse(p.len()));
        Redactor { patterns }
    }

    /// Replaces every occurrence in `data`; returns the new bytes and how many were
    /// replaced.
    pub fn scrub(&self, data: &[u8]) -> (Vec<u8>, u32) {
        let mut current = data.to_vec();
        let mut count = 0u32;
        for pattern in &self.patterns {
            let finder = memchr::memmem::Finder::new(pattern);
            let hits: Vec<usize> = finder.find_iter(&current).collect();
            if hits.is_empty() {
                continue;
            }
            let mut out = Vec::with_capacity(current.len());
            let mut last = 0;
            for at in hits {
                // Overlapping hits: the earlier replacement already covered this one.
                if at < last {
                    continue;
                }
                out.extend_from_slice(&current[last..at]);
                out.extend_from_slice(MARK);
                last = at + pattern.len();
                count = count.saturating_add(1);
            }
            out.extend_from_slice(&current[last..]);
            current = out;
        }
        (current, count)
    }

    /// Scrubs a text value (a header); invalid UTF-8 after scrubbing is replaced lossily.
    pub fn scrub_str(&self, text: &str) -> (String, u32) {
        let (bytes, n) = self.scrub(text.as_bytes());
        (String::from_utf8_lossy(&bytes).into_owned(), n)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_encoding_of_the_secret_is_scrubbed_and_counted() {
        let secret = b"s3cr3t/+token==";
        let r = Redactor::new(secret, &[b"Bearer s3cr3t/+token=="]);
        let b64 = STANDARD.encode(secret);
        let url = percent_encode(secret);
        let body = format!("auth=Bearer s3cr3t/+token== raw=s3cr3t/+token== b64={b64} q={url}");
        let (out, n) = r.scrub(body.as_bytes());
        let out = String::from_utf8(out).unwrap();
        assert!(!out.contains("s3cr3t"), "{out}");
        assert!(!out.contains(&b64));
        assert_eq!(n, 4);
    }

    #[test]
    fn short_values_are_not_scrubbed_from_results() {
        let r = Redactor::new(b"ab", &[]);
        assert_eq!(r.scrub(b"abcabc"), (b"abcabc".to_vec(), 0));
    }
}
