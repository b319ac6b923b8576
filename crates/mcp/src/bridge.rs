//! `postern mcp`: the stdio process an agent's MCP client launches.
//!
//! It relays MCP messages between stdio and the broker's socket, line by line, and after
//! it has written a response to the agent's stdout (and flushed it) it tells the broker
//! with a `notifications/postern/delivered` notification naming the response id. That is
//! the confirmation RESULT_DELIVERED waits for.
//!
//! # What reaches the broker
//! The agent may write any bytes. The bridge reads raw bytes per line, never more than
//! [`MAX_LINE`] of one line, and only well-formed JSON-RPC 2.0 goes on to the broker
//! (see [`classify`]). Everything else is answered here, as JSON-RPC says: -32700 for a
//! line that is not JSON (not UTF-8, truncated, trailing bytes, nested deeper than
//! [`MAX_DEPTH`]), -32600 for JSON that is not a JSON-RPC message (the id echoed when one
//! is readable), -32602 for an MCP method whose params do not fit it. Notifications and
//! responses are never answered; a malformed one is dropped with a line on stderr. Blank
//! lines are framing noise and ignored. The session keeps serving after every one.
//!
//! # How a session ends
//! On stdin EOF the bridge stops reading the agent, keeps relaying the responses it
//! still owes for requests already forwarded (until each is answered or
//! [`DRAIN_TIMEOUT`]), acknowledges them, flushes and shuts down its half of the socket,
//! and only then exits: the last result of a session is recorded as delivered.
//!
//! # Who answers
//! Before it sends a byte, the bridge checks that the server it reached is the broker
//! ([`verify_broker`], unix; issue 26): the server's uid (the kernel's word, SO_PEERCRED
//! or getpeereid) must be the socket file's owner, and every component of the socket
//! path must pass the daemon's walk ([`crate::daemon`]), with the socket's owner trusted
//! for directories (a privilege-separated broker runs as its own user) but never for a
//! symlink or an entry of a shared sticky directory such as /tmp, which must be root's or
//! this user's. Otherwise whoever owns a link or directory on the path could put a
//! listener of their own there and read every call, with its arguments, and answer it.
//! A server that fails the check is treated as no broker: nothing is sent to it. Windows
//! pipes have no path to walk; the daemon creates its pipe as the first instance.
//!
//! # What the bridge says about the agent
//! Right after the agent's `initialize` request it sends the broker a [`BRIDGE_REPORT`]
//! notification: its parent's pid, executable path and blake3, and its own path. The
//! bridge runs as the agent's user and can read what a broker running as another user
//! cannot; the broker records it as a claim beside what it read itself. After the
//! initialize request, not before it: a broker from before the report takes any
//! notification ahead of `initialize` as a broken handshake, and ignores one after it.
//!
//! # With no broker
//! It still answers, as an MCP server whose every tool call returns BROKER_UNAVAILABLE
//! (not_attempted), behind the same line filter. The message says why: no broker
//! listening, this user may not reach the socket, or the server there is not trusted.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rmcp::ErrorData as McpError;
use rmcp::ServerHandler;
use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientJsonRpcMessage, ClientRequest,
    InitializeRequestParams, JsonRpcMessage, ListToolsResult, PaginatedRequestParams, RequestId,
    ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Notify, mpsc};

use postern_broker::provenance::BridgeReport;

pub use crate::input::{MAX_DEPTH, MAX_LINE, nesting_exceeds};
use crate::server::{BRIDGE_REPORT, DELIVERED, REFUSED};
use crate::tools;

/// After stdin closes, how long the bridge waits for responses it still owes.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the last acknowledgements may take to reach the socket.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL_ERROR: i64 = -32603;

const UTF8_BOM: &[u8] = b"\xef\xbb\xbf";

#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("stdio: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Mcp(String),
    #[error(
        "the Postern broker at {0} closed the connection; requests it had not answered were \
         answered with an error (their outcome is in the journal: get_invocation or \
         fetch_result on a new session)"
    )]
    BrokerClosed(String),
}

/// Connects to the broker and relays, or serves the unavailable answer.
pub async fn run(socket: &Path) -> Result<(), BridgeError> {
    match postern_broker::platform::connect(socket).await {
        Ok(stream) => {
            #[cfg(unix)]
            if let Err(why) = verify_broker(socket, &stream) {
                // Closed unused: the server gets nothing from this agent.
                drop(stream);
                return unavailable(untrusted_message(socket, &why), agent_input()).await;
            }
            // One reader of stdin for the session, whoever serves it: a second one would
            // lose what the first had read.
            let mut input = agent_input();
            let report = Some(report_line().await);
            match relay_reporting(stream, &mut input, agent_output(), true, report).await {
                End::BrokerClosed => Err(BridgeError::BrokerClosed(socket.display().to_string())),
                // The agent keeps an MCP server that says why, as with no broker.
                End::Refused(message) => unavailable(message, input).await,
                End::AgentDone | End::AgentGone => Ok(()),
            }
        }
        Err(error) => unavailable(unreachable_message(socket, &error), agent_input()).await,
    }
}

/// The first line sent to the broker: what this bridge can say about the agent that
/// started it ([`BridgeReport::of_this_process`], read off the async threads). The broker
/// records it as the bridge's claim.
async fn report_line() -> Vec<u8> {
    let report = tokio::task::spawn_blocking(BridgeReport::of_this_process)
        .await
        .ok()
        .flatten();
    let mut line = serde_json::to_vec(&json!({
        "jsonrpc": "2.0",
        "method": BRIDGE_REPORT,
        "params": report,
    }))
    .unwrap_or_default();
    line.push(b'\n');
    line
}

/// Checks that the server on `stream`, reached at `socket`, is the broker (see the module
/// docs): the path's components are trusted and the server runs as the socket's owner.
/// The error says why not, as a sentence about the path.
#[cfg(unix)]
pub fn verify_broker(socket: &Path, stream: &tokio::net::UnixStream) -> Result<(), String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    use crate::daemon::socket_path::{Trust, WalkError, own_gid, walk_trusted};

    let me = crate::caller::own_uid().ok_or("this process's own uid is unknown")?;
    let peer = stream
        .peer_cred()
        .map_err(|e| format!("the server's credentials cannot be read ({e})"))?
        .uid();
    // The owner the path leads to now; the walk then checks every step to it, and that
    // it still leads to a socket of that owner.
    let owner = std::fs::metadata(socket)
        .map_err(|e| format!("{} cannot be examined ({e})", socket.display()))?
        .uid();
    let trust = Trust {
        me,
        gid: own_gid(),
        also: Some(owner),
    };
    let walked = walk_trusted(socket, &trust).map_err(|e| match e {
        WalkError::Untrusted(u) => format!("{} {}", u.component.display(), u.reason),
        WalkError::Io { path, source } => {
            format!("{} cannot be examined ({source})", path.display())
        }
    })?;
    let at = walked.resolved.display();
    if walked.missing {
        return Err(format!("the socket {at} went away while it was checked"));
    }
    if !walked.meta.file_type().is_socket() {
        return Err(format!("{at} is not a socket"));
    }
    if walked.meta.uid() != owner {
        return Err(format!("the socket {at} changed while it was checked"));
    }
    if peer != owner {
        return Err(format!(
            "the server listening there runs as uid {peer}, but the socket file {at} is \
             owned by uid {owner}: another user's listener answers on it"
        ));
    }
    Ok(())
}

/// What an agent is told when the server at `socket` is not trusted to be the broker.
pub fn untrusted_message(socket: &Path, why: &str) -> String {
    format!(
        "Refusing the server at the Postern broker socket {}: {why}. It may not be the \
         broker, so nothing was sent. Use a socket path whose directories and links only \
         root, this user or the broker's user can change (the broker refuses others too).",
        socket.display()
    )
}

/// The agent's messages: stdin. When it is a pipe (how MCP clients start the bridge) it
/// is read on the runtime's own thread, without blocking it; otherwise (a terminal, a
/// file) through tokio's stdin, which reads on the blocking pool: a hand-off to another
/// thread and back for every read.
fn agent_input() -> Box<dyn AsyncRead + Unpin + Send> {
    #[cfg(unix)]
    if let Some(pipe) = as_pipe(
        std::io::stdin(),
        tokio::net::unix::pipe::Receiver::from_owned_fd,
    ) {
        return Box::new(pipe);
    }
    Box::new(tokio::io::stdin())
}

/// Where the agent reads its answers: stdout, written like [`agent_input`] reads.
fn agent_output() -> Box<dyn AsyncWrite + Unpin + Send> {
    #[cfg(unix)]
    if let Some(pipe) = as_pipe(
        std::io::stdout(),
        tokio::net::unix::pipe::Sender::from_owned_fd,
    ) {
        return Box::new(pipe);
    }
    Box::new(tokio::io::stdout())
}

/// A copy of `stdio`'s descriptor opened as a non-blocking pipe end by `open`; `None` when
/// it is not a pipe (or cannot be copied).
#[cfg(unix)]
fn as_pipe<T>(
    stdio: impl std::os::fd::AsFd,
    open: impl FnOnce(std::os::fd::OwnedFd) -> std::io::Result<T>,
) -> Option<T> {
    let fd = stdio.as_fd().try_clone_to_owned().ok()?;
    open(fd).ok()
}

/// What an agent is told when the socket cannot be reached, by cause: nothing listening
/// (no socket file, or nobody accepting) is "not running"; a refusal by file permissions
/// (EACCES/EPERM on the socket or a directory above it) is "permission denied", which
/// means the broker runs as another user or with other permissions.
pub fn unreachable_message(socket: &Path, error: &std::io::Error) -> String {
    let socket = socket.display();
    match error.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => format!(
            "No Postern broker is running at {socket}; nothing was sent. Start it and retry."
        ),
        std::io::ErrorKind::PermissionDenied => format!(
            "Permission denied connecting to the Postern broker socket {socket}: this user may \
             not reach it (the broker runs as another user, or the socket or its directory \
             has other permissions); nothing was sent. Run the agent as the broker's user, \
             or start a broker for this user."
        ),
        _ => {
            format!("Cannot reach the Postern broker socket {socket} ({error}); nothing was sent.")
        }
    }
}

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

/// The params of the broker's [`REFUSED`] notification, if `line` is one.
fn refusal(line: &[u8]) -> Option<Value> {
    memchr::memmem::find(line, REFUSED.as_bytes())?;
    let value: Value = serde_json::from_slice(line).ok()?;
    (value.get("method").and_then(Value::as_str) == Some(REFUSED) && value.get("id").is_none())
        .then(|| value.get("params").cloned().unwrap_or(Value::Null))
}

/// A JSON-RPC error response.
fn error_reply(id: Option<&RequestId>, code: i64, message: impl Into<String>) -> Value {
    let id = id
        .and_then(|id| serde_json::to_value(id).ok())
        .unwrap_or(Value::Null);
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
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

fn too_long(id: Option<&RequestId>) -> Value {
    error_reply(
        id,
        INVALID_REQUEST,
        format!(
            "Invalid Request: the message is longer than the line limit of {MAX_LINE} bytes \
             (16 MiB); it was discarded"
        ),
    )
}

/// A JSON-RPC id as MCP accepts it (a string, or an integer that fits i64), parsed the way
/// the broker's MCP layer parses it.
fn request_id(value: &Value) -> Option<RequestId> {
    serde_json::from_value(value.clone()).ok()
}

/// The key an id is tracked under: its canonical JSON (`1.0` and `1` are the same id).
fn id_key(id: &RequestId) -> String {
    serde_json::to_string(id).unwrap_or_default()
}

/// What the bridge does with one line from the agent.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// A blank line: framing noise, ignored.
    Skip,
    /// Well-formed JSON-RPC: relayed to the broker as it came (without CR or BOM).
    Forward { text: String, kind: Kind },
    /// Answered by the bridge itself.
    Reply(Value),
    /// A malformed notification or response: JSON-RPC forbids answering it; logged.
    Drop(String),
}

/// The kind of a forwarded message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Request {
        id: RequestId,
        method: String,
    },
    /// `cancels`: the request a notifications/cancelled gives up on.
    Notification {
        cancels: Option<RequestId>,
    },
    Response,
}

/// Decides what happens to one line from the agent (see the module docs).
pub(crate) fn classify(line: &[u8]) -> Verdict {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = line.strip_prefix(UTF8_BOM).unwrap_or(line);
    if line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
        return Verdict::Skip;
    }
    let text = match std::str::from_utf8(line) {
        Ok(text) => text,
        Err(e) => {
            return Verdict::Reply(error_reply(
                None,
                PARSE_ERROR,
                format!(
                    "Parse error: the message is not valid UTF-8 (invalid byte at offset {})",
                    e.valid_up_to()
                ),
            ));
        }
    };
    if nesting_exceeds(line, MAX_DEPTH) {
        return Verdict::Reply(error_reply(
            None,
            PARSE_ERROR,
            format!(
                "Parse error: the message nests arrays or objects deeper than {MAX_DEPTH} levels"
            ),
        ));
    }
    let value: Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(e) => {
            return Verdict::Reply(error_reply(None, PARSE_ERROR, format!("Parse error: {e}")));
        }
    };
    match value {
        Value::Object(map) => classify_object(text, &map),
        Value::Array(items) if items.is_empty() => Verdict::Reply(error_reply(
            None,
            INVALID_REQUEST,
            "Invalid Request: an empty batch",
        )),
        Value::Array(items) => classify_batch(&items),
        other => Verdict::Reply(error_reply(
            None,
            INVALID_REQUEST,
            format!(
                "Invalid Request: a JSON-RPC message is an object, not {}",
                json_kind(&other)
            ),
        )),
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn classify_object(text: &str, map: &Map<String, Value>) -> Verdict {
    let id_field = map.get("id");
    let id = id_field.and_then(request_id);
    let reject = |message: &str| {
        Verdict::Reply(error_reply(
            id.as_ref(),
            INVALID_REQUEST,
            format!("Invalid Request: {message}"),
        ))
    };
    if map.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return reject("\"jsonrpc\" must be \"2.0\"");
    }
    let method = match map.get("method") {
        Some(Value::String(method)) => method,
        Some(_) => return reject("\"method\" must be a string"),
        None => return classify_response(text, map, id_field.is_some(), reject),
    };
    if id_field.is_some() && id.is_none() {
        return Verdict::Reply(error_reply(
            None,
            INVALID_REQUEST,
            "Invalid Request: \"id\" must be a string or an integer that fits in 64 bits",
        ));
    }
    let params_object = map.get("params").is_none_or(Value::is_object);
    let Some(id) = id.clone() else {
        // A notification: never answered.
        if method == DELIVERED {
            return Verdict::Drop(format!("{DELIVERED}: only the bridge reports delivery"));
        }
        if !params_object {
            return Verdict::Drop(format!("notification {method}: params must be an object"));
        }
        return match serde_json::from_str::<ClientJsonRpcMessage>(text) {
            Ok(_) => Verdict::Forward {
                text: text.to_string(),
                kind: Kind::Notification {
                    cancels: cancelled_request(method, map),
                },
            },
            Err(e) => Verdict::Drop(format!("notification {method}: {e}")),
        };
    };
    if !params_object {
        return reject("\"params\" must be an object (MCP uses named parameters)");
    }
    let invalid_params = |detail: String| {
        Verdict::Reply(error_reply(
            Some(&id),
            INVALID_PARAMS,
            format!("Invalid params for {method}: {detail}"),
        ))
    };
    match serde_json::from_str::<ClientJsonRpcMessage>(text) {
        // The broker's MCP layer takes a known method whose params do not fit it for a
        // custom method and answers "method not found"; say what is wrong instead.
        Ok(JsonRpcMessage::Request(request))
            if matches!(request.request, ClientRequest::CustomRequest(_))
                && STANDARD_REQUESTS.contains(&method.as_str()) =>
        {
            invalid_params(params_mismatch(method, map.get("params")))
        }
        Ok(_) => Verdict::Forward {
            text: text.to_string(),
            kind: Kind::Request {
                id,
                method: method.clone(),
            },
        },
        Err(e) => invalid_params(e.to_string()),
    }
}

/// An object without a method: a response to a request the broker sent the agent.
fn classify_response(
    text: &str,
    map: &Map<String, Value>,
    has_id: bool,
    reject: impl Fn(&str) -> Verdict,
) -> Verdict {
    let has_result = map.contains_key("result");
    let has_error = map.contains_key("error");
    if !has_id || has_result == has_error {
        return reject(
            "a message is a request or notification (a string \"method\") or a response (an \
             \"id\" with exactly one of \"result\" and \"error\")",
        );
    }
    // Answering a response could start an error storm with a peer that echoes errors.
    match serde_json::from_str::<ClientJsonRpcMessage>(text) {
        Ok(_) => Verdict::Forward {
            text: text.to_string(),
            kind: Kind::Response,
        },
        Err(e) => Verdict::Drop(format!("response: {e}")),
    }
}

/// MCP batches are not accepted (MCP 2025-06-18 removed them): each request in one gets
/// Invalid Request with its id; notifications and responses in it get nothing.
fn classify_batch(items: &[Value]) -> Verdict {
    let replies: Vec<Value> = items
        .iter()
        .filter(|item| {
            let Some(map) = item.as_object() else {
                return true;
            };
            let notification =
                map.get("method").is_some_and(Value::is_string) && !map.contains_key("id");
            let response = !map.contains_key("method")
                && (map.contains_key("result") || map.contains_key("error"));
            !notification && !response
        })
        .map(|item| {
            let id = item.get("id").and_then(request_id);
            error_reply(
                id.as_ref(),
                INVALID_REQUEST,
                "Invalid Request: MCP does not accept JSON-RPC batches; send each message on \
                 its own line",
            )
        })
        .collect();
    if replies.is_empty() {
        Verdict::Drop("a batch of notifications or responses (MCP does not accept batches)".into())
    } else {
        Verdict::Reply(Value::Array(replies))
    }
}

/// The request methods an MCP server knows (the broker's MCP layer treats any other
/// method as custom and answers "method not found" itself).
const STANDARD_REQUESTS: &[&str] = &[
    "initialize",
    "ping",
    "server/discover",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "resources/templates/list",
    "subscriptions/listen",
    "tools/call",
    "tools/list",
    "completion/complete",
    "logging/setLevel",
];

/// Why `params` do not fit `method`, as precisely as the types say.
fn params_mismatch(method: &str, params: Option<&Value>) -> String {
    let params = params.cloned().unwrap_or(Value::Null);
    let detail = match method {
        "tools/call" => serde_json::from_value::<CallToolRequestParams>(params).err(),
        "initialize" => serde_json::from_value::<InitializeRequestParams>(params).err(),
        _ => None,
    };
    detail.map_or_else(
        || "the params do not have the shape this method takes".to_string(),
        |e| e.to_string(),
    )
}

/// The request a `notifications/cancelled` gives up on.
fn cancelled_request(method: &str, map: &Map<String, Value>) -> Option<RequestId> {
    if method != "notifications/cancelled" {
        return None;
    }
    map.get("params")?.get("requestId").and_then(request_id)
}

/// How a relay ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The agent closed stdin and everything owed was delivered (or the drain timed out).
    AgentDone,
    /// The agent stopped reading: nothing more can be delivered.
    AgentGone,
    /// The broker closed the connection while the agent was still talking.
    BrokerClosed,
    /// The broker refused the connection ([`REFUSED`]) and closed it: what it said.
    Refused(String),
}

/// State the two directions share.
struct Shared<O> {
    out: tokio::sync::Mutex<O>,
    /// Requests forwarded and not yet answered: id key → (id, method).
    pending: Mutex<HashMap<String, (RequestId, String)>>,
    answered: Notify,
    /// The broker has answered a request other than ping: its MCP lifecycle has begun,
    /// and notifications or responses may go to it (before that its MCP layer ends the
    /// connection on anything but a request).
    started: AtomicBool,
    /// The broker refused the connection ([`REFUSED`]): its params.
    refused: Mutex<Option<Value>>,
    /// The bridge's report, sent once, right after the agent's `initialize` request.
    report: Mutex<Option<Vec<u8>>>,
}

impl<O: AsyncWrite + Unpin> Shared<O> {
    /// Writes one line (with its newline) to the agent and flushes.
    async fn write(&self, line: &[u8]) -> std::io::Result<()> {
        let mut out = self.out.lock().await;
        out.write_all(line).await?;
        if line.last() != Some(&b'\n') {
            out.write_all(b"\n").await?;
        }
        out.flush().await
    }

    fn pending_insert(&self, id: RequestId, method: String) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.insert(id_key(&id), (id, method));
        }
    }

    fn pending_remove(&self, key: &str) -> Option<String> {
        let removed = self.pending.lock().ok()?.remove(key).map(|(_, m)| m);
        self.answered.notify_waiters();
        removed
    }

    fn take_pending(&self) -> Vec<RequestId> {
        self.pending
            .lock()
            .map(|mut p| p.drain().map(|(_, (id, _))| id).collect())
            .unwrap_or_default()
    }

    /// Resolves once no forwarded request is waiting for its response.
    async fn all_answered(&self) {
        loop {
            let notified = self.answered.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.pending.lock().map_or(true, |p| p.is_empty()) {
                return;
            }
            notified.await;
        }
    }
}

enum AgentEnd {
    Eof,
    Gone,
    BrokerGone,
}

/// Agent → broker: every line filtered, well-formed messages forwarded.
async fn agent_to_broker<I, O>(
    input: I,
    shared: &Shared<O>,
    to_broker: mpsc::Sender<Vec<u8>>,
) -> AgentEnd
where
    I: AsyncRead + Unpin,
    O: AsyncWrite + Unpin,
{
    let mut lines = LineReader::new(BufReader::new(input), MAX_LINE);
    loop {
        let verdict = match lines.next().await {
            Ok(Some(Line::Complete(bytes))) => classify(&bytes),
            Ok(Some(Line::TooLong)) => {
                Verdict::Reply(too_long(leading_id(lines.too_long_head()).as_ref()))
            }
            // A read error is the end of the agent's input as much as EOF is.
            Ok(None) | Err(_) => return AgentEnd::Eof,
        };
        match verdict {
            Verdict::Skip => {}
            Verdict::Reply(reply) => {
                if shared.write(reply.to_string().as_bytes()).await.is_err() {
                    return AgentEnd::Gone;
                }
            }
            Verdict::Drop(why) => log_dropped(&why),
            Verdict::Forward { text, kind } => {
                let initialize =
                    matches!(&kind, Kind::Request { method, .. } if method == "initialize");
                match kind {
                    Kind::Request { id, method } => shared.pending_insert(id, method),
                    _ if !shared.started.load(Ordering::SeqCst) => {
                        log_dropped("a notification or response before initialize");
                        continue;
                    }
                    Kind::Notification {
                        cancels: Some(cancelled),
                    } => {
                        // The broker does not answer a cancelled request.
                        shared.pending_remove(&id_key(&cancelled));
                    }
                    Kind::Notification { cancels: None } | Kind::Response => {}
                }
                let mut line = text.into_bytes();
                line.push(b'\n');
                if to_broker.send(line).await.is_err() {
                    return AgentEnd::BrokerGone;
                }
                let report = initialize
                    .then(|| shared.report.lock().ok().and_then(|mut r| r.take()))
                    .flatten();
                if let Some(report) = report
                    && to_broker.send(report).await.is_err()
                {
                    return AgentEnd::BrokerGone;
                }
            }
        }
    }
}

fn log_dropped(why: &str) {
    let why: String = why.chars().take(300).collect();
    eprintln!("postern mcp: ignored a message (not answered, per JSON-RPC): {why}");
}

/// The id, and whether it is a success, of a response line from the broker (requests
/// and notifications from the broker have a method and are not responses).
fn response_head(line: &[u8]) -> Option<(Value, bool)> {
    #[derive(serde::Deserialize)]
    struct Head {
        id: Option<Value>,
        method: Option<serde::de::IgnoredAny>,
        result: Option<serde::de::IgnoredAny>,
        error: Option<serde::de::IgnoredAny>,
    }
    let head: Head = serde_json::from_slice(line).ok()?;
    if head.method.is_some() || (head.result.is_none() && head.error.is_none()) {
        return None;
    }
    let id = head.id.filter(|id| !id.is_null())?;
    Some((id, head.result.is_some()))
}

enum BrokerEnd {
    Closed,
    AgentGone,
}

/// Broker → agent: every line written and flushed, then acknowledged.
async fn broker_to_agent<R, O>(
    read: R,
    shared: &Shared<O>,
    acknowledge: Option<mpsc::Sender<Vec<u8>>>,
) -> BrokerEnd
where
    R: AsyncRead + Unpin,
    O: AsyncWrite + Unpin,
{
    let mut reader = BufReader::new(read);
    loop {
        let mut line = Vec::new();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return BrokerEnd::Closed,
            Ok(_) => {}
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if let Some(params) = refusal(&line) {
            // Not the agent's: kept to answer what was forwarded.
            if let Ok(mut refused) = shared.refused.lock() {
                *refused = Some(params);
            }
            continue;
        }
        let head = response_head(&line);
        let key = head
            .as_ref()
            .and_then(|(id, _)| request_id(id))
            .map(|id| id_key(&id));
        if let (Some((_, true)), Some(key)) = (&head, &key) {
            let method = shared
                .pending
                .lock()
                .ok()
                .and_then(|p| p.get(key).map(|(_, m)| m.clone()));
            if method.is_some_and(|m| m != "ping" && m != "server/discover") {
                shared.started.store(true, Ordering::SeqCst);
            }
        }
        if shared.write(&line).await.is_err() {
            // The agent is gone: nothing more can be delivered.
            return BrokerEnd::AgentGone;
        }
        if let Some((id, _)) = head {
            if let Some(ack) = &acknowledge {
                let ack_line = json!({"jsonrpc": "2.0", "method": DELIVERED, "params": {"id": id}});
                let mut bytes = ack_line.to_string().into_bytes();
                bytes.push(b'\n');
                let _ = ack.send(bytes).await;
            }
            if let Some(key) = key {
                shared.pending_remove(&key);
            }
        }
    }
}

/// Relays between the agent (`input`, `output`) and `upstream` (the broker's socket, or
/// the local unavailable server) until the session ends; see the module docs. With
/// `acknowledge`, every response written to the agent is acknowledged upstream.
pub async fn relay<U, I, O>(upstream: U, input: I, output: O, acknowledge: bool) -> End
where
    U: AsyncRead + AsyncWrite + Send + 'static,
    I: AsyncRead + Unpin,
    O: AsyncWrite + Unpin,
{
    relay_reporting(upstream, input, output, acknowledge, None).await
}

/// [`relay`], sending `report` (a [`BRIDGE_REPORT`] line) right after the agent's
/// `initialize` request.
pub async fn relay_reporting<U, I, O>(
    upstream: U,
    input: I,
    output: O,
    acknowledge: bool,
    report: Option<Vec<u8>>,
) -> End
where
    U: AsyncRead + AsyncWrite + Send + 'static,
    I: AsyncRead + Unpin,
    O: AsyncWrite + Unpin,
{
    let (upstream_read, mut upstream_write) = tokio::io::split(upstream);
    // One writer to the broker: agent messages and delivery acknowledgements.
    let (to_broker, mut outgoing) = mpsc::channel::<Vec<u8>>(256);
    let writer = tokio::spawn(async move {
        while let Some(line) = outgoing.recv().await {
            if upstream_write.write_all(&line).await.is_err() {
                return;
            }
        }
        // Every sender is gone: flush what was queued, then say we are done.
        let _ = upstream_write.flush().await;
        let _ = upstream_write.shutdown().await;
    });
    let shared = Shared {
        out: tokio::sync::Mutex::new(output),
        pending: Mutex::new(HashMap::new()),
        answered: Notify::new(),
        started: AtomicBool::new(false),
        refused: Mutex::new(None),
        report: Mutex::new(report),
    };
    let end = {
        let from_agent = agent_to_broker(input, &shared, to_broker.clone());
        let from_broker = broker_to_agent(
            upstream_read,
            &shared,
            acknowledge.then(|| to_broker.clone()),
        );
        drop(to_broker);
        tokio::pin!(from_agent, from_broker);
        tokio::select! {
            end = &mut from_agent => match end {
                AgentEnd::Eof => {
                    // Keep relaying what is owed for requests already forwarded.
                    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
                        tokio::select! {
                            end = &mut from_broker => Some(end),
                            () = shared.all_answered() => None,
                        }
                    })
                    .await;
                    match drained {
                        Ok(Some(BrokerEnd::AgentGone)) => End::AgentGone,
                        _ => End::AgentDone,
                    }
                }
                AgentEnd::Gone => End::AgentGone,
                AgentEnd::BrokerGone => End::BrokerClosed,
            },
            end = &mut from_broker => match end {
                BrokerEnd::Closed => End::BrokerClosed,
                BrokerEnd::AgentGone => End::AgentGone,
            },
        }
        // Leaving this block drops both directions and with them every sender, so the
        // writer drains its queue (the last acknowledgements) and shuts down.
    };
    let refused = shared.refused.lock().ok().and_then(|r| r.clone());
    let end = match (end, &refused) {
        (End::BrokerClosed, Some(params)) => End::Refused(
            params["message"]
                .as_str()
                .unwrap_or("the broker refused the connection")
                .to_string(),
        ),
        (end, _) => end,
    };
    if let End::Refused(message) = &end {
        // Nothing was read: what was forwarded is answered with the broker's code and
        // retry.
        for id in shared.take_pending() {
            let mut reply = error_reply(
                Some(&id),
                INTERNAL_ERROR,
                format!("BROKER_UNAVAILABLE (retry: backoff, not attempted): {message}"),
            );
            if let Some(params) = &refused {
                reply["error"]["data"] = params.clone();
            }
            if shared.write(reply.to_string().as_bytes()).await.is_err() {
                break;
            }
        }
    }
    if end == End::BrokerClosed {
        for id in shared.take_pending() {
            let reply = error_reply(
                Some(&id),
                INTERNAL_ERROR,
                "The Postern broker closed the connection before answering; the call may or \
                 may not have run. Its record is in the journal: use get_invocation or \
                 fetch_result on a new session.",
            );
            if shared.write(reply.to_string().as_bytes()).await.is_err() {
                break;
            }
        }
    }
    let _ = tokio::time::timeout(FLUSH_TIMEOUT, writer).await;
    end
}

/// Answers every tool call with BROKER_UNAVAILABLE.
#[derive(Clone)]
struct Unavailable {
    message: String,
}

impl ServerHandler for Unavailable {
    fn get_info(&self) -> ServerConfig {
        crate::server::server_info()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools::tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if !tools::ALL.contains(&request.name.as_ref()) {
            return Err(McpError::invalid_params(
                format!("unknown tool {}", request.name),
                None,
            ));
        }
        let envelope =
            postern_broker::invocation::outcome::broker_unavailable("", self.message.clone());
        let value = serde_json::to_value(envelope).unwrap_or(Value::Null);
        Ok(CallToolResult::structured_error(value).into())
    }
}

/// Serves the unavailable answer on stdio, behind the same line filter as the relay.
async fn unavailable(
    message: String,
    input: Box<dyn AsyncRead + Unpin + Send>,
) -> Result<(), BridgeError> {
    eprintln!("postern mcp: {message}");
    let server = Unavailable { message };
    let (bridge_side, server_side) = tokio::io::duplex(64 * 1024);
    let service = tokio::spawn(async move {
        if let Ok(running) = server.serve(server_side).await {
            let _ = running.waiting().await;
        }
    });
    relay(bridge_side, input, agent_output(), false).await;
    // The relay shut its side down; the server ends on that EOF.
    let _ = tokio::time::timeout(FLUSH_TIMEOUT, service).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(verdict: Verdict) -> Value {
        match verdict {
            Verdict::Reply(value) => value,
            other => panic!("expected a reply, got {other:?}"),
        }
    }

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

    #[test]
    fn nesting_is_measured_without_recursion_and_ignores_brackets_in_strings() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(nesting_exceeds(deep.as_bytes(), MAX_DEPTH));
        let at_limit = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(!nesting_exceeds(at_limit.as_bytes(), MAX_DEPTH));
        let in_string = format!("{{\"a\":\"{}\\\"{}\"}}", "[".repeat(500), "{".repeat(500));
        assert!(!nesting_exceeds(in_string.as_bytes(), MAX_DEPTH));
    }

    // Regression: issue 10
    #[test]
    fn a_hundred_thousand_deep_message_is_a_parse_error_not_a_stack_overflow() {
        for deep in [
            format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
            format!("{}1{}", "{\"a\":".repeat(100_000), "}".repeat(100_000)),
        ] {
            let value = reply(classify(deep.as_bytes()));
            assert_eq!(value["error"]["code"], PARSE_ERROR);
            assert_eq!(value["id"], Value::Null);
        }
    }

    // Regression: issue 10
    #[test]
    fn serde_json_and_the_mcp_parser_reject_deep_input_without_overflowing_the_stack() {
        // The second lock behind the scan: the parsers the bridge and the broker use stop
        // at serde_json's recursion limit (128) instead of recursing 100k levels.
        for deep in [
            format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
            format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{}1{}}}",
                "{\"a\":".repeat(100_000),
                "}".repeat(100_000)
            ),
        ] {
            let e = serde_json::from_str::<Value>(&deep).unwrap_err();
            assert!(e.to_string().contains("recursion limit exceeded"), "{e}");
            let e = serde_json::from_str::<ClientJsonRpcMessage>(&deep).unwrap_err();
            assert!(e.to_string().contains("recursion limit exceeded"), "{e}");
        }
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

    // Regression: issue 10
    #[test]
    fn malformed_lines_are_answered_with_json_rpc_errors() {
        let parse = reply(classify(b"{\"a\":\"\xff\"}"));
        assert_eq!(parse["error"]["code"], PARSE_ERROR);
        assert!(
            parse["error"]["message"]
                .as_str()
                .unwrap()
                .contains("UTF-8")
        );
        let truncated = reply(classify(b"{\"jsonrpc\":"));
        assert_eq!(truncated["error"]["code"], PARSE_ERROR);
        let scalar = reply(classify(b"42"));
        assert_eq!(scalar["error"]["code"], INVALID_REQUEST);
        let no_method = reply(classify(br#"{"jsonrpc":"2.0","id":"x","method":7}"#));
        assert_eq!(no_method["error"]["code"], INVALID_REQUEST);
        assert_eq!(no_method["id"], "x", "a readable id is echoed");
        let huge_id = reply(classify(br#"{"jsonrpc":"2.0","id":1e300,"method":"ping"}"#));
        assert_eq!(huge_id["id"], Value::Null);
        let bad_params = reply(classify(
            br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":5}}"#,
        ));
        assert_eq!(bad_params["error"]["code"], INVALID_PARAMS);
        assert_eq!(bad_params["id"], 3);
        let too_long = too_long(None);
        assert!(
            too_long["error"]["message"]
                .as_str()
                .unwrap()
                .contains("16 MiB")
        );
    }

    #[test]
    fn well_formed_messages_are_forwarded_as_they_came() {
        match classify(b"{\"jsonrpc\":\"2.0\",\"id\":1.0,\"method\":\"ping\"}\r") {
            Verdict::Forward { text, kind } => {
                assert_eq!(text, "{\"jsonrpc\":\"2.0\",\"id\":1.0,\"method\":\"ping\"}");
                let Kind::Request { id, method } = kind else {
                    panic!("a request")
                };
                assert_eq!(id_key(&id), "1", "1.0 and 1 are one id");
                assert_eq!(method, "ping");
            }
            other => panic!("forwarded, got {other:?}"),
        }
        match classify(
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":4}}"#,
        ) {
            Verdict::Forward {
                kind: Kind::Notification { cancels: Some(id) },
                ..
            } => assert_eq!(id_key(&id), "4"),
            other => panic!("a cancellation, got {other:?}"),
        }
        assert!(matches!(classify(b"  \t"), Verdict::Skip));
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":"notifications/postern/delivered","params":{"id":1}}"#),
            Verdict::Drop(_)
        ));
    }

    #[test]
    #[cfg(unix)]
    fn permission_denied_is_not_reported_as_no_broker_running() {
        let socket = Path::new("/srv/postern/run/postern.sock");
        let denied = unreachable_message(socket, &std::io::Error::from_raw_os_error(libc::EACCES));
        assert!(denied.contains("Permission denied") && denied.contains("another user"));
        assert!(denied.contains("/srv/postern/run/postern.sock"));
        let eperm = unreachable_message(socket, &std::io::Error::from_raw_os_error(libc::EPERM));
        assert!(eperm.contains("Permission denied"));
        for errno in [libc::ENOENT, libc::ECONNREFUSED] {
            let absent = unreachable_message(socket, &std::io::Error::from_raw_os_error(errno));
            assert!(
                absent.starts_with("No Postern broker is running"),
                "{absent}"
            );
        }
    }

    #[test]
    #[cfg(windows)]
    fn a_refused_pipe_is_not_reported_as_no_broker_running() {
        let pipe = Path::new(r"\\.\pipe\postern-0123456789abcdef");
        // ERROR_ACCESS_DENIED: another user's pipe.
        let denied = unreachable_message(pipe, &std::io::Error::from_raw_os_error(5));
        assert!(denied.contains("Permission denied") && denied.contains("another user"));
        // ERROR_FILE_NOT_FOUND: nobody serves the name.
        let absent = unreachable_message(pipe, &std::io::Error::from_raw_os_error(2));
        assert!(
            absent.starts_with("No Postern broker is running"),
            "{absent}"
        );
    }

    // Regression: issue 26 (item 3): the bridge sent a user's calls to whatever listened
    // at the socket path, also through another user's symlink.
    #[tokio::test]
    #[cfg(unix)]
    async fn a_server_is_trusted_only_through_trusted_links_and_as_the_sockets_owner() {
        if crate::caller::own_uid() != Some(0) {
            eprintln!("skipped: not root, cannot give a link or a socket to another uid");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let socket = real.join("postern.sock");
        let _listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
        verify_broker(&socket, &stream).unwrap();
        // The same listener through another user's symlink is refused, naming the link.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
        let through = link.join("postern.sock");
        let stream = tokio::net::UnixStream::connect(&through).await.unwrap();
        let why = verify_broker(&through, &stream).unwrap_err();
        assert!(
            why.contains(&format!(
                "{} is a symbolic link owned by uid 65534",
                link.display()
            )),
            "{why}"
        );
        // A socket file of another user's with root's listener behind it: the server is
        // not the file's owner.
        std::os::unix::fs::chown(&socket, Some(65534), Some(65534)).unwrap();
        let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
        let why = verify_broker(&socket, &stream).unwrap_err();
        assert!(
            why.contains("runs as uid 0") && why.contains("owned by uid 65534"),
            "{why}"
        );
        let message = untrusted_message(&socket, &why);
        assert!(message.contains("nothing was sent"), "{message}");
    }

    /// A fake broker on one end of a pipe: answers each request line with a result for
    /// its id after `delay`, and records every line it receives.
    async fn fake_broker(stream: tokio::io::DuplexStream, delay: Duration) -> Vec<Value> {
        let (read, mut write) = tokio::io::split(stream);
        let mut lines = BufReader::new(read).lines();
        let mut seen = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            let value: Value = serde_json::from_str(&line).unwrap();
            if let (Some(id), Some(_)) = (value.get("id"), value.get("method")) {
                tokio::time::sleep(delay).await;
                let answer = json!({"jsonrpc": "2.0", "id": id, "result": {}});
                write
                    .write_all(format!("{answer}\n").as_bytes())
                    .await
                    .unwrap();
            }
            seen.push(value);
        }
        seen
    }

    // Regression: issue 10
    #[tokio::test]
    async fn on_stdin_eof_owed_responses_are_relayed_and_acknowledged_before_the_socket_closes() {
        let (bridge_side, broker_side) = tokio::io::duplex(4096);
        let broker = tokio::spawn(fake_broker(broker_side, Duration::from_millis(200)));
        let (agent_out, bridge_in) = tokio::io::duplex(4096);
        let (bridge_out, agent_in) = tokio::io::duplex(4096);
        let mut agent_out = agent_out;
        agent_out
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}\n")
            .await
            .unwrap();
        // The agent closes stdin at once, while the request is still with the broker.
        drop(agent_out);
        let end = relay(bridge_side, bridge_in, bridge_out, true).await;
        assert_eq!(end, End::AgentDone);
        let mut to_agent = String::new();
        let mut agent_in = agent_in;
        tokio::io::AsyncReadExt::read_to_string(&mut agent_in, &mut to_agent)
            .await
            .unwrap();
        assert!(
            to_agent.contains("\"id\":1"),
            "the owed response was relayed: {to_agent}"
        );
        // The broker saw the request, then the acknowledgement, then EOF (it returned).
        let seen = broker.await.unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(seen[1]["method"], DELIVERED);
        assert_eq!(seen[1]["params"]["id"], 1);
    }

    // A broker from before the report takes a notification ahead of `initialize` as a
    // broken handshake: the bridge sends its report right after the initialize request,
    // which such a broker (an rmcp server that knows nothing of it) ignores. The session
    // then works as before.
    #[tokio::test]
    async fn a_server_that_knows_no_report_still_serves_a_bridge_that_sends_one() {
        let (bridge_side, server_side) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let server = Unavailable {
                message: "no broker here".into(),
            };
            if let Ok(running) = server.serve(server_side).await {
                let _ = running.waiting().await;
            }
        });
        let (agent_out, bridge_in) = tokio::io::duplex(64 * 1024);
        let (bridge_out, agent_in) = tokio::io::duplex(64 * 1024);
        let relaying = tokio::spawn(async move {
            let report = br#"{"jsonrpc":"2.0","method":"notifications/postern/bridge_report","params":null}"#;
            let mut report = report.to_vec();
            report.push(b'\n');
            relay_reporting(bridge_side, bridge_in, bridge_out, false, Some(report)).await
        });
        let mut agent_out = agent_out;
        let mut agent_in = BufReader::new(agent_in).lines();
        agent_out
            .write_all(
                b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}\n",
            )
            .await
            .unwrap();
        let init: Value =
            serde_json::from_str(&agent_in.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(init["id"], 1, "{init}");
        assert!(init.get("result").is_some(), "{init}");
        agent_out
            .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\"}\n")
            .await
            .unwrap();
        let listed: Value =
            serde_json::from_str(&agent_in.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(listed["id"], 2, "{listed}");
        assert!(
            listed["result"]["tools"]
                .as_array()
                .is_some_and(|t| !t.is_empty()),
            "{listed}"
        );
        drop(agent_out);
        let _ = relaying.await;
        server.abort();
    }

    #[tokio::test]
    async fn when_the_broker_closes_owed_requests_get_an_error_not_silence() {
        let (bridge_side, broker_side) = tokio::io::duplex(4096);
        let (agent_out, bridge_in) = tokio::io::duplex(4096);
        let (bridge_out, agent_in) = tokio::io::duplex(4096);
        let mut agent_out = agent_out;
        agent_out
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":\"q\",\"method\":\"tools/list\"}\n")
            .await
            .unwrap();
        let broker = tokio::spawn(async move {
            let (read, _write) = tokio::io::split(broker_side);
            let mut lines = BufReader::new(read).lines();
            // Reads the request, then goes away without answering.
            let _ = lines.next_line().await;
        });
        let end = relay(bridge_side, bridge_in, bridge_out, true).await;
        broker.await.unwrap();
        assert_eq!(end, End::BrokerClosed);
        drop(agent_out);
        let mut to_agent = String::new();
        let mut agent_in = agent_in;
        tokio::io::AsyncReadExt::read_to_string(&mut agent_in, &mut to_agent)
            .await
            .unwrap();
        let answer: Value = serde_json::from_str(to_agent.trim()).unwrap();
        assert_eq!(answer["id"], "q");
        assert_eq!(answer["error"]["code"], INTERNAL_ERROR);
    }
}
