//! `postern operator`: the console's commands over a running daemon's operator socket,
//! answers printed as JSON. Exit status: 0 answered, 1 the broker refused (a typed error,
//! including OPERATOR_REFUSED), 2 the socket could not be reached.

use std::path::Path;

use postern_console::dto::{CommandError, ErrorCode};
use postern_console::operator::OperatorClient;
use serde_json::{Value, json};

use crate::common::{EXIT_FAILED, EXIT_UNAVAILABLE, Failure, Outcome};
use crate::vault_cmd::{Source, read_secret};

/// One operator request: the console command and its arguments.
pub struct Request {
    pub command: &'static str,
    pub args: Value,
}

impl Request {
    pub fn overview() -> Self {
        Request {
            command: "overview",
            args: Value::Null,
        }
    }

    pub fn approvals() -> Self {
        Request {
            command: "list_approvals",
            args: Value::Null,
        }
    }

    pub fn answer(
        invocation_id: &str,
        fingerprint: &str,
        card_digest: &str,
        approve: bool,
    ) -> Self {
        Request {
            command: "answer_approval",
            args: json!({
                "invocationId": invocation_id,
                "fingerprint": fingerprint,
                "cardDigest": card_digest,
                "decision": if approve { "approve" } else { "deny" },
            }),
        }
    }

    pub fn verify() -> Self {
        Request {
            command: "integrity",
            args: json!({"recheck": true}),
        }
    }

    pub fn credentials() -> Self {
        Request {
            command: "list_credentials",
            args: Value::Null,
        }
    }

    pub fn remove_credential(id: &str) -> Self {
        Request {
            command: "remove_credential",
            args: json!({ "id": id }),
        }
    }

    /// Adds or rotates credential `id` with the secret read from `source` (stdin, a
    /// no-echo prompt or a file; never argv). The broker answers with metadata only.
    pub fn set_credential(id: &str, kind: &str, source: &Source) -> Result<Self, Failure> {
        let secret = read_secret(id, source)?;
        if secret.is_empty() {
            return Err(Failure::failed("the secret is empty; nothing was stored"));
        }
        let text = std::str::from_utf8(secret.expose()).map_err(|_| {
            Failure::failed("the secret is not UTF-8 text; the operator socket carries text only")
        })?;
        Ok(Request {
            command: "set_credential",
            args: json!({"credential": {"id": id, "kind": kind, "secret": text}}),
        })
    }

    pub fn sessions() -> Self {
        Request {
            command: "list_sessions",
            args: Value::Null,
        }
    }

    /// Pauses (or resumes) agent calls.
    pub fn pause(paused: bool) -> Self {
        Request {
            command: if paused {
                "pause_agents"
            } else {
                "resume_agents"
            },
            args: Value::Null,
        }
    }

    pub fn incidents() -> Self {
        Request {
            command: "peer_incidents",
            args: Value::Null,
        }
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
pub fn run(socket: &Path, request: Request) -> Outcome {
    let runtime = crate::runtime()?;
    let client = OperatorClient::new(socket);
    let answer = runtime.block_on(client.call(request.command, request.args));
    match answer {
        Ok(value) => {
            let text = serde_json::to_string_pretty(&value)
                .map_err(|e| Failure::failed(format!("cannot print the answer: {e}")))?;
            println!("{text}");
            // A failed integrity check is a failed check, as `postern audit verify` says.
            if request.command == "integrity" && value["state"] != "verified" {
                return Err(Failure::silent(EXIT_FAILED));
            }
            Ok(())
        }
        Err(error) => Err(failure(&error)),
    }
}
