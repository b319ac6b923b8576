//! The agent's input read as lines of raw bytes, never holding more than a limit of one
//! line, and the id found at the start of a line too long to parse, so it is still
//! answered to the request it carried.

use rmcp::model::RequestId;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// One line read from the agent.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// The bytes before the newline (or before EOF, for a last unterminated line).
    Complete(Vec<u8>),
    /// A line longer than the limit; its bytes were discarded as they arrived.
    TooLong,
}

/// Reads lines of raw bytes, never holding more than `max` bytes of one line.
pub struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    max: usize,
    /// Inside a line already reported too long: drop bytes up to its newline.
    discarding: bool,
    /// The first [`HEAD_BYTES`] of the last line reported too long, so its answer can
    /// name the request's id when the line starts with it.
    head: Vec<u8>,
}

/// How much of a too-long line is kept to find its id.
const HEAD_BYTES: usize = 4096;

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    pub fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            buf: Vec::new(),
            max,
            discarding: false,
            head: Vec::new(),
        }
    }

    /// The start of the last line reported [`Line::TooLong`] (at most 4 KiB).
    pub fn too_long_head(&self) -> &[u8] {
        &self.head
    }

    /// The next line; `None` at EOF. An over-long line is reported once, as soon as it
    /// passes the limit; the rest of it is skipped.
    pub async fn next(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let available = self.inner.fill_buf().await?;
            if available.is_empty() {
                self.discarding = false;
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(Line::Complete(std::mem::take(&mut self.buf))));
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let content = newline.unwrap_or(available.len());
            let consumed = newline.map_or(available.len(), |at| at + 1);
            if self.discarding {
                self.discarding = newline.is_none();
                self.inner.consume(consumed);
                continue;
            }
            if self.buf.len().saturating_add(content) > self.max {
                self.head.clear();
                let kept = self.buf.len().min(HEAD_BYTES);
                self.head.extend_from_slice(&self.buf[..kept]);
                let more = (HEAD_BYTES - kept).min(content);
                self.head.extend_from_slice(&available[..more]);
                self.buf = Vec::new();
                self.discarding = newline.is_none();
                self.inner.consume(consumed);
                return Ok(Some(Line::TooLong));
            }
            self.buf.extend_from_slice(&available[..content]);
            self.inner.consume(consumed);
            if newline.is_some() {
                return Ok(Some(Line::Complete(std::mem::take(&mut self.buf))));
            }
        }
    }
}
/// The `id` of a JSON-RPC object whose text starts with `head`, when the id appears (and
/// ends) within it as a top-level member: how a line too long to parse is still answered
/// to the request it carried, so the client does not wait for its own timeout.
pub fn leading_id(head: &[u8]) -> Option<RequestId> {
    let mut depth = 0usize;
    let mut expecting_key = false;
    let mut i = 0;
    while i < head.len() {
        match head[i] {
            b'"' => {
                let end = string_end(head, i)?;
                if depth == 1 && expecting_key && &head[i + 1..end] == b"id" {
                    return id_value(head, end + 1);
                }
                expecting_key = false;
                i = end;
            }
            b'{' | b'[' => {
                depth += 1;
                expecting_key = depth == 1 && head[i] == b'{';
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b',' => expecting_key = depth == 1,
            _ => {}
        }
        i += 1;
    }
    None
}

/// The index of the quote that closes the string opening at `start`.
fn string_end(text: &[u8], start: usize) -> Option<usize> {
    let mut escaped = false;
    for (offset, &b) in text.get(start + 1..)?.iter().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b'"' => return Some(start + 1 + offset),
            _ => {}
        }
    }
    None
}

/// The id value after a member name ending at `after`: `: <string or integer>`, complete
/// within `text`.
fn id_value(text: &[u8], after: usize) -> Option<RequestId> {
    let skip_ws = |mut i: usize| {
        while text.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        i
    };
    let colon = skip_ws(after);
    if text.get(colon) != Some(&b':') {
        return None;
    }
    let start = skip_ws(colon + 1);
    let end = match text.get(start)? {
        b'"' => string_end(text, start)? + 1,
        _ => {
            let len = text[start..]
                .iter()
                .position(|b| !(b.is_ascii_digit() || *b == b'-'))?;
            // The number must end inside what was kept, or it may be cut short, and end
            // as an integer does (`1e300` and `1.5` are not ids MCP takes).
            let end = start + len;
            if !matches!(
                text.get(end),
                Some(b',' | b'}') | Some(b' ' | b'\t' | b'\r')
            ) {
                return None;
            }
            end
        }
    };
    serde_json::from_slice(&text[start..end]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::BufReader;

    #[tokio::test]
    async fn an_over_long_line_is_reported_once_and_the_next_line_is_read_whole() {
        let input: &[u8] = b"short\nxxxxxxxxxxxxxxxxxxxx-long-line\nafter\nxxxxxxxxxxxxxxxx\ntail";
        let mut lines = LineReader::new(BufReader::with_capacity(4, input), 10);
        assert_eq!(
            lines.next().await.unwrap(),
            Some(Line::Complete(b"short".to_vec()))
        );
        assert_eq!(lines.next().await.unwrap(), Some(Line::TooLong));
        assert_eq!(
            lines.next().await.unwrap(),
            Some(Line::Complete(b"after".to_vec()))
        );
        assert_eq!(lines.next().await.unwrap(), Some(Line::TooLong));
        assert_eq!(
            lines.next().await.unwrap(),
            Some(Line::Complete(b"tail".to_vec()))
        );
        assert_eq!(lines.next().await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_line_exactly_at_the_limit_is_accepted_and_a_crlf_is_left_to_the_classifier() {
        let input: &[u8] = b"0123456789\nabc\r\n";
        let mut lines = LineReader::new(BufReader::with_capacity(3, input), 10);
        assert_eq!(
            lines.next().await.unwrap(),
            Some(Line::Complete(b"0123456789".to_vec()))
        );
        assert_eq!(
            lines.next().await.unwrap(),
            Some(Line::Complete(b"abc\r".to_vec()))
        );
        assert_eq!(lines.next().await.unwrap(), None);
    }

    // Regression: issue 26 (item 9): a too-long line was answered with `id: null`, so the
    // client waited for its own timeout.
    #[test]
    fn the_id_at_the_start_of_a_too_long_line_is_found() {
        let id = |text: &str| leading_id(text.as_bytes());
        assert_eq!(
            id(
                r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"arguments":{"body":"AAAA"#
            ),
            Some(RequestId::Number(7))
        );
        assert_eq!(
            id(r#"{ "method" : "tools/call", "id" : "call-\"9\"", "params": {"#),
            Some(RequestId::String("call-\"9\"".into()))
        );
        // Not a top-level id: nested, a value that spells "id", or cut short.
        assert_eq!(id(r#"{"params":{"id":5,"x":"#), None);
        assert_eq!(id(r#"{"method":"id","params":"#), None);
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":12"#), None);
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":"unterminated"#), None);
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":1e300,"method":"ping"#), None);
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"#), None);
        assert_eq!(id(r#"["id",1]"#), None);
    }

    #[tokio::test]
    async fn a_too_long_line_keeps_its_start_for_the_answer() {
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":42,\"pad\":\"{}\"}}\n",
            "x".repeat(100)
        );
        let mut lines = LineReader::new(BufReader::with_capacity(7, line.as_bytes()), 50);
        assert_eq!(lines.next().await.unwrap(), Some(Line::TooLong));
        assert_eq!(
            leading_id(lines.too_long_head()),
            Some(RequestId::Number(42))
        );
    }
}
