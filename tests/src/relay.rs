//! An HTTP relay for tests, on `127.0.0.1:0`: it stands on the path between two Postern
//! brokers' peering ports and forwards each request to the upstream (which a test may
//! move to a restarted broker's new port), counting the MCP tool calls that pass.
//!
//! It is also the party on the path that federation must withstand ([`RelayMode`]): a
//! rate limiter answering `429`, or an attacker that alters or strips the signature on
//! what the upstream attested. It only ever connects to the loopback upstream it was
//! given.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The largest request or response body the relay buffers.
const MAX_BODY: usize = 32 * 1024 * 1024;

/// What the relay does to the traffic it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelayMode {
    /// Forwards every request and answer unchanged.
    Pass,
    /// A rate limiter: after `after` calls of the tool `tool` have passed, answers the
    /// next `answers` of them `429 Too Many Requests` itself (they never reach the
    /// upstream), then lets calls through again.
    RateLimit {
        tool: &'static str,
        after: usize,
        answers: usize,
    },
    /// Flips one hex digit of every attestation's signature in the upstream's answers.
    ForgeSignature,
    /// Removes the signature from every attestation in the upstream's answers.
    StripSignature,
    /// Forwards the first `peer_call` and keeps its answer; answers every later
    /// `peer_call` itself with that answer (its JSON-RPC id set to the new request's),
    /// never forwarding it: a genuine, signed answer replayed for another call.
    ReplayFirstAnswer,
    /// Changes the first `peer_call`'s `policy_version` on the way and keeps the upstream's
    /// answer to it; forwards every later `peer_call` unchanged but replaces the
    /// upstream's answer with the kept one.
    RewritePolicyThenSwap,
    /// Answers `peer_capabilities` `503` itself, and renames the caller (`auth.peer`) of
    /// every `peer_call` it forwards.
    FailListingRenameCaller,
}

#[derive(Debug)]
struct State {
    upstream: SocketAddr,
    mode: RelayMode,
    /// The tool named by each `tools/call` that reached the relay, in order.
    calls: Vec<String>,
    /// Calls answered `429` by the relay itself.
    limited: usize,
    /// Calls forwarded to the upstream whose answer the relay altered.
    altered: usize,
    /// The answer kept by [`RelayMode::ReplayFirstAnswer`] or
    /// [`RelayMode::RewritePolicyThenSwap`].
    kept: Option<Bytes>,
}

/// A running relay, stopped on drop.
pub struct Relay {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl Relay {
    /// Starts a relay to `upstream` (a loopback address).
    ///
    /// # Errors
    ///
    /// The upstream is not loopback, or the relay cannot listen.
    pub async fn start(upstream: SocketAddr) -> io::Result<Relay> {
        check_loopback(upstream)?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State {
            upstream,
            mode: RelayMode::Pass,
            calls: Vec::new(),
            limited: 0,
            altered: 0,
            kept: None,
        }));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let state = shared.clone();
                connections.spawn(async move {
                    let service = service_fn(move |request| relay(state.clone(), request));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Relay { addr, state, task })
    }

    /// The MCP endpoint through the relay (the upstream's `/mcp`).
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Forwards from now on to `upstream` (a loopback address).
    ///
    /// # Errors
    ///
    /// The upstream is not loopback.
    pub fn set_upstream(&self, upstream: SocketAddr) -> io::Result<()> {
        check_loopback(upstream)?;
        lock(&self.state).upstream = upstream;
        Ok(())
    }

    pub fn set_mode(&self, mode: RelayMode) {
        let mut state = lock(&self.state);
        state.mode = mode;
        state.limited = 0;
        state.kept = None;
    }

    /// How many `tools/call` requests naming `tool` reached the relay.
    pub fn calls(&self, tool: &str) -> usize {
        lock(&self.state)
            .calls
            .iter()
            .filter(|t| *t == tool)
            .count()
    }

    /// How many calls the relay answered `429` itself since the mode was last set.
    pub fn limited(&self) -> usize {
        lock(&self.state).limited
    }

    /// How many upstream answers the relay altered.
    pub fn altered(&self) -> usize {
        lock(&self.state).altered
    }
}

fn check_loopback(addr: SocketAddr) -> io::Result<()> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the relay only forwards to loopback, not {addr}"),
        ))
    }
}

type Answer = Response<Full<Bytes>>;

/// One request: counted, then answered by the relay or forwarded.
async fn relay(state: Arc<Mutex<State>>, request: Request<Incoming>) -> Result<Answer, io::Error> {
    let (parts, body) = request.into_parts();
    let body = Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|e| io::Error::other(format!("reading the request: {e}")))?
        .to_bytes();
    let tool = called_tool(&body);
    let is_call = tool.as_deref() == Some("peer_call");
    let mut body = body;
    let (upstream, mode, kept) = {
        let mut state = lock(&state);
        let mode = state.mode;
        let kept = state.kept.clone();
        if let Some(tool) = &tool {
            state.calls.push(tool.clone());
            match mode {
                RelayMode::ReplayFirstAnswer if is_call => {
                    if let Some(kept) = &kept {
                        state.altered += 1;
                        return Ok(json_answer(with_id_of(kept, &body)));
                    }
                }
                RelayMode::RewritePolicyThenSwap if is_call && kept.is_none() => {
                    body = rewrite_arguments(&body, |args| {
                        args["policy_version"] = Value::from("blake3:rewritten-by-the-relay");
                    });
                }
                RelayMode::FailListingRenameCaller if tool == "peer_capabilities" => {
                    return Ok(unavailable());
                }
                RelayMode::FailListingRenameCaller if is_call => {
                    body = rewrite_arguments(&body, |args| {
                        args["auth"]["peer"] = Value::from("postern.local/audit/renamed");
                    });
                }
                _ => {}
            }
            if let RelayMode::RateLimit {
                tool: limited_tool,
                after,
                answers,
            } = mode
            {
                let seen = state.calls.iter().filter(|t| *t == limited_tool).count();
                if tool == limited_tool && seen > after && state.limited < answers {
                    state.limited += 1;
                    return Ok(too_many_requests());
                }
            }
        }
        (state.upstream, mode, kept)
    };

    let stream = TcpStream::connect(upstream).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(connection);
    let mut forwarded = Request::builder()
        .method(parts.method)
        .uri(parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    for (name, value) in &parts.headers {
        // The body may have been rewritten: its length is the new body's.
        if name != hyper::header::HOST && name != hyper::header::CONTENT_LENGTH {
            forwarded = forwarded.header(name, value);
        }
    }
    let forwarded_body = body.clone();
    let forwarded = forwarded
        .header(hyper::header::HOST, upstream.to_string())
        .body(Full::new(body))
        .map_err(io::Error::other)?;
    // An upstream that dies mid-answer closes this connection too: the caller sees
    // the reset the upstream caused.
    let answer = sender
        .send_request(forwarded)
        .await
        .map_err(io::Error::other)?;
    let (parts, body) = answer.into_parts();
    let body = Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|e| io::Error::other(format!("reading the answer: {e}")))?
        .to_bytes();
    let body = match mode {
        RelayMode::ReplayFirstAnswer | RelayMode::RewritePolicyThenSwap if is_call => match kept {
            None => {
                lock(&state).kept = Some(body.clone());
                body
            }
            Some(kept) => {
                lock(&state).altered += 1;
                Bytes::from(with_id_of(&kept, &forwarded_body))
            }
        },
        RelayMode::ForgeSignature | RelayMode::StripSignature => {
            match alter(&body, mode == RelayMode::StripSignature) {
                Some(altered) => {
                    lock(&state).altered += 1;
                    Bytes::from(altered)
                }
                None => body,
            }
        }
        _ => body,
    };
    let mut response = Response::builder().status(parts.status);
    for (name, value) in &parts.headers {
        if name != hyper::header::CONTENT_LENGTH && name != hyper::header::TRANSFER_ENCODING {
            response = response.header(name, value);
        }
    }
    response.body(Full::new(body)).map_err(io::Error::other)
}

/// A `503` the relay answers itself.
fn unavailable() -> Answer {
    let mut answer = Response::new(Full::new(Bytes::from_static(b"unavailable\n")));
    *answer.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    answer
}

/// A JSON answer the relay makes itself.
fn json_answer(body: Vec<u8>) -> Answer {
    let mut answer = Response::new(Full::new(Bytes::from(body)));
    answer.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    answer
}

/// `answer` (a JSON-RPC response, plain or as server-sent events) with its id set to
/// the id of `request`: a kept answer made to look like the answer to a new request.
fn with_id_of(answer: &[u8], request: &[u8]) -> Vec<u8> {
    let id = serde_json::from_slice::<Value>(request)
        .ok()
        .and_then(|r| r.get("id").cloned())
        .unwrap_or(Value::Null);
    let set = |mut v: Value| {
        v["id"] = id.clone();
        v.to_string()
    };
    if let Ok(value) = serde_json::from_slice::<Value>(answer) {
        return set(value).into_bytes();
    }
    // Server-sent events: each `data:` line holds one message.
    String::from_utf8_lossy(answer)
        .lines()
        .map(|line| match line.strip_prefix("data:") {
            Some(data) => match serde_json::from_str::<Value>(data.trim()) {
                Ok(v) if v.get("id").is_some() => format!("data: {}", set(v)),
                _ => line.to_string(),
            },
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        .into_bytes()
}

/// A `tools/call` request body with its arguments changed by `edit`.
fn rewrite_arguments(body: &[u8], edit: impl FnOnce(&mut Value)) -> Bytes {
    let Ok(mut value) = serde_json::from_slice::<Value>(body) else {
        return Bytes::copy_from_slice(body);
    };
    if let Some(args) = value.get_mut("params").and_then(|p| p.get_mut("arguments")) {
        edit(args);
    }
    Bytes::from(serde_json::to_vec(&value).unwrap_or_default())
}

fn too_many_requests() -> Answer {
    let mut answer = Response::new(Full::new(Bytes::from_static(b"slow down\n")));
    *answer.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    answer.headers_mut().insert(
        hyper::header::RETRY_AFTER,
        hyper::header::HeaderValue::from_static("1"),
    );
    answer
}

/// The tool a JSON-RPC `tools/call` request names.
fn called_tool(body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    if value.get("method")?.as_str()? != "tools/call" {
        return None;
    }
    Some(value.get("params")?.get("name")?.as_str()?.to_string())
}

/// The answer with every attestation's signature altered (one hex digit flipped) or
/// removed, including inside text content that holds JSON; `None` when it holds none.
fn alter(body: &[u8], strip: bool) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(body).ok()?;
    if !alter_value(&mut value, strip) {
        return None;
    }
    serde_json::to_vec(&value).ok()
}

fn alter_value(value: &mut Value, strip: bool) -> bool {
    match value {
        Value::Object(map) => {
            let mut changed = false;
            if let Some(Value::Object(attestation)) = map.get_mut("attestation") {
                if strip {
                    changed |= attestation.remove("signature").is_some();
                } else if let Some(Value::String(signature)) = attestation.get_mut("signature")
                    && let Some(first) = signature.chars().next()
                {
                    let flipped = if first == '0' { '1' } else { '0' };
                    signature.replace_range(..first.len_utf8(), &flipped.to_string());
                    changed = true;
                }
            }
            for (_, child) in map.iter_mut() {
                changed |= alter_value(child, strip);
            }
            changed
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |changed, item| alter_value(item, strip) | changed),
        Value::String(text) => {
            let Ok(mut inner) = serde_json::from_str::<Value>(text) else {
                return false;
            };
            if !inner.is_object() || !alter_value(&mut inner, strip) {
                return false;
            }
            *text = inner.to_string();
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_is_altered_wherever_an_attestation_appears() {
        let body = serde_json::json!({
            "result": {
                "structuredContent": {"attestation": {"kind": "denial", "signature": "0abc"}},
                "content": [{"type": "text",
                    "text": "{\"attestation\":{\"kind\":\"denial\",\"signature\":\"9abc\"}}"}]
            }
        });
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        let forged: Value =
            serde_json::from_slice(&alter(&bytes, false).unwrap_or_default()).unwrap_or_default();
        let sc = &forged["result"]["structuredContent"]["attestation"]["signature"];
        assert_eq!(sc, "1abc");
        let text = forged["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        assert!(text.contains("\"signature\":\"0abc\""), "{text}");

        let stripped: Value =
            serde_json::from_slice(&alter(&bytes, true).unwrap_or_default()).unwrap_or_default();
        assert!(
            stripped["result"]["structuredContent"]["attestation"]
                .get("signature")
                .is_none()
        );
        assert!(alter(b"{\"result\":{}}", false).is_none());
    }

    #[test]
    fn only_a_tools_call_names_a_tool() {
        assert_eq!(
            called_tool(
                br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"peer_call"}}"#
            ),
            Some("peer_call".to_string())
        );
        assert_eq!(
            called_tool(br#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#),
            None
        );
        assert_eq!(called_tool(b"not json"), None);
    }
}
