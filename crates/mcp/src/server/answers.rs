//! An outcome made into a tool result: the response or the command's output as JSON
//! (text, or base64 when it is not UTF-8), the evidence, a 202's job, and a result over
//! the piece cap sent as its first piece and a cursor.

use base64::Engine;
use rmcp::model::CallToolResult;
use serde_json::{Value, json};

use postern_broker::channel::http::{HttpOutcome, HttpResponse};
use postern_broker::channel::ssh::{SshOutcome, SshResult};
use postern_broker::delivery::Piece;
use postern_broker::journal::events::Relation;

use super::Session;
use crate::tools::{self};

impl Session {
    /// An `http_request` (or retry) answer, capped, and whether it carried the whole result.
    pub(super) fn http_answer(&self, outcome: &HttpOutcome) -> (CallToolResult, bool) {
        let bytes = outcome.result.as_ref().map_or(0, |r| r.body.len() as u64);
        let mut answer = http_value(outcome);
        // A 202 queued a job: say which invocation tracks it, for poll_job. (Only then is
        // the journal asked: every other answer skips the lookup.)
        let accepted = outcome.result.as_ref().is_some_and(|r| r.status == 202);
        if let Some(job) = accepted
            .then(|| {
                let owned = self
                    .agents
                    .owned(&self.identity.session, &outcome.invocation_id);
                owned.ok().and_then(|o| self.agents.children(&o).ok())
            })
            .flatten()
            .and_then(|c| c.into_iter().find(|l| l.relation == Relation::Job))
        {
            answer.0["job"] = json!({
                "invocation_id": job.invocation_id,
                "poll_with": tools::POLL_JOB,
            });
        }
        match self.first_piece(&outcome.invocation_id, bytes) {
            Some(piece) => (pieced(answer, &piece), false),
            None => (wrap(answer), true),
        }
    }

    /// An `ssh_exec` answer, capped, and whether it carried the whole result.
    pub(super) fn ssh_answer(&self, outcome: &SshOutcome) -> (CallToolResult, bool) {
        let bytes = outcome
            .result
            .as_ref()
            .map_or(0, |r| (r.stdout.len() + r.stderr.len()) as u64);
        match self.first_piece(&outcome.invocation_id, bytes) {
            Some(piece) => (pieced(ssh_value(outcome), &piece), false),
            None => (ssh_result_of(outcome), true),
        }
    }
}

fn text_or_base64(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => Value::String(text.to_string()),
        Err(_) => json!({ "base64": base64::engine::general_purpose::STANDARD.encode(bytes) }),
    }
}

fn ssh_json(result: &SshResult) -> Value {
    json!({
        "exit_status": result.exit_status,
        "exit_signal": result.exit_signal,
        "stdout": text_or_base64(&result.stdout),
        "stderr": text_or_base64(&result.stderr),
        "stdout_complete": result.stdout_complete,
        "stderr_complete": result.stderr_complete,
        "host_key_fingerprint": result.host_key_fingerprint,
    })
}

/// An `ssh_exec` result: `{invocation_id, outcome, exit_status, exit_signal,
/// stdout, stderr, stdout_complete, stderr_complete, host_key_fingerprint}`, or the
/// envelope when the record carries a code.
pub fn ssh_result_of(outcome: &SshOutcome) -> CallToolResult {
    wrap(ssh_value(outcome))
}

/// An answer's JSON, and whether it is an error.
pub(super) type Answer = (Value, bool);

fn wrap((value, error): Answer) -> CallToolResult {
    if error {
        CallToolResult::structured_error(value)
    } else {
        CallToolResult::structured(value)
    }
}

fn ssh_value(outcome: &SshOutcome) -> Answer {
    match (&outcome.error, &outcome.result) {
        (None, Some(result)) => {
            let mut value =
                json!({ "invocation_id": outcome.invocation_id, "outcome": outcome.outcome });
            if let (Value::Object(map), Value::Object(extra)) = (&mut value, ssh_json(result)) {
                map.extend(extra);
            }
            (value, false)
        }
        (Some(envelope), result) => {
            let mut value = serde_json::to_value(envelope).unwrap_or(Value::Null);
            if let Some(result) = result {
                value["result"] = ssh_json(result);
            }
            (value, true)
        }
        (None, None) => (
            json!({ "invocation_id": outcome.invocation_id, "outcome": outcome.outcome }),
            false,
        ),
    }
}

/// An answer whose result goes out in pieces: the streams' bytes are replaced by the
/// first piece (`delivery`), which carries the cursor of the next.
fn pieced((mut value, error): Answer, piece: &Piece) -> CallToolResult {
    const STREAM_KEYS: [&str; 4] = ["body", "body_base64", "stdout", "stderr"];
    for nested in ["", "response", "result"] {
        let target = if nested.is_empty() {
            Some(&mut value)
        } else {
            value.get_mut(nested)
        };
        if let Some(Value::Object(map)) = target {
            for key in STREAM_KEYS {
                map.remove(key);
            }
        }
    }
    value["delivery"] = serde_json::to_value(piece).unwrap_or(Value::Null);
    wrap((value, error))
}

fn response_json(response: &HttpResponse) -> Value {
    let headers: serde_json::Map<String, Value> = response
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let mut out = json!({ "status": response.status, "headers": headers });
    match std::str::from_utf8(&response.body) {
        Ok(text) => out["body"] = Value::String(text.to_string()),
        Err(_) => {
            out["body_base64"] =
                Value::String(base64::engine::general_purpose::STANDARD.encode(&response.body))
        }
    }
    if let Some(from) = &response.decoded_from {
        out["decoded_from"] = Value::String(from.clone());
    }
    if let Some(reason) = &response.body_withheld {
        out["body_withheld"] = serde_json::to_value(reason).unwrap_or(Value::Null);
        out["body_withheld"]["message"] = Value::String(reason.message());
    }
    out
}

/// A tool result: the remote response with `invocation_id` and `outcome`, or, when the
/// record carries a code, `isError` with the envelope (plus the response, if complete).
pub fn result_of(outcome: &HttpOutcome) -> CallToolResult {
    wrap(http_value(outcome))
}

pub(super) fn http_value(outcome: &HttpOutcome) -> Answer {
    let mut value = match &outcome.error {
        Some(envelope) => serde_json::to_value(envelope).unwrap_or(Value::Null),
        None => json!({ "invocation_id": outcome.invocation_id, "outcome": outcome.outcome }),
    };
    if let Some(response) = &outcome.result {
        if outcome.error.is_some() {
            value["response"] = response_json(response);
        } else if let (Value::Object(map), Value::Object(extra)) =
            (&mut value, response_json(response))
        {
            map.extend(extra);
        }
    }
    if let Some(manifest) = &outcome.manifest {
        value["manifest"] = serde_json::to_value(manifest).unwrap_or(Value::Null);
    }
    (value, outcome.error.is_some())
}
