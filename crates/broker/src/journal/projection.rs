//! The current status of an invocation, folded from its events.
//!
//! The fold refuses impossible transitions rather than papering over them, so the same
//! code guards appends (the writer refuses an event the projection rejects) and reads (a
//! tampered or corrupt record surfaces as an error, not a plausible status). The rules:
//! after DISPATCH_STARTED the outcome is `unknown` until authoritative
//! evidence settles it and never `not_attempted`; `unknown` may become `rejected` or
//! `committed`; `committed` never changes.

use crate::contract::{
    AttemptEvidence, Code, ConfidenceSource, Envelope, ErrorBody, Evidence, MemberState, Outcome,
    Phase, RemoteContract, Retry,
};
use crate::federation::Incident;
use crate::federation::record::{PeerAnswer, PeerEvidence, PeerStage};
use crate::journal::events::{
    Channel, Event, EventBody, ExpiryReason, OperationFacts, ResultFacts, Settlement,
};
use crate::record::job::{JobFacts, JobState, ParentLink, Relation};
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

    fn apply_in_place(&mut self, seq: u64, body: &EventBody) -> Result<(), ProjectionError> {
        let refuse = |p: &Projection, reason| Err(p.refuse(seq, body, reason));
        if seq <= self.last_seq {
            return refuse(self, "sequence numbers must increase");
        }
        let accepted = self.exists();
        if let EventBody::SessionOpened(_) = body {
            if accepted {
                return refuse(self, "a session record is never part of an invocation");
            }
            // Not an invocation: nothing is in flight, so recovery never closes it.
            self.session_record = true;
            self.terminal = true;
            self.last_seq = seq;
            return Ok(());
        }
        if self.session_record {
            return refuse(self, "a session record holds only session events");
        }
        if !accepted && !matches!(body, EventBody::ActionAccepted { .. }) {
            return refuse(self, "the first event must be ACTION_ACCEPTED");
        }
        let attempt_open = self.attempt.generation > 0 && !self.attempt.closed;
        match body {
            EventBody::ActionAccepted {
                channel,
                target,
                summary,
                session,
                parent,
            } => {
                if accepted {
                    return refuse(self, "an invocation is accepted once");
                }
                self.parent = parent.clone();
                self.channel = Some(*channel);
                self.target = Some(target.clone());
                self.summary = Some(summary.clone());
                self.session = session.clone();
            }
            EventBody::PreflightValidated {
                fingerprint,
                operation,
                ..
            } => {
                // Bound values never change: a changed request is a new invocation.
                if self.fingerprint.is_some() {
                    return refuse(self, "the configuration snapshot is bound once");
                }
                if self.terminal {
                    return refuse(self, "the invocation already ended");
                }
                self.fingerprint = Some(fingerprint.clone());
                self.operation = Some(operation.clone());
                if let Some(batch) = &operation.batch {
                    self.members = batch
                        .members
                        .iter()
                        .map(|id| MemberState {
                            id: id.clone(),
                            outcome: Outcome::NotAttempted,
                            status: None,
                            settled_by: None,
                        })
                        .collect();
                }
            }
            EventBody::ApprovalRequested { fingerprint, .. }
            | EventBody::ApprovalGranted { fingerprint, .. }
            | EventBody::ApprovalDenied { fingerprint, .. } => {
                if self.fingerprint.as_deref() != Some(fingerprint.as_str()) {
                    return refuse(self, "an approval must name the bound fingerprint");
                }
                if self.ever_dispatched {
                    return refuse(self, "approval comes before dispatch");
                }
                self.phase = Phase::CredentialInjection;
                match body {
                    EventBody::ApprovalGranted { .. } => self.approved = true,
                    EventBody::ApprovalDenied { .. } => self.denied = true,
                    _ => {}
                }
            }
            EventBody::CredentialAuthorized {
                credential_id,
                credential_version,
            } => {
                if self.fingerprint.is_none() {
                    return refuse(self, "credentials are authorized after preflight");
                }
                if self.denied {
                    return refuse(self, "the invocation was denied");
                }
                if self.terminal && self.authorized_generation.is_none() {
                    return refuse(self, "the invocation already ended");
                }
                if self.phase < Phase::CredentialInjection {
                    self.phase = Phase::CredentialInjection;
                }
                self.credential = Some((credential_id.clone(), credential_version.clone()));
            }
            EventBody::AttemptStarted { generation, .. } => {
                // A channel without a credential of its own (a peer: the peer holds
                // it) starts attempts without one.
                if self.credential.is_none() && self.channel != Some(Channel::Peer) {
                    return refuse(self, "an attempt needs an authorized credential");
                }
                if attempt_open {
                    return refuse(self, "the previous attempt is still open");
                }
                if *generation != self.attempt.generation + 1 {
                    return refuse(self, "attempt generations increase by one");
                }
                if self.outcome == Outcome::Committed {
                    return refuse(self, "a committed invocation is never attempted again");
                }
                // Once the invocation has ended, only a manifest can reopen it.
                if self.terminal && self.authorized_generation != Some(*generation) {
                    return refuse(self, "a retry needs a retry manifest that allows it");
                }
                if self.attempt.dispatched {
                    self.last_dispatched = Some(self.attempt.clone());
                }
                self.attempt = AttemptMarkers {
                    generation: *generation,
                    ..Default::default()
                };
                self.authorized_generation = None;
                self.terminal = false;
                self.recorded_retry = None;
                self.code = None;
                self.message = None;
                if let Some(peer) = self.peer.as_mut() {
                    peer.last_in_attempt = false;
                }
            }
            EventBody::ConnectionAttempt {
                n,
                stage,
                outcome,
                code,
                via,
            } => {
                if !attempt_open {
                    return refuse(self, "connection attempts belong to an open attempt");
                }
                if self.attempt.dispatched {
                    return refuse(self, "connection setup ends before dispatch");
                }
                if *outcome != Outcome::NotAttempted {
                    return refuse(self, "connection setup can only prove not_attempted");
                }
                self.phase = Phase::ConnectionSetup;
                self.attempts.push(AttemptEvidence {
                    n: *n,
                    stage: *stage,
                    outcome: *outcome,
                    code: *code,
                    via: via.clone(),
                });
            }
            EventBody::DispatchStarted {
                generation,
                fingerprint,
                connection_id,
                peer_identity,
            } => {
                if !attempt_open || *generation != self.attempt.generation {
                    return refuse(self, "dispatch belongs to the current open attempt");
                }
                if self.attempt.dispatched {
                    return refuse(self, "an attempt dispatches once");
                }
                if self.fingerprint.as_deref() != Some(fingerprint.as_str()) {
                    return refuse(self, "dispatch must carry the bound fingerprint");
                }
                self.phase = Phase::RemoteExecution;
                self.outcome = Outcome::Unknown;
                for m in &mut self.members {
                    if m.outcome == Outcome::NotAttempted {
                        m.outcome = Outcome::Unknown;
                    }
                }
                self.ever_dispatched = true;
                self.dispatches += 1;
                self.confidence = None;
                self.result_id = None;
                self.result_facts = None;
                self.attempt.dispatched = true;
                self.attempt.dispatch_seq = Some(seq);
                self.attempt.connection_id = connection_id.clone();
                self.attempt.peer_identity = peer_identity.clone();
            }
            EventBody::RequestSent {
                headers_sent,
                body_complete,
            } => {
                if !attempt_open || !self.attempt.dispatched {
                    return refuse(self, "request markers follow dispatch");
                }
                self.attempt.headers_sent |= *headers_sent;
                self.attempt.request_complete |= *body_complete;
            }
            EventBody::RemoteResponseStarted {
                http_status,
                remote_request_id,
            } => {
                if !attempt_open || !self.attempt.dispatched {
                    return refuse(self, "a response follows dispatch");
                }
                if self.attempt.response_headers_received {
                    return refuse(self, "the final response starts once");
                }
                if http_status.is_some_and(|s| s < 200) {
                    return refuse(self, "1xx responses never settle anything");
                }
                self.attempt.response_headers_received = true;
                self.attempt.http_status = *http_status;
                self.attempt.remote_request_id = remote_request_id.clone();
            }
            EventBody::RemoteResponseComplete { digest } => {
                if !attempt_open || !self.attempt.response_headers_received {
                    return refuse(self, "a response completes after it started");
                }
                self.attempt.response_complete = true;
                self.attempt.response_digest = Some(digest.clone());
            }
            EventBody::ResultCommitted {
                outcome,
                code,
                retry,
                result_id,
                facts,
                confidence,
                redactions,
                ..
            } => {
                if !attempt_open || !self.attempt.response_complete {
                    return refuse(self, "only a complete response settles an attempt");
                }
                if !matches!(outcome, Outcome::Committed | Outcome::Rejected) {
                    return refuse(self, "a stored result is committed or rejected");
                }
                self.outcome = *outcome;
                self.recorded_retry = Some(*retry);
                self.code = *code;
                match &facts.batch {
                    Some(batch) => {
                        let ids =
                            |m: &[MemberState]| m.iter().map(|m| m.id.clone()).collect::<Vec<_>>();
                        if ids(&batch.members) != ids(&self.members) {
                            return refuse(self, "a batch result reports the bound members");
                        }
                        self.members = batch.members.clone();
                    }
                    None => {
                        // The response settled the whole: every member shares it.
                        for m in &mut self.members {
                            m.outcome = *outcome;
                            m.settled_by = Some(*confidence);
                        }
                    }
                }
                self.result_id = Some(result_id.clone());
                self.result_facts = Some(facts.clone());
                self.confidence = Some(*confidence);
                self.redactions = *redactions;
                self.attempt.closed = true;
                self.terminal = true;
            }
            EventBody::ResultDelivered => {
                if !self.terminal {
                    return refuse(self, "only an ended invocation is delivered");
                }
                self.delivered = true;
                self.delivery_failed = false;
            }
            EventBody::DeliveryFailed { code, message } => {
                if !self.terminal || self.result_id.is_none() {
                    return refuse(self, "only a stored result can fail delivery");
                }
                self.delivery_failed = true;
                self.phase = Phase::ResultDelivery;
                self.code = Some(*code);
                self.message = Some(message.clone());
            }
            EventBody::ResultExpired {
                result_id,
                reason,
                bytes,
                ..
            } => {
                // An earlier attempt's result may expire too; it changes nothing here.
                if self.result_id.as_deref() == Some(result_id.as_str()) {
                    if self.result_expired.is_some() {
                        return refuse(self, "a result expires once");
                    }
                    self.result_expired = Some((seq, *reason, *bytes));
                }
            }
            EventBody::Failed {
                phase,
                outcome,
                retry,
                code,
                message,
                field,
            } if *code == Code::ResultStoreFailed && *phase == Phase::ResultDelivery => {
                // A complete response whose result could not be stored: the recorded
                // completion supports the outcome the response settles (committed or
                // rejected); only the result itself is lost.
                if !attempt_open || !self.attempt.response_complete {
                    return refuse(self, "a result is lost only after a complete response");
                }
                if !matches!(outcome, Outcome::Committed | Outcome::Rejected) {
                    return refuse(self, "a complete response settles committed or rejected");
                }
                self.outcome = *outcome;
                self.phase = Phase::ResultDelivery;
                self.recorded_retry = Some(*retry);
                self.code = Some(*code);
                self.message = Some(message.clone());
                self.field = field.clone();
                self.confidence = Some(ConfidenceSource::RemoteResponse);
                self.attempt.closed = true;
                self.authorized_generation = None;
                self.terminal = true;
            }
            EventBody::Failed {
                phase,
                outcome,
                retry,
                code,
                message,
                field,
            } => {
                if self.terminal && !attempt_open && self.authorized_generation.is_none() {
                    return refuse(self, "the invocation already ended");
                }
                if attempt_open && self.attempt.dispatched {
                    // After dispatch only a stored, complete result may settle; a
                    // failure leaves the outcome unknown.
                    if *outcome != Outcome::Unknown {
                        return refuse(self, "a failure after dispatch leaves the outcome unknown");
                    }
                    if *phase != Phase::RemoteExecution {
                        return refuse(self, "a failure after dispatch is in remote_execution");
                    }
                } else if *outcome != Outcome::NotAttempted {
                    return refuse(self, "a failure before dispatch proves not_attempted");
                } else if matches!(phase, Phase::RemoteExecution | Phase::ResultDelivery) {
                    return refuse(self, "nothing was dispatched in this attempt");
                }
                // An earlier attempt's dispatch keeps the invocation unknown (or its
                // settled rejection): this attempt's not_attempted cannot undo it.
                if !self.ever_dispatched {
                    self.outcome = Outcome::NotAttempted;
                } else if self.attempt.dispatched && attempt_open {
                    self.outcome = Outcome::Unknown;
                }
                self.phase = *phase;
                self.field = field.clone();
                self.recorded_retry = Some(*retry);
                self.code = Some(*code);
                self.message = Some(message.clone());
                self.confidence = Some(ConfidenceSource::TransportObserved);
                if attempt_open {
                    self.attempt.closed = true;
                }
                self.authorized_generation = None;
                self.terminal = true;
            }
            EventBody::RetryManifest {
                for_generation,
                decision,
                ..
            } => {
                if attempt_open {
                    return refuse(self, "a retry manifest follows an ended attempt");
                }
                if *for_generation != self.attempt.generation + 1 {
                    return refuse(self, "a manifest authorizes the next generation");
                }
                if decision.starts_attempt() {
                    if self.outcome == Outcome::Committed {
                        return refuse(self, "a committed invocation is never retried");
                    }
                    self.authorized_generation = Some(*for_generation);
                } else {
                    // The latest decision wins: a later "stop" withdraws a permission.
                    self.authorized_generation = None;
                }
            }
            EventBody::Reconciled {
                source,
                settlement,
                note,
                ..
            } => {
                if self.outcome != Outcome::Unknown || attempt_open {
                    return refuse(
                        self,
                        "only an ended attempt with an unknown outcome is reconciled",
                    );
                }
                if !matches!(
                    source,
                    ConfidenceSource::RemoteQuery | ConfidenceSource::OperatorAttested
                ) {
                    return refuse(self, "reconciliation comes from a query or an operator");
                }
                let (outcome, code, retry) = match settlement {
                    Settlement::Committed => {
                        (Outcome::Committed, Code::ReconciledCommitted, Retry::Never)
                    }
                    Settlement::NotApplied => (
                        Outcome::Rejected,
                        Code::ReconciledNotApplied,
                        Retry::Backoff,
                    ),
                };
                self.outcome = outcome;
                self.code = Some(code);
                self.recorded_retry = Some(retry);
                self.message = Some(note.clone());
                self.confidence = Some(*source);
                self.reconciled = Some(*settlement);
                for m in self
                    .members
                    .iter_mut()
                    .filter(|m| m.outcome == Outcome::Unknown)
                {
                    m.outcome = outcome;
                    m.settled_by = Some(*source);
                }
                // Settled facts replace the ones a pending retry was planned on.
                self.authorized_generation = None;
                self.terminal = true;
            }
            EventBody::MemberReconciled {
                member,
                source,
                settlement,
                ..
            } => {
                if attempt_open {
                    return refuse(self, "a member is reconciled after its attempt ended");
                }
                if !matches!(
                    source,
                    ConfidenceSource::RemoteQuery | ConfidenceSource::OperatorAttested
                ) {
                    return refuse(self, "reconciliation comes from a query or an operator");
                }
                let Some(m) = self.members.iter_mut().find(|m| m.id == *member) else {
                    return refuse(self, "only a member of the batch is reconciled");
                };
                if m.outcome != Outcome::Unknown {
                    return refuse(self, "only a member whose outcome is unknown is reconciled");
                }
                m.outcome = match settlement {
                    Settlement::Committed => Outcome::Committed,
                    Settlement::NotApplied => Outcome::Rejected,
                };
                m.settled_by = Some(*source);
            }
            EventBody::JobTracked {
                submission,
                job_id,
                status_resource,
                pollable,
            } => {
                let is_job = self
                    .parent
                    .as_ref()
                    .is_some_and(|l| l.relation == Relation::Job && l.invocation_id == *submission);
                if !is_job {
                    return refuse(self, "only a job invocation tracks its submission's job");
                }
                if self.job.is_some() || self.fingerprint.is_some() || self.terminal {
                    return refuse(self, "a job is tracked once, right after acceptance");
                }
                self.job = Some(JobFacts {
                    submission: submission.clone(),
                    job_id: job_id.clone(),
                    status_resource: status_resource.clone(),
                    pollable: *pollable,
                    state: JobState::Pending,
                    polls: 0,
                    last_poll: None,
                });
                // The submission's complete 202 proves the job was queued, not that it
                // ran: the remote may act at any time, so the outcome is unknown.
                self.phase = Phase::RemoteExecution;
                self.outcome = Outcome::Unknown;
                self.code = Some(Code::JobPending);
                self.recorded_retry = Some(Retry::Reconcile);
                self.confidence = Some(ConfidenceSource::RemoteResponse);
                self.terminal = true;
            }
            EventBody::JobStatus {
                poll,
                http_status,
                state,
            } => {
                let Some(job) = self.job.as_mut() else {
                    return refuse(self, "job status belongs to a tracked job");
                };
                if self.outcome != Outcome::Unknown {
                    return refuse(self, "a settled job is not read again");
                }
                job.polls += 1;
                job.state = *state;
                job.last_poll = Some(poll.clone());
                let (outcome, code, retry) = match state {
                    JobState::Succeeded => (Outcome::Committed, None, Retry::Never),
                    JobState::Failed => {
                        (Outcome::Committed, Some(Code::JobFailed), Retry::Reconcile)
                    }
                    JobState::Pending | JobState::Unreported => {
                        (Outcome::Unknown, Some(Code::JobPending), Retry::Reconcile)
                    }
                };
                self.outcome = outcome;
                self.code = code;
                self.recorded_retry = Some(retry);
                self.message = Some(format!(
                    "The job's status resource answered {http_status} ({}) to poll {poll}.",
                    state.as_str()
                ));
                if state.is_final() {
                    self.confidence = Some(ConfidenceSource::RemoteQuery);
                }
            }
            EventBody::PeerAnswer(answer) => {
                if self.channel != Some(Channel::Peer) {
                    return refuse(self, "only a call through a peer has peer answers");
                }
                let ok = match answer.stage {
                    PeerStage::Setup => attempt_open && !self.attempt.dispatched,
                    PeerStage::Call => attempt_open && self.attempt.dispatched,
                    PeerStage::Reconcile => !attempt_open && self.ever_dispatched,
                };
                if !ok {
                    return refuse(
                        self,
                        "a peer answer belongs to an open attempt (setup before dispatch, the call after) or to a reconciliation after one",
                    );
                }
                let state = self.peer.get_or_insert_with(PeerState::default);
                if answer.n != state.answers + 1 {
                    return refuse(self, "peer answers are numbered one after another");
                }
                state.answers = answer.n;
                match answer.spent {
                    Some(crate::federation::record::Budget::Transient) => state.transient_used += 1,
                    Some(crate::federation::record::Budget::Unknown) => state.unknown_used += 1,
                    None => {}
                }
                if answer.signature == crate::federation::record::SignatureCheck::Verified {
                    state.last_verified = Some((**answer).clone());
                }
                state.last = Some((**answer).clone());
                state.last_in_attempt = answer.stage != PeerStage::Reconcile;
            }
            EventBody::PeerNotRun {
                code,
                retry,
                message,
                attestation_digest,
            } => {
                if !attempt_open || !self.attempt.dispatched {
                    return refuse(
                        self,
                        "a peer's not-run attestation ends a dispatched attempt",
                    );
                }
                let proved = self.peer.as_ref().is_some_and(|p| {
                    p.last_in_attempt
                        && p.last.as_ref().is_some_and(|a| {
                            a.stage == PeerStage::Call
                                && a.attests_not_run()
                                && a.attestation
                                    .as_ref()
                                    .is_some_and(|att| att.digest == *attestation_digest)
                        })
                });
                if !proved {
                    return refuse(
                        self,
                        "not_attempted after dispatch needs the peer's verified attestation, recorded just before, that it did not run the call",
                    );
                }
                // The peer runs a call at most once per invocation of this broker, so
                // its signed "did not run" covers every attempt of this invocation.
                self.outcome = Outcome::NotAttempted;
                self.phase = Phase::RemoteExecution;
                self.code = Some(*code);
                self.recorded_retry = Some(*retry);
                self.message = Some(message.clone());
                self.field = None;
                self.confidence = Some(ConfidenceSource::RemoteResponse);
                self.attempt.closed = true;
                self.authorized_generation = None;
                self.terminal = true;
            }
            EventBody::PeerIncident(incident) => {
                if self.channel != Some(Channel::Peer) {
                    return refuse(self, "only a call through a peer raises a peer incident");
                }
                self.peer.get_or_insert_with(PeerState::default).incident = Some(incident.incident);
            }
            // Journal-level: never stored under an invocation's id.
            EventBody::SigningResumed { .. } | EventBody::AgentPause { .. } => {}
            // Handled before the match.
            EventBody::SessionOpened(_) => {}
        }
        self.last_seq = seq;
        Ok(())
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
