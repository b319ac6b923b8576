//! One entry point for every console operation: a command name and its JSON arguments in,
//! the JSON answer (or a [`CommandError`]) out. The desktop window's Tauri commands and
//! the daemon's operator socket both call [`dispatch_as`], so each operation has one code
//! path whichever front end asked.
//!
//! Arguments use the names the webview sends (camelCase of the Rust parameter names,
//! e.g. `invocationId`); unknown fields are refused, so a misspelt argument is an error,
//! not a silent default.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::console::Console;
use crate::dto::*;

/// Every command [`dispatch`] understands, in the order the desktop registers them (the
/// desktop's `commands_list.rs` includes the same file).
pub const COMMANDS: &[&str] = &include!("command_names.in");

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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AnswerArgs {
    invocation_id: String,
    fingerprint: String,
    /// The digest of the card the person answered (`ApprovalCard.card_digest`).
    card_digest: String,
    decision: Decision,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionArgs {
    session: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ActivityArgs {
    filter: ActivityFilter,
    before_seq: Option<i64>,
    limit: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportArgs {
    filter: ActivityFilter,
    format: ExportFormat,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct InvocationArgs {
    invocation_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AttestArgs {
    attestation: Attestation,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetCredentialArgs {
    credential: SetCredential,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IdArgs {
    id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    edit: TargetEdit,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IntegrityArgs {
    recheck: bool,
}

/// The arguments of `command`, or an INVALID_INPUT error that says what is wrong with
/// them. `null` stands for no arguments. The error text names the field serde stopped
/// at, never the value (a set_credential argument carries a secret).
fn args<T: DeserializeOwned>(command: &str, args: Value) -> Result<T, CommandError> {
    let args = if args.is_null() {
        Value::Object(Default::default())
    } else {
        args
    };
    serde_json::from_value(args).map_err(|e| {
        let reason = match e.classify() {
            // serde's text may quote a value, and this one may carry a secret.
            _ if command == "set_credential" => {
                "expected {credential: {id, kind, secret, passphrase?}}".to_string()
            }
            serde_json::error::Category::Data => e.to_string(),
            _ => "the arguments are not a JSON object".to_string(),
        };
        CommandError::field(
            ErrorCode::InvalidInput,
            "args",
            format!("Bad arguments for `{command}`: {reason}"),
        )
    })
}

fn to_value<T: serde::Serialize>(value: T) -> Result<Value, CommandError> {
    serde_json::to_value(value).map_err(|e| CommandError::new(ErrorCode::Internal, e.to_string()))
}

/// Runs a blocking console operation (SQLite, the keychain, file writes) off the async
/// threads.
async fn blocking<T: serde::Serialize + Send + 'static>(
    console: &Arc<Console>,
    op: impl FnOnce(&Console) -> Result<T, CommandError> + Send + 'static,
) -> Result<Value, CommandError> {
    let console = console.clone();
    let out = tokio::task::spawn_blocking(move || op(&console))
        .await
        .map_err(|e| CommandError::new(ErrorCode::Internal, e.to_string()))??;
    to_value(out)
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

/// Runs `command` with `args` for `caller`. An unknown command is UNKNOWN_COMMAND;
/// malformed arguments are INVALID_INPUT with `field: "args"`.
pub async fn dispatch_as(
    console: &Arc<Console>,
    caller: &Caller,
    command: &str,
    raw: Value,
) -> Result<Value, CommandError> {
    match command {
        "overview" => {
            let NoArgs {} = args(command, raw)?;
            blocking(console, |c| c.overview()).await
        }
        "list_approvals" => {
            let NoArgs {} = args(command, raw)?;
            to_value(console.approval_cards())
        }
        "answer_approval" => {
            let a: AnswerArgs = args(command, raw)?;
            let operator = caller.operator.clone();
            blocking(console, move |c| {
                c.answer_as(
                    &a.invocation_id,
                    &a.fingerprint,
                    &a.card_digest,
                    a.decision,
                    &operator,
                )
            })
            .await
        }
        "list_sessions" => {
            let NoArgs {} = args(command, raw)?;
            blocking(console, |c| c.sessions()).await
        }
        "session_timeline" => {
            let a: SessionArgs = args(command, raw)?;
            blocking(console, move |c| c.timeline(&a.session)).await
        }
        "query_activity" => {
            let a: ActivityArgs = args(command, raw)?;
            blocking(console, move |c| {
                c.activity(&a.filter, a.before_seq, a.limit as usize)
            })
            .await
        }
        "export_activity" => {
            let a: ExportArgs = args(command, raw)?;
            let dir = caller.export_dir.clone();
            blocking(console, move |c| c.export(&a.filter, a.format, &dir)).await
        }
        "invocation_detail" => {
            let a: InvocationArgs = args(command, raw)?;
            blocking(console, move |c| c.detail(&a.invocation_id)).await
        }
        "needs_reconciliation" => {
            let NoArgs {} = args(command, raw)?;
            blocking(console, |c| c.needs_reconciliation()).await
        }
        "run_reconcile_query" => {
            let a: InvocationArgs = args(command, raw)?;
            to_value(console.run_reconcile_query(&a.invocation_id).await?)
        }
        "peer_incidents" => {
            let NoArgs {} = args(command, raw)?;
            blocking(console, |c| c.peer_incidents()).await
        }
        "attest_outcome" => {
            let a: AttestArgs = args(command, raw)?;
            blocking(console, move |c| c.attest(&a.attestation)).await
        }
        "list_credentials" => {
            let NoArgs {} = args(command, raw)?;
            blocking(console, |c| c.credentials()).await
        }
        "set_credential" => {
            let a: SetCredentialArgs = args(command, raw)?;
            blocking(console, move |c| c.set_credential(a.credential)).await
        }
        "remove_credential" => {
            let a: IdArgs = args(command, raw)?;
            blocking(console, move |c| c.remove_credential(&a.id)).await
        }
        "list_targets" => {
            let NoArgs {} = args(command, raw)?;
            blocking(console, |c| c.targets()).await
        }
        "update_target" => {
            let a: EditArgs = args(command, raw)?;
            blocking(console, move |c| c.update_target(&a.edit)).await
        }
        "integrity" => {
            let a: IntegrityArgs = args(command, raw)?;
            if a.recheck {
                blocking(console, |c| Ok(c.verify_now())).await
            } else {
                to_value(console.integrity())
            }
        }
        "pause_agents" | "resume_agents" => {
            let NoArgs {} = args(command, raw)?;
            let operator = caller.operator.clone();
            let paused = command == "pause_agents";
            blocking(console, move |c| c.set_agents_paused(paused, &operator)).await
        }
        other => Err(CommandError::field(
            ErrorCode::UnknownCommand,
            "command",
            format!(
                "Unknown command `{}`; the console knows: {}.",
                postern_broker::display::escape_text(&other.chars().take(64).collect::<String>()),
                COMMANDS.join(", ")
            ),
        )),
    }
}
