//! Showing untrusted text to a person: request bodies and commands an agent wrote are
//! rendered so that nothing in them can hide or disguise what is shown. Control
//! characters, bidirectional overrides and invisible characters become visible escapes
//! (`\n`, `\x1b`, `\u{202e}`), and invalid UTF-8 becomes `\xNN`.

use serde::Serialize;

/// Characters that change how surrounding text is laid out or are invisible: bidi
/// embeddings, overrides and isolates (Trojan Source), marks, zero-width characters and
/// the byte order mark.
fn is_deceptive(c: char) -> bool {
    matches!(
        c,
        '\u{061C}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2069}'
            | '\u{FEFF}'
    )
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\\' => out.push_str("\\\\"),
        c if (c as u32) < 0x20 || c == '\u{7f}' => {
            out.push_str(&format!("\\x{:02x}", c as u32));
        }
        c if c.is_control() || is_deceptive(c) => out.push_str(&format!("\\u{{{:04x}}}", c as u32)),
        c => out.push(c),
    }
}

/// Escaped output cut after a number of characters.
struct Limited {
    out: String,
    chars: usize,
    max: usize,
}

impl Limited {
    /// Adds `c` (escaped); `false` once the limit is reached.
    fn push(&mut self, c: char) -> bool {
        if self.chars >= self.max {
            return false;
        }
        let before = self.out.len();
        push_escaped(&mut self.out, c);
        // Escapes are ASCII; an unescaped character is one character.
        self.chars += if self.out.len() - before == c.len_utf8() && !c.is_ascii() {
            1
        } else {
            self.out.len() - before
        };
        true
    }

    fn push_byte(&mut self, b: u8) -> bool {
        if self.chars >= self.max {
            return false;
        }
        self.out.push_str(&format!("\\x{b:02x}"));
        self.chars += 4;
        true
    }
}

/// `bytes` as visible text, escaping what could hide or reorder content, cut after
/// about `max_chars` output characters (an escape is never split). Returns the text and
/// whether it was cut.
pub fn escape_bytes(bytes: &[u8], max_chars: usize) -> (String, bool) {
    let mut out = Limited {
        out: String::new(),
        chars: 0,
        max: max_chars,
    };
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if !out.push(c) {
                return (out.out, true);
            }
        }
        for b in chunk.invalid() {
            if !out.push_byte(*b) {
                return (out.out, true);
            }
        }
    }
    (out.out, false)
}

/// `text` with every control, bidi and invisible character escaped.
pub fn escape_text(text: &str) -> String {
    escape_bytes(text.as_bytes(), usize::MAX).0
}

/// What an approval card shows of a request body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BodyPreview {
    pub size: u64,
    /// blake3 of the exact body bytes, lowercase hex (the value bound in the fingerprint).
    pub digest: String,
    /// The first [`PREVIEW_CHARS`] characters, escaped.
    pub text: String,
    pub truncated: bool,
}

/// How much of a body a card shows.
pub const PREVIEW_CHARS: usize = 2048;

impl BodyPreview {
    pub fn of(body: &[u8]) -> Self {
        let (text, truncated) = escape_bytes(body, PREVIEW_CHARS);
        BodyPreview {
            size: body.len() as u64,
            digest: blake3::hash(body).to_hex().to_string(),
            text,
            truncated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_bidi_characters_become_visible() {
        let shown = escape_text("rm -rf /\u{202e}txt.exe\u{1b}[2J\r\nok\u{200b}");
        assert_eq!(shown, "rm -rf /\\u{202e}txt.exe\\x1b[2J\\r\\nok\\u{200b}");
    }

    #[test]
    fn invalid_utf8_is_shown_as_bytes() {
        let (shown, cut) = escape_bytes(b"ab\xff\xfecd", 100);
        assert_eq!(shown, "ab\\xff\\xfecd");
        assert!(!cut);
    }

    #[test]
    fn preview_is_cut_and_says_so() {
        let body = vec![b'a'; PREVIEW_CHARS + 10];
        let preview = BodyPreview::of(&body);
        assert!(preview.truncated);
        assert_eq!(preview.text.len(), PREVIEW_CHARS);
        assert_eq!(preview.size, (PREVIEW_CHARS + 10) as u64);
        assert_eq!(preview.digest, blake3::hash(&body).to_hex().to_string());
    }

    #[test]
    fn backslashes_are_escaped_so_escapes_cannot_be_forged() {
        assert_eq!(escape_text("\\u{202e}"), "\\\\u{202e}");
    }
}
