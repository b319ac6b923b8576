//! The peering server: what this broker serves to federated peer brokers, over MCP
//! Streamable HTTP at [`PATH`], stateless (every POST stands alone; no MCP session),
//! answering with JSON.
//!
//! Exactly the three peering tools ([`postern_broker::federation::wire`]): no agent tool
//! and no operator tool is reachable here. Each answer's structured content is the JSON
//! of a [`CapabilitiesAnswer`] or [`CallAnswer`], whose attestation is signed with this
//! broker's key; the work is [`PeerService`]'s. What is not a verdict (malformed
//! arguments: `invalid_params`; a stale or replayed auth: `invalid_request`) is a
//! JSON-RPC error, never a signed statement.
//!
//! Plain HTTP only: put TLS in front for confidentiality. The auths and attestations
//! are signed, so a party on the path can read but not forge or alter what either
//! broker says.
//!
//! # What a party without a key can make this broker hold
//!
//! Anyone who reaches the port can open connections and send bytes; only the signed
//! auth inside a request body says who asks. So what unauthenticated traffic can make
//! the broker hold is bounded before any body is read (issue 27: 100 connections each
//! sending just under 16 MiB took a broker from 22 MB to 1.77 GB; 2 × 9,990 trickling
//! connections held it at its descriptor limit):
//!
//! - Connections: at most [`MAX_CONNECTIONS`] in all and [`MAX_PER_SOURCE`] per
//!   [`Source`] (an IPv4 address, an IPv6 /64), lowered to fit the process's descriptor
//!   limit ([`caps_for_descriptors`]). One past either cap is answered a fixed 503 and
//!   closed at once, nothing of it read. Every peer behind one proxy or TLS terminator
//!   (or on this host, over loopback) is one source.
//! - Time: the headers within [`HEADER_TIMEOUT`] (an idle kept-alive connection too);
//!   a body within [`BODY_TIMEOUT`] of its headers, never pausing longer than
//!   [`BODY_IDLE_TIMEOUT`]; then 408 and the connection is closed.
//! - Bytes: a body above [`SMALL_BODY_BYTES`] must declare its length (else 411), at
//!   most [`MAX_REQUEST_BYTES`] (else 413), and carry a [`PEER_HEADER`] naming a pinned
//!   peer (else 403): all checked before a byte of it is read. Its declared length is
//!   then taken from [`LARGE_BODY_BUDGET`], shared by every connection, before it is
//!   buffered; a body that does not fit is answered 503 with `Retry-After`, never
//!   buffered. Small bodies have a budget of their own, so a flood of large ones never
//!   turns a small call (a `peer_capabilities` listing, an old peer's call) away.
//! - Memory: a request's bytes go back to the budget when it ends, however it ends
//!   (answered, refused, timed out, connection closed). [`serve`] fixes the allocator's
//!   thresholds for the process, so that a large block freed goes back to the operating
//!   system at once, and once no large body is held the holes left in its arenas go
//!   back too. Parsing a body briefly holds about one more copy of it, so the port's
//!   large bodies take at most about twice [`LARGE_BODY_BUDGET`].
//!
//! The header proves nothing (it is not secret; the signature in the body is what
//! authenticates): it only keeps parties that do not even know a pinned peer's key name
//! from making the broker buffer large bodies.
//!
//! [`CapabilitiesAnswer`]: postern_broker::federation::wire::CapabilitiesAnswer
//! [`CallAnswer`]: postern_broker::federation::wire::CallAnswer

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONNECTION, HeaderMap, HeaderValue, RETRY_AFTER};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rmcp::ErrorData as McpError;
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, JsonObject, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::admission::{Admission, Admitted};
use postern_broker::budget::ByteBudget;
use postern_broker::federation::serve::{NotAnswered, PeerService};
use postern_broker::federation::wire::{
    CallArgs, CapabilitiesArgs, ReconcileArgs, TOOL_CALL, TOOL_CAPABILITIES, TOOL_RECONCILE,
};

mod gate;

use gate::{BODY_TIMEOUTS, Gate, hand_large_blocks_back, serve_gated};
pub use gate::{Source, caps_for_descriptors};

/// Where the peering MCP endpoint is mounted.
pub const PATH: &str = "/mcp";
/// Every tool the peering server exposes.
pub const TOOLS: &[&str] = &[TOOL_CAPABILITIES, TOOL_CALL, TOOL_RECONCILE];
/// The largest request body accepted (a peer call carries its body as base64).
pub const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;
/// The request header a peer names itself in (its key name, as this broker pins it);
/// required on bodies above [`SMALL_BODY_BYTES`].
pub use postern_broker::federation::client::PEER_HEADER;
/// Request bodies up to this size need neither a declared length nor a [`PEER_HEADER`]:
/// every `peer_capabilities` listing and an old peer's ordinary calls fit.
pub const SMALL_BODY_BYTES: usize = 64 * 1024;
/// Bytes of bodies above [`SMALL_BODY_BYTES`] held at once, over every connection: six
/// bodies of the largest size.
pub const LARGE_BODY_BUDGET: usize = 6 * MAX_REQUEST_BYTES;
/// Connections the peering port holds at once (fewer when descriptors are scarce).
pub const MAX_CONNECTIONS: usize = 256;
/// Connections one [`Source`] holds at once: a broker opens one per call in flight.
pub const MAX_PER_SOURCE: usize = 32;
/// How long a client may take to send its request headers (and an idle kept-alive
/// connection may wait for the next ones).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request body may take from the end of its headers: the largest body at
/// 4.5 Mbit/s.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a request body may pause between two pieces of it.
pub const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// What a client answered 503 is asked to wait before trying again, in seconds.
const RETRY_AFTER_SECONDS: &str = "2";
/// The read buffer of one connection (hyper's own is 400 KiB): headers fit, and a body
/// streams through it.
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// Descriptors kept free for the agent socket's connections, the journal and outgoing
/// connections when the process may not open many.
const RESERVED_DESCRIPTORS: usize = 256;
/// Blocks the allocator maps on their own ([`hand_large_blocks_back`]).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ALLOCATOR_MMAP_BYTES: libc::c_int = 256 * 1024;
/// Free bytes at the top of an arena past which it is trimmed ([`hand_large_blocks_back`]).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ALLOCATOR_TRIM_BYTES: libc::c_int = 1024 * 1024;
/// How often the port looks whether the heap large bodies were in is owed back.
const TRIM_EVERY: Duration = Duration::from_secs(1);
/// Connections the kernel holds for the port before it accepts them: a burst of a
/// flood is turned away by the accept loop, not by dropping a peer's connection attempt
/// (which it would only make again a second later).
const LISTEN_BACKLOG: u32 = 4096;
/// How long shutdown waits for the requests in flight.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Who may reach the peering port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Loopback addresses only (`--peer-listen`); the `Host` header must name loopback.
    Loopback,
    /// Any address (`--peer-listen-any`): meant to sit behind a TLS terminator.
    Any,
}

/// Why the peering server could not start.
#[derive(Debug, thiserror::Error)]
pub enum PeeringError {
    #[error(
        "--peer-listen {0} is not a loopback address; use --peer-listen-any to serve peers on other addresses (behind TLS)"
    )]
    NotLoopback(SocketAddr),
    #[error("cannot listen for peers on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Binds the peering port, refusing a non-loopback address unless `reach` is `Any`.
/// Its backlog is [`LISTEN_BACKLOG`] (the system may hold it lower).
pub async fn bind(addr: SocketAddr, reach: Reach) -> Result<TcpListener, PeeringError> {
    if reach == Reach::Loopback && !addr.ip().is_loopback() {
        return Err(PeeringError::NotLoopback(addr));
    }
    let bound = || -> std::io::Result<TcpListener> {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        #[cfg(unix)]
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(LISTEN_BACKLOG)
    };
    bound().map_err(|source| PeeringError::Bind { addr, source })
}

/// The MCP handler of one peering request.
#[derive(Clone)]
pub struct Peering {
    service: Arc<PeerService>,
}

impl Peering {
    pub fn new(service: Arc<PeerService>) -> Peering {
        Peering { service }
    }
}

fn schema(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

fn auth_schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["peer", "issued_at_ms", "nonce", "signature"],
        "properties": {
            "peer": {"type": "string", "description": "The asking broker's key name (its audit log origin)."},
            "issued_at_ms": {"type": "integer"},
            "nonce": {"type": "string", "description": "16 random bytes, hex; never reused."},
            "signature": {"type": "string", "description": "Ed25519 by the asking broker's key, hex."}
        }
    })
}

fn pairs_schema() -> Value {
    json!({"type": "array", "items": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2}})
}

/// The peering tools, in a stable order.
pub fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            TOOL_CAPABILITIES,
            "List the capabilities this broker exports to the asking broker, with a signed \
             attestation (kind `outcome`, capability `*`); a signed `denial` listing nothing \
             when the asker is not a pinned peer.",
            schema(json!({
                "type": "object",
                "additionalProperties": false,
                "required": ["auth"],
                "properties": {"auth": auth_schema()}
            })),
        ),
        Tool::new(
            TOOL_CALL,
            "Run one HTTP request against an exported capability, at most once per caller \
             invocation. The answer is a signed attestation: `denial` (not exported to you; \
             whether it exists is not disclosed), `unavailable` (ask again later with the same \
             caller invocation), or `outcome` with this broker's record of the call.",
            schema(json!({
                "type": "object",
                "additionalProperties": false,
                "required": ["auth", "request", "caller_invocation", "caller_attempt"],
                "properties": {
                    "auth": auth_schema(),
                    "request": {
                        "type": "object",
                        "additionalProperties": false,
                        "required": ["capability", "method", "path"],
                        "properties": {
                            "capability": {"type": "string"},
                            "method": {"type": "string"},
                            "path": {"type": "string", "description": "Starts with `/`, relative to the capability's base URL."},
                            "headers": pairs_schema(),
                            "query": pairs_schema(),
                            "body_base64": {"type": "string"},
                            "idempotency_key": {"type": ["string", "null"]},
                            "timeout_ms": {"type": ["integer", "null"], "minimum": 1}
                        }
                    },
                    "caller_invocation": {"type": "string", "description": "The asking broker's invocation id."},
                    "caller_attempt": {"type": "integer", "minimum": 0, "description": "The asking broker's attempt (dispatch generation) this call belongs to; signed, and named by the answer."},
                    "policy_version": {"type": ["string", "null"], "description": "This broker's export policy version as the asker last saw it."}
                }
            })),
        ),
        Tool::new(
            TOOL_RECONCILE,
            "Ask this broker to run its reconcile query for one of your calls whose outcome \
             is unknown, and answer its record afterwards, signed.",
            schema(json!({
                "type": "object",
                "additionalProperties": false,
                "required": ["auth", "capability", "invocation_id", "request_fingerprint"],
                "properties": {
                    "auth": auth_schema(),
                    "capability": {"type": "string"},
                    "invocation_id": {"type": "string", "description": "The invocation on this broker (from the outcome)."},
                    "request_fingerprint": {"type": "string"}
                }
            })),
        ),
    ]
}

/// The arguments of `request`, taken out of it (a peer call's body travels in them, up
/// to 16 MiB: never copied).
fn parse<T: serde::de::DeserializeOwned>(
    request: &mut CallToolRequestParams,
) -> Result<T, McpError> {
    let args = Value::Object(request.arguments.take().unwrap_or_default());
    serde_json::from_value(args)
        .map_err(|e| McpError::invalid_params(format!("{}: {e}", request.name), None))
}

fn not_answered(e: NotAnswered) -> McpError {
    if e.is_invalid_params() {
        McpError::invalid_params(e.to_string(), None)
    } else {
        McpError::invalid_request(e.to_string(), None)
    }
}

fn structured<T: serde::Serialize>(answer: &T) -> Result<CallToolResult, McpError> {
    serde_json::to_value(answer)
        .map(CallToolResult::structured)
        .map_err(|e| McpError::internal_error(format!("answer encoding: {e}"), None))
}

impl ServerHandler for Peering {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.instructions = Some(
            "Postern peering: another broker's calls to capabilities this broker exports. \
             Every answer carries an attestation signed with this broker's key."
                .to_string(),
        );
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        mut request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.clone();
        let result = match name.as_ref() {
            TOOL_CAPABILITIES => {
                let args: CapabilitiesArgs = parse(&mut request)?;
                structured(&self.service.capabilities(args).map_err(not_answered)?)?
            }
            TOOL_CALL => {
                let args: CallArgs = parse(&mut request)?;
                structured(&self.service.call(args).await.map_err(not_answered)?)?
            }
            TOOL_RECONCILE => {
                let args: ReconcileArgs = parse(&mut request)?;
                structured(&self.service.reconcile(args).await.map_err(not_answered)?)?
            }
            other => {
                return Err(McpError::invalid_params(
                    format!("unknown tool {other}"),
                    None,
                ));
            }
        };
        Ok(result.into())
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn not_found() -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from_static(
            b"not found; the peering endpoint is /mcp\n",
        ))
        .boxed(),
    );
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

/// Serves the peering tools on `listener` until `shutdown` completes; then stops
/// taking calls (new ones are answered `unavailable` while the connections drain) and
/// lets the requests in flight finish, bounded by a few seconds.
pub async fn serve<F>(service: Arc<PeerService>, listener: TcpListener, reach: Reach, shutdown: F)
where
    F: Future<Output = ()>,
{
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_max_request_body_bytes(MAX_REQUEST_BYTES);
    if reach == Reach::Any {
        // Peers are authenticated by signature, not by the name they used to reach us;
        // the Host check (a browser's DNS-rebinding defence) would only refuse them.
        config = config.disable_allowed_hosts();
    }
    let handler = Peering::new(service.clone());
    let mcp: StreamableHttpService<Peering, NeverSessionManager> = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    hand_large_blocks_back();
    let pinned = service.clone();
    let gate = Arc::new(Gate::new(
        caps_for_descriptors(postern_broker::platform::raise_descriptor_limit()),
        LARGE_BODY_BUDGET,
        BODY_TIMEOUTS,
        Box::new(move |name| pinned.is_pinned_peer(name)),
    ));
    let handle = move |request: Request<Full<Bytes>>| {
        let mcp = mcp.clone();
        async move { mcp.handle(request).await }
    };
    let stopping = async {
        shutdown.await;
        service.stop_accepting();
    };
    serve_gated(gate, listener, handle, stopping).await;
}
