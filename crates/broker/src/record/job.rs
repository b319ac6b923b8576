//! How one invocation relates to another and the state of a job it tracks: the links
//! and job facts that the journal's events record and the evidence envelope shows.

use serde::{Deserialize, Serialize};

use crate::contract::codes::wire_names;

/// Why an invocation was started by the broker on behalf of another one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    /// The parent's complete 3xx answer was followed (a new dispatch to its `Location`).
    Redirect,
    /// The job a parent's 202 Accepted queued: tracked as its own operation.
    Job,
    /// One read of a job's status resource.
    JobPoll,
    /// The reconcile query run for the parent's unknown outcome.
    ReconcileQuery,
}

wire_names!(Relation {
    Redirect => "redirect",
    Job => "job",
    JobPoll => "job_poll",
    ReconcileQuery => "reconcile_query",
});

/// The invocation a broker-started invocation belongs to, named in its ACTION_ACCEPTED.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct ParentLink {
    pub invocation_id: String,
    pub relation: Relation,
}

/// What a job's status resource said, read through its configured contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Still queued or running (HTTP 202, or a configured pending value).
    Pending,
    /// Finished and applied (HTTP 303, or a configured success value).
    Succeeded,
    /// Finished and reported failure (a configured failure value).
    Failed,
    /// The status resource answered without a state the contract can read.
    Unreported,
}

impl JobState {
    /// A state that settles the job.
    pub fn is_final(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed)
    }
}

wire_names!(JobState {
    Pending => "pending",
    Succeeded => "succeeded",
    Failed => "failed",
    Unreported => "unreported",
});

/// The job an invocation tracks, folded from JOB_TRACKED and JOB_STATUS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct JobFacts {
    /// The submission whose 202 queued it.
    pub submission: String,
    /// The job's id in the remote system, when the contract says where to find it.
    pub job_id: Option<String>,
    /// Where its status is read.
    pub status_resource: String,
    /// The status resource lies under the submission's target, so the broker may read
    /// it with that target's credential; otherwise it is recorded and never read.
    pub pollable: bool,
    pub state: JobState,
    pub polls: u32,
    /// The job_poll invocation that last read the status.
    pub last_poll: Option<String>,
}
