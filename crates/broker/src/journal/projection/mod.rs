//! The current status of an invocation, folded from its events.
//!
//! The fold refuses impossible transitions rather than papering over them, so the same
//! code guards appends (the writer refuses an event the projection rejects) and reads (a
//! tampered or corrupt record surfaces as an error, not a plausible status). The rules:
//! after DISPATCH_STARTED the outcome is `unknown` until authoritative
//! evidence settles it and never `not_attempted`; `unknown` may become `rejected` or
//! `committed`; `committed` never changes.
//!
//! `transitions` holds the rules, one transition per event family; this module holds
//! the state they move and what is read from it (the retry disposition, the evidence,
//! the envelope).

mod transitions;

use crate::contract::{
    AttemptEvidence, Code, ConfidenceSource, Envelope, ErrorBody, Evidence, MemberState, Outcome,
    Phase, RemoteContract, Retry,
};
// Up a floor (ARCHITECTURE.md, Layers): the federation payloads the journal stores and
// the projection reads are defined beside the federation protocol.
use crate::journal::events::{
    Channel, Event, EventBody, ExpiryReason, OperationFacts, ResultFacts, Settlement,
};
use crate::record::job::{JobFacts, ParentLink};
use crate::record::peer::Incident;
use crate::record::peer::{PeerAnswer, PeerEvidence};
use crate::retry::{MemberDisposition, RecordFacts, disposition_for_unknown};

/// A call through a peer broker: its answers so far, folded from PEER_ANSWER.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerState {
    /// Answers across every attempt (and reconciliation): the next is `answers + 1`.
    pub answers: u32,
    /// The budgets spent, across attempts and restarts.
    pub transient_used: u32,
    pub unknown_used: u32,
    /// The latest answer.
    pub last: Option<PeerAnswer>,
    /// Whether `last` belongs to the current attempt (cleared when one starts).
    pub last_in_attempt: bool,
    /// The latest answer with a verified attestation, of any attempt.
    pub last_verified: Option<PeerAnswer>,
    /// The incident raised, if any.
    pub incident: Option<Incident>,
}

/// Why an event cannot follow the ones before it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invocation {invocation_id}: {kind} at sequence {seq} is impossible here: {reason}")]
pub struct ProjectionError {
    pub invocation_id: String,
    pub seq: u64,
    pub kind: &'static str,
    pub reason: &'static str,
}

/// Markers of the current attempt: after dispatch they say how far the exchange got,
/// which is diagnosis; only a complete result or a reconciliation settles it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttemptMarkers {
    pub generation: u32,
    pub dispatched: bool,
    pub dispatch_seq: Option<u64>,
    pub headers_sent: bool,
    pub request_complete: bool,
    pub response_headers_received: bool,
    pub response_complete: bool,
    /// The attempt ended (settled or failed); no further transport events belong to it.
    pub closed: bool,
    pub connection_id: Option<String>,
    pub peer_identity: Option<String>,
    pub remote_request_id: Option<String>,
    pub http_status: Option<u16>,
    pub response_digest: Option<String>,
}

/// The folded status of one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Projection {
    pub invocation_id: String,
    pub channel: Option<Channel>,
    pub target: Option<String>,
    pub summary: Option<String>,
    pub session: Option<String>,
    pub phase: Phase,
    pub outcome: Outcome,
    /// The retry disposition recorded by the last terminal event, if any. For an
    /// unsettled unknown outcome, [`Projection::retry`] derives it from the operation.
    recorded_retry: Option<Retry>,
    pub code: Option<Code>,
    pub message: Option<String>,
    /// The request field a validation failure is about.
    pub field: Option<String>,
    pub fingerprint: Option<String>,
    pub operation: Option<OperationFacts>,
    pub credential: Option<(String, String)>,
    pub approved: bool,
    pub denied: bool,
    /// Some attempt of this invocation crossed dispatch. Sticky.
    pub ever_dispatched: bool,
    /// Total dispatches, counted against the retry budget.
    pub dispatches: u32,
    pub attempt: AttemptMarkers,
    /// The markers of the latest attempt that crossed dispatch, kept when a later
    /// attempt did not, so the evidence behind an unknown outcome never disappears.
    pub last_dispatched: Option<AttemptMarkers>,
    pub attempts: Vec<AttemptEvidence>,
    /// The generation a retry manifest authorized, if one is outstanding.
    pub authorized_generation: Option<u32>,
    pub result_id: Option<String>,
    pub result_facts: Option<ResultFacts>,
    pub confidence: Option<ConfidenceSource>,
    pub redactions: u32,
    pub delivered: bool,
    pub delivery_failed: bool,
    /// The retention policy removed the stored result: the sequence of its
    /// RESULT_EXPIRED record, why, and how many bytes were removed.
    pub result_expired: Option<(u64, ExpiryReason, u64)>,
    /// The attempt or the invocation reached a terminal record.
    pub terminal: bool,
    pub reconciled: Option<Settlement>,
    pub last_seq: u64,
    /// The key holds session records ([`crate::provenance`]), not an invocation: it
    /// never exists as one and there is nothing to recover.
    pub session_record: bool,
    /// The invocation this one was started for (a followed redirect, a job, a query).
    pub parent: Option<ParentLink>,
    /// For a job invocation: the job and what its status resource last said.
    pub job: Option<JobFacts>,
    /// For a batch: each member's outcome, in request order.
    pub members: Vec<MemberState>,
    /// For a call through a peer broker: its answers and what they proved.
    pub peer: Option<PeerState>,
}

impl Projection {
    /// Whether this is an unknown outcome that nothing has settled: its attempt is
    /// closed (not still running) and no reconciliation was recorded. Only such an
    /// outcome can be queried or attested.
    pub fn is_unsettled(&self) -> bool {
        self.outcome == Outcome::Unknown && self.terminal && self.reconciled.is_none()
    }

    fn empty(invocation_id: &str) -> Self {
        Projection {
            invocation_id: invocation_id.to_string(),
            channel: None,
            target: None,
            summary: None,
            session: None,
            phase: Phase::Validation,
            outcome: Outcome::NotAttempted,
            recorded_retry: None,
            code: None,
            message: None,
            field: None,
            fingerprint: None,
            operation: None,
            credential: None,
            approved: false,
            denied: false,
            ever_dispatched: false,
            dispatches: 0,
            attempt: AttemptMarkers::default(),
            last_dispatched: None,
            attempts: Vec::new(),
            authorized_generation: None,
            result_id: None,
            result_facts: None,
            confidence: None,
            redactions: 0,
            delivered: false,
            delivery_failed: false,
            result_expired: None,
            terminal: false,
            reconciled: None,
            last_seq: 0,
            session_record: false,
            parent: None,
            job: None,
            members: Vec::new(),
            peer: None,
        }
    }

    /// Folds a whole event list; the first impossible event is an error.
    pub fn fold<'a>(
        invocation_id: &str,
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Result<Self, ProjectionError> {
        let mut p = Projection::empty(invocation_id);
        for event in events {
            p.apply(event.seq, &event.body)?;
        }
        Ok(p)
    }

    /// A projection with no events yet, for validating the first append.
    pub fn new(invocation_id: &str) -> Self {
        Projection::empty(invocation_id)
    }

    /// Whether any event has been applied.
    pub fn exists(&self) -> bool {
        self.channel.is_some()
    }

    /// Applies one event, or explains why it cannot follow the current state. On error
    /// the projection is unchanged.
    pub fn apply(&mut self, seq: u64, body: &EventBody) -> Result<(), ProjectionError> {
        let mut next = self.clone();
        next.apply_in_place(seq, body)?;
        *self = next;
        Ok(())
    }

    fn refuse(&self, seq: u64, body: &EventBody, reason: &'static str) -> ProjectionError {
        ProjectionError {
            invocation_id: self.invocation_id.clone(),
            seq,
            kind: body.kind(),
            reason,
        }
    }

    /// The retry disposition now. A recorded disposition wins, except that a settled
    /// result that failed delivery is fetched, never re-run. An unknown outcome's
    /// disposition always comes from the bound operation facts, the key's retention
    /// window and the retry budget ("the retry disposition of every unknown outcome
    /// comes from decide()"), never from what a later attempt recorded: a second
    /// attempt that failed in setup must not turn `unknown` into `backoff`.
    pub fn retry(&self, now_ms: i64) -> Retry {
        if self.delivery_failed && self.result_id.is_some() && self.result_expired.is_none() {
            return Retry::FetchResult;
        }
        if self.outcome == Outcome::Unknown {
            return self.unknown_disposition(now_ms);
        }
        self.recorded_retry.unwrap_or(Retry::Backoff)
    }

    /// The retry an unknown outcome will have once a failure with `code` is recorded:
    /// what a FAILED event records, so that the record and the answer built from the
    /// projection after it agree (issue 27: a contract violation was recorded
    /// `same_idempotency_key` while the agent was told `reconcile`).
    pub fn retry_once_failed(&self, code: Code, now_ms: i64) -> Retry {
        if self.delivery_failed && self.result_id.is_some() && self.result_expired.is_none() {
            return Retry::FetchResult;
        }
        self.unknown_disposition_with(Some(code), now_ms)
    }

    fn unknown_disposition(&self, now_ms: i64) -> Retry {
        self.unknown_disposition_with(self.code, now_ms)
    }

    fn unknown_disposition_with(&self, code: Option<Code>, now_ms: i64) -> Retry {
        // A peer that broke the attestation contract is not trusted to de-duplicate,
        // and an unknown the peer itself records is settled there: both reconcile.
        if matches!(
            code,
            Some(Code::PeerContractViolation | Code::PeerOutcomeUnknown | Code::PeerPolicyChanged)
        ) {
            return Retry::Reconcile;
        }
        match &self.operation {
            Some(op) if self.dispatches >= op.retry_budget => Retry::Reconcile,
            Some(op) => disposition_for_unknown(
                op.idempotent,
                op.remote_contract,
                op.idempotency.as_ref().and_then(|i| i.expires_at_ms),
                op.idempotency.is_some(),
                now_ms,
            ),
            None => Retry::Reconcile,
        }
    }

    /// The code that describes the current state: the recorded one, or for an
    /// interrupted record the one its evidence supports.
    pub fn effective_code(&self) -> Option<Code> {
        if self.code.is_some() {
            return self.code;
        }
        if self.outcome == Outcome::Unknown && !self.terminal {
            return Some(Code::RemoteOutcomeUnknown);
        }
        None
    }

    /// The evidence block of the envelope.
    pub fn evidence(&self) -> Evidence {
        let facts = self.result_facts.clone().unwrap_or_default();
        // Describe the attempt that determines the outcome: the current one, unless it
        // never dispatched and an earlier one did.
        let m = match &self.last_dispatched {
            Some(earlier) if !self.attempt.dispatched => earlier,
            _ => &self.attempt,
        };
        Evidence {
            dispatch_started: m.dispatched,
            request_headers_sent: m.headers_sent,
            request_complete: m.request_complete,
            response_headers_received: m.response_headers_received,
            response_complete: m.response_complete,
            attempts: self.attempts.clone(),
            idempotency: self.operation.as_ref().and_then(|o| o.idempotency.clone()),
            fingerprint: self.fingerprint.clone(),
            dispatch_sequence: m.dispatch_seq,
            journal_sequence: self.last_seq,
            attempt_generation: self.attempt.generation,
            connection_id: m.connection_id.clone(),
            peer_identity: m.peer_identity.clone(),
            remote_request_id: facts
                .remote_request_id
                .clone()
                .or_else(|| m.remote_request_id.clone()),
            http_status: facts.http_status.or(m.http_status),
            response_digest: m.response_digest.clone(),
            exit_status: facts.exit_status,
            exit_signal: facts.exit_signal,
            result_record_id: self.result_id.clone(),
            confidence: self.confidence,
            redactions: self.redactions,
            field: self.field.clone(),
            status_resource: facts.status_resource.clone(),
            redirect_location: facts.redirect_location.clone(),
            not_before_ms: facts.not_before_ms,
            parent: self.parent.clone(),
            job: self.job.clone(),
            members: self.members.clone(),
            peer: self.peer_evidence(),
        }
    }

    /// What the peer proved, for a call through one.
    pub fn peer_evidence(&self) -> Option<PeerEvidence> {
        let op = self.operation.as_ref()?.peer.as_ref()?;
        let state = self.peer.clone().unwrap_or_default();
        let last = state.last.as_ref();
        // The peer's own record comes from the latest verified outcome.
        let settled = state
            .last_verified
            .as_ref()
            .filter(|a| a.peer_invocation.is_some());
        Some(PeerEvidence {
            peer: op.peer.clone(),
            capability: op.capability.clone(),
            answers: state.answers,
            transient_used: state.transient_used,
            unknown_used: state.unknown_used,
            transient_budget: op.attempts.transient_budget,
            unknown_budget: op.attempts.unknown_budget,
            last_verdict: last.map(|a| a.verdict),
            signature: last.map(|a| a.signature),
            attestation: last.and_then(|a| a.attestation.clone()),
            peer_invocation_id: settled.and_then(|a| a.peer_invocation.clone()),
            peer_outcome: settled.and_then(|a| a.peer_outcome),
            peer_error: settled.and_then(|a| a.peer_error.clone()),
            incident: state.incident,
        })
    }

    /// The public envelope, when the current state carries a code (a failure, an
    /// unsettled dispatch, a delivery failure, a settled error status).
    pub fn envelope(&self, now_ms: i64) -> Option<Envelope> {
        let code = self.effective_code()?;
        let message = self
            .message
            .clone()
            .unwrap_or_else(|| code.spec().meaning.to_string());
        Some(Envelope {
            invocation_id: self.invocation_id.clone(),
            error: ErrorBody {
                code,
                phase: self.phase,
                outcome: self.outcome,
                retry: self.retry(now_ms),
                message,
            },
            evidence: self.evidence(),
        })
    }

    /// The facts `retry::decide` reads.
    pub fn record_facts(&self, now_ms: i64) -> RecordFacts {
        let op = self.operation.as_ref();
        RecordFacts {
            invocation_id: self.invocation_id.clone(),
            last_seq: self.last_seq,
            outcome: self.outcome,
            retry: self.retry(now_ms),
            code: self.effective_code(),
            fingerprint: self.fingerprint.clone().unwrap_or_default(),
            idempotent: op.is_some_and(|o| o.idempotent),
            remote_contract: op.map_or(RemoteContract::None, |o| o.remote_contract),
            idempotency_key: op.and_then(|o| o.idempotency.as_ref().map(|i| i.key.clone())),
            idempotency_expires_at_ms: op
                .and_then(|o| o.idempotency.as_ref().and_then(|i| i.expires_at_ms)),
            reconcile_configured: op.is_some_and(|o| o.reconcile_configured),
            attempts_used: self.dispatches,
            retry_budget: op.map_or(1, |o| o.retry_budget),
            not_before_ms: None,
            source_query: op.and_then(|o| o.source_query.as_deref().cloned()),
            members: {
                let batch = op.and_then(|o| o.batch.as_ref());
                let query = batch
                    .filter(|b| !b.atomic)
                    .and_then(|b| b.member_query.as_ref());
                self.members
                    .iter()
                    .map(|m| MemberDisposition {
                        id: m.id.clone(),
                        outcome: m.outcome,
                        query: query
                            .filter(|_| m.outcome == Outcome::Unknown)
                            .map(|q| q.for_member(&m.id)),
                    })
                    .collect()
            },
        }
    }
}
