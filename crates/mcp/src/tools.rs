//! The agent-facing tools: names, descriptions written for a model, exact input schemas
//! (unknown fields rejected), and the typed arguments they parse into.
//!
//! There is deliberately no tool that reveals a secret, approves, reads the audit log
//! or changes configuration: those belong to the operator side only.

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::model::{JsonObject, Tool};
use serde::Deserialize;
use serde_json::{Value, json};

pub const HTTP_REQUEST: &str = "http_request";
pub const SSH_EXEC: &str = "ssh_exec";
pub const FETCH_RESULT: &str = "fetch_result";
pub const GET_INVOCATION: &str = "get_invocation";
pub const RETRY_INVOCATION: &str = "retry_invocation";
pub const LIST_TARGETS: &str = "list_targets";
pub const POLL_JOB: &str = "poll_job";

/// Every tool's name, for checking that nothing else is exposed.
pub const ALL: &[&str] = &[
    HTTP_REQUEST,
    SSH_EXEC,
    FETCH_RESULT,
    GET_INVOCATION,
    RETRY_INVOCATION,
    POLL_JOB,
    LIST_TARGETS,
];

const OUTCOMES: &str = "Every answer carries `invocation_id` and `outcome`. Outcomes: \
`not_attempted` = nothing reached the remote system (safe to fix and send again); \
`rejected` = the remote refused it with a complete answer (it did not act); \
`committed` = the remote gave a complete answer (it may have acted, even if the status is an error); \
`unknown` = the request may have reached the remote and no complete answer arrived: it MAY HAVE \
ACTED. Never resend an `unknown` request as a new call; use retry_invocation, which only repeats \
when that is provably safe, or ask a person to reconcile. Errors carry `error.code`, `error.phase`, \
`error.outcome` and `error.retry` (never, after_correction, backoff, same_idempotency_key, \
reconcile, fetch_result): follow `retry`, do not parse `message`.";

/// A tool's input: an object with exactly these `properties` (an unknown field is
/// refused), of which the `required` ones must be given.
fn input(required: &[&str], properties: Value) -> Arc<JsonObject> {
    let mut schema = JsonObject::new();
    schema.insert("type".into(), json!("object"));
    schema.insert("additionalProperties".into(), json!(false));
    if !required.is_empty() {
        schema.insert("required".into(), json!(required));
    }
    schema.insert("properties".into(), properties);
    Arc::new(schema)
}

fn invocation_schema() -> Arc<JsonObject> {
    input(
        &["invocation_id"],
        json!({
            "invocation_id": {"type": "string", "description": "The id an earlier call returned."}
        }),
    )
}

/// The tool list, in a stable order.
pub fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            HTTP_REQUEST,
            format!(
                "Send an HTTP request to a configured target. Postern adds the credential; you \
                 never see it, and you must not send Authorization or similar headers yourself. \
                 Some targets need a person's approval first (the call waits). {OUTCOMES}"
            ),
            input(
                &["url", "method"],
                json!({
                    "url": {"type": "string", "description": "Absolute URL under a configured target, or peer://<peer>/<capability>/<path> for a capability another broker exports (see list_targets)."},
                    "method": {"type": "string", "description": "HTTP method, e.g. GET or POST."},
                    "headers": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Extra request headers (not credentials, not framing)."},
                    "query": {"type": "array", "items": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2}, "description": "Extra query parameters as [name, value] pairs, in order."},
                    "body": {"type": "string", "description": "Request body as text."},
                    "body_base64": {"type": "string", "description": "Request body as base64 (instead of body)."},
                    "idempotency_key": {"type": "string", "description": "Your key for this logical operation; reusing it with a different request is refused."},
                    "timeout_ms": {"type": "integer", "minimum": 1, "description": "Give up waiting after this long (the remote may still act)."}
                }),
            ),
        ),
        Tool::new(
            SSH_EXEC,
            format!(
                "Run a command on a configured SSH host. Postern logs in with a key you never \
                 see, against a pinned host key. Any exit status is a result (`committed`): \
                 exit 23 means the command ran and said 23. If the connection drops after the \
                 command was sent, the outcome is `unknown` and the command may still be \
                 running. {OUTCOMES}"
            ),
            input(
                &["host", "command"],
                json!({
                    "host": {"type": "string", "description": "An SSH target name or its host (see list_targets)."},
                    "command": {"type": "string", "description": "The command line to run."},
                    "stdin": {"type": "string", "description": "Text sent to the command's standard input."},
                    "timeout_ms": {"type": "integer", "minimum": 1, "description": "Give up waiting after this long (the command may keep running)."}
                }),
            ),
        ),
        Tool::new(
            FETCH_RESULT,
            "Read the stored result of an earlier invocation again. This never re-sends \
             anything: use it when an answer was lost on the way to you (retry = fetch_result). \
             Results over 1 MiB come in pieces: an answer with `delivery` carries one piece \
             (`data_base64`, `stream`, `offset`, `length`, `piece_digest` = blake3 of the \
             piece) and, until the last piece, a `cursor`; pass that cursor back to get the \
             next piece. After a lost answer, resume with the cursor of the last piece you \
             verified. Only the last piece says `complete: true`. A result removed by the \
             retention policy answers RESULT_EXPIRED.",
            input(
                &["invocation_id"],
                json!({
                    "invocation_id": {"type": "string", "description": "The id an earlier call returned."},
                    "cursor": {"type": "string", "description": "The `delivery.cursor` of an earlier answer, unchanged: where to continue."},
                    "max_bytes": {"type": "integer", "minimum": 1, "maximum": 1048576, "description": "At most this many result bytes in the piece (default and maximum 1 MiB)."}
                }),
            ),
        ),
        Tool::new(
            GET_INVOCATION,
            "Show what Postern recorded for one of your invocations: phase, outcome, retry \
             advice, the evidence, and every recorded step in order.",
            invocation_schema(),
        ),
        Tool::new(
            RETRY_INVOCATION,
            format!(
                "Ask Postern to repeat one of your invocations. It repeats only on a safe basis \
                 (never sent, declared idempotent, or the same idempotency key under the API's \
                 contract); otherwise it returns the recorded evidence and a retry manifest \
                 saying why not (for example: reconcile first). {OUTCOMES}"
            ),
            invocation_schema(),
        ),
        Tool::new(
            POLL_JOB,
            "Check on a job that an http_request queued (the API answered 202 Accepted; the \
             answer's `job.invocation_id` names it). Pass the job's or the submission's \
             invocation_id. Postern reads the job's status resource once, with the target's \
             credential, and answers the job's `outcome`: `unknown` with code JOB_PENDING \
             while it runs, `committed` once it finished (code JOB_FAILED if it reported \
             failure), plus the read itself under `poll`. Never re-submit a pending job: \
             the submission was accepted and the job may still act.",
            invocation_schema(),
        ),
        Tool::new(
            LIST_TARGETS,
            "List the targets you can call: name, base URL, allowed methods, which methods the \
             API declares idempotent, and whether calls need approval.",
            input(&[], json!({})),
        ),
    ]
}

/// `http_request` arguments, exactly.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpRequestArgs {
    pub url: String,
    pub method: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub query: Vec<(String, String)>,
    pub body: Option<String>,
    pub body_base64: Option<String>,
    pub idempotency_key: Option<String>,
    pub timeout_ms: Option<u64>,
}

/// `ssh_exec` arguments, exactly.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SshExecArgs {
    pub host: String,
    pub command: String,
    pub stdin: Option<String>,
    pub timeout_ms: Option<u64>,
}

/// Arguments naming one invocation.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvocationArgs {
    pub invocation_id: String,
}

/// `fetch_result` arguments: the invocation, and optionally where to continue and how
/// much to take.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FetchResultArgs {
    pub invocation_id: String,
    pub cursor: Option<String>,
    pub max_bytes: Option<u64>,
}

/// `list_targets` takes nothing.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_rejects_unknown_fields() {
        for tool in tools() {
            assert_eq!(
                tool.input_schema.get("additionalProperties"),
                Some(&json!(false)),
                "{}",
                tool.name
            );
        }
    }

    #[test]
    fn no_tool_reveals_approves_audits_or_configures() {
        for tool in tools() {
            for word in ["secret", "approve", "audit", "config", "vault"] {
                assert!(
                    !tool.name.contains(word),
                    "{} looks like an operator tool",
                    tool.name
                );
            }
        }
        assert_eq!(tools().len(), ALL.len());
    }

    #[test]
    fn unknown_argument_fields_are_refused() {
        let bad = json!({"url": "http://x", "method": "GET", "authorization": "x"});
        assert!(serde_json::from_value::<HttpRequestArgs>(bad).is_err());
    }
}
