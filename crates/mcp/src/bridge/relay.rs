//! The relay: agent → broker (every line classified, well-formed messages forwarded,
//! the bridge's report after `initialize`), broker → agent (every line written and
//! flushed, then acknowledged), the requests owed in between, and how a session ends.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rmcp::model::RequestId;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Notify, mpsc};

use super::classify::{
    INTERNAL_ERROR, Kind, Verdict, classify, error_reply, id_key, request_id, too_long,
};
use super::lines::{Line, LineReader, leading_id};
use crate::input::MAX_LINE;
use crate::server::{DELIVERED, REFUSED};

/// After stdin closes, how long the bridge waits for responses it still owes.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the last acknowledgements may take to reach the socket.
pub(super) const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The params of the broker's [`REFUSED`] notification, if `line` is one.
fn refusal(line: &[u8]) -> Option<Value> {
    memchr::memmem::find(line, REFUSED.as_bytes())?;
    let value: Value = serde_json::from_slice(line).ok()?;
    (value.get("method").and_then(Value::as_str) == Some(REFUSED) && value.get("id").is_none())
        .then(|| value.get("params").cloned().unwrap_or(Value::Null))
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

/// [`relay`], sending `report` (a [`BRIDGE_REPORT`](crate::server::BRIDGE_REPORT) line) right after the agent's
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::unavailable::Unavailable;
    use rmcp::ServiceExt;

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
