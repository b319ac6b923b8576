//! The Tauri commands: thin wrappers that hand the webview's arguments to the console's
//! one dispatcher ([`postern_console::dispatch`]), through a [`Backend`]: in-process (the
//! broker runs inside this app) or attached (the broker runs as its own user and this
//! window reaches it over the operator socket). Every name here is in
//! `commands_list.rs`, gets an `allow-…` permission, and is granted to the main window
//! only (`capabilities/main-window.json`).
//!
//! None of these is reachable by an agent: agents speak MCP on the agent socket, which
//! has no tool to approve, reveal a secret, read the audit log or change configuration.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Value, json};
use tauri::{AppHandle, Manager, Runtime, State};

use postern_console::console::Console;
use postern_console::dispatch::{Caller, dispatch_as};
use postern_console::dto::*;
use postern_console::operator::OperatorClient;

/// Where the console's commands go.
pub enum Backend {
    /// The broker runs in this process.
    InProcess(Arc<Console>),
    /// The broker runs elsewhere (as its own system user); commands go over its
    /// operator socket.
    Attached(OperatorClient),
}

impl Backend {
    /// Runs `command`; `export_dir` is where an in-process export writes (an attached
    /// broker writes into its own data dir).
    pub async fn call(
        &self,
        command: &str,
        args: Value,
        export_dir: Option<PathBuf>,
    ) -> Result<Value, CommandError> {
        match self {
            Backend::InProcess(console) => {
                let mut caller = Caller::local(console);
                if let Some(dir) = export_dir {
                    caller.export_dir = dir;
                }
                dispatch_as(console, &caller, command, args).await
            }
            Backend::Attached(client) => client.call(command, args).await,
        }
    }
}

type BackendState<'a> = State<'a, Arc<Backend>>;

async fn call(
    backend: BackendState<'_>,
    command: &str,
    args: Value,
) -> Result<Value, CommandError> {
    backend.call(command, args, None).await
}

#[tauri::command]
pub async fn overview(backend: BackendState<'_>) -> Result<Value, CommandError> {
    call(backend, "overview", Value::Null).await
}

#[tauri::command]
pub async fn list_approvals(backend: BackendState<'_>) -> Result<Value, CommandError> {
    call(backend, "list_approvals", Value::Null).await
}

#[tauri::command]
pub async fn answer_approval(
    backend: BackendState<'_>,
    invocation_id: String,
    fingerprint: String,
    card_digest: String,
    decision: Decision,
) -> Result<Value, CommandError> {
    let args = json!({
        "invocationId": invocation_id,
        "fingerprint": fingerprint,
        "cardDigest": card_digest,
        "decision": decision,
    });
    call(backend, "answer_approval", args).await
}

#[tauri::command]
pub async fn list_sessions(backend: BackendState<'_>) -> Result<Value, CommandError> {
    call(backend, "list_sessions", Value::Null).await
}

#[tauri::command]
pub async fn session_timeline(
    backend: BackendState<'_>,
    session: String,
) -> Result<Value, CommandError> {
    call(backend, "session_timeline", json!({"session": session})).await
}

#[tauri::command]
pub async fn query_activity(
    backend: BackendState<'_>,
    filter: Value,
    before_seq: Option<i64>,
    limit: u32,
) -> Result<Value, CommandError> {
    let args = json!({"filter": filter, "beforeSeq": before_seq, "limit": limit});
    call(backend, "query_activity", args).await
}

#[tauri::command]
pub async fn export_activity<R: Runtime>(
    app: AppHandle<R>,
    backend: BackendState<'_>,
    filter: Value,
    format: ExportFormat,
) -> Result<Value, CommandError> {
    let dir = app.path().download_dir().ok().filter(|d| d.is_dir());
    let args = json!({"filter": filter, "format": format});
    backend.call("export_activity", args, dir).await
}

#[tauri::command]
pub async fn invocation_detail(
    backend: BackendState<'_>,
    invocation_id: String,
) -> Result<Value, CommandError> {
    call(
        backend,
        "invocation_detail",
        json!({"invocationId": invocation_id}),
    )
    .await
}

#[tauri::command]
pub async fn needs_reconciliation(backend: BackendState<'_>) -> Result<Value, CommandError> {
    call(backend, "needs_reconciliation", Value::Null).await
}

#[tauri::command]
pub async fn run_reconcile_query(
    backend: BackendState<'_>,
    invocation_id: String,
) -> Result<Value, CommandError> {
    call(
        backend,
        "run_reconcile_query",
        json!({"invocationId": invocation_id}),
    )
    .await
}

#[tauri::command]
pub async fn attest_outcome(
    backend: BackendState<'_>,
    attestation: Value,
) -> Result<Value, CommandError> {
    call(
        backend,
        "attest_outcome",
        json!({"attestation": attestation}),
    )
    .await
}

/// Incidents of calls through peer brokers, each routed to its owner.
#[tauri::command]
pub async fn peer_incidents(backend: BackendState<'_>) -> Result<Value, CommandError> {
    call(backend, "peer_incidents", Value::Null).await
}

#[tauri::command]
pub async fn list_credentials(backend: BackendState<'_>) -> Result<Value, CommandError> {
    call(backend, "list_credentials", Value::Null).await
}

/// Add or rotate. The secret goes into the keychain; the answer is metadata only.
#[tauri::command]
pub async fn set_credential(
    backend: BackendState<'_>,
    credential: Value,
) -> Result<Value, CommandError> {
    call(backend, "set_credential", json!({"credential": credential})).await
}

#[tauri::command]
pub async fn remove_credential(
    backend: BackendState<'_>,
    id: String,
) -> Result<Value, CommandError> {
    call(backend, "remove_credential", json!({"id": id})).await
}

#[tauri::command]
pub async fn list_targets(backend: BackendState<'_>) -> Result<Value, CommandError> {
    call(backend, "list_targets", Value::Null).await
}

#[tauri::command]
pub async fn update_target(backend: BackendState<'_>, edit: Value) -> Result<Value, CommandError> {
    call(backend, "update_target", json!({"edit": edit})).await
}

/// The banner's state; `recheck` verifies the whole file again first.
#[tauri::command]
pub async fn integrity(backend: BackendState<'_>, recheck: bool) -> Result<Value, CommandError> {
    call(backend, "integrity", json!({"recheck": recheck})).await
}

/// Refuses new agent calls (AGENTS_PAUSED) until `resume_agents`.
#[tauri::command]
pub async fn pause_agents(backend: BackendState<'_>) -> Result<Value, CommandError> {
    call(backend, "pause_agents", Value::Null).await
}

#[tauri::command]
pub async fn resume_agents(backend: BackendState<'_>) -> Result<Value, CommandError> {
    call(backend, "resume_agents", Value::Null).await
}

/// Registers every command; the list must match `commands_list.rs` (tested).
#[macro_export]
macro_rules! console_handlers {
    () => {
        tauri::generate_handler![
            $crate::commands::overview,
            $crate::commands::list_approvals,
            $crate::commands::answer_approval,
            $crate::commands::list_sessions,
            $crate::commands::session_timeline,
            $crate::commands::query_activity,
            $crate::commands::export_activity,
            $crate::commands::invocation_detail,
            $crate::commands::needs_reconciliation,
            $crate::commands::run_reconcile_query,
            $crate::commands::attest_outcome,
            $crate::commands::peer_incidents,
            $crate::commands::list_credentials,
            $crate::commands::set_credential,
            $crate::commands::remove_credential,
            $crate::commands::list_targets,
            $crate::commands::update_target,
            $crate::commands::integrity,
            $crate::commands::pause_agents,
            $crate::commands::resume_agents,
        ]
    };
}
