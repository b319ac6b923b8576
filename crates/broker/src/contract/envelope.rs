//! The evidence envelope: what an agent receives when an invocation did not produce a
//! plain result, and the evidence that supports its outcome. Evidence fields may be
//! added; none is renamed or repurposed. Every field of [`Evidence`] is always serialized
//! (absent values as `null`), so the shape an agent sees does not depend on how far an
//! action got.

use serde::{Deserialize, Serialize};

use super::codes::{
    Code, ConfidenceSource, ErrorBody, MemberState, Outcome, RemoteContract, Stage,
};

/// One connection-setup attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptEvidence {
    pub n: u32,
    pub stage: Stage,
    pub outcome: Outcome,
    pub code: Code,
    /// The proxy (`host:port`, never its credentials) the attempt went through: the hop
    /// whose answer a `proxy_tunnel` failure is. Absent for a direct connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

/// The four idempotency facts stored before dispatch: the key, its scope, the request
/// fingerprint it was bound to, and whether the remote has a contract for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyEvidence {
    pub key: String,
    pub scope: Option<String>,
    pub fingerprint: String,
    pub remote_contract: RemoteContract,
    /// Earliest safe expiry of the key at the remote, unix ms; retries stop before it.
    pub expires_at_ms: Option<i64>,
}

/// How the broker knows what it claims. Every field is always present in JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    pub dispatch_started: bool,
    pub request_headers_sent: bool,
    pub request_complete: bool,
    pub response_headers_received: bool,
    pub response_complete: bool,
    pub attempts: Vec<AttemptEvidence>,
    pub idempotency: Option<IdempotencyEvidence>,
    /// The request fingerprint bound at preflight (`blake3:` + hex).
    pub fingerprint: Option<String>,
    /// Journal sequence of DISPATCH_STARTED, when dispatch began.
    pub dispatch_sequence: Option<u64>,
    /// Journal sequence of the last event this evidence reflects.
    pub journal_sequence: u64,
    /// Which attempt generation the evidence is about (1 for the first).
    pub attempt_generation: u32,
    pub connection_id: Option<String>,
    /// Verified peer identity (TLS certificate digest or SSH host key fingerprint).
    pub peer_identity: Option<String>,
    pub remote_request_id: Option<String>,
    pub http_status: Option<u16>,
    pub response_digest: Option<String>,
    pub exit_status: Option<i32>,
    pub exit_signal: Option<String>,
    pub result_record_id: Option<String>,
    /// How the current outcome became known.
    pub confidence: Option<ConfidenceSource>,
    /// How many copies of the injected secret were scrubbed from the returned result.
    pub redactions: u32,
    /// The request field a validation error is about (`url`, `headers[2].name`, `body`).
    pub field: Option<String>,
    /// For an accepted asynchronous job (HTTP 202): where its status can be checked.
    /// Checking it is a separate invocation; the submission itself is settled.
    pub status_resource: Option<String>,
    /// For a redirect that was not followed: where it pointed.
    pub redirect_location: Option<String>,
    /// Earliest time a new attempt is allowed (from Retry-After), unix ms.
    pub not_before_ms: Option<i64>,
    /// The invocation this one was started for, and why (a followed redirect, a job,
    /// a job poll, a reconcile query).
    pub parent: Option<crate::record::job::ParentLink>,
    /// For a job invocation: the job, where its status is read, and its last state.
    pub job: Option<crate::record::job::JobFacts>,
    /// For a batch: each member's outcome and what settled it (empty otherwise).
    pub members: Vec<MemberState>,
    /// For a call through a peer broker: what the peer proved (its invocation, its
    /// signed attestation and whether the signature verified) and the budgets spent.
    pub peer: Option<crate::record::peer::PeerEvidence>,
}

/// What an agent receives when an invocation did not produce a plain result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    pub invocation_id: String,
    pub error: ErrorBody,
    pub evidence: Evidence,
}
