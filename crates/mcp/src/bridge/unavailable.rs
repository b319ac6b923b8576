//! With no broker: an MCP server whose every tool call returns BROKER_UNAVAILABLE
//! (not_attempted), saying why, served behind the same line filter as the relay.

use rmcp::ErrorData as McpError;
use rmcp::ServerHandler;
use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ListToolsResult,
    PaginatedRequestParams, ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::Value;
use tokio::io::AsyncRead;

use super::relay::{FLUSH_TIMEOUT, relay};
use super::{BridgeError, agent_output};
use crate::tools;

/// Answers every tool call with BROKER_UNAVAILABLE.
#[derive(Clone)]
pub(super) struct Unavailable {
    pub(super) message: String,
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
pub(super) async fn unavailable(
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
