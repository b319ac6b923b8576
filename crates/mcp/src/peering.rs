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
//! [`CapabilitiesAnswer`]: postern_broker::federation::wire::CapabilitiesAnswer
//! [`CallAnswer`]: postern_broker::federation::wire::CallAnswer

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
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
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use postern_broker::federation::serve::{NotAnswered, PeerService};
use postern_broker::federation::wire::{
    CallArgs, CapabilitiesArgs, ReconcileArgs, TOOL_CALL, TOOL_CAPABILITIES, TOOL_RECONCILE,
};

/// Where the peering MCP endpoint is mounted.
pub const PATH: &str = "/mcp";
/// Every tool the peering server exposes.
pub const TOOLS: &[&str] = &[TOOL_CAPABILITIES, TOOL_CALL, TOOL_RECONCILE];
/// The largest request body accepted (a peer call carries its body as base64).
pub const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;
/// How long a client may take to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
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
pub async fn bind(addr: SocketAddr, reach: Reach) -> Result<TcpListener, PeeringError> {
    if reach == Reach::Loopback && !addr.ip().is_loopback() {
        return Err(PeeringError::NotLoopback(addr));
    }
    TcpListener::bind(addr)
        .await
        .map_err(|source| PeeringError::Bind { addr, source })
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

fn parse<T: serde::de::DeserializeOwned>(request: &CallToolRequestParams) -> Result<T, McpError> {
    let args = Value::Object(request.arguments.clone().unwrap_or_default());
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
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let result = match request.name.as_ref() {
            TOOL_CAPABILITIES => {
                let args: CapabilitiesArgs = parse(&request)?;
                structured(&self.service.capabilities(args).map_err(not_answered)?)?
            }
            TOOL_CALL => {
                let args: CallArgs = parse(&request)?;
                structured(&self.service.call(args).await.map_err(not_answered)?)?
            }
            TOOL_RECONCILE => {
                let args: ReconcileArgs = parse(&request)?;
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
    let mut shutdown = std::pin::pin!(shutdown);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let Ok((stream, _peer)) = accepted else {
                    // Out of file descriptors and the like: back off, keep serving.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let mcp = mcp.clone();
                let mut stop = stop_rx.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let mcp = mcp.clone();
                        async move {
                            if req.uri().path() == PATH {
                                Ok::<_, Infallible>(mcp.handle(req).await)
                            } else {
                                Ok(not_found())
                            }
                        }
                    });
                    let conn = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .serve_connection(TokioIo::new(stream), service);
                    let mut conn = std::pin::pin!(conn);
                    tokio::select! {
                        _ = conn.as_mut() => {}
                        _ = stop.changed() => {
                            conn.as_mut().graceful_shutdown();
                            let _ = conn.await;
                        }
                    }
                });
            }
        }
    }
    service.stop_accepting();
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
}
