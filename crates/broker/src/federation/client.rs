//! The asking broker's side of the peering connection: one MCP Streamable HTTP session
//! with a peer at `{url}/mcp`, the peering tools called through it, and what came back
//! sorted into an answer at the attestation layer or a [`TransportFault`] below it.
//!
//! A session is opened per try ([`Session::open_as`], or [`Session::open`] for a peer
//! that needs no name: the MCP handshake, which sends nothing of the call, so a failure
//! there proves the call was not sent), then one
//! tool is called ([`Session::call`]) and the session closed. An answer is the tool
//! result's `structuredContent` (or its first text content, parsed as JSON); a tool
//! result that carries neither, or a JSON-RPC error from the peer, is an answer
//! without an envelope: unknown, never a denial (seed 002).

use std::collections::HashMap;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    HttpStatusError, StreamableHttpClientTransportConfig, StreamableHttpError,
};
use serde_json::Value;
use url::Url;

use super::TransportFault;

/// The largest answer read from a peer (its JSON): a call's response body travels in it.
pub const MAX_ANSWER_BYTES: usize = 32 * 1024 * 1024;

/// The request header naming the asking broker's key (its audit log origin), sent on
/// every request of a session opened with [`Session::open_as`]. It proves nothing (the
/// signed auth inside the body does); a peer reads it only to refuse, before buffering
/// it, a large body from a party it does not pin.
pub const PEER_HEADER: &str = "postern-peer";

/// A failure below the attestation layer, with what was observed (for people).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{fault:?}: {detail}")]
pub struct Fault {
    pub fault: TransportFault,
    pub detail: String,
}

/// One open MCP session with a peer.
pub struct Session {
    service: RunningService<RoleClient, ()>,
}

/// The MCP endpoint of a peer at `url`: its base URL, or the endpoint itself as the
/// peer prints it at start-up (`postern: peering on http://…/mcp`).
pub fn endpoint(url: &Url) -> String {
    let base = url.as_str().trim_end_matches('/');
    if url.query().is_none() && base.ends_with("/mcp") {
        base.to_string()
    } else {
        format!("{base}/mcp")
    }
}

impl Session {
    /// Opens a session with the peer at `url` (the MCP handshake), within `timeout`,
    /// naming no one: a peer refuses a request body above its small-body threshold
    /// (64 KiB) from such a session. Prefer [`Session::open_as`].
    pub async fn open(url: &Url, timeout: Duration) -> Result<Session, Fault> {
        Session::open_with(url, timeout, HashMap::new()).await
    }

    /// [`Session::open`], sending [`PEER_HEADER`]`: caller_key_name` (the asking
    /// broker's key name, as the peer pins it) on every request, so that the peer takes
    /// request bodies of any size up to its maximum. A name that cannot be a header
    /// value is not sent; the session then works as one from [`Session::open`].
    pub async fn open_as(
        url: &Url,
        timeout: Duration,
        caller_key_name: &str,
    ) -> Result<Session, Fault> {
        let mut headers = HashMap::new();
        if let Ok(value) = HeaderValue::from_str(caller_key_name) {
            headers.insert(HeaderName::from_static(PEER_HEADER), value);
        }
        Session::open_with(url, timeout, headers).await
    }

    async fn open_with(
        url: &Url,
        timeout: Duration,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Session, Fault> {
        let mut config = StreamableHttpClientTransportConfig::with_uri(endpoint(url));
        config.max_json_response_size = MAX_ANSWER_BYTES;
        config.custom_headers = headers;
        let transport = StreamableHttpClientTransport::from_config(config);
        match tokio::time::timeout(timeout, ().serve(transport)).await {
            Err(_) => Err(Fault {
                fault: TransportFault::Timeout,
                detail: format!("the peer did not complete the MCP handshake within {timeout:?}"),
            }),
            Ok(Err(e)) => Err(fault_of(&e)),
            Ok(Ok(service)) => Ok(Session { service }),
        }
    }

    /// Calls `tool` with `args` within `timeout`. `Ok(None)` is an answer that carried
    /// no JSON (or a JSON-RPC error from the peer): an answer without an envelope.
    pub async fn call(
        &self,
        tool: &str,
        args: Value,
        timeout: Duration,
    ) -> Result<Option<Value>, Fault> {
        let mut params = CallToolRequestParams::new(tool.to_string());
        if let Value::Object(map) = args {
            params = params.with_arguments(map);
        }
        match tokio::time::timeout(timeout, self.service.call_tool(params)).await {
            Err(_) => Err(Fault {
                fault: TransportFault::Timeout,
                detail: format!("no answer to {tool} within {timeout:?}"),
            }),
            // The peer's MCP layer answered, without a tool result: no envelope.
            Ok(Err(ServiceError::McpError(_))) => Ok(None),
            Ok(Err(e)) => Err(fault_of(&e)),
            Ok(Ok(result)) => Ok(answer_json(&result)),
        }
    }

    /// Ends the session (best effort: the answer is already in hand).
    pub async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.service.cancel()).await;
    }
}

/// The JSON a tool result carries: its structured content, or its first text content
/// parsed as JSON.
pub fn answer_json(result: &CallToolResult) -> Option<Value> {
    if let Some(value) = &result.structured_content {
        return Some(value.clone());
    }
    result
        .content
        .iter()
        .find_map(|c| c.as_text().map(|t| t.text.clone()))
        .and_then(|text| serde_json::from_str(&text).ok())
}

/// Sorts a transport error: HTTP 429 anywhere in its chain is the peer's rate limiter;
/// a timeout is a timeout; anything else (refused, reset, a 5xx, a closed stream) is a
/// reset. None of these is a verdict about policy.
fn fault_of(error: &(dyn std::error::Error + 'static)) -> Fault {
    let detail = error.to_string();
    let mut node: Option<&(dyn std::error::Error + 'static)> = Some(error);
    let mut fault = TransportFault::Reset;
    while let Some(e) = node {
        if let Some(status) = e.downcast_ref::<HttpStatusError>() {
            if status.status == 429 {
                fault = TransportFault::RateLimited;
                break;
            }
        } else if let Some(StreamableHttpError::HttpStatus(status)) =
            e.downcast_ref::<StreamableHttpError<reqwest::Error>>()
        {
            if status.status == 429 {
                fault = TransportFault::RateLimited;
                break;
            }
        } else if let Some(r) = e.downcast_ref::<reqwest::Error>() {
            if r.is_timeout() {
                fault = TransportFault::Timeout;
            }
        } else if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            fault = TransportFault::Timeout;
        }
        // Error types that display their source transparently hide it from
        // `source()`; the status line in the text is the last resort.
        if e.to_string().contains("HTTP 429") {
            fault = TransportFault::RateLimited;
            break;
        }
        node = e.source();
    }
    Fault { fault, detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_the_same_from_the_base_or_from_what_the_peer_prints() {
        for url in [
            "http://127.0.0.1:8443",
            "http://127.0.0.1:8443/",
            "http://127.0.0.1:8443/mcp",
            "http://127.0.0.1:8443/mcp/",
        ] {
            let url = Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(endpoint(&url), "http://127.0.0.1:8443/mcp", "{url}");
        }
        let behind = Url::parse("https://gw.example/postern/").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(endpoint(&behind), "https://gw.example/postern/mcp");
    }

    /// The head of the first request a session sends, read by a server that answers
    /// every request with a 500.
    async fn first_request_head(open: impl AsyncFnOnce(Url) -> Result<Session, Fault>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed before its headers");
                head.extend_from_slice(&buf[..n]);
            }
            let _ = stream
                .write_all(b"HTTP/1.1 500 No\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await;
            String::from_utf8_lossy(&head).to_ascii_lowercase()
        });
        assert!(open(url).await.is_err());
        server.await.unwrap()
    }

    // Regression: issue 27 (item 4).
    #[tokio::test]
    async fn a_session_opened_as_a_broker_names_it_on_its_requests_and_one_opened_plainly_does_not()
    {
        let timeout = Duration::from_secs(5);
        let named =
            first_request_head(async |url| Session::open_as(&url, timeout, "postern-7f3a9c").await)
                .await;
        assert!(
            named.contains(&format!("\r\n{PEER_HEADER}: postern-7f3a9c\r\n")),
            "{named}"
        );
        let plain = first_request_head(async |url| Session::open(&url, timeout).await).await;
        assert!(!plain.contains(PEER_HEADER), "{plain}");
        // A name that cannot be a header value is left out, not an error of its own.
        let odd =
            first_request_head(async |url| Session::open_as(&url, timeout, "bad\nname").await)
                .await;
        assert!(!odd.contains(PEER_HEADER), "{odd}");
    }
}
