//! The agent side of the end-to-end tests: an MCP client that launches `postern mcp`
//! over stdio, exactly as an agent's MCP client does, and calls tools through it.

use std::path::Path;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use serde_json::Value;

pub type Agent = RunningService<RoleClient, ()>;

/// Launches `postern mcp --socket SOCKET` (the binary at `postern`) and completes the
/// MCP handshake through it.
pub async fn connect(postern: &Path, socket: &Path) -> Result<Agent, crate::fixture::BoxError> {
    let mut command = tokio::process::Command::new(postern);
    command.arg("mcp").arg("--socket").arg(socket);
    Ok(().serve(TokioChildProcess::new(command)?).await?)
}

/// Calls `tool` with `args` (a JSON object; anything else is sent as no arguments).
pub async fn call(
    agent: &rmcp::Peer<RoleClient>,
    tool: &str,
    args: Value,
) -> Result<CallToolResult, crate::fixture::BoxError> {
    let mut params = CallToolRequestParams::new(tool.to_string());
    if let Value::Object(args) = args {
        params = params.with_arguments(args);
    }
    Ok(agent.call_tool(params).await?)
}

/// The structured result (the envelope), or null.
pub fn structured(result: &CallToolResult) -> Value {
    result.structured_content.clone().unwrap_or(Value::Null)
}

/// Whether the tool reported an error.
pub fn is_error(result: &CallToolResult) -> bool {
    result.is_error == Some(true)
}
