//! The journal's event vocabulary: the nine lifecycle transitions (accepted, validated,
//! credential authorized, dispatch started, request sent, response started, response
//! complete, result committed, result delivered) plus connection
//! attempts, approvals, attempt leases, retry manifests, reconciliation and the
//! tracking of an accepted job; and, outside any invocation, the session records of
//! [`crate::provenance`]. Bodies are stored as canonical JSON (serde field order, no maps with
//! unordered keys) and that exact text is what the audit chain hashes.

use serde::{Deserialize, Serialize};

use crate::action::ConfigSnapshot;
pub use crate::contract::MemberState;
use crate::contract::{
    Code, ConfidenceSource, IdempotencyEvidence, Outcome, Phase, RemoteContract, Retry, Stage,
};
use crate::record::approval::ApprovalCard;
pub use crate::record::job::{JobFacts, JobState, ParentLink, Relation};
use crate::record::session::SessionOpened;
use crate::retry::{Decision, SourceQueryPredicate, Verdict};

/// Which channel an invocation runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    Http,
    Ssh,
    /// A capability another broker exports (`peer/<name>/<capability>`).
    Peer,
}

/// What the configuration says about repeating this operation, bound at preflight so a
/// later config edit cannot change the retry basis of an invocation already recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationFacts {
    /// The target declares this method idempotent (configured knowledge, not the token).
    pub idempotent: bool,
    pub remote_contract: RemoteContract,
    pub idempotency: Option<IdempotencyEvidence>,
    /// A reconcile query is configured, so an unknown outcome can be queried first.
    pub reconcile_configured: bool,
    /// That query, bound with this invocation's key (absent in older records, which
    /// read the configuration at reconcile time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_query: Option<Box<SourceQueryPredicate>>,
    /// For a batch request: its members, bound before dispatch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<Box<BatchOperation>>,
    /// How many dispatches this invocation may make in total, across restarts.
    pub retry_budget: u32,
    /// For a call through a peer broker: whom it asks, the policy version and budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<Box<crate::record::peer::PeerOperation>>,
}

/// A batch request's members and how to settle them, bound at preflight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchOperation {
    /// Member ids in request order.
    pub members: Vec<String>,
    /// The remote applies the batch entirely or not at all: it is reconciled as one.
    pub atomic: bool,
    /// The per-member query, its path still holding `{member_id}`.
    pub member_query: Option<SourceQueryPredicate>,
}

/// What a complete response said about a batch's members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchResult {
    pub members: Vec<MemberState>,
    /// The response carried the target's partial-application signature.
    pub partial_signature: bool,
}

/// How a reconciliation settled an unknown outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(rename_all = "snake_case")]
pub enum Settlement {
    /// The remote applied the operation.
    Committed,
    /// The remote did not apply it.
    NotApplied,
}

/// Non-secret facts about a settled remote result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultFacts {
    pub http_status: Option<u16>,
    pub exit_status: Option<i32>,
    pub exit_signal: Option<String>,
    pub remote_request_id: Option<String>,
    /// HTTP 202: the job's status resource (`Location`).
    #[serde(default)]
    pub status_resource: Option<String>,
    /// HTTP 3xx not followed: the `Location` it pointed to.
    #[serde(default)]
    pub redirect_location: Option<String>,
    /// Retry-After, as an absolute time (unix ms).
    #[serde(default)]
    pub not_before_ms: Option<i64>,
    /// For a batch: each member's outcome as the response reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchResult>,
}

/// Why the retention policy removed a stored result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpiryReason {
    /// Older than `[results] max_age`.
    Age,
    /// Among the oldest when the stored results exceeded `[results] max_bytes`.
    Size,
}

impl ExpiryReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ExpiryReason::Age => "age",
            ExpiryReason::Size => "size",
        }
    }
}

/// One journal transition. The `kind` tag is also stored in its own column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "SCREAMING_SNAKE_CASE", deny_unknown_fields)]
pub enum EventBody {
    /// Request parsed, invocation id assigned.
    ActionAccepted {
        channel: Channel,
        target: String,
        /// A short, secret-free description (method and normalized URL, or host and
        /// command digest) for people reading the log.
        summary: String,
        session: Option<String>,
        /// Set when the broker started this invocation for another one (a followed
        /// redirect, a job, a reconcile query); absent for an agent's own request.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent: Option<ParentLink>,
    },
    /// Target resolved, request normalized, configuration snapshot and fingerprint bound.
    PreflightValidated {
        fingerprint: String,
        snapshot: ConfigSnapshot,
        operation: OperationFacts,
    },
    /// A person was asked. `card` is exactly what the approval card displays and
    /// `card_digest` its [`ApprovalCard::digest`]; both are absent in records written
    /// before cards were recorded.
    ApprovalRequested {
        fingerprint: String,
        mode: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        card: Option<Box<ApprovalCard>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        card_digest: Option<String>,
    },
    /// `card_digest`: the digest of the card the person answered (absent when the answer
    /// named no card: a remembered session approval, or an older record).
    ApprovalGranted {
        fingerprint: String,
        approver: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        card_digest: Option<String>,
    },
    ApprovalDenied {
        fingerprint: String,
        approver: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        card_digest: Option<String>,
    },
    /// The credential was read from the keychain into a private buffer (id and version
    /// tag only here).
    CredentialAuthorized {
        credential_id: String,
        credential_version: String,
    },
    /// A lease on the invocation for one attempt; the generation guards dispatch.
    AttemptStarted {
        generation: u32,
        holder: String,
        lease_expires_at_ms: i64,
    },
    /// One connection-setup stage that failed (or the stage reached when it succeeded,
    /// with outcome not_attempted: nothing crossed dispatch during setup).
    ConnectionAttempt {
        n: u32,
        stage: Stage,
        outcome: Outcome,
        code: Code,
        /// The proxy (`host:port`) the connection went through; absent when direct.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        via: Option<String>,
    },
    /// Appended and fsynced before the first request byte is handed to the transport.
    DispatchStarted {
        generation: u32,
        fingerprint: String,
        connection_id: Option<String>,
        peer_identity: Option<String>,
    },
    RequestSent {
        headers_sent: bool,
        body_complete: bool,
    },
    /// Final response headers (HTTP) or exec accepted (SSH). 1xx never lands here.
    RemoteResponseStarted {
        http_status: Option<u16>,
        remote_request_id: Option<String>,
    },
    /// The protocol's completion marker was observed (declared length, chunked
    /// terminator, exit status and channel close).
    RemoteResponseComplete { digest: String },
    /// The settled result is stored under `result_id` in the same transaction.
    ResultCommitted {
        outcome: Outcome,
        code: Option<Code>,
        retry: Retry,
        result_id: String,
        digest: String,
        facts: ResultFacts,
        confidence: ConfidenceSource,
        redactions: u32,
    },
    /// The caller-facing protocol confirmed the complete handoff.
    ResultDelivered,
    /// The record could not be handed to the caller; it stays retrievable.
    DeliveryFailed { code: Code, message: String },
    /// The retention policy deleted the stored result `result_id` (`bytes` of chunks).
    /// Only the result tables are pruned: the invocation's events, and so its outcome,
    /// stay as recorded.
    ResultExpired {
        result_id: String,
        reason: ExpiryReason,
        bytes: u64,
    },
    /// The current attempt ended without a settled result. `outcome` is this attempt's
    /// outcome; the invocation's outcome is the projection's.
    Failed {
        phase: Phase,
        outcome: Outcome,
        retry: Retry,
        code: Code,
        message: String,
        /// The request field a validation failure is about.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        field: Option<String>,
    },
    /// The retry manifest: verdict, decision and evidence digest, appended before any
    /// retry happens.
    RetryManifest {
        for_generation: u32,
        verdict: Verdict,
        decision: Decision,
        directive: String,
        digest: String,
        /// The bound source query the manifest names (absent before v2 manifests).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source_query_predicate: Option<SourceQueryPredicate>,
        /// The broker's ed25519 signature over the digest, hex (absent before v2).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// A later observer settled an unknown outcome. Never rewrites the attempt.
    Reconciled {
        source: ConfidenceSource,
        settlement: Settlement,
        by: String,
        note: String,
        http_status: Option<u16>,
    },
    /// One member of a batch whose outcome was not known, settled by a query about that
    /// member (its own invocation) or by an operator. Never rewrites the attempt.
    MemberReconciled {
        member: String,
        source: ConfidenceSource,
        settlement: Settlement,
        by: String,
        note: String,
        http_status: Option<u16>,
    },
    /// The job a submission's 202 Accepted queued, tracked as its own operation: the
    /// first event after the ACTION_ACCEPTED of an invocation whose parent relation is
    /// `job`. Its outcome stays unknown until its status resource settles it.
    JobTracked {
        submission: String,
        job_id: Option<String>,
        status_resource: String,
        pollable: bool,
    },
    /// One read of the job's status resource by the job_poll invocation `poll`.
    JobStatus {
        poll: String,
        http_status: u16,
        state: JobState,
    },
    /// Journal-level, not an invocation's: at open, the writer found events after the last
    /// checkpoint (a run ended without signing them, or a version before per-batch
    /// signing wrote them) and signs them now, saying so in the chain.
    SigningResumed {
        first_unsigned: u64,
        last_unsigned: u64,
        /// The newest checkpoint before them (0: none).
        last_checkpoint: u64,
    },
    /// Journal-level, not an invocation's: the operator paused (or resumed) agent calls
    /// (see [`crate::pause`]); `operator` as an approval records its approver. The
    /// newest one is the state the broker opens in after a restart.
    AgentPause { paused: bool, operator: String },
    /// One answer from a peer broker (or the transport failure instead of one), with
    /// its classification, its signature check and the budget it spent. The budgets
    /// of a call through a peer are counted from these, so a restart does not reset
    /// them.
    PeerAnswer(Box<crate::record::peer::PeerAnswer>),
    /// The peer attested, in the answer recorded just before (signed and verified),
    /// that it did not run the call: the attempt ends not_attempted although this
    /// broker dispatched it. `attestation_digest` names that answer's attestation.
    PeerNotRun {
        code: Code,
        retry: Retry,
        message: String,
        attestation_digest: String,
    },
    /// A call through a peer stopped with an incident for its owner (seed 002).
    PeerIncident(Box<crate::record::peer::PeerIncident>),
    /// An agent's bridge connected: who the agent process is, recorded before the
    /// connection may run an invocation. Stored under the session's reserved key
    /// ([`crate::provenance::session_key`]), never under an invocation.
    SessionOpened(SessionOpened),
}

/// The `invocation_id` of journal-level events (not part of any invocation).
pub const JOURNAL_SCOPE: &str = "journal";

/// The kind of [`EventBody::AgentPause`].
pub const AGENT_PAUSE: &str = "AGENT_PAUSE";

impl EventBody {
    /// A FAILED record for a stop before dispatch (nothing was sent).
    pub fn failed_before_dispatch(
        phase: Phase,
        code: Code,
        retry: Retry,
        message: &str,
    ) -> EventBody {
        EventBody::Failed {
            phase,
            outcome: Outcome::NotAttempted,
            retry,
            code,
            message: message.to_string(),
            field: None,
        }
    }

    /// The tag stored in the `kind` column.
    pub fn kind(&self) -> &'static str {
        match self {
            EventBody::ActionAccepted { .. } => "ACTION_ACCEPTED",
            EventBody::PreflightValidated { .. } => "PREFLIGHT_VALIDATED",
            EventBody::ApprovalRequested { .. } => "APPROVAL_REQUESTED",
            EventBody::ApprovalGranted { .. } => "APPROVAL_GRANTED",
            EventBody::ApprovalDenied { .. } => "APPROVAL_DENIED",
            EventBody::CredentialAuthorized { .. } => "CREDENTIAL_AUTHORIZED",
            EventBody::AttemptStarted { .. } => "ATTEMPT_STARTED",
            EventBody::ConnectionAttempt { .. } => "CONNECTION_ATTEMPT",
            EventBody::DispatchStarted { .. } => "DISPATCH_STARTED",
            EventBody::RequestSent { .. } => "REQUEST_SENT",
            EventBody::RemoteResponseStarted { .. } => "REMOTE_RESPONSE_STARTED",
            EventBody::RemoteResponseComplete { .. } => "REMOTE_RESPONSE_COMPLETE",
            EventBody::ResultCommitted { .. } => "RESULT_COMMITTED",
            EventBody::ResultDelivered => "RESULT_DELIVERED",
            EventBody::DeliveryFailed { .. } => "DELIVERY_FAILED",
            EventBody::ResultExpired { .. } => "RESULT_EXPIRED",
            EventBody::Failed { .. } => "FAILED",
            EventBody::RetryManifest { .. } => "RETRY_MANIFEST",
            EventBody::Reconciled { .. } => "RECONCILED",
            EventBody::MemberReconciled { .. } => "MEMBER_RECONCILED",
            EventBody::JobTracked { .. } => "JOB_TRACKED",
            EventBody::JobStatus { .. } => "JOB_STATUS",
            EventBody::SigningResumed { .. } => super::chain::SIGNING_RESUMED,
            EventBody::SessionOpened(_) => "SESSION_OPENED",
            EventBody::AgentPause { .. } => AGENT_PAUSE,
            EventBody::PeerAnswer(_) => "PEER_ANSWER",
            EventBody::PeerNotRun { .. } => "PEER_NOT_RUN",
            EventBody::PeerIncident(_) => "PEER_INCIDENT",
        }
    }

    /// Whether the call that appends this event must not return before it is on disk.
    /// DISPATCH_STARTED is on disk before the first byte is sent, RESULT_COMMITTED before
    /// anything is returned. Settling records (failures, reconciliations, manifests) are durable
    /// too, since a retry decision may be taken on them after a crash.
    pub fn must_be_durable(&self) -> bool {
        matches!(
            self,
            EventBody::DispatchStarted { .. }
                | EventBody::ResultCommitted { .. }
                | EventBody::Failed { .. }
                | EventBody::RetryManifest { .. }
                | EventBody::Reconciled { .. }
                | EventBody::MemberReconciled { .. }
                | EventBody::JobTracked { .. }
                | EventBody::JobStatus { .. }
                | EventBody::SigningResumed { .. }
                | EventBody::SessionOpened(_)
                | EventBody::AgentPause { .. }
                | EventBody::PeerAnswer(_)
                | EventBody::PeerNotRun { .. }
                | EventBody::PeerIncident(_)
        )
    }
}

/// A stored event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Global, gap-free, monotonic order of durable transitions.
    pub seq: u64,
    pub invocation_id: String,
    pub recorded_at_ms: i64,
    pub body: EventBody,
}
