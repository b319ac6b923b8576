//! The daemon's input guard: what the MCP layer reads from an agent connection.
//!
//! Lines longer than [`MAX_LINE`] or nested deeper than [`MAX_DEPTH`] are dropped here
//! unparsed: the MCP layer would drop them too (its own line limit; serde_json's
//! recursion limit), this only keeps them from being parsed at all. The bridge never
//! sends either kind; clients that talk to the socket directly might. Every delivery
//! acknowledgement passed on is counted, so that a closing connection can wait until the
//! session has handled each one.
//!
//! A bridge's report of the agent that started it ([`BRIDGE_REPORT`]) is taken from the
//! line right after the connection's `initialize` request (or from its first line) and
//! put where the session reads it; it never reaches the MCP layer. A malformed one is
//! dropped. No later line is ever taken as a report.
//!
//! The guard is a reader the MCP layer reads through, not a task of its own: a line goes
//! from the socket to the MCP layer's buffer in the same poll, with no pipe between two
//! tasks and no wake-up to hand it across.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use rmcp::model::{ClientJsonRpcMessage, ClientNotification, JsonRpcMessage};
use tokio::io::{AsyncRead, ReadBuf};

use postern_broker::budget::ByteBudget;
use postern_broker::provenance::BridgeReport;

use crate::server::{BRIDGE_REPORT, DELIVERED};

/// Bytes read from the connection at a time.
const READ_CHUNK: usize = 16 * 1024;
/// The unfinished lines of every connection together: a line that would take more is
/// dropped like an over-long one (issue 26: 300 connections each holding an unfinished
/// 15 MiB line took the daemon to 4.8 GB). Eight lines at the full limit fit at once.
pub(crate) const MAX_PENDING_BYTES: usize = 8 * MAX_LINE;
/// A buffer grown past this for one large line is let go once the line has passed, so an
/// idle connection does not keep a large line's memory.
const KEEP_CAPACITY: usize = 64 * 1024;

/// What the unfinished lines of all connections hold.
static PENDING: ByteBudget = ByteBudget::new(MAX_PENDING_BYTES);

/// A connection's input as the MCP layer may see it: complete lines, each ending in a
/// newline, with the over-long and over-nested ones left out.
pub(crate) struct GuardedInput<R> {
    inner: R,
    /// Bytes read from the connection; `raw[at..filled]` is not looked at yet.
    raw: Box<[u8]>,
    at: usize,
    filled: usize,
    /// The line being gathered (never more than `max` bytes); its length is held in
    /// `budget`.
    line: Vec<u8>,
    budget: &'static ByteBudget,
    max: usize,
    /// Inside a line already found too long: bytes up to its newline are dropped.
    discarding: bool,
    /// A line that passed, with its newline; `out[sent..]` is still to be handed on.
    out: Vec<u8>,
    sent: usize,
    /// The connection ended (or failed): nothing more will be read from it.
    ended: bool,
    acks: Arc<Acks>,
    /// Where the bridge report goes, while it may still come: before the first line, and
    /// right after a first line that is an `initialize` request.
    report: Option<Arc<OnceLock<BridgeReport>>>,
    /// Complete lines looked at so far (up to 2: all the report rule needs).
    lines: u8,
}

impl<R> GuardedInput<R> {
    pub(crate) fn new(inner: R, acks: Arc<Acks>) -> Self {
        Self::with_limit(inner, acks, MAX_LINE)
    }

    fn with_limit(inner: R, acks: Arc<Acks>, max: usize) -> Self {
        Self::within(inner, acks, max, &PENDING)
    }

    fn within(inner: R, acks: Arc<Acks>, max: usize, budget: &'static ByteBudget) -> Self {
        GuardedInput {
            inner,
            raw: vec![0; READ_CHUNK].into_boxed_slice(),
            at: 0,
            filled: 0,
            line: Vec::new(),
            budget,
            max,
            discarding: false,
            out: Vec::new(),
            sent: 0,
            ended: false,
            acks,
            report: None,
            lines: 0,
        }
    }

    /// Takes a bridge report from the connection's first line into `slot`.
    pub(crate) fn taking_report(mut self, slot: Arc<OnceLock<BridgeReport>>) -> Self {
        self.report = Some(slot);
        self
    }

    /// Takes the unread bytes up to the end of the current line (or all of them).
    fn scan(&mut self) {
        let available = &self.raw[self.at..self.filled];
        let newline = memchr::memchr(b'\n', available);
        let content = newline.unwrap_or(available.len());
        let consumed = newline.map_or(available.len(), |at| at + 1);
        if self.discarding {
            self.discarding = newline.is_none();
        } else if self.line.len().saturating_add(content) > self.max || !self.budget.take(content) {
            // Too long, or more than all connections may hold at once: dropped whole.
            // It was a line: none after it is the first.
            self.report = None;
            self.drop_line();
            self.discarding = newline.is_none();
        } else {
            let available = &self.raw[self.at..self.filled];
            self.line.extend_from_slice(&available[..content]);
            if newline.is_some() {
                self.pass_line();
            }
        }
        self.at += consumed;
    }

    /// Lets go of the gathered line and gives its bytes back to the budget.
    fn drop_line(&mut self) {
        self.budget.give_back(self.line.len());
        self.line.clear();
        if self.line.capacity() > KEEP_CAPACITY {
            self.line = Vec::new();
        }
    }

    /// The gathered line is complete: it goes on, unless it nests too deep.
    fn pass_line(&mut self) {
        self.lines = self.lines.saturating_add(1);
        let slot = self.report.take();
        if let Some(slot) = &slot
            && let Some(report) = bridge_report(&self.line)
        {
            // Taken (or dropped as malformed), never handed on.
            if let Ok(report) = report {
                let _ = slot.set(report);
            }
            self.drop_line();
            return;
        }
        // The report may still follow a first line that is the initialize request.
        if self.lines == 1 && is_initialize(&self.line) {
            self.report = slot;
        }
        if !nesting_exceeds(&self.line, MAX_DEPTH) {
            if is_ack(&self.line) {
                self.acks.forwarded.fetch_add(1, Ordering::SeqCst);
            }
            // `out` is empty here: its buffer is reused for the next line. The budget
            // counts unfinished lines only: this one is the MCP layer's from here on.
            self.budget.give_back(self.line.len());
            std::mem::swap(&mut self.line, &mut self.out);
            self.out.push(b'\n');
        }
        self.drop_line();
    }

    /// The connection ended: a last line without its newline still goes on (as the
    /// bridge's reader treats it); a read error drops it.
    fn end(&mut self, failed: bool) {
        self.ended = true;
        if !failed && !self.discarding && !self.line.is_empty() {
            self.pass_line();
        }
        self.drop_line();
        self.line = Vec::new();
        self.discarding = false;
    }
}

impl<R> Drop for GuardedInput<R> {
    fn drop(&mut self) {
        self.budget.give_back(self.line.len());
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for GuardedInput<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.sent < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.sent);
                buf.put_slice(&this.out[this.sent..this.sent + n]);
                this.sent += n;
                if this.sent == this.out.len() {
                    this.out.clear();
                    if this.out.capacity() > KEEP_CAPACITY {
                        this.out = Vec::new();
                    }
                    this.sent = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.at < this.filled {
                this.scan();
                continue;
            }
            if this.ended {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = ReadBuf::new(&mut this.raw);
            let read = ready!(Pin::new(&mut this.inner).poll_read(cx, &mut chunk));
            let n = chunk.filled().len();
            (this.at, this.filled) = (0, n);
            match read {
                Ok(()) if n > 0 => {}
                // The end of the connection, or an error, which ends it the same way
                // for the MCP layer.
                Ok(()) => this.end(false),
                Err(_) => this.end(true),
            }
        }
    }
}

/// Whether `line` is an MCP `initialize` request.
fn is_initialize(line: &[u8]) -> bool {
    if memchr::memmem::find(line, b"initialize").is_none() {
        return false;
    }
    serde_json::from_slice::<serde_json::Value>(line).is_ok_and(|v| {
        v.get("method").and_then(|m| m.as_str()) == Some("initialize") && v.get("id").is_some()
    })
}

/// `None` when `line` is not a bridge report; else the report, or why it was not taken.
fn bridge_report(line: &[u8]) -> Option<Result<BridgeReport, String>> {
    // Most lines are ruled out without being parsed.
    memchr::memmem::find(line, BRIDGE_REPORT.as_bytes())?;
    let value: serde_json::Value = serde_json::from_slice(line).ok()?;
    if value.get("method").and_then(|m| m.as_str()) != Some(BRIDGE_REPORT)
        || value.get("id").is_some()
    {
        return None;
    }
    let report = value
        .get("params")
        .cloned()
        .ok_or_else(|| "no params".to_string())
        .and_then(|params| {
            serde_json::from_value::<BridgeReport>(params).map_err(|e| e.to_string())
        })
        .and_then(|report| {
            report
                .validate()
                .map(|()| report)
                .map_err(|e| e.to_string())
        });
    Some(report)
}

/// Whether `line` is a delivery acknowledgement the MCP layer will hand to the session:
/// what it parses as is what [`crate::daemon`]'s session counts as handled.
pub(crate) fn is_ack(line: &[u8]) -> bool {
    // Without an escape, a method named DELIVERED is spelled out in the line's bytes:
    // most lines (every tool call) are ruled out without being parsed.
    if !line.contains(&b'\\') && memchr::memmem::find(line, DELIVERED.as_bytes()).is_none() {
        return false;
    }
    matches!(
        serde_json::from_slice::<ClientJsonRpcMessage>(line),
        Ok(JsonRpcMessage::Notification(n))
            if matches!(&n.notification, ClientNotification::CustomNotification(c) if c.method == DELIVERED)
    )
}

/// Longest line accepted (16 MiB, bytes before the newline). A longer line is discarded
/// as it streams in, never buffered, and answered with Invalid Request.
pub const MAX_LINE: usize = 16 * 1024 * 1024;

/// Deepest nesting of arrays and objects accepted in one message, the same as
/// serde_json's recursion limit. A linear scan checks it before any parser sees the line,
/// so the answer ("nested too deep") is precise and no parser's recursion is relied on;
/// serde_json's limit (in force by default, even with its `unbounded_depth` feature,
/// which only adds an opt-out method nothing here calls) is the second lock.
pub const MAX_DEPTH: usize = 128;

/// Whether `bytes` nest arrays or objects deeper than `limit` (brackets inside strings
/// do not count). A linear scan with no recursion, so any input is safe to check.
pub fn nesting_exceeds(bytes: &[u8], limit: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Delivery acknowledgements on one connection: passed on to the session, and handled.
#[derive(Default)]
pub(crate) struct Acks {
    /// Read from the connection and passed on to the MCP layer ([`GuardedInput`]).
    pub(crate) forwarded: AtomicUsize,
    pub(crate) handled: AtomicUsize,
    pub(crate) changed: tokio::sync::Notify,
}

impl Acks {
    /// Waits (at most `within`) until every acknowledgement passed on has been handled.
    pub(crate) async fn settled(&self, within: Duration) {
        let _ = tokio::time::timeout(within, async {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if self.handled.load(Ordering::SeqCst) >= self.forwarded.load(Ordering::SeqCst) {
                    return;
                }
                changed.await;
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A connection that hands over its bytes `step` at a time, then fails or ends.
    struct Trickle {
        bytes: Vec<u8>,
        at: usize,
        step: usize,
        fail_at_end: bool,
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let this = self.get_mut();
            if this.at == this.bytes.len() && this.fail_at_end {
                return Poll::Ready(Err(std::io::ErrorKind::ConnectionReset.into()));
            }
            let n = this
                .step
                .min(buf.remaining())
                .min(this.bytes.len() - this.at);
            buf.put_slice(&this.bytes[this.at..this.at + n]);
            this.at += n;
            Poll::Ready(Ok(()))
        }
    }

    /// What the MCP layer reads from `bytes` sent `step` at a time, read `read` at a
    /// time, and how many acknowledgements were counted.
    fn guarded(bytes: &[u8], step: usize, read: usize, fail_at_end: bool) -> (String, usize) {
        let acks = Arc::new(Acks::default());
        let trickle = Trickle {
            bytes: bytes.to_vec(),
            at: 0,
            step,
            fail_at_end,
        };
        let mut input = GuardedInput::with_limit(trickle, acks.clone(), LIMIT);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let out = runtime.block_on(async {
            let mut out = Vec::new();
            let mut piece = vec![0u8; read];
            loop {
                let n = input.read(&mut piece).await.unwrap();
                if n == 0 {
                    return out;
                }
                out.extend_from_slice(&piece[..n]);
            }
        });
        (
            String::from_utf8(out).unwrap(),
            acks.forwarded.load(Ordering::SeqCst),
        )
    }

    /// The line limit of these tests: room for a line nested one level too deep.
    const LIMIT: usize = 300;

    /// Reads what `input` passes on until the source has nothing more right now.
    fn drain<R: AsyncRead + Unpin>(input: &mut GuardedInput<R>) -> String {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut out = Vec::new();
            let mut piece = [0u8; 64];
            loop {
                let n = input.read(&mut piece).await.unwrap();
                if n == 0 {
                    return String::from_utf8(out).unwrap();
                }
                out.extend_from_slice(&piece[..n]);
            }
        })
    }

    // Regression: issue 26 (item 4): every connection could hold an unfinished line up
    // to the limit, so many connections held gigabytes.
    #[test]
    fn unfinished_lines_of_all_connections_share_one_budget_and_give_it_back() {
        static BUDGET: ByteBudget = ByteBudget::new(250);
        let stalled = |bytes: Vec<u8>| Trickle {
            bytes,
            at: 0,
            step: 1000,
            fail_at_end: false,
        };
        // One connection holds 200 bytes of an unfinished line (its end is not sent).
        let acks = Arc::new(Acks::default());
        let mut first = GuardedInput::within(stalled(Vec::new()), acks.clone(), LIMIT, &BUDGET);
        // The bytes arrive and are scanned; the connection neither ends nor sends the
        // newline (an ended connection would pass its last line).
        first.raw[..200].copy_from_slice(&[b'a'; 200]);
        first.filled = 200;
        first.scan();
        assert_eq!(BUDGET.held(), 200);
        // A second connection's line that would need more than is left is dropped whole,
        // and the next line on it still passes.
        let input = format!("{}\n{PING}\n", "b".repeat(100));
        let mut second =
            GuardedInput::within(stalled(input.into_bytes()), acks.clone(), LIMIT, &BUDGET);
        assert_eq!(drain(&mut second), format!("{PING}\n"));
        assert_eq!(BUDGET.held(), 200, "the dropped line gave its bytes back");
        // The first connection goes away: its bytes come back.
        drop(first);
        assert_eq!(BUDGET.held(), 0);
        let input = format!("{}\n", "c".repeat(100));
        let mut third = GuardedInput::within(stalled(input.into_bytes()), acks, LIMIT, &BUDGET);
        assert_eq!(drain(&mut third), format!("{}\n", "c".repeat(100)));
        assert_eq!(BUDGET.held(), 0, "a line that passed is no longer held");
    }

    const ACK: &str =
        r#"{"jsonrpc":"2.0","method":"notifications/postern/delivered","params":{"id":1}}"#;
    const PING: &str = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

    #[test]
    fn complete_lines_pass_and_long_or_deep_ones_are_dropped_however_the_bytes_arrive() {
        let long = format!("\"{}\"", "x".repeat(LIMIT + 1));
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(deep.len() <= LIMIT);
        let sent = format!("{PING}\n{long}\n{deep}\n\n{ACK}\n{long}{PING}\n{PING}");
        for step in [1, 5, LIMIT, LIMIT + 1, 4096] {
            for read in [1, 3, 8192] {
                let (out, acks) = guarded(sent.as_bytes(), step, read, false);
                assert_eq!(
                    out,
                    format!("{PING}\n\n{ACK}\n{PING}\n"),
                    "step {step}, read {read}"
                );
                assert_eq!(acks, 1, "step {step}, read {read}");
            }
        }
    }

    #[test]
    fn acknowledgements_are_counted_as_they_pass_even_spelled_with_escapes() {
        let escaped = ACK.replace("postern/", r"postern\u002f");
        let sent = format!("{ACK}\n{PING}\n{escaped}\n");
        let acks = Arc::new(Acks::default());
        let mut input = GuardedInput::new(sent.as_bytes(), acks.clone());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut out = String::new();
        runtime.block_on(input.read_to_string(&mut out)).unwrap();
        assert_eq!(out, sent);
        assert_eq!(acks.forwarded.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_last_line_without_newline_passes_at_the_end_but_not_after_a_failure() {
        let (out, _) = guarded(PING.as_bytes(), 7, 16, false);
        assert_eq!(out, format!("{PING}\n"));
        let (out, _) = guarded(format!("{PING}\n{PING}").as_bytes(), 7, 16, true);
        assert_eq!(out, format!("{PING}\n"));
    }

    /// What the guard should pass of `sent`, said line by line: every line (the last one
    /// even without its newline) that is within the limit and not nested too deep, and
    /// how many of them are acknowledgements.
    fn model(sent: &[u8]) -> (Vec<u8>, usize) {
        let mut lines: Vec<&[u8]> = sent.split(|b| *b == b'\n').collect();
        if lines.last().is_some_and(|l| l.is_empty()) {
            lines.pop();
        }
        let passed: Vec<&[u8]> = lines
            .into_iter()
            .filter(|l| l.len() <= LIMIT && !nesting_exceeds(l, MAX_DEPTH))
            .collect();
        let acks = passed.iter().filter(|l| is_ack(l)).count();
        let mut out = Vec::new();
        for line in passed {
            out.extend_from_slice(line);
            out.push(b'\n');
        }
        (out, acks)
    }

    proptest::proptest! {
        #[test]
        fn the_guard_passes_what_a_line_by_line_reading_would(
            pieces in proptest::collection::vec(0usize..7, 0..40),
            step in 1usize..400,
            read in 1usize..400,
            fail_at_end: bool,
        ) {
            let deep = "[".repeat(MAX_DEPTH + 1);
            let long = "x".repeat(LIMIT / 2 + 1);
            let fragments: [&str; 7] = [PING, ACK, "\n", &deep, &long, "]", r"\u002f"];
            let sent: String = pieces.iter().map(|&i| fragments[i]).collect();
            let (out, acks) = guarded(sent.as_bytes(), step, read, fail_at_end);
            // A read error drops the unfinished last line.
            let kept = if fail_at_end {
                &sent[..sent.rfind('\n').map_or(0, |at| at + 1)]
            } else {
                &sent[..]
            };
            let (expected, expected_acks) = model(kept.as_bytes());
            proptest::prop_assert_eq!(out.as_bytes(), &expected[..]);
            proptest::prop_assert_eq!(acks, expected_acks);
        }
    }

    #[test]
    fn only_well_formed_delivery_acknowledgements_are_counted() {
        assert!(is_ack(ACK.as_bytes()));
        assert!(!is_ack(
            br#"{"jsonrpc":"2.0","id":3,"method":"notifications/postern/delivered","params":{}}"#
        ));
        assert!(!is_ack(
            br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#
        ));
        assert!(!is_ack(b"not json"));
        assert!(is_ack(ACK.replace("postern/", r"postern\u002f").as_bytes()));
    }

    /// What the MCP layer reads from `bytes` through a guard taking a bridge report, and
    /// the report it took.
    fn reported(bytes: &[u8]) -> (String, Option<BridgeReport>) {
        let slot = Arc::new(OnceLock::new());
        let mut input = GuardedInput::with_limit(bytes, Arc::new(Acks::default()), LIMIT)
            .taking_report(slot.clone());
        let passed = drain(&mut input);
        (passed, slot.get().cloned())
    }

    fn report_line(parent_pid: u32, hex: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","method":"{BRIDGE_REPORT}","params":{{"parent_pid":{parent_pid},"parent_executable":"/usr/bin/agent","parent_executable_digest":{{"state":"blake3","hex":"{hex}"}},"bridge_executable":null}}}}"#
        )
    }

    const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#;
    const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

    #[test]
    fn the_bridge_report_after_initialize_or_first_is_taken_and_never_passed_on() {
        let hex = "ab".repeat(32);
        let report = report_line(7, &hex);
        // Where the bridge sends it: right after the initialize request.
        let (passed, taken) = reported(format!("{INIT}\n{report}\n{INITIALIZED}\n").as_bytes());
        assert_eq!(passed, format!("{INIT}\n{INITIALIZED}\n"));
        let taken = taken.unwrap();
        assert_eq!(taken.parent_pid, 7);
        assert_eq!(taken.parent_executable.as_deref(), Some("/usr/bin/agent"));
        // As the connection's first line.
        let (passed, taken) = reported(format!("{report}\n{INIT}\n").as_bytes());
        assert_eq!(passed, format!("{INIT}\n"));
        assert!(taken.is_some());
    }

    #[test]
    fn a_malformed_report_is_dropped_and_a_later_one_is_not_a_report() {
        // A digest that is not one: dropped, not recorded, not passed on.
        let (passed, report) =
            reported(format!("{}\n{INIT}\n", report_line(7, "not-hex")).as_bytes());
        assert_eq!(passed, format!("{INIT}\n"));
        assert!(report.is_none());
        // Anywhere else, a report is an ordinary line for the MCP layer: after a first
        // line that is not the initialize request, or after the line that follows it.
        let later = report_line(8, &"cd".repeat(32));
        for sent in [
            format!("{INITIALIZED}\n{later}\n"),
            format!("{INIT}\n{INITIALIZED}\n{later}\n"),
        ] {
            let (passed, report) = reported(sent.as_bytes());
            assert_eq!(passed, sent);
            assert!(report.is_none(), "{sent}");
        }
        // A first line dropped as too long is still the first line.
        let long = format!("{}\n{later}\n", "x".repeat(LIMIT + 1));
        let (passed, report) = reported(long.as_bytes());
        assert_eq!(passed, format!("{later}\n"));
        assert!(report.is_none());
        // A request naming the method is not a report.
        let request =
            format!(r#"{{"jsonrpc":"2.0","id":3,"method":"{BRIDGE_REPORT}","params":{{}}}}"#);
        let (passed, report) = reported(format!("{request}\n").as_bytes());
        assert_eq!(passed, format!("{request}\n"));
        assert!(report.is_none());
    }
}
