//! Showing untrusted text to a person: request bodies, headers and commands an agent
//! wrote are rendered so that nothing in them can hide or disguise what is shown.
//! Control characters, format characters (bidirectional overrides, zero-width and tag
//! characters, the soft hyphen), line and paragraph separators, spaces other than U+0020,
//! invisible letters (Hangul fillers), variation selectors and combining marks that do
//! not sit on a non-ASCII letter become visible escapes (`\n`, `\x1b`, `\u{202e}`); in a
//! word that mixes scripts (Latin with Cyrillic look-alikes), every letter not of the
//! word's main script is escaped too; invalid UTF-8 becomes `\xNN`.

use serde::Serialize;
use unicode_general_category::{GeneralCategory, get_general_category};
use unicode_script::{Script, UnicodeScript};

/// Letters that render as nothing: the Hangul fillers, the Khmer inherent vowels and the
/// braille blank. They are letters by category, so the category test alone keeps them.
fn is_invisible_letter(c: char) -> bool {
    matches!(
        c,
        '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}' | '\u{2800}' | '\u{3164}' | '\u{FFA0}'
    )
}

/// Marks that never change a glyph a person could read: the combining grapheme joiner,
/// the Mongolian free variation selectors and the variation selectors.
fn is_selector(c: char) -> bool {
    matches!(
        c,
        '\u{034F}' | '\u{180B}'..='\u{180F}' | '\u{FE00}'..='\u{FE0F}' | '\u{E0100}'..='\u{E01EF}'
    )
}

fn is_mark(c: char) -> bool {
    matches!(
        get_general_category(c),
        GeneralCategory::NonspacingMark | GeneralCategory::EnclosingMark
    )
}

/// Whether `c` is escaped wherever it stands: what is invisible, lays out the text around
/// it, or renders as whatever the font decides.
fn always_escaped(c: char) -> bool {
    use GeneralCategory as G;
    if c.is_ascii() {
        return c.is_ascii_control();
    }
    match get_general_category(c) {
        G::Control
        | G::Format
        | G::LineSeparator
        | G::ParagraphSeparator
        | G::SpaceSeparator
        | G::PrivateUse
        | G::Unassigned
        | G::Surrogate => true,
        _ => is_invisible_letter(c) || is_selector(c),
    }
}

/// More combining marks than this on one letter are escaped from the next on (stacked
/// marks can paint over neighbouring text; no script needs more than a few).
const MAX_MARKS_PER_LETTER: usize = 2;

/// Scripts that legitimately share words (Japanese mixes kanji and kana, Korean hanja
/// and hangul) count as one.
fn script_group(s: Script) -> Script {
    match s {
        Script::Hiragana | Script::Katakana | Script::Hangul | Script::Bopomofo => Script::Han,
        other => other,
    }
}

/// A letter's script for the mixed-script check; `None` for what every script shares
/// (digits, punctuation, marks).
fn letter_script(c: char) -> Option<Script> {
    match c.script() {
        Script::Common | Script::Inherited | Script::Unknown => None,
        s => Some(script_group(s)),
    }
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || is_mark(c)
}

/// The script a word's letters should all share, and whether some do not: Latin when the
/// word has Latin letters (the look-alikes are what is escaped), else its first letter's.
fn word_script(word: &str) -> Option<Script> {
    let mut first = None;
    let mut latin = false;
    let mut mixed = false;
    for s in word.chars().filter_map(letter_script) {
        latin |= s == Script::Latin;
        match first {
            None => first = Some(s),
            Some(f) if f != s => mixed = true,
            Some(_) => {}
        }
    }
    if !mixed {
        return None;
    }
    if latin { Some(Script::Latin) } else { first }
}

fn push_escaped(out: &mut String, c: char, escape: bool) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\\' => out.push_str("\\\\"),
        c if (c as u32) < 0x20 || c == '\u{7f}' => {
            out.push_str(&format!("\\x{:02x}", c as u32));
        }
        c if escape => out.push_str(&format!("\\u{{{:04x}}}", c as u32)),
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
    /// Adds `c`, escaped when `escape` says so (controls always are); `false` once the
    /// limit is reached.
    fn push(&mut self, c: char, escape: bool) -> bool {
        if self.chars >= self.max {
            return false;
        }
        let before = self.out.len();
        push_escaped(&mut self.out, c, escape);
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

    /// Adds valid text, word by word; `false` once the limit is reached.
    fn push_text(&mut self, text: &str) -> bool {
        if text.is_ascii() {
            return text.chars().all(|c| self.push(c, false));
        }
        let mut rest = text;
        while !rest.is_empty() {
            let word_len = rest
                .char_indices()
                .find(|&(_, c)| !is_word_char(c))
                .map_or(rest.len(), |(i, _)| i);
            let (word, after) = rest.split_at(word_len);
            if !self.push_word(word) {
                return false;
            }
            let Some(c) = after.chars().next() else { break };
            if !self.push(c, always_escaped(c)) {
                return false;
            }
            rest = &after[c.len_utf8()..];
        }
        true
    }

    fn push_word(&mut self, word: &str) -> bool {
        // Only the part that can still be shown decides (a long word is cut anyway).
        let shown = word
            .char_indices()
            .nth(self.max.saturating_sub(self.chars).saturating_add(1))
            .map_or(word, |(i, _)| &word[..i]);
        let main = word_script(shown);
        let mut base: Option<char> = None;
        let mut marks = 0usize;
        for c in shown.chars() {
            let escape = if is_mark(c) {
                marks += 1;
                is_selector(c)
                    || marks > MAX_MARKS_PER_LETTER
                    || !base.is_some_and(|b| !b.is_ascii() && b.is_alphabetic())
            } else {
                marks = 0;
                base = Some(c);
                always_escaped(c) || main.is_some_and(|m| letter_script(c).is_some_and(|s| s != m))
            };
            if !self.push(c, escape) {
                return false;
            }
        }
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
        if !out.push_text(chunk.valid()) {
            return (out.out, true);
        }
        for b in chunk.invalid() {
            if !out.push_byte(*b) {
                return (out.out, true);
            }
        }
    }
    (out.out, false)
}

/// `text` with every character escaped that could hide, disguise or reorder it.
pub fn escape_text(text: &str) -> String {
    escape_bytes(text.as_bytes(), usize::MAX).0
}

/// What an approval card shows of a request body (or an SSH command's stdin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(deny_unknown_fields)]
pub struct BodyPreview {
    #[cfg_attr(feature = "ts", ts(type = "number"))]
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

/// One request header as an approval card shows it: the name and the start of the value
/// escaped, with the value's full length and digest so a cut value is still bound to
/// exactly what is sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(deny_unknown_fields)]
pub struct HeaderPreview {
    pub name: String,
    /// The first [`HEADER_PREVIEW_CHARS`] characters of the value, escaped.
    pub value: String,
    /// The value's length in bytes.
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub size: u64,
    /// blake3 of the exact value bytes, lowercase hex.
    pub digest: String,
    pub truncated: bool,
    /// Why this header changes what the request means (a method override, forwarding or
    /// identity, a cookie); the card lists these first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flag: Option<String>,
}

/// How much of one header value a card shows: enough for any ordinary value, short enough
/// that a padded header cannot push the next one off the card.
pub const HEADER_PREVIEW_CHARS: usize = 256;

impl HeaderPreview {
    pub fn of(name: &str, value: &[u8], flag: Option<String>) -> Self {
        let (shown, truncated) = escape_bytes(value, HEADER_PREVIEW_CHARS);
        HeaderPreview {
            name: escape_text(name),
            value: shown,
            size: value.len() as u64,
            digest: blake3::hash(value).to_hex().to_string(),
            truncated,
            flag,
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

    // Regression: issue 26 (item 6): each class came through raw.
    #[test]
    fn line_and_paragraph_separators_are_escaped() {
        assert_eq!(escape_text("a\u{2028}b\u{2029}c"), "a\\u{2028}b\\u{2029}c");
    }

    #[test]
    fn a_soft_hyphen_cannot_hide_inside_a_file_name() {
        assert_eq!(escape_text("./deploy\u{ad}.sh"), "./deploy\\u{00ad}.sh");
    }

    #[test]
    fn hangul_fillers_and_other_blank_letters_are_escaped() {
        assert_eq!(
            escape_text("x\u{3164}y\u{115f}z\u{1160}\u{ffa0}\u{2800}"),
            "x\\u{3164}y\\u{115f}z\\u{1160}\\u{ffa0}\\u{2800}"
        );
    }

    #[test]
    fn tag_characters_are_escaped() {
        // "hi" spelled in the invisible tag block (an ASCII smuggling carrier).
        assert_eq!(
            escape_text("ok\u{e0001}\u{e0068}\u{e0069}\u{e007f}"),
            "ok\\u{e0001}\\u{e0068}\\u{e0069}\\u{e007f}"
        );
    }

    #[test]
    fn the_combining_grapheme_joiner_and_variation_selectors_are_escaped() {
        assert_eq!(escape_text("a\u{34f}b"), "a\\u{034f}b");
        assert_eq!(escape_text("ok\u{fe0f}"), "ok\\u{fe0f}");
        assert_eq!(escape_text("ok\u{e0100}"), "ok\\u{e0100}");
        // Even on a letter that takes marks.
        assert_eq!(escape_text("é\u{fe00}"), "é\\u{fe00}");
    }

    #[test]
    fn combining_marks_on_ascii_or_stacked_are_escaped_but_real_text_stays() {
        // An overlay on an ASCII letter changes how it reads.
        assert_eq!(escape_text("pay\u{338}ee"), "pay\\u{0338}ee");
        assert_eq!(escape_text("e\u{301}"), "e\\u{0301}");
        // A mark with nothing under it.
        assert_eq!(escape_text(" \u{301}x"), " \\u{0301}x");
        // Stacked marks past the second.
        assert_eq!(
            escape_text("ё\u{301}\u{302}\u{303}"),
            "ё\u{301}\u{302}\\u{0303}"
        );
        // Scripts that write with marks read as they are.
        assert_eq!(escape_text("हिन्दी"), "हिन्दी");
        assert_eq!(escape_text("naïve café"), "naïve café");
    }

    #[test]
    fn spaces_other_than_the_ascii_space_are_escaped() {
        assert_eq!(
            escape_text("a\u{a0}b\u{2009}c\u{3000}d"),
            "a\\u{00a0}b\\u{2009}c\\u{3000}d"
        );
    }

    #[test]
    fn private_use_and_unassigned_characters_are_escaped() {
        assert_eq!(escape_text("a\u{e000}b\u{378}"), "a\\u{e000}b\\u{0378}");
    }

    #[test]
    fn look_alike_letters_in_a_mixed_script_word_are_escaped() {
        // Cyrillic а and о in a Latin word.
        assert_eq!(
            escape_text("p\u{430}yp\u{430}l.com"),
            "p\\u{0430}yp\\u{0430}l.com"
        );
        assert_eq!(escape_text("g\u{43e}\u{43e}gle"), "g\\u{043e}\\u{043e}gle");
        // Greek omicron in a Latin word.
        assert_eq!(escape_text("r\u{3bf}\u{3bf}t"), "r\\u{03bf}\\u{03bf}t");
        // Whole words in one script stay as they are, side by side.
        assert_eq!(escape_text("paypal привет ελλάδα"), "paypal привет ελλάδα");
        // Japanese mixes kanji and kana in one word.
        assert_eq!(escape_text("東京タワーへ"), "東京タワーへ");
    }

    #[test]
    fn a_cut_preview_never_splits_an_escape_and_counts_escapes() {
        let text = "\u{ad}".repeat(100);
        let (shown, cut) = escape_bytes(text.as_bytes(), 20);
        assert!(cut);
        assert_eq!(shown, "\\u{00ad}".repeat(3));
    }

    #[test]
    fn a_header_preview_binds_the_whole_value_and_shows_its_start() {
        let pad = vec![b'A'; 60 * 1024];
        let h = HeaderPreview::of("x-pad", &pad, None);
        assert!(h.truncated);
        assert_eq!(h.value.len(), HEADER_PREVIEW_CHARS);
        assert_eq!(h.size, 60 * 1024);
        assert_eq!(h.digest, blake3::hash(&pad).to_hex().to_string());
        let short = HeaderPreview::of("x-do", b"wire-transfer", None);
        assert!(!short.truncated);
        assert_eq!(short.value, "wire-transfer");
    }
}
