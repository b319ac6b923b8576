//! The Tauri commands: thin wrappers that hand the webview's arguments to [`Console`].
//! Every name here is in `commands_list.rs`, gets an `allow-…` permission, and is granted
//! to the main window only (`capabilities/main-window.json`).
//!
//! None of these is reachable by an agent: agents speak MCP on the socket, which has no
//! tool to approve, reveal a secret, read the audit log or change configuration.

use std::sync::Arc;

use tauri::{AppHandle, Manager, Runtime, State};

use crate::console::Console;
use crate::dto::*;

type ConsoleState<'a> = State<'a, Arc<Console>>;

#[tauri::command]
pub async fn overview(console: ConsoleState<'_>) -> Result<Overview, CommandError> {
    console.overview()
}

#[tauri::command]
pub async fn list_approvals(console: ConsoleState<'_>) -> Result<Vec<ApprovalCard>, CommandError> {
    Ok(console.approval_cards())
}

#[tauri::command]
pub async fn answer_approval(
    console: ConsoleState<'_>,
    invocation_id: String,
    fingerprint: String,
    card_digest: String,
    decision: Decision,
) -> Result<(), CommandError> {
    console.answer(&invocation_id, &fingerprint, &card_digest, decision)
}

#[tauri::command]
pub async fn list_sessions(console: ConsoleState<'_>) -> Result<Vec<SessionSummary>, CommandError> {
    console.sessions()
}

#[tauri::command]
pub async fn session_timeline(
    console: ConsoleState<'_>,
    session: String,
) -> Result<Vec<InvocationDetail>, CommandError> {
    console.timeline(&session)
}

#[tauri::command]
pub async fn query_activity(
    console: ConsoleState<'_>,
    filter: ActivityFilter,
    before_seq: Option<i64>,
    limit: u32,
) -> Result<ActivityPage, CommandError> {
    console.activity(&filter, before_seq, limit as usize)
}

#[tauri::command]
pub async fn export_activity<R: Runtime>(
    app: AppHandle<R>,
    console: ConsoleState<'_>,
    filter: ActivityFilter,
    format: ExportFormat,
) -> Result<ExportResult, CommandError> {
    let dir = app
        .path()
        .download_dir()
        .ok()
        .filter(|d| d.is_dir())
        .unwrap_or_else(|| console.paths.data_dir.join("exports"));
    let console = console.inner().clone();
    tauri::async_runtime::spawn_blocking(move || console.export(&filter, format, &dir))
        .await
        .map_err(|e| CommandError::new(ErrorCode::Internal, e.to_string()))?
}

#[tauri::command]
pub async fn invocation_detail(
    console: ConsoleState<'_>,
    invocation_id: String,
) -> Result<InvocationDetail, CommandError> {
    console.detail(&invocation_id)
}

#[tauri::command]
pub async fn needs_reconciliation(
    console: ConsoleState<'_>,
) -> Result<Vec<InvocationDetail>, CommandError> {
    console.needs_reconciliation()
}

#[tauri::command]
pub async fn run_reconcile_query(
    console: ConsoleState<'_>,
    invocation_id: String,
) -> Result<InvocationDetail, CommandError> {
    console.run_reconcile_query(&invocation_id).await
}

#[tauri::command]
pub async fn attest_outcome(
    console: ConsoleState<'_>,
    attestation: Attestation,
) -> Result<InvocationDetail, CommandError> {
    console.attest(&attestation)
}

#[tauri::command]
pub async fn list_credentials(
    console: ConsoleState<'_>,
) -> Result<Vec<CredentialCard>, CommandError> {
    console.credentials()
}

/// Add or rotate. The secret goes into the keychain; the answer is metadata only.
#[tauri::command]
pub async fn set_credential(
    console: ConsoleState<'_>,
    credential: SetCredential,
) -> Result<CredentialCard, CommandError> {
    let console = console.inner().clone();
    tauri::async_runtime::spawn_blocking(move || console.set_credential(credential))
        .await
        .map_err(|e| CommandError::new(ErrorCode::Internal, e.to_string()))?
}

#[tauri::command]
pub async fn remove_credential(console: ConsoleState<'_>, id: String) -> Result<(), CommandError> {
    console.remove_credential(&id)
}

#[tauri::command]
pub async fn list_targets(console: ConsoleState<'_>) -> Result<TargetList, CommandError> {
    console.targets()
}

#[tauri::command]
pub async fn update_target(
    console: ConsoleState<'_>,
    edit: TargetEdit,
) -> Result<TargetCard, CommandError> {
    console.update_target(&edit)
}

/// The banner's state; `recheck` verifies the whole file again first.
#[tauri::command]
pub async fn integrity(
    console: ConsoleState<'_>,
    recheck: bool,
) -> Result<IntegrityState, CommandError> {
    if !recheck {
        return Ok(console.integrity());
    }
    let console = console.inner().clone();
    tauri::async_runtime::spawn_blocking(move || console.verify_now())
        .await
        .map_err(|e| CommandError::new(ErrorCode::Internal, e.to_string()))
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
            $crate::commands::list_credentials,
            $crate::commands::set_credential,
            $crate::commands::remove_credential,
            $crate::commands::list_targets,
            $crate::commands::update_target,
            $crate::commands::integrity,
        ]
    };
}
