//! `postern mcp`: the stdio process an agent's MCP client launches.
//!
//! It relays MCP messages between stdio and the broker's socket, line by line, and after
//! it has written a response to the agent's stdout (and flushed it) it tells the broker
//! with a `notifications/postern/delivered` notification naming the response id. That is
//! the confirmation RESULT_DELIVERED waits for.
//!
//! With no broker running it still answers, as an MCP server whose every tool call
//! returns BROKER_UNAVAILABLE (not_attempted) instead of hanging.

use std::path::Path;

use rmcp::ErrorData as McpError;
use rmcp::ServerHandler;
use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ListToolsResult,
    PaginatedRequestParams, ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use crate::server::DELIVERED;
use crate::tools;

/// Longest line relayed (16 MiB); longer input is dropped, not buffered without bound.
const MAX_LINE: usize = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("stdio: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Mcp(String),
}

/// Connects to the broker and relays, or serves the unavailable answer.
pub async fn run(socket: &Path) -> Result<(), BridgeError> {
    match UnixStream::connect(socket).await {
        Ok(stream) => relay(stream).await,
        Err(_) => unavailable(socket).await,
    }
}

async fn relay(stream: UnixStream) -> Result<(), BridgeError> {
    let (socket_read, mut socket_write) = stream.into_split();
    // One writer to the socket: agent messages and delivery acknowledgements.
    let (to_socket, mut outgoing) = mpsc::channel::<String>(256);
    let writer = tokio::spawn(async move {
        while let Some(line) = outgoing.recv().await {
            if socket_write.write_all(line.as_bytes()).await.is_err()
                || socket_write.write_all(b"\n").await.is_err()
            {
                break;
            }
        }
    });

    let agent_to_broker = {
        let to_socket = to_socket.clone();
        async move {
            let mut stdin = BufReader::new(tokio::io::stdin()).lines();
            while let Ok(Some(line)) = stdin.next_line().await {
                if line.len() > MAX_LINE {
                    continue;
                }
                if to_socket.send(line).await.is_err() {
                    break;
                }
            }
        }
    };

    let broker_to_agent = async move {
        let mut stdout = tokio::io::stdout();
        let mut lines = BufReader::new(socket_read).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if stdout.write_all(line.as_bytes()).await.is_err()
                || stdout.write_all(b"\n").await.is_err()
                || stdout.flush().await.is_err()
            {
                // The agent is gone: nothing more can be delivered.
                return;
            }
            if let Some(id) = response_id(&line) {
                let ack = json!({"jsonrpc": "2.0", "method": DELIVERED, "params": {"id": id}});
                let _ = to_socket.send(ack.to_string()).await;
            }
        }
    };

    tokio::select! {
        () = agent_to_broker => {}
        () = broker_to_agent => {}
    }
    writer.abort();
    Ok(())
}

/// The id of a JSON-RPC response (a message with an id and a result or error).
fn response_id(line: &str) -> Option<Value> {
    let value: Value = serde_json::from_str(line).ok()?;
    let is_response = value.get("result").is_some() || value.get("error").is_some();
    if is_response && value.get("method").is_none() {
        value.get("id").cloned()
    } else {
        None
    }
}

/// Answers every tool call with BROKER_UNAVAILABLE.
#[derive(Clone)]
struct Unavailable {
    socket: String,
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
        let envelope = postern_broker::channel::broker_unavailable(
            "",
            format!(
                "No Postern broker is running at {}; nothing was sent. Start it and retry.",
                self.socket
            ),
        );
        let value = serde_json::to_value(envelope).unwrap_or(Value::Null);
        Ok(CallToolResult::structured_error(value).into())
    }
}

async fn unavailable(socket: &Path) -> Result<(), BridgeError> {
    let server = Unavailable {
        socket: socket.display().to_string(),
    };
    let running = server
        .serve((tokio::io::stdin(), tokio::io::stdout()))
        .await
        .map_err(|e| BridgeError::Mcp(e.to_string()))?;
    running
        .waiting()
        .await
        .map_err(|e| BridgeError::Mcp(e.to_string()))?;
    Ok(())
}
