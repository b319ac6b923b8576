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
//! (see `classify`). Everything else is answered here, as JSON-RPC says: -32700 for a
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
//!
//! # Where each step is
//! - `trust`: whether the server at the socket is the broker, and what an agent is told
//!   when it is not or cannot be reached.
//! - `lines`: the agent's input read as lines of raw bytes, bounded, and the id found
//!   at the start of a line too long to parse.
//! - `classify`: what the bridge does with one line (forward, answer, drop, skip), and
//!   the JSON-RPC errors it answers with.
//! - `relay`: the two directions between the agent and the broker, the requests owed,
//!   the acknowledgements, the report after `initialize`, and how a session ends.
//! - `unavailable`: the MCP server that answers BROKER_UNAVAILABLE when there is no
//!   broker to relay to.

mod classify;
mod lines;
mod relay;
mod trust;
mod unavailable;

use std::path::Path;

use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite};

use postern_broker::provenance::BridgeReport;

pub use crate::input::{MAX_DEPTH, MAX_LINE, nesting_exceeds};
pub use lines::{Line, LineReader, leading_id};
pub use relay::{DRAIN_TIMEOUT, End, relay, relay_reporting};
#[cfg(unix)]
pub use trust::verify_broker;
pub use trust::{unreachable_message, untrusted_message};

use crate::server::BRIDGE_REPORT;
use unavailable::unavailable;

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
