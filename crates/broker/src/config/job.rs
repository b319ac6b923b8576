//! Asynchronous acceptance (seed 000: "a complete HTTP 202 response is a committed result
//! for the submission, not proof that the queued job finished"). The submission stays
//! settled as it was; the job it queued becomes its own invocation, linked to it
//! (relation `job`), whose outcome stays unknown until its status resource says the job
//! finished. Each read of that resource is a third invocation (relation `job_poll`), run
//! through the pipeline like any GET, so it is journaled, credentialed for the same
//! target only, and approved where the target asks.
//!
//! How a status resource is read comes from the target's optional `[http.job]` table;
//! without one, the HTTP status alone is read: 202 pending, 303 succeeded, anything
//! else unreported.

use serde_json::Value;

use crate::record::job::JobState;

/// A target's `[http.job]` table: where a 202's body names the job, and how a status
/// response says what state the job is in. Values are compared as text (a JSON number
/// 3 matches "3").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JobContract {
    /// JSON pointer to the job's id in the 202 body.
    pub id_pointer: Option<String>,
    /// JSON pointer to the status resource in the 202 body, used when the response
    /// has no `Location`.
    pub status_pointer: Option<String>,
    /// JSON pointer to the job's state in a status response.
    pub state_pointer: Option<String>,
    pub pending: Vec<String>,
    pub succeeded: Vec<String>,
    pub failed: Vec<String>,
}

/// The `[http.job]` table as written.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJob {
    id_pointer: Option<String>,
    status_pointer: Option<String>,
    state_pointer: Option<String>,
    #[serde(default)]
    pending: Vec<String>,
    #[serde(default)]
    succeeded: Vec<String>,
    #[serde(default)]
    failed: Vec<String>,
}

/// Why a `[http.job]` table is refused: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobProblem {
    /// Not a JSON pointer (RFC 6901: empty, or starting with `/`).
    Pointer { field: &'static str },
    /// States are listed but there is no `state_pointer` to read them from.
    StatesWithoutPointer,
    /// `state_pointer` is set but no value says the job succeeded.
    NoSuccessState,
    /// One value is listed under two states.
    ConflictingState { value: String },
}

impl JobContract {
    /// Checks a raw table.
    pub fn check(raw: RawJob) -> Result<JobContract, JobProblem> {
        for (field, pointer) in [
            ("job.id_pointer", &raw.id_pointer),
            ("job.status_pointer", &raw.status_pointer),
            ("job.state_pointer", &raw.state_pointer),
        ] {
            if let Some(p) = pointer
                && !is_pointer(p)
            {
                return Err(JobProblem::Pointer { field });
            }
        }
        let listed = !(raw.pending.is_empty() && raw.succeeded.is_empty() && raw.failed.is_empty());
        if raw.state_pointer.is_none() && listed {
            return Err(JobProblem::StatesWithoutPointer);
        }
        if raw.state_pointer.is_some() && raw.succeeded.is_empty() {
            return Err(JobProblem::NoSuccessState);
        }
        let mut seen: Vec<&String> = Vec::new();
        for value in raw.pending.iter().chain(&raw.succeeded).chain(&raw.failed) {
            if seen.contains(&value) {
                return Err(JobProblem::ConflictingState {
                    value: value.clone(),
                });
            }
            seen.push(value);
        }
        let sorted = |mut v: Vec<String>| {
            v.sort();
            v
        };
        Ok(JobContract {
            id_pointer: raw.id_pointer,
            status_pointer: raw.status_pointer,
            state_pointer: raw.state_pointer,
            pending: sorted(raw.pending),
            succeeded: sorted(raw.succeeded),
            failed: sorted(raw.failed),
        })
    }

    /// The job's id in a 202 body, if the contract says where it is.
    pub fn job_id(&self, body: &[u8]) -> Option<String> {
        text_at(body, self.id_pointer.as_deref()?)
    }

    /// The status resource named in a 202 body, if the contract says where it is.
    pub fn status_in_body(&self, body: &[u8]) -> Option<String> {
        text_at(body, self.status_pointer.as_deref()?)
    }

    /// What one complete status response says about the job.
    pub fn state_of(&self, status: u16, body: &[u8]) -> JobState {
        match status {
            202 => JobState::Pending,
            303 => JobState::Succeeded,
            200..=299 => {
                let Some(value) = self.state_pointer.as_deref().and_then(|p| text_at(body, p))
                else {
                    return JobState::Unreported;
                };
                if self.succeeded.contains(&value) {
                    JobState::Succeeded
                } else if self.failed.contains(&value) {
                    JobState::Failed
                } else if self.pending.contains(&value) {
                    JobState::Pending
                } else {
                    JobState::Unreported
                }
            }
            _ => JobState::Unreported,
        }
    }
}

/// RFC 6901: the empty pointer or one starting with `/`.
pub fn is_pointer(p: &str) -> bool {
    p.is_empty() || p.starts_with('/')
}

/// The scalar at `pointer` in a JSON body, as text; `None` for a body that is not JSON,
/// a missing member, or an object or array.
pub fn text_at(body: &[u8], pointer: &str) -> Option<String> {
    let doc: Value = serde_json::from_slice(body).ok()?;
    scalar_text(doc.pointer(pointer)?)
}

/// A JSON scalar as text: strings as they are, numbers and booleans as written.
pub fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contract() -> JobContract {
        JobContract::check(RawJob {
            id_pointer: Some("/job/id".into()),
            status_pointer: Some("/job/href".into()),
            state_pointer: Some("/state".into()),
            pending: vec!["queued".into(), "running".into()],
            succeeded: vec!["done".into()],
            failed: vec!["error".into(), "3".into()],
        })
        .unwrap()
    }

    #[test]
    fn a_status_response_is_read_through_the_contract_and_the_http_status() {
        let c = contract();
        assert_eq!(c.state_of(202, b""), JobState::Pending);
        assert_eq!(c.state_of(303, b""), JobState::Succeeded);
        assert_eq!(
            c.state_of(200, br#"{"state":"running"}"#),
            JobState::Pending
        );
        assert_eq!(c.state_of(200, br#"{"state":"done"}"#), JobState::Succeeded);
        assert_eq!(c.state_of(200, br#"{"state":"error"}"#), JobState::Failed);
        assert_eq!(c.state_of(200, br#"{"state":3}"#), JobState::Failed);
        assert_eq!(c.state_of(200, br#"{"state":"new"}"#), JobState::Unreported);
        assert_eq!(c.state_of(200, b"not json"), JobState::Unreported);
        assert_eq!(
            c.state_of(200, br#"{"state":{"x":1}}"#),
            JobState::Unreported
        );
        assert_eq!(
            c.state_of(404, br#"{"state":"done"}"#),
            JobState::Unreported
        );
        assert_eq!(
            c.state_of(500, br#"{"state":"done"}"#),
            JobState::Unreported
        );
        // Without a contract only the status speaks.
        let none = JobContract::default();
        assert_eq!(
            none.state_of(200, br#"{"state":"done"}"#),
            JobState::Unreported
        );
        assert_eq!(none.state_of(202, b""), JobState::Pending);
    }

    #[test]
    fn the_job_id_and_status_resource_come_from_the_named_members() {
        let c = contract();
        let body = br#"{"job":{"id":41,"href":"/v1/jobs/41"}}"#;
        assert_eq!(c.job_id(body).as_deref(), Some("41"));
        assert_eq!(c.status_in_body(body).as_deref(), Some("/v1/jobs/41"));
        assert_eq!(JobContract::default().job_id(body), None);
    }

    #[test]
    fn bad_tables_are_refused_with_the_reason() {
        let raw = |state: Option<&str>, succeeded: &[&str], failed: &[&str]| RawJob {
            id_pointer: None,
            status_pointer: None,
            state_pointer: state.map(str::to_string),
            pending: vec![],
            succeeded: succeeded.iter().map(|s| s.to_string()).collect(),
            failed: failed.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(
            JobContract::check(raw(Some("state"), &["ok"], &[])),
            Err(JobProblem::Pointer {
                field: "job.state_pointer"
            })
        );
        assert_eq!(
            JobContract::check(raw(None, &["ok"], &[])),
            Err(JobProblem::StatesWithoutPointer)
        );
        assert_eq!(
            JobContract::check(raw(Some("/s"), &[], &["x"])),
            Err(JobProblem::NoSuccessState)
        );
        assert_eq!(
            JobContract::check(raw(Some("/s"), &["x"], &["x"])),
            Err(JobProblem::ConflictingState { value: "x".into() })
        );
    }
}
