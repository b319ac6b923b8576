//! Scrubbing the injected secret from anything returned to a caller.
//!
//! A remote may echo what it received (a debug endpoint, an error page quoting the
//! request, a JSON dump of the headers). The scrubber looks for the secret and every
//! rendered value the broker sent (`Bearer <secret>`, `user:<secret>`, `Basic …`) in
//! these forms, and replaces each occurrence with `[REDACTED]`, counting one replacement
//! per occurrence:
//!
//! - **raw**, ASCII case-insensitive (`S3CR3T` is caught as well as `s3cr3t`), and
//!   **reversed**;
//! - **hex**, lower, upper or mixed case;
//! - **base64**, standard and URL-safe, padded or not, and at any byte offset inside a
//!   longer base64 blob (`base64("id=" + secret)`): for an offset `k` of 0, 1 or 2 bytes
//!   the characters fully determined by the secret's bits are matched (characters
//!   `ceil(8k/6)` to `floor(8(k+n)/6) - 1` of the encoding of `k` zero bytes followed by
//!   the secret), so at most one partial character either side survives;
//! - **base32** (RFC 4648 alphabet, any case), the same way at offsets 0 to 4;
//! - **escaped text**, decoded one token at a time so that raw and escaped characters
//!   may mix freely: percent-encoding of some or all bytes (`%xx` in either case), JSON
//!   and JavaScript escapes (`\u00XX` in any case, surrogate pairs for characters beyond
//!   the BMP, short escapes such as `\/` and `\"`, `\xXX`), and HTML character
//!   references (`&#NN;`, `&#xNN;`, `&amp;`, `&quot;`, `&lt;`, `&gt;`, `&apos;`). The
//!   decoded text is searched for the secret in every form above.
//!
//! A rendered value that contains another one (`Bearer <secret>`, an SSH key and each of
//! its lines) is replaced whole when it appears raw; in its encoded forms the inner
//! value's occurrence is what gets replaced.
//!
//! Out of reach, of this scrubber or of any: the secret split across two headers, two
//! JSON fields or two chunks of a body that the caller reassembles; any transform the
//! remote chooses (XOR, encryption, hashing, compression inside the body, an unusual
//! alphabet, line-wrapped or double-encoded text); partial disclosure (a few characters
//! at a time, or one bit through timing). A remote the agent controls can always
//! exfiltrate the credential; the scrubber removes accidental and naive echoes.
//!
//! The scrubber sees bytes as they will be returned: the HTTP channel first undoes any
//! content coding it can (`gzip`, `deflate`) and withholds a body it cannot decode.
//!
//! Values shorter than [`MIN_REDACTABLE`] are never scrubbed: they would match ordinary
//! text.
//!
//! Cost: one Aho-Corasick pass over the data (all forms at once), plus a decoding pass
//! over the neighbourhood of each `%`, `\` or `&`, processed in bounded pieces.

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE};

/// What replaces a secret.
pub const MARK: &[u8] = b"[REDACTED]";

/// Below this length a "secret" would match ordinary text; such values are still never
/// logged, but scrubbing them from results would corrupt the result instead.
pub const MIN_REDACTABLE: usize = 4;

/// The longest escape token the decoded view understands (a JSON surrogate pair,
/// `\uD83D\uDE00`): no decoded byte comes from more source bytes than this.
const MAX_TOKEN: usize = 12;

/// The decoded view is built over pieces of at most this many source bytes (plus an
/// overlap as long as the longest escaped match), so its position map stays bounded.
const PIECE: usize = 1 << 20;

/// Inputs shorter than this are searched pattern by pattern; longer ones build (once)
/// and use the automaton.
const AUTOMATON_AT: usize = 2048;

/// A matched range of the input, `[start, end)`.
type Span = (usize, usize);

/// Everything to look for, compiled once per secret.
pub struct Redactor {
    /// ASCII-lowercased, deduplicated patterns (also the fallback search).
    patterns: Vec<Vec<u8>>,
    /// All patterns, ASCII case-insensitive, overlapping matches reported; built on the
    /// first input of at least [`AUTOMATON_AT`] bytes (most answers are a few short
    /// headers and a small body, searched pattern by pattern for less than building it
    /// costs). `None` when there is nothing to scrub, or if it could not be built (then
    /// `patterns` are searched one by one).
    automaton: std::sync::OnceLock<Option<AhoCorasick>>,
    /// How far an escaped occurrence may reach from one of its escape bytes.
    reach: usize,
}

/// Overwrites the stack below the caller's frame with zeros. The searches over a secret
/// (building the patterns, scrubbing) run vectorised string code that spills patterns to
/// the stack; those dead frames stay in the thread's stack until something else overwrites
/// them (issue 26 found a key line there after an SSH call). Called on the way out of
/// each, on the thread that ran it.
#[inline(never)]
pub(crate) fn wipe_stack_below() {
    let mut dead = [0u8; 32 * 1024];
    // The write is observed, so it is not optimised away.
    std::hint::black_box(&mut dead);
}

impl Drop for Redactor {
    /// The patterns are the secret and its encodings: wiped when the call ends (issue
    /// 26 found key lines in a daemon's memory seconds after an SSH call).
    fn drop(&mut self) {
        use zeroize::Zeroize;
        for pattern in &mut self.patterns {
            pattern.zeroize();
        }
    }
}

impl Redactor {
    /// Patterns for `secret` and for each rendered form the broker sent (for example
    /// `Bearer <secret>` or `user:<secret>` before base64).
    pub fn new(secret: &[u8], rendered: &[&[u8]]) -> Redactor {
        let redactor = Self::build(secret, rendered);
        wipe_stack_below();
        redactor
    }

    /// [`Redactor::new`]'s work, in a frame of its own so that the wipe after it reaches
    /// every frame it used.
    #[inline(never)]
    fn build(secret: &[u8], rendered: &[&[u8]]) -> Redactor {
        let values: Vec<&[u8]> = std::iter::once(secret)
            .chain(rendered.iter().copied())
            .filter(|v| v.len() >= MIN_REDACTABLE)
            .collect();
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        for value in &values {
            // A value holding a shorter one (`Bearer <secret>`, a key and its lines) is
            // matched whole when raw; its encoded forms contain the shorter value's
            // (at some offset), which are searched anyway.
            let holds_another = values.iter().any(|other| {
                other.len() < value.len() && memchr::memmem::find(value, other).is_some()
            });
            if holds_another {
                patterns.push(value.to_vec());
            } else {
                forms(value, &mut patterns);
            }
        }
        for p in &mut patterns {
            p.make_ascii_lowercase();
        }
        patterns.sort();
        // What is left out (too short, a duplicate) is wiped, not just freed.
        let mut kept: Vec<Vec<u8>> = Vec::with_capacity(patterns.len());
        for mut p in patterns {
            if p.len() >= MIN_REDACTABLE && kept.last() != Some(&p) {
                kept.push(p);
            } else {
                zeroize::Zeroize::zeroize(&mut p);
            }
        }
        let patterns = kept;
        let longest = patterns.iter().map(Vec::len).max().unwrap_or(0);
        Redactor {
            patterns,
            automaton: std::sync::OnceLock::new(),
            reach: longest.saturating_mul(MAX_TOKEN),
        }
    }

    /// The automaton over every pattern, built once, on first need.
    fn automaton(&self) -> Option<&AhoCorasick> {
        self.automaton
            .get_or_init(|| {
                if self.patterns.is_empty() {
                    return None;
                }
                AhoCorasick::builder()
                    .ascii_case_insensitive(true)
                    .match_kind(MatchKind::Standard)
                    // A redactor is built per request: the contiguous NFA builds about
                    // three times faster than a DFA and scans only slightly slower.
                    .kind(Some(aho_corasick::AhoCorasickKind::ContiguousNFA))
                    .build(&self.patterns)
                    .ok()
            })
            .as_ref()
    }

    /// Replaces every occurrence in `data`; returns the new bytes and how many were
    /// replaced (overlapping occurrences count once).
    pub fn scrub(&self, data: &[u8]) -> (Vec<u8>, u32) {
        let scrubbed = self.scrub_here(data);
        wipe_stack_below();
        scrubbed
    }

    /// [`Redactor::scrub`]'s work, in a frame of its own (see [`Redactor::build`]).
    #[inline(never)]
    fn scrub_here(&self, data: &[u8]) -> (Vec<u8>, u32) {
        if self.patterns.is_empty() {
            return (data.to_vec(), 0);
        }
        let mut spans: Vec<Span> = Vec::new();
        self.each_match(data, |s, e| push_span(&mut spans, (s, e)));
        self.escaped(data, &mut spans);
        replace(data, spans)
    }

    /// Scrubs a text value (a header); invalid UTF-8 after scrubbing is replaced lossily.
    pub fn scrub_str(&self, text: &str) -> (String, u32) {
        let (bytes, n) = self.scrub(text.as_bytes());
        (String::from_utf8_lossy(&bytes).into_owned(), n)
    }

    /// Calls `found(start, end)` for every occurrence of every pattern in `hay`,
    /// overlapping ones included.
    ///
    /// Every occurrence of every pattern is reported, overlapping ones included, by the
    /// automaton or pattern by pattern alike, so the union of the spans (what
    /// [`replace`] removes) is the same either way.
    fn each_match(&self, hay: &[u8], mut found: impl FnMut(usize, usize)) {
        if hay.len() >= AUTOMATON_AT
            && let Some(ac) = self.automaton()
            && let Ok(iter) = ac.try_find_overlapping_iter(hay)
        {
            for m in iter {
                found(m.start(), m.end());
            }
            return;
        }
        let lower = hay.to_ascii_lowercase();
        for p in &self.patterns {
            let finder = memchr::memmem::Finder::new(p);
            let mut from = 0;
            while let Some(at) = lower.get(from..).and_then(|rest| finder.find(rest)) {
                found(from + at, from + at + p.len());
                from += at + 1;
            }
        }
    }

    /// The escaped forms: every stretch of `data` within reach of a `%`, `\` or `&` is
    /// decoded token by token and searched again; matches map back to source spans.
    fn escaped(&self, data: &[u8], spans: &mut Vec<Span>) {
        let mut view = View::default();
        let mut region: Option<Span> = None;
        for at in memchr::memchr3_iter(b'%', b'\\', b'&', data) {
            let start = at.saturating_sub(self.reach);
            let end = at
                .saturating_add(self.reach)
                .saturating_add(MAX_TOKEN)
                .min(data.len());
            region = match region {
                Some((s, e)) if start <= e => Some((s, e.max(end))),
                Some(done) => {
                    self.search_region(data, done, &mut view, spans);
                    Some((start, end))
                }
                None => Some((start, end)),
            };
        }
        if let Some(done) = region {
            self.search_region(data, done, &mut view, spans);
        }
    }

    /// Searches the decoded view of `data[start..end]`, in pieces that overlap by
    /// `reach` so no occurrence straddles a cut unseen.
    fn search_region(
        &self,
        data: &[u8],
        (start, end): Span,
        view: &mut View,
        spans: &mut Vec<Span>,
    ) {
        let mut a = start;
        loop {
            let b = end.min(a.saturating_add(PIECE).saturating_add(self.reach));
            if view.decode(data, a, b) {
                self.each_match(&view.bytes, |ds, de| {
                    if let Some(span) = view.source_span(ds, de) {
                        push_span(spans, span);
                    }
                });
            }
            if b >= end {
                break;
            }
            a = a.saturating_add(PIECE);
        }
    }
}

/// Adds a match, folding it into the previous one when they overlap (a repetitive
/// secret in repetitive text would otherwise produce one span per byte).
fn push_span(spans: &mut Vec<Span>, (s, e): Span) {
    if let Some(last) = spans.last_mut()
        && s < last.1
        && e > last.0
    {
        last.0 = last.0.min(s);
        last.1 = last.1.max(e);
        return;
    }
    spans.push((s, e));
}

/// Replaces the union of `spans` with [`MARK`]; one replacement per connected range.
fn replace(data: &[u8], mut spans: Vec<Span>) -> (Vec<u8>, u32) {
    if spans.is_empty() {
        return (data.to_vec(), 0);
    }
    spans.sort_unstable();
    let mut out = Vec::with_capacity(data.len());
    let mut count = 0u32;
    let mut last = 0usize;
    let mut current: Option<Span> = None;
    let mut flush = |span: Span, out: &mut Vec<u8>, last: &mut usize| {
        out.extend_from_slice(data.get(*last..span.0).unwrap_or_default());
        out.extend_from_slice(MARK);
        *last = span.1;
        count = count.saturating_add(1);
    };
    for (s, e) in spans {
        current = match current {
            Some((cs, ce)) if s < ce => Some((cs, ce.max(e))),
            Some(done) => {
                flush(done, &mut out, &mut last);
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some(done) = current {
        flush(done, &mut out, &mut last);
    }
    out.extend_from_slice(data.get(last..).unwrap_or_default());
    (out, count)
}

/// Every form of `value` the scrubber looks for (any case; deduplicated later).
fn forms(value: &[u8], out: &mut Vec<Vec<u8>>) {
    let n = value.len();
    out.push(value.to_vec());
    out.push(value.iter().rev().copied().collect());
    out.push(hex::encode(value).into_bytes());
    // Base64 whole (padded), so an exact echo is replaced without leftovers.
    for engine in [&STANDARD, &URL_SAFE] {
        out.push(engine.encode(value).into_bytes());
    }
    for k in 0..3usize {
        let mut shifted = vec![0u8; k];
        shifted.extend_from_slice(value);
        let text = STANDARD_NO_PAD.encode(&shifted).into_bytes();
        let core = text
            .get((8 * k).div_ceil(6)..(8 * (k + n)) / 6)
            .unwrap_or_default();
        out.push(core.to_vec());
        out.push(url_safe(core));
        if k == 0 {
            // The whole unpadded form, final partial character included.
            out.push(url_safe(&text));
            out.push(text);
        }
    }
    for k in 0..5usize {
        let mut shifted = vec![0u8; k];
        shifted.extend_from_slice(value);
        let text = base32(&shifted);
        let core = text
            .get((8 * k).div_ceil(5)..(8 * (k + n)) / 5)
            .unwrap_or_default();
        out.push(core.to_vec());
        if k == 0 {
            let mut padded = text.clone();
            padded.resize(text.len().div_ceil(8) * 8, b'=');
            out.push(padded);
            out.push(text);
        }
    }
}

/// The URL-safe alphabet's spelling of standard base64 text.
fn url_safe(text: &[u8]) -> Vec<u8> {
    text.iter()
        .map(|&c| match c {
            b'+' => b'-',
            b'/' => b'_',
            c => c,
        })
        .collect()
}

/// RFC 4648 base32, unpadded.
fn base32(data: &[u8]) -> Vec<u8> {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = Vec::with_capacity(data.len().div_ceil(5) * 8);
    let mut acc: u64 = 0;
    let mut bits = 0u32;
    for &b in data {
        acc = (acc << 8) | u64::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((acc >> bits) & 31) as usize]);
        }
        acc &= (1u64 << bits) - 1;
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (5 - bits)) & 31) as usize]);
    }
    out
}

/// A piece of the input with its escape tokens decoded, and where each token came from
/// (raw stretches between tokens map one to one).
#[derive(Default)]
struct View {
    bytes: Vec<u8>,
    /// Source offset of the piece.
    start: usize,
    tokens: Vec<Token>,
}

/// One decoded escape token: where its bytes sit in the view and in the source.
struct Token {
    decoded_at: usize,
    decoded_len: usize,
    source_at: usize,
    source_len: usize,
}

impl View {
    /// Decodes `data[start..end]`; false when no token decoded (the view would equal the
    /// source, already searched).
    fn decode(&mut self, data: &[u8], start: usize, end: usize) -> bool {
        self.bytes.clear();
        self.tokens.clear();
        self.start = start;
        let src = data.get(..end).unwrap_or(data);
        let mut i = start;
        let mut buf = [0u8; 4];
        while i < src.len() {
            let next = memchr::memchr3(b'%', b'\\', b'&', src.get(i..).unwrap_or_default())
                .map_or(src.len(), |d| i + d);
            self.bytes
                .extend_from_slice(src.get(i..next).unwrap_or_default());
            i = next;
            if i >= src.len() {
                break;
            }
            match token(src, i, &mut buf) {
                Some((len, used)) => {
                    self.tokens.push(Token {
                        decoded_at: self.bytes.len(),
                        decoded_len: len,
                        source_at: i,
                        source_len: used,
                    });
                    self.bytes
                        .extend_from_slice(buf.get(..len).unwrap_or_default());
                    i += used;
                }
                None => {
                    self.bytes.push(src[i]);
                    i += 1;
                }
            }
        }
        !self.tokens.is_empty()
    }

    /// The source range decoded byte `d` came from (a whole token, or one raw byte).
    fn unit(&self, d: usize) -> Span {
        let before = self.tokens.partition_point(|t| t.decoded_at <= d);
        let Some(t) = before.checked_sub(1).and_then(|k| self.tokens.get(k)) else {
            let at = self.start + d;
            return (at, at + 1);
        };
        if d < t.decoded_at + t.decoded_len {
            (t.source_at, t.source_at + t.source_len)
        } else {
            let at = t.source_at + t.source_len + (d - t.decoded_at - t.decoded_len);
            (at, at + 1)
        }
    }

    /// The source range of decoded bytes `[ds, de)`.
    fn source_span(&self, ds: usize, de: usize) -> Option<Span> {
        let last = de.checked_sub(1).filter(|&l| l >= ds)?;
        Some((self.unit(ds).0, self.unit(last).1))
    }
}

fn hex_digit(b: u8) -> Option<u32> {
    char::from(b).to_digit(16)
}

/// Exactly `n` hex digits at `src[at..]`.
fn hex_at(src: &[u8], at: usize, n: usize) -> Option<u32> {
    let digits = src.get(at..at.checked_add(n)?)?;
    digits
        .iter()
        .try_fold(0u32, |acc, &b| Some(acc * 16 + hex_digit(b)?))
}

/// Writes code point `cp` as UTF-8 into `out`; returns `(bytes, used)`.
fn utf8(cp: u32, out: &mut [u8; 4], used: usize) -> Option<(usize, usize)> {
    let c = char::from_u32(cp)?;
    Some((c.encode_utf8(out).len(), used))
}

/// The escape token at `src[i]`: how many bytes it decodes to (written to `out`) and how
/// many source bytes it spans; `None` when the byte there is not the start of a token.
fn token(src: &[u8], i: usize, out: &mut [u8; 4]) -> Option<(usize, usize)> {
    let byte = |k: usize| src.get(i.checked_add(k)?).copied();
    match byte(0)? {
        b'%' => {
            out[0] = u8::try_from(hex_at(src, i + 1, 2)?).ok()?;
            Some((1, 3))
        }
        b'\\' => match byte(1)? {
            b'u' => {
                let cp = hex_at(src, i + 2, 4)?;
                match cp {
                    0xD800..=0xDBFF => {
                        if byte(6)? != b'\\' || byte(7)? != b'u' {
                            return None;
                        }
                        let low = hex_at(src, i + 8, 4)?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return None;
                        }
                        utf8(0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00), out, 12)
                    }
                    0xDC00..=0xDFFF => None,
                    _ => utf8(cp, out, 6),
                }
            }
            b'x' => {
                out[0] = u8::try_from(hex_at(src, i + 2, 2)?).ok()?;
                Some((1, 4))
            }
            short => {
                out[0] = match short {
                    b'"' | b'\\' | b'/' | b'\'' => short,
                    b'b' => 0x08,
                    b'f' => 0x0C,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    _ => return None,
                };
                Some((1, 2))
            }
        },
        b'&' => {
            if byte(1)? == b'#' {
                let (radix, first) = match byte(2)? {
                    b'x' | b'X' => (16, 3),
                    _ => (10, 2),
                };
                let mut cp = 0u32;
                let mut k = first;
                while let Some(d) = byte(k).and_then(|b| char::from(b).to_digit(radix)) {
                    if k - first >= 7 {
                        return None;
                    }
                    cp = cp * radix + d;
                    k += 1;
                }
                if k == first || byte(k)? != b';' {
                    return None;
                }
                return utf8(cp, out, k + 1);
            }
            const NAMED: &[(&[u8], u8)] = &[
                (b"&amp;", b'&'),
                (b"&lt;", b'<'),
                (b"&gt;", b'>'),
                (b"&quot;", b'"'),
                (b"&apos;", b'\''),
            ];
            let rest = src.get(i..)?;
            let (name, b) = NAMED.iter().find(|(name, _)| rest.starts_with(name))?;
            out[0] = *b;
            Some((1, name.len()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::action::percent_encode;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    const SECRET: &[u8] = b"s3cr3t/+token==";
    const TOKEN: &str = "pstn-canary-7f3a9c1e5b";

    fn scrub_text(r: &Redactor, text: &str) -> (String, u32) {
        let (out, n) = r.scrub(text.as_bytes());
        (String::from_utf8(out).unwrap(), n)
    }

    /// `text` with exactly the occurrences of `form` replaced, wrapped in ordinary prose.
    fn assert_scrubs(r: &Redactor, form: &str) {
        let body = format!("before {form} middle {form}\nafter");
        let (out, n) = scrub_text(r, &body);
        assert_eq!(
            out, "before [REDACTED] middle [REDACTED]\nafter",
            "form {form:?}"
        );
        assert_eq!(n, 2, "form {form:?}");
    }

    /// Reference RFC 4648 base32 for the tests, one bit at a time.
    fn base32_ref(data: &[u8]) -> String {
        let bits: String = data.iter().map(|b| format!("{b:08b}")).collect();
        bits.as_bytes()
            .chunks(5)
            .map(|c| {
                let mut v = 0usize;
                for i in 0..5 {
                    v = v * 2 + usize::from(c.get(i) == Some(&b'1'));
                }
                char::from(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"[v])
            })
            .collect()
    }

    #[test]
    fn every_encoding_of_the_secret_is_scrubbed_and_counted() {
        let r = Redactor::new(SECRET, &[b"Bearer s3cr3t/+token=="]);
        let b64 = STANDARD.encode(SECRET);
        let url = percent_encode(SECRET);
        let body = format!("auth=Bearer s3cr3t/+token== raw=s3cr3t/+token== b64={b64} q={url}");
        let (out, n) = scrub_text(&r, &body);
        assert!(!out.contains("s3cr3t"), "{out}");
        assert!(!out.contains(&b64));
        assert_eq!(n, 4);
    }

    #[test]
    fn short_values_are_not_scrubbed_from_results() {
        let r = Redactor::new(b"ab", &[]);
        assert_eq!(r.scrub(b"abcabc"), (b"abcabc".to_vec(), 0));
        for form in ["AB", "ba", "6162", "YWI", "%61%62", "\\u0061b", "MFRA"] {
            assert_eq!(r.scrub(form.as_bytes()), (form.as_bytes().to_vec(), 0));
        }
    }

    // Regression: issue 10
    #[test]
    fn hex_in_any_case_is_scrubbed() {
        let r = Redactor::new(TOKEN.as_bytes(), &[]);
        let lower = hex::encode(TOKEN);
        assert_scrubs(&r, &lower);
        assert_scrubs(&r, &lower.to_uppercase());
        let mixed: String = lower
            .chars()
            .enumerate()
            .map(|(i, c)| {
                if i % 3 == 0 {
                    c.to_ascii_uppercase()
                } else {
                    c
                }
            })
            .collect();
        assert_scrubs(&r, &mixed);
        // Inside a longer hex dump, at a byte boundary.
        let dump = hex::encode(format!("id=7;{TOKEN};end"));
        let (out, n) = scrub_text(&r, &dump);
        assert_eq!(n, 1, "{out}");
        assert!(!out.contains(&lower), "{out}");
    }

    // Regression: issue 10
    #[test]
    fn the_raw_secret_in_another_case_or_reversed_is_scrubbed() {
        let r = Redactor::new(TOKEN.as_bytes(), &[]);
        assert_scrubs(&r, &TOKEN.to_uppercase());
        assert_scrubs(&r, "PsTn-CaNaRy-7F3A9C1E5B");
        let reversed: String = TOKEN.chars().rev().collect();
        assert_scrubs(&r, &reversed);
        assert_scrubs(&r, &reversed.to_uppercase());
    }

    // Regression: issue 10
    #[test]
    fn base64_at_every_byte_offset_inside_a_longer_blob_is_scrubbed() {
        let r = Redactor::new(SECRET, &[]);
        let n = SECRET.len();
        for prefix in 0..7usize {
            for suffix in 0..4usize {
                let mut plain = b"Xy!Zw?Q".get(..prefix).unwrap().to_vec();
                plain.extend_from_slice(SECRET);
                plain.extend_from_slice(b"#tail".get(..suffix).unwrap());
                for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
                    let blob = engine.encode(&plain);
                    let body = format!("data: {blob}\n");
                    let (out, count) = scrub_text(&r, &body);
                    assert_eq!(count, 1, "prefix {prefix} suffix {suffix}: {out}");
                    // What survives of the blob: at most the characters the secret
                    // shares with its neighbours, plus theirs and padding.
                    let kept = out.len() - MARK.len() - "data: \n".len();
                    let covered = blob.len() - kept;
                    assert!(
                        covered >= (8 * n) / 6 - 1,
                        "prefix {prefix} suffix {suffix}: {blob} -> {out}"
                    );
                }
            }
        }
    }

    // Regression: issue 10
    #[test]
    fn base32_at_every_byte_offset_in_any_case_is_scrubbed() {
        let r = Redactor::new(TOKEN.as_bytes(), &[]);
        for prefix in 0..6usize {
            let mut plain = b"abcde".get(..prefix.min(5)).unwrap().to_vec();
            plain.extend_from_slice(TOKEN.as_bytes());
            plain.extend_from_slice(b"!!");
            let blob = base32_ref(&plain);
            for text in [blob.clone(), blob.to_lowercase()] {
                let (out, n) = scrub_text(&r, &format!("k={text};"));
                assert_eq!(n, 1, "prefix {prefix}: {text} -> {out}");
                assert!(out.len() < 16 + MARK.len(), "prefix {prefix}: {out}");
            }
        }
        assert_scrubs(&r, &base32_ref(TOKEN.as_bytes()));
    }

    // Regression: issue 10
    #[test]
    fn json_escapes_mixed_with_raw_characters_are_scrubbed() {
        let r = Redactor::new(SECRET, &[]);
        let every: String = SECRET.iter().map(|b| format!("\\u{b:04x}")).collect();
        assert_scrubs(&r, &every);
        assert_scrubs(&r, &every.to_uppercase().replace("\\U", "\\u"));
        // Raw and escaped characters mixed, `/` as the short escape a JSON encoder may use.
        assert_scrubs(&r, "s\\u0033cr3t\\/+t\\u006Fken\\u003d=");
        assert_scrubs(&r, "s3cr3t\\/+token==");
        assert_scrubs(&r, "\\x73\\x33cr3t/+token==");
        // Inside a JSON document, at several offsets.
        for pad in 0..4 {
            let doc = format!(
                "{{\"pad\":\"{}\",\"echo\":\"s3cr3t\\/+\\u0074oken==\"}}",
                "x".repeat(pad)
            );
            let (out, n) = scrub_text(&r, &doc);
            assert_eq!(n, 1, "{out}");
            assert!(out.ends_with("\"echo\":\"[REDACTED]\"}"), "{out}");
        }
    }

    // Regression: issue 10
    #[test]
    fn non_ascii_secrets_are_scrubbed_from_json_code_points_and_surrogate_pairs() {
        let secret = "pässwörd-🔑-42";
        let r = Redactor::new(secret.as_bytes(), &[]);
        assert_scrubs(&r, secret);
        assert_scrubs(&r, "p\\u00e4ssw\\u00F6rd-\\ud83d\\udd11-42");
        let every: String = secret
            .encode_utf16()
            .map(|u| format!("\\u{u:04X}"))
            .collect();
        assert_scrubs(&r, &every);
        assert_scrubs(&r, &percent_encode(secret.as_bytes()));
        assert_scrubs(&r, "p&#228;ssw&#xF6;rd-&#x1F511;-42");
    }

    // Regression: issue 10
    #[test]
    fn percent_encoding_of_some_or_all_bytes_in_any_case_is_scrubbed() {
        let r = Redactor::new(SECRET, &[]);
        let upper: String = SECRET.iter().map(|b| format!("%{b:02X}")).collect();
        assert_scrubs(&r, &upper);
        assert_scrubs(&r, &upper.to_lowercase());
        assert_scrubs(&r, &percent_encode(SECRET));
        assert_scrubs(&r, "s3%63r3t%2f%2Bto%6Ben%3D%3d");
        // Percent-encoded base64, as a query parameter would carry it.
        let b64 = STANDARD.encode(SECRET);
        let escaped: String = b64.bytes().map(|b| format!("%{b:02X}")).collect();
        assert_scrubs(&r, &escaped);
    }

    // Regression: issue 10
    #[test]
    fn html_character_references_are_scrubbed() {
        let r = Redactor::new(b"a<b>&\"c'd", &[]);
        assert_scrubs(&r, "a&lt;b&gt;&amp;&quot;c&apos;d");
        assert_scrubs(&r, "a&#60;b&#x3E;&amp;&#34;c&#39;d");
    }

    // Regression: issue 10
    #[test]
    fn overlapping_forms_count_once_and_separate_echoes_count_each() {
        let r = Redactor::new(TOKEN.as_bytes(), &[format!("Bearer {TOKEN}").as_bytes()]);
        let (out, n) = scrub_text(&r, &format!("Bearer {TOKEN}"));
        assert_eq!((out.as_str(), n), ("[REDACTED]", 1));
        let (out, n) = scrub_text(&r, &format!("{TOKEN}{TOKEN} {}", TOKEN.to_uppercase()));
        assert_eq!(n, 3, "{out}");
        // A form that starts inside another form's occurrence is still covered.
        let reversed: String = TOKEN.chars().rev().collect();
        let joined = format!("{}{}", reversed, &TOKEN[1..]);
        let (out, n) = scrub_text(&r, &format!("<{joined}>"));
        assert_eq!(out, "<[REDACTED]>");
        assert_eq!(n, 1);
    }

    // Regression: issue 10
    #[test]
    fn an_escaped_echo_across_a_piece_boundary_of_a_large_body_is_scrubbed() {
        let r = Redactor::new(TOKEN.as_bytes(), &[]);
        let escaped: String = TOKEN.bytes().map(|b| format!("%{b:02x}")).collect();
        // Dense escapes everywhere, so the whole body is one decoded region.
        let filler = "%20a".repeat(PIECE / 4 + 7);
        for shift in [0usize, 1, 2, 30, 60] {
            let body = format!("{}{escaped}{filler}{escaped}", &filler[..PIECE - shift]);
            let (out, n) = scrub_text(&r, &body);
            assert_eq!(n, 2, "shift {shift}");
            assert!(!out.contains(&escaped));
        }
    }

    // Regression: issue 10
    #[test]
    fn a_key_and_its_lines_are_scrubbed_whole_raw_and_line_by_line_encoded() {
        let lines = [
            "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",
            "QyNTUxOQAAACDx0Jh8cBV5mY0sQm1kQ0mZ3m9lYvJ2V0bXq1l9m3d6PwAAAJg1x2yBNcds",
        ];
        let key = format!(
            "-----BEGIN OPENSSH PRIVATE KEY-----\n{}\n{}\n-----END OPENSSH PRIVATE KEY-----\n",
            lines[0], lines[1]
        );
        let trimmed = key.trim().to_string();
        let r = Redactor::new(
            key.as_bytes(),
            &[lines[0].as_bytes(), lines[1].as_bytes(), trimmed.as_bytes()],
        );
        assert_eq!(scrub_text(&r, &key), ("[REDACTED]".to_string(), 1));
        for encoded in [
            hex::encode(&key),
            STANDARD.encode(&key),
            base32_ref(key.as_bytes()).to_lowercase(),
            key.chars().rev().collect(),
            percent_encode(key.as_bytes()),
        ] {
            let (out, n) = scrub_text(&r, &encoded);
            assert!(n >= 1, "{out}");
            for line in lines {
                let (_, left) = Redactor::new(line.as_bytes(), &[]).scrub(out.as_bytes());
                assert_eq!(left, 0, "a line survived in {out}");
            }
        }
    }

    #[test]
    fn unrelated_text_is_left_alone() {
        let r = Redactor::new(TOKEN.as_bytes(), &[format!("Bearer {TOKEN}").as_bytes()]);
        let other = "pstn-canary-00000000";
        let text = format!(
            "{{\"msg\":\"100% done\\n\\\"ok\\\" \\u00e9 &amp; &#65;\",\"blob\":\"{}\",\
             \"hex\":\"{}\",\"b32\":\"{}\",\"q\":\"{}\",\"near\":\"{other}\"}}",
            STANDARD.encode(format!("unrelated {other} bytes")),
            hex::encode(other),
            base32_ref(other.as_bytes()),
            percent_encode(other.as_bytes()),
        )
        .repeat(50);
        let (out, n) = scrub_text(&r, &text);
        assert_eq!(n, 0);
        assert_eq!(out, text);
        assert_eq!(r.scrub(b""), (Vec::new(), 0));
    }
}
