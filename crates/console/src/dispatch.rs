//! Runs an operator command: the typed [`OperatorCommand`] in, the JSON answer (or a
//! [`CommandError`]) out. The desktop window's `operator` command, the daemon's operator
//! socket and the CLI all come here, so each operation has one code path whichever front
//! end asked. Each arm's answer is checked against the type the protocol table declares
//! for it ([`Command::Answer`]).

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;

use crate::console::Console;
use crate::dto::*;
use crate::protocol::{Command, OperatorCommand};

pub use crate::protocol::COMMANDS;

/// Who is asking, as far as the broker records it.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Recorded in the journal as the one who answered an approval.
    pub operator: String,
    /// Where `export_activity` writes its file.
    pub export_dir: PathBuf,
}

impl Caller {
    /// The console's own operator (the desktop's user), exporting into the data dir.
    pub fn local(console: &Console) -> Caller {
        Caller {
            operator: console.operator.clone(),
            export_dir: console.paths.data_dir.join("exports"),
        }
    }
}

/// `answer` as JSON, once the compiler has checked it is what the table declares for
/// the command `C`.
fn reply<C: Command>(answer: Result<C::Answer, CommandError>) -> Result<Value, CommandError> {
    serde_json::to_value(answer?).map_err(|e| CommandError::new(ErrorCode::Internal, e.to_string()))
}

/// Runs a blocking console operation (SQLite, the keychain, file writes) off the async
/// threads.
async fn blocking<T: Send + 'static>(
    console: &Arc<Console>,
    op: impl FnOnce(&Console) -> Result<T, CommandError> + Send + 'static,
) -> Result<T, CommandError> {
    let console = console.clone();
    tokio::task::spawn_blocking(move || op(&console))
        .await
        .map_err(|e| CommandError::new(ErrorCode::Internal, e.to_string()))?
}

/// [`dispatch_as`] for the console's own operator ([`Caller::local`]).
pub async fn dispatch(
    console: &Arc<Console>,
    command: &str,
    args: Value,
) -> Result<Value, CommandError> {
    let caller = Caller::local(console);
    dispatch_as(console, &caller, command, args).await
}

/// Runs the command named `command` with `args` (as the operator socket carries them)
/// for `caller`. An unknown command is UNKNOWN_COMMAND; malformed arguments are
/// INVALID_INPUT with `field: "args"` ([`OperatorCommand::parse`]).
pub async fn dispatch_as(
    console: &Arc<Console>,
    caller: &Caller,
    command: &str,
    args: Value,
) -> Result<Value, CommandError> {
    handle(console, caller, OperatorCommand::parse(command, args)?).await
}

/// Runs `command` for `caller`.
pub async fn handle(
    console: &Arc<Console>,
    caller: &Caller,
    command: OperatorCommand,
) -> Result<Value, CommandError> {
    use crate::protocol::*;
    match command {
        OperatorCommand::Overview(OverviewArgs {}) => {
            reply::<OverviewArgs>(blocking(console, |c| c.overview()).await)
        }
        OperatorCommand::ListApprovals(ListApprovalsArgs {}) => {
            reply::<ListApprovalsArgs>(Ok(console.approval_cards()))
        }
        OperatorCommand::AnswerApproval(a) => {
            let operator = caller.operator.clone();
            reply::<AnswerApprovalArgs>(
                blocking(console, move |c| {
                    c.answer_as(
                        &a.invocation_id,
                        &a.fingerprint,
                        &a.card_digest,
                        a.decision,
                        &operator,
                    )
                })
                .await,
            )
        }
        OperatorCommand::ListSessions(ListSessionsArgs {}) => {
            reply::<ListSessionsArgs>(blocking(console, |c| c.sessions()).await)
        }
        OperatorCommand::SessionTimeline(a) => {
            reply::<SessionTimelineArgs>(blocking(console, move |c| c.timeline(&a.session)).await)
        }
        OperatorCommand::QueryActivity(a) => reply::<QueryActivityArgs>(
            blocking(console, move |c| {
                c.activity(&a.filter, a.before_seq, a.limit as usize)
            })
            .await,
        ),
        OperatorCommand::ExportActivity(a) => {
            let dir = caller.export_dir.clone();
            reply::<ExportActivityArgs>(
                blocking(console, move |c| c.export(&a.filter, a.format, &dir)).await,
            )
        }
        OperatorCommand::InvocationDetail(a) => reply::<InvocationDetailArgs>(
            blocking(console, move |c| c.detail(&a.invocation_id)).await,
        ),
        OperatorCommand::NeedsReconciliation(NeedsReconciliationArgs {}) => {
            reply::<NeedsReconciliationArgs>(blocking(console, |c| c.needs_reconciliation()).await)
        }
        OperatorCommand::RunReconcileQuery(a) => {
            reply::<RunReconcileQueryArgs>(console.run_reconcile_query(&a.invocation_id).await)
        }
        OperatorCommand::PeerIncidents(PeerIncidentsArgs {}) => {
            reply::<PeerIncidentsArgs>(blocking(console, |c| c.peer_incidents()).await)
        }
        OperatorCommand::AttestOutcome(a) => {
            reply::<AttestOutcomeArgs>(blocking(console, move |c| c.attest(&a.attestation)).await)
        }
        OperatorCommand::ListCredentials(ListCredentialsArgs {}) => {
            reply::<ListCredentialsArgs>(blocking(console, |c| c.credentials()).await)
        }
        OperatorCommand::SetCredential(a) => reply::<SetCredentialArgs>(
            blocking(console, move |c| c.set_credential(a.credential)).await,
        ),
        OperatorCommand::RemoveCredential(a) => reply::<RemoveCredentialArgs>(
            blocking(console, move |c| c.remove_credential(&a.id)).await,
        ),
        OperatorCommand::ListTargets(ListTargetsArgs {}) => {
            reply::<ListTargetsArgs>(blocking(console, |c| c.targets()).await)
        }
        OperatorCommand::UpdateTarget(a) => {
            reply::<UpdateTargetArgs>(blocking(console, move |c| c.update_target(&a.edit)).await)
        }
        OperatorCommand::Integrity(IntegrityArgs { recheck: true }) => {
            reply::<IntegrityArgs>(blocking(console, |c| Ok(c.verify_now())).await)
        }
        OperatorCommand::Integrity(IntegrityArgs { recheck: false }) => {
            reply::<IntegrityArgs>(Ok(console.integrity()))
        }
        OperatorCommand::PauseAgents(PauseAgentsArgs {}) => {
            let operator = caller.operator.clone();
            reply::<PauseAgentsArgs>(
                blocking(console, move |c| c.set_agents_paused(true, &operator)).await,
            )
        }
        OperatorCommand::ResumeAgents(ResumeAgentsArgs {}) => {
            let operator = caller.operator.clone();
            reply::<ResumeAgentsArgs>(
                blocking(console, move |c| c.set_agents_paused(false, &operator)).await,
            )
        }
    }
}
