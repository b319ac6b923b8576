//! How each event moves an invocation's projection: [`Projection::apply_in_place`]
//! checks what holds for every event, then hands the event to the transition of its
//! family (binding, approval, lease, exchange, settlement, delivery, reconciliation,
//! job, peer). Each transition refuses what cannot follow the state before it, with the
//! reason, rather than papering over it.

use super::{AttemptMarkers, PeerState, Projection, ProjectionError};
use crate::contract::{
    AttemptEvidence, Code, ConfidenceSource, MemberState, Outcome, Phase, Retry,
};
use crate::journal::events::{Channel, EventBody, Settlement};
use crate::record::job::{JobFacts, JobState, Relation};
use crate::record::peer::PeerStage;

/// What a transition answers an event of another family (never reached: the dispatch
/// in [`Projection::apply_in_place`] routes each event to its own).
const MISROUTED: &str = "the event belongs to another transition";

/// One event being applied, and what held before it.
struct Step<'a> {
    seq: u64,
    body: &'a EventBody,
    /// The current attempt started and has not ended.
    attempt_open: bool,
    /// The invocation was accepted (ACTION_ACCEPTED came before).
    accepted: bool,
}

impl Step<'_> {
    fn refuse(&self, p: &Projection, reason: &'static str) -> Result<(), ProjectionError> {
        Err(p.refuse(self.seq, self.body, reason))
    }
}

impl Projection {
    /// Applies one event in place: what holds for every event (increasing sequence
    /// numbers, session records apart, ACTION_ACCEPTED first), then the transition of
    /// the event's family. On error the projection may be half changed: [`Projection::apply`]
    /// works on a copy.
    pub(super) fn apply_in_place(
        &mut self,
        seq: u64,
        body: &EventBody,
    ) -> Result<(), ProjectionError> {
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
        let step = Step {
            seq,
            body,
            attempt_open,
            accepted,
        };
        match body {
            EventBody::ActionAccepted { .. } | EventBody::PreflightValidated { .. } => {
                self.apply_binding(&step)?
            }
            EventBody::ApprovalRequested { .. }
            | EventBody::ApprovalGranted { .. }
            | EventBody::ApprovalDenied { .. } => self.apply_approval(&step)?,
            EventBody::CredentialAuthorized { .. } | EventBody::AttemptStarted { .. } => {
                self.apply_lease(&step)?
            }
            EventBody::ConnectionAttempt { .. }
            | EventBody::DispatchStarted { .. }
            | EventBody::RequestSent { .. }
            | EventBody::RemoteResponseStarted { .. }
            | EventBody::RemoteResponseComplete { .. } => self.apply_exchange(&step)?,
            EventBody::ResultCommitted { .. } | EventBody::Failed { .. } => {
                self.apply_settlement(&step)?
            }
            EventBody::ResultDelivered
            | EventBody::DeliveryFailed { .. }
            | EventBody::ResultExpired { .. } => self.apply_delivery(&step)?,
            EventBody::RetryManifest { .. }
            | EventBody::Reconciled { .. }
            | EventBody::MemberReconciled { .. } => self.apply_reconciliation(&step)?,
            EventBody::JobTracked { .. } | EventBody::JobStatus { .. } => self.apply_job(&step)?,
            EventBody::PeerAnswer(_)
            | EventBody::PeerNotRun { .. }
            | EventBody::PeerIncident(_) => self.apply_peer(&step)?,
            // Journal-level: never stored under an invocation's id.
            EventBody::SigningResumed { .. } | EventBody::AgentPause { .. } => {}
            // Handled above.
            EventBody::SessionOpened(_) => {}
        }
        self.last_seq = seq;
        Ok(())
    }

    /// Acceptance and binding: ACTION_ACCEPTED once, then the configuration snapshot
    /// (PREFLIGHT_VALIDATED) bound once, before the invocation ends.
    fn apply_binding(&mut self, step: &Step<'_>) -> Result<(), ProjectionError> {
        match step.body {
            EventBody::ActionAccepted {
                channel,
                target,
                summary,
                session,
                parent,
            } => {
                if step.accepted {
                    return step.refuse(self, "an invocation is accepted once");
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
                    return step.refuse(self, "the configuration snapshot is bound once");
                }
                if self.terminal {
                    return step.refuse(self, "the invocation already ended");
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
            _ => return step.refuse(self, MISROUTED),
        }
        Ok(())
    }

    /// Approval: requested, granted or denied, always naming the bound fingerprint, and
    /// before any dispatch.
    fn apply_approval(&mut self, step: &Step<'_>) -> Result<(), ProjectionError> {
        match step.body {
            EventBody::ApprovalRequested { fingerprint, .. }
            | EventBody::ApprovalGranted { fingerprint, .. }
            | EventBody::ApprovalDenied { fingerprint, .. } => {
                if self.fingerprint.as_deref() != Some(fingerprint.as_str()) {
                    return step.refuse(self, "an approval must name the bound fingerprint");
                }
                if self.ever_dispatched {
                    return step.refuse(self, "approval comes before dispatch");
                }
                self.phase = Phase::CredentialInjection;
                match step.body {
                    EventBody::ApprovalGranted { .. } => self.approved = true,
                    EventBody::ApprovalDenied { .. } => self.denied = true,
                    _ => {}
                }
            }
            _ => return step.refuse(self, MISROUTED),
        }
        Ok(())
    }

    /// The credential and the attempt: CREDENTIAL_AUTHORIZED after preflight, and
    /// ATTEMPT_STARTED under the next generation (after an ended invocation only with a
    /// retry manifest that allows it).
    fn apply_lease(&mut self, step: &Step<'_>) -> Result<(), ProjectionError> {
        match step.body {
            EventBody::CredentialAuthorized {
                credential_id,
                credential_version,
            } => {
                if self.fingerprint.is_none() {
                    return step.refuse(self, "credentials are authorized after preflight");
                }
                if self.denied {
                    return step.refuse(self, "the invocation was denied");
                }
                if self.terminal && self.authorized_generation.is_none() {
                    return step.refuse(self, "the invocation already ended");
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
                    return step.refuse(self, "an attempt needs an authorized credential");
                }
                if step.attempt_open {
                    return step.refuse(self, "the previous attempt is still open");
                }
                if *generation != self.attempt.generation + 1 {
                    return step.refuse(self, "attempt generations increase by one");
                }
                if self.outcome == Outcome::Committed {
                    return step.refuse(self, "a committed invocation is never attempted again");
                }
                // Once the invocation has ended, only a manifest can reopen it.
                if self.terminal && self.authorized_generation != Some(*generation) {
                    return step.refuse(self, "a retry needs a retry manifest that allows it");
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
            _ => return step.refuse(self, MISROUTED),
        }
        Ok(())
    }

    /// The exchange of the current attempt: connection setup (which proves only
    /// not_attempted), DISPATCH_STARTED once with the bound fingerprint (the outcome
    /// becomes unknown), and the request and response markers after it.
    fn apply_exchange(&mut self, step: &Step<'_>) -> Result<(), ProjectionError> {
        match step.body {
            EventBody::ConnectionAttempt {
                n,
                stage,
                outcome,
                code,
                via,
            } => {
                if !step.attempt_open {
                    return step.refuse(self, "connection attempts belong to an open attempt");
                }
                if self.attempt.dispatched {
                    return step.refuse(self, "connection setup ends before dispatch");
                }
                if *outcome != Outcome::NotAttempted {
                    return step.refuse(self, "connection setup can only prove not_attempted");
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
                if !step.attempt_open || *generation != self.attempt.generation {
                    return step.refuse(self, "dispatch belongs to the current open attempt");
                }
                if self.attempt.dispatched {
                    return step.refuse(self, "an attempt dispatches once");
                }
                if self.fingerprint.as_deref() != Some(fingerprint.as_str()) {
                    return step.refuse(self, "dispatch must carry the bound fingerprint");
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
                self.attempt.dispatch_seq = Some(step.seq);
                self.attempt.connection_id = connection_id.clone();
                self.attempt.peer_identity = peer_identity.clone();
            }
            EventBody::RequestSent {
                headers_sent,
                body_complete,
            } => {
                if !step.attempt_open || !self.attempt.dispatched {
                    return step.refuse(self, "request markers follow dispatch");
                }
                self.attempt.headers_sent |= *headers_sent;
                self.attempt.request_complete |= *body_complete;
            }
            EventBody::RemoteResponseStarted {
                http_status,
                remote_request_id,
            } => {
                if !step.attempt_open || !self.attempt.dispatched {
                    return step.refuse(self, "a response follows dispatch");
                }
                if self.attempt.response_headers_received {
                    return step.refuse(self, "the final response starts once");
                }
                if http_status.is_some_and(|s| s < 200) {
                    return step.refuse(self, "1xx responses never settle anything");
                }
                self.attempt.response_headers_received = true;
                self.attempt.http_status = *http_status;
                self.attempt.remote_request_id = remote_request_id.clone();
            }
            EventBody::RemoteResponseComplete { digest } => {
                if !step.attempt_open || !self.attempt.response_headers_received {
                    return step.refuse(self, "a response completes after it started");
                }
                self.attempt.response_complete = true;
                self.attempt.response_digest = Some(digest.clone());
            }
            _ => return step.refuse(self, MISROUTED),
        }
        Ok(())
    }

    /// What ends an attempt: a stored result after a complete response (committed or
    /// rejected), a result lost after a complete response, or a failure (after dispatch it
    /// leaves the outcome unknown; before, it proves not_attempted).
    fn apply_settlement(&mut self, step: &Step<'_>) -> Result<(), ProjectionError> {
        match step.body {
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
                if !step.attempt_open || !self.attempt.response_complete {
                    return step.refuse(self, "only a complete response settles an attempt");
                }
                if !matches!(outcome, Outcome::Committed | Outcome::Rejected) {
                    return step.refuse(self, "a stored result is committed or rejected");
                }
                self.outcome = *outcome;
                self.recorded_retry = Some(*retry);
                self.code = *code;
                match &facts.batch {
                    Some(batch) => {
                        let ids =
                            |m: &[MemberState]| m.iter().map(|m| m.id.clone()).collect::<Vec<_>>();
                        if ids(&batch.members) != ids(&self.members) {
                            return step.refuse(self, "a batch result reports the bound members");
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
                if !step.attempt_open || !self.attempt.response_complete {
                    return step.refuse(self, "a result is lost only after a complete response");
                }
                if !matches!(outcome, Outcome::Committed | Outcome::Rejected) {
                    return step.refuse(self, "a complete response settles committed or rejected");
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
                if self.terminal && !step.attempt_open && self.authorized_generation.is_none() {
                    return step.refuse(self, "the invocation already ended");
                }
                if step.attempt_open && self.attempt.dispatched {
                    // After dispatch only a stored, complete result may settle; a
                    // failure leaves the outcome unknown.
                    if *outcome != Outcome::Unknown {
                        return step
                            .refuse(self, "a failure after dispatch leaves the outcome unknown");
                    }
                    if *phase != Phase::RemoteExecution {
                        return step
                            .refuse(self, "a failure after dispatch is in remote_execution");
                    }
                } else if *outcome != Outcome::NotAttempted {
                    return step.refuse(self, "a failure before dispatch proves not_attempted");
                } else if matches!(phase, Phase::RemoteExecution | Phase::ResultDelivery) {
                    return step.refuse(self, "nothing was dispatched in this attempt");
                }
                // An earlier attempt's dispatch keeps the invocation unknown (or its
                // settled rejection): this attempt's not_attempted cannot undo it.
                if !self.ever_dispatched {
                    self.outcome = Outcome::NotAttempted;
                } else if self.attempt.dispatched && step.attempt_open {
                    self.outcome = Outcome::Unknown;
                }
                self.phase = *phase;
                self.field = field.clone();
                self.recorded_retry = Some(*retry);
                self.code = Some(*code);
                self.message = Some(message.clone());
                self.confidence = Some(ConfidenceSource::TransportObserved);
                if step.attempt_open {
                    self.attempt.closed = true;
                }
                self.authorized_generation = None;
                self.terminal = true;
            }
            _ => return step.refuse(self, MISROUTED),
        }
        Ok(())
    }

    /// Delivery of an ended invocation's result, its failure, and the stored result's
    /// expiry.
    fn apply_delivery(&mut self, step: &Step<'_>) -> Result<(), ProjectionError> {
        match step.body {
            EventBody::ResultDelivered => {
                if !self.terminal {
                    return step.refuse(self, "only an ended invocation is delivered");
                }
                self.delivered = true;
                self.delivery_failed = false;
            }
            EventBody::DeliveryFailed { code, message } => {
                if !self.terminal || self.result_id.is_none() {
                    return step.refuse(self, "only a stored result can fail delivery");
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
                        return step.refuse(self, "a result expires once");
                    }
                    self.result_expired = Some((step.seq, *reason, *bytes));
                }
            }
            _ => return step.refuse(self, MISROUTED),
        }
        Ok(())
    }

    /// After an attempt ended: the retry manifest that authorizes (or withdraws) the next
    /// generation, and the reconciliation of an unknown outcome, whole or one batch member.
    fn apply_reconciliation(&mut self, step: &Step<'_>) -> Result<(), ProjectionError> {
        match step.body {
            EventBody::RetryManifest {
                for_generation,
                decision,
                ..
            } => {
                if step.attempt_open {
                    return step.refuse(self, "a retry manifest follows an ended attempt");
                }
                if *for_generation != self.attempt.generation + 1 {
                    return step.refuse(self, "a manifest authorizes the next generation");
                }
                if decision.starts_attempt() {
                    if self.outcome == Outcome::Committed {
                        return step.refuse(self, "a committed invocation is never retried");
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
                if self.outcome != Outcome::Unknown || step.attempt_open {
                    return step.refuse(
                        self,
                        "only an ended attempt with an unknown outcome is reconciled",
                    );
                }
                if !matches!(
                    source,
                    ConfidenceSource::RemoteQuery | ConfidenceSource::OperatorAttested
                ) {
                    return step.refuse(self, "reconciliation comes from a query or an operator");
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
                if step.attempt_open {
                    return step.refuse(self, "a member is reconciled after its attempt ended");
                }
                if !matches!(
                    source,
                    ConfidenceSource::RemoteQuery | ConfidenceSource::OperatorAttested
                ) {
                    return step.refuse(self, "reconciliation comes from a query or an operator");
                }
                let Some(m) = self.members.iter_mut().find(|m| m.id == *member) else {
                    return step.refuse(self, "only a member of the batch is reconciled");
                };
                if m.outcome != Outcome::Unknown {
                    return step
                        .refuse(self, "only a member whose outcome is unknown is reconciled");
                }
                m.outcome = match settlement {
                    Settlement::Committed => Outcome::Committed,
                    Settlement::NotApplied => Outcome::Rejected,
                };
                m.settled_by = Some(*source);
            }
            _ => return step.refuse(self, MISROUTED),
        }
        Ok(())
    }

    /// A job invocation: the submission's job tracked once, right after acceptance, then
    /// what its status resource answers.
    fn apply_job(&mut self, step: &Step<'_>) -> Result<(), ProjectionError> {
        match step.body {
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
                    return step.refuse(self, "only a job invocation tracks its submission's job");
                }
                if self.job.is_some() || self.fingerprint.is_some() || self.terminal {
                    return step.refuse(self, "a job is tracked once, right after acceptance");
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
                    return step.refuse(self, "job status belongs to a tracked job");
                };
                if self.outcome != Outcome::Unknown {
                    return step.refuse(self, "a settled job is not read again");
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
            _ => return step.refuse(self, MISROUTED),
        }
        Ok(())
    }

    /// A call through a peer broker: its numbered answers, its signed "did not run", and an
    /// incident.
    fn apply_peer(&mut self, step: &Step<'_>) -> Result<(), ProjectionError> {
        match step.body {
            EventBody::PeerAnswer(answer) => {
                if self.channel != Some(Channel::Peer) {
                    return step.refuse(self, "only a call through a peer has peer answers");
                }
                let ok = match answer.stage {
                    PeerStage::Setup => step.attempt_open && !self.attempt.dispatched,
                    PeerStage::Call => step.attempt_open && self.attempt.dispatched,
                    PeerStage::Reconcile => !step.attempt_open && self.ever_dispatched,
                };
                if !ok {
                    return step.refuse(
                        self,
                        "a peer answer belongs to an open attempt (setup before dispatch, the call after) or to a reconciliation after one",
                    );
                }
                let state = self.peer.get_or_insert_with(PeerState::default);
                if answer.n != state.answers + 1 {
                    return step.refuse(self, "peer answers are numbered one after another");
                }
                state.answers = answer.n;
                match answer.spent {
                    Some(crate::record::peer::Budget::Transient) => state.transient_used += 1,
                    Some(crate::record::peer::Budget::Unknown) => state.unknown_used += 1,
                    None => {}
                }
                if answer.signature == crate::record::peer::SignatureCheck::Verified {
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
                if !step.attempt_open || !self.attempt.dispatched {
                    return step.refuse(
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
                    return step.refuse(
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
                    return step.refuse(self, "only a call through a peer raises a peer incident");
                }
                self.peer.get_or_insert_with(PeerState::default).incident = Some(incident.incident);
            }
            _ => return step.refuse(self, MISROUTED),
        }
        Ok(())
    }
}
