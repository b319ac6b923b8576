//! The operator protocol: every command the operator side can give, as one typed enum.
//! The desktop window (one Tauri command, `operator`), the daemon's operator socket and
//! the CLI all send an [`OperatorCommand`]; [`crate::dispatch::handle`] runs it. The
//! command names, each command's arguments and its answer type are declared once, in the
//! table below: the permissions, the TypeScript bindings (with their typed wrappers) and
//! the wire names all come from it.
//!
//! On the wire a command is `{"command": "<name>", "args": {…}}`, the arguments named as
//! the webview names them (camelCase). Unknown fields are refused, so a misspelt argument
//! is an error, not a silent default.
//!
//! Never: hold a command that an agent may give. The agent side has no route here: its
//! socket speaks MCP, and [`postern_broker::AgentApi`] has nothing that this runs.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use ts_rs::TS;

use crate::dto::*;

/// One command's signature for the generated TypeScript wrapper: its wire name, its
/// arguments (webview names and TypeScript types) and its answer's TypeScript type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    pub name: &'static str,
    pub args: Vec<(String, String)>,
    pub returns: String,
}

/// A command's arguments, and the type of its answer (what
/// [`crate::dispatch::handle`] serializes for it).
pub trait Command {
    type Answer: Serialize;
}

macro_rules! operator_commands {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident $name:literal $args:ident {
            $( $field:ident : $ty:ty $(as $ts:literal)? ),* $(,)?
        } -> $ret:ty ;
    )*) => {
        /// Every command the operator side can give (see the module docs).
        #[derive(Debug, Serialize, Deserialize)]
        #[serde(tag = "command", content = "args", rename_all = "snake_case")]
        pub enum OperatorCommand {
            $( $(#[doc = $doc])* $variant($args), )*
        }

        $(
            #[doc = concat!("The arguments of `", $name, "`.")]
            #[derive(Debug, Serialize, Deserialize, TS)]
            #[serde(rename_all = "camelCase", deny_unknown_fields)]
            pub struct $args { $( $(#[ts(type = $ts)])? pub $field: $ty, )* }

            impl Command for $args {
                type Answer = $ret;
            }
        )*

        /// Every command's wire name, in the order the table declares them.
        pub const COMMANDS: &[&str] = &[ $( $name ),* ];

        impl OperatorCommand {
            /// The command's wire name.
            pub fn name(&self) -> &'static str {
                match self { $( OperatorCommand::$variant(_) => $name, )* }
            }

            /// `args` (`null` for none) as the arguments of the command named `name`.
            /// `None` when no command has that name.
            fn from_parts(
                name: &str,
                args: Value,
            ) -> Option<Result<OperatorCommand, serde_json::Error>> {
                match name {
                    $( $name => Some(
                        serde_json::from_value::<$args>(args).map(OperatorCommand::$variant),
                    ), )*
                    _ => None,
                }
            }
        }

        /// Every command's signature, in table order.
        pub fn signatures() -> Vec<Signature> {
            vec![ $( Signature {
                name: $name,
                args: vec![ $( (camel(stringify!($field)), {
                    let declared: Option<&str> = None $( .or(Some($ts)) )?;
                    declared.map_or_else(<$ty as TS>::name, str::to_string)
                }) ),* ],
                returns: <$ret as TS>::name(),
            } ),* ]
        }
    };
}

operator_commands! {
    /// What the console's home screen shows.
    Overview "overview" OverviewArgs {} -> Overview;
    /// The approval cards waiting for a person.
    ListApprovals "list_approvals" ListApprovalsArgs {} -> Vec<ApprovalCard>;
    /// Approves or denies exactly the card the person was shown.
    AnswerApproval "answer_approval" AnswerApprovalArgs {
        invocation_id: String,
        fingerprint: String,
        card_digest: String,
        decision: Decision,
    } -> ();
    /// The agent sessions this broker has seen.
    ListSessions "list_sessions" ListSessionsArgs {} -> Vec<SessionSummary>;
    /// One session's invocations.
    SessionTimeline "session_timeline" SessionTimelineArgs { session: String } -> Vec<InvocationDetail>;
    /// A page of the activity log.
    QueryActivity "query_activity" QueryActivityArgs {
        filter: ActivityFilter,
        before_seq: Option<i64> as "number | null",
        limit: u32,
    } -> ActivityPage;
    /// Writes the filtered activity to a file.
    ExportActivity "export_activity" ExportActivityArgs { filter: ActivityFilter, format: ExportFormat } -> ExportResult;
    /// One invocation with its evidence.
    InvocationDetail "invocation_detail" InvocationDetailArgs { invocation_id: String } -> InvocationDetail;
    /// Invocations whose outcome is unknown.
    NeedsReconciliation "needs_reconciliation" NeedsReconciliationArgs {} -> Vec<InvocationDetail>;
    /// Asks the target's source of truth about an unknown outcome.
    RunReconcileQuery "run_reconcile_query" RunReconcileQueryArgs { invocation_id: String } -> InvocationDetail;
    /// Records what the operator knows of an unknown outcome.
    AttestOutcome "attest_outcome" AttestOutcomeArgs { attestation: Attestation } -> InvocationDetail;
    /// Incidents of calls through peer brokers.
    PeerIncidents "peer_incidents" PeerIncidentsArgs {} -> Vec<PeerIncidentRow>;
    /// The stored credentials' metadata (never a secret).
    ListCredentials "list_credentials" ListCredentialsArgs {} -> Vec<CredentialCard>;
    /// Stores a credential.
    SetCredential "set_credential" SetCredentialArgs { credential: SetCredential } -> CredentialCard;
    /// Removes a credential.
    RemoveCredential "remove_credential" RemoveCredentialArgs { id: String } -> ();
    /// The configured targets.
    ListTargets "list_targets" ListTargetsArgs {} -> TargetList;
    /// Replaces one target's text.
    UpdateTarget "update_target" UpdateTargetArgs { edit: TargetEdit } -> TargetCard;
    /// The audit log's integrity, checked again when `recheck`.
    Integrity "integrity" IntegrityArgs { recheck: bool } -> IntegrityState;
    /// Pauses agent calls.
    PauseAgents "pause_agents" PauseAgentsArgs {} -> AgentPauseState;
    /// Resumes agent calls.
    ResumeAgents "resume_agents" ResumeAgentsArgs {} -> AgentPauseState;
}

impl OperatorCommand {
    /// The command named `name` with `args` (`null` for none), as the operator socket
    /// and the CLI receive it. An unknown name is UNKNOWN_COMMAND; arguments that do not
    /// fit are INVALID_INPUT with `field: "args"`, naming the field serde stopped at and
    /// never a value (a `set_credential` argument carries a secret).
    pub fn parse(name: &str, args: Value) -> Result<OperatorCommand, CommandError> {
        let args = if args.is_null() {
            Value::Object(Default::default())
        } else {
            args
        };
        match OperatorCommand::from_parts(name, args) {
            Some(Ok(command)) => Ok(command),
            Some(Err(e)) => {
                let reason = match e.classify() {
                    // serde's text may quote a value, and this one may carry a secret.
                    _ if name == "set_credential" => {
                        "expected {credential: {id, kind, secret, passphrase?}}".to_string()
                    }
                    serde_json::error::Category::Data => e.to_string(),
                    _ => "the arguments are not a JSON object".to_string(),
                };
                Err(CommandError::field(
                    ErrorCode::InvalidInput,
                    "args",
                    format!("Bad arguments for `{name}`: {reason}"),
                ))
            }
            None => Err(CommandError::field(
                ErrorCode::UnknownCommand,
                "command",
                format!(
                    "Unknown command `{}`; the console knows: {}.",
                    postern_broker::display::escape_text(
                        &name.chars().take(64).collect::<String>()
                    ),
                    COMMANDS.join(", ")
                ),
            )),
        }
    }

    /// The command's arguments as the wire carries them.
    pub fn args_value(&self) -> Value {
        serde_json::to_value(self)
            .ok()
            .and_then(|mut v| v.get_mut("args").map(Value::take))
            .unwrap_or(Value::Null)
    }
}

/// A command as it arrives, before it is checked: its name and its arguments (`null` for
/// none). [`WireCommand::parse`] makes the typed [`OperatorCommand`] or the typed error
/// (UNKNOWN_COMMAND, INVALID_INPUT) the front end shows.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireCommand {
    pub command: String,
    #[serde(default)]
    pub args: Value,
}

impl WireCommand {
    /// The typed command (see [`OperatorCommand::parse`]).
    pub fn parse(self) -> Result<OperatorCommand, CommandError> {
        OperatorCommand::parse(&self.command, self.args)
    }
}

/// `snake_case` as the webview names it (`camelCase`).
pub fn camel(name: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_round_trips_through_its_wire_form() {
        let samples = [
            ("overview", Value::Null),
            (
                "answer_approval",
                serde_json::json!({"invocationId": "inv_1", "fingerprint": "f", "cardDigest": "d", "decision": "approve"}),
            ),
            ("integrity", serde_json::json!({"recheck": true})),
            (
                "query_activity",
                serde_json::json!({"filter": ActivityFilter::default(), "beforeSeq": null, "limit": 5}),
            ),
        ];
        for (name, args) in samples {
            let command = OperatorCommand::parse(name, args).unwrap();
            assert_eq!(command.name(), name);
            let again = OperatorCommand::parse(name, command.args_value()).unwrap();
            assert_eq!(format!("{again:?}"), format!("{command:?}"));
        }
    }

    #[test]
    fn a_misspelt_argument_and_an_unknown_command_are_typed_errors() {
        let e =
            OperatorCommand::parse("integrity", serde_json::json!({"rechek": true})).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidInput);
        assert_eq!(e.field.as_deref(), Some("args"));
        let e = OperatorCommand::parse("approve_everything", Value::Null).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnknownCommand);
    }

    #[test]
    fn a_bad_set_credential_never_echoes_the_secret() {
        let e = OperatorCommand::parse(
            "set_credential",
            // serde would quote this string in its message.
            serde_json::json!({"credential": "CANARY-7f3a"}),
        )
        .unwrap_err();
        assert!(!e.message.contains("CANARY-7f3a"), "{}", e.message);
    }

    #[test]
    fn the_table_names_every_command_once() {
        let names: Vec<&str> = signatures().iter().map(|s| s.name).collect();
        assert_eq!(names, COMMANDS);
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
    }
}
