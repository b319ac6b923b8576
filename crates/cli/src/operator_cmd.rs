//! `postern operator`: the console's commands over a running daemon's operator socket,
//! answers printed as JSON. Exit status: 0 answered, 1 the broker refused (a typed error,
//! including OPERATOR_REFUSED), 2 the socket could not be reached.

use std::path::Path;

use postern_console::dto::{CommandError, ErrorCode};
use postern_console::operator::OperatorClient;
use postern_console::protocol::OperatorCommand;
use serde_json::json;

use crate::common::{EXIT_FAILED, EXIT_UNAVAILABLE, Failure, Outcome};
use crate::vault_cmd::{Source, read_secret};

/// The operator commands the CLI gives, built as the typed protocol
/// ([`OperatorCommand`]) the console and the desktop use.
pub mod request {
    use postern_console::dto::{Decision, SetCredential};
    use postern_console::protocol::*;

    use super::*;

    pub fn overview() -> OperatorCommand {
        OperatorCommand::Overview(OverviewArgs {})
    }

    pub fn approvals() -> OperatorCommand {
        OperatorCommand::ListApprovals(ListApprovalsArgs {})
    }

    pub fn answer(
        invocation_id: &str,
        fingerprint: &str,
        card_digest: &str,
        approve: bool,
    ) -> OperatorCommand {
        OperatorCommand::AnswerApproval(AnswerApprovalArgs {
            invocation_id: invocation_id.to_string(),
            fingerprint: fingerprint.to_string(),
            card_digest: card_digest.to_string(),
            decision: if approve {
                Decision::Approve
            } else {
                Decision::Deny
            },
        })
    }

    pub fn verify() -> OperatorCommand {
        OperatorCommand::Integrity(IntegrityArgs { recheck: true })
    }

    pub fn credentials() -> OperatorCommand {
        OperatorCommand::ListCredentials(ListCredentialsArgs {})
    }

    pub fn remove_credential(id: &str) -> OperatorCommand {
        OperatorCommand::RemoveCredential(RemoveCredentialArgs { id: id.to_string() })
    }

    /// Adds or rotates credential `id` with the secret read from `source` (stdin, a
    /// no-echo prompt or a file; never argv). The broker answers with metadata only.
    pub fn set_credential(
        id: &str,
        kind: &str,
        source: &Source,
    ) -> Result<OperatorCommand, Failure> {
        let secret = read_secret(id, source)?;
        if secret.is_empty() {
            return Err(Failure::failed("the secret is empty; nothing was stored"));
        }
        let text = std::str::from_utf8(secret.expose()).map_err(|_| {
            Failure::failed("the secret is not UTF-8 text; the operator socket carries text only")
        })?;
        Ok(OperatorCommand::SetCredential(SetCredentialArgs {
            credential: SetCredential {
                id: id.to_string(),
                kind: kind.to_string(),
                secret: text.to_string(),
                passphrase: None,
            },
        }))
    }

    pub fn sessions() -> OperatorCommand {
        OperatorCommand::ListSessions(ListSessionsArgs {})
    }

    /// Pauses (or resumes) agent calls.
    pub fn pause(paused: bool) -> OperatorCommand {
        if paused {
            OperatorCommand::PauseAgents(PauseAgentsArgs {})
        } else {
            OperatorCommand::ResumeAgents(ResumeAgentsArgs {})
        }
    }

    pub fn incidents() -> OperatorCommand {
        OperatorCommand::PeerIncidents(PeerIncidentsArgs {})
    }
}

/// The error as JSON on stdout (what a script reads) and as a sentence on stderr.
fn failure(error: &CommandError) -> Failure {
    eprintln!(
        "postern: operator: {}: {}",
        error.code.as_str(),
        error.message
    );
    let status = if error.code == ErrorCode::OperatorUnreachable {
        EXIT_UNAVAILABLE
    } else {
        EXIT_FAILED
    };
    Failure {
        status,
        message: format!("{}: {}", error.code.as_str(), error.message),
        json: Some(json!({"ok": false, "error": error})),
    }
}

/// Sends `request` to the operator socket at `socket` and prints the answer.
pub fn run(socket: &Path, request: OperatorCommand) -> Outcome {
    let runtime = crate::runtime()?;
    let client = OperatorClient::new(socket);
    let answer = runtime.block_on(client.run(&request));
    match answer {
        Ok(value) => {
            let text = serde_json::to_string_pretty(&value)
                .map_err(|e| Failure::failed(format!("cannot print the answer: {e}")))?;
            println!("{text}");
            // A failed integrity check is a failed check, as `postern audit verify` says.
            if matches!(request, OperatorCommand::Integrity(_)) && value["state"] != "verified" {
                return Err(Failure::silent(EXIT_FAILED));
            }
            Ok(())
        }
        Err(error) => Err(failure(&error)),
    }
}
