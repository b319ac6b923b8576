//! SESSION_OPENED: who the agent is, read and recorded once per connection when its MCP
//! session opens (or by the first call that needs it), and awaited by every call that
//! would run an invocation; a session whose record could not be written runs nothing.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use rmcp::model::CallToolResult;
use serde_json::json;

use postern_broker::AgentApi;
use postern_broker::contract::{Code, ErrorBody, Outcome, Phase, Retry};
use postern_broker::provenance::{BridgeReport, SessionOpened};

use super::Session;
use crate::caller::AgentIdentity;

/// The SESSION_OPENED record of one connection: read from /proc and written when the
/// agent's MCP session opens (its `notifications/initialized`), or by the first call
/// that needs it, whichever comes first; awaited by every call that would run an invocation.
/// A bare connection that never speaks MCP (a liveness probe) records nothing.
pub(super) struct Opening {
    /// Set once the recording has been started, so it runs once per connection.
    pub(super) started: AtomicBool,
    pub(super) task: Mutex<Option<tokio::task::JoinHandle<Result<u64, String>>>>,
    /// The record's sequence number, or why it could not be written.
    pub(super) done: tokio::sync::OnceCell<Result<u64, String>>,
}

/// Reads the agent behind `identity` from /proc (hashing its executable) and appends
/// SESSION_OPENED, durably.
fn record_opening(
    agents: &AgentApi,
    identity: &AgentIdentity,
    report: Option<BridgeReport>,
) -> Result<u64, String> {
    let ancestors: Vec<u32> = identity.parent_chain.iter().map(|p| p.pid).collect();
    let opened = SessionOpened::observe(
        &identity.session,
        identity.agent.pid,
        identity.agent.start_time,
        &ancestors,
        identity.bridge_pid,
        report,
    )
    .map_err(|e| e.to_string())?;
    let opened = SessionOpened {
        confinement: identity.confinement.clone(),
        ..opened
    };
    agents.record_session(opened).map_err(|e| e.to_string())
}

impl Session {
    /// Starts reading the agent from /proc (hashing its executable off the async
    /// threads) and appending SESSION_OPENED. Runs once per connection.
    pub fn start_recording(&self) {
        // Held while the task is started and stored: a call waiting in `opened` (the
        // `initialized` notification and the first call run concurrently) finds it.
        let slot = self.opening.task.lock();
        if self.opening.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let (agents, identity) = (self.agents.clone(), self.identity.clone());
        let report = self.report.get().cloned();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let task =
                    runtime.spawn_blocking(move || record_opening(&agents, &identity, report));
                if let Ok(mut slot) = slot {
                    *slot = Some(task);
                }
            }
            Err(_) => {
                let _ = self
                    .opening
                    .done
                    .set(record_opening(&agents, &identity, report));
            }
        }
    }

    /// Waits until this connection's SESSION_OPENED is on disk (starting the recording
    /// if the session has not). Its sequence number, or the refusal the agent gets
    /// instead of running anything unrecorded.
    pub async fn opened(&self) -> Result<u64, CallToolResult> {
        self.start_recording();
        let done = self
            .opening
            .done
            .get_or_init(|| async {
                let task = self.opening.task.lock().ok().and_then(|mut t| t.take());
                match task {
                    Some(task) => task
                        .await
                        .unwrap_or_else(|e| Err(format!("the recording task failed: {e}"))),
                    None => Err("the session was never recorded".to_string()),
                }
            })
            .await;
        done.clone().map_err(|reason| session_unrecorded(&reason))
    }
}

/// The refusal an agent gets when its session could not be recorded: nothing runs
/// unrecorded. There is no invocation id, since nothing was accepted.
fn session_unrecorded(reason: &str) -> CallToolResult {
    let error = ErrorBody {
        code: Code::BrokerUnavailable,
        phase: Phase::Validation,
        outcome: Outcome::NotAttempted,
        retry: Retry::Backoff,
        message: format!(
            "The broker could not record who this agent is ({reason}); nothing was run. \
             Reconnect and try again."
        ),
    };
    CallToolResult::structured_error(json!({
        "invocation_id": null,
        "error": error,
        "outcome": Outcome::NotAttempted,
        "recorded": false,
    }))
}
