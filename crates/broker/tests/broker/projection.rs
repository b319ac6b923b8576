//! The projection's transition rules, applied directly to `EventBody` values (no journal):
//! once dispatched, the burden of proof changes (no more `not_attempted`), and the error
//! envelope carries the evidence for its outcome. Unit tests for each rule, then property tests over random event sequences.

use postern_broker::contract::{
    Code, ConfidenceSource, IdempotencyEvidence, Outcome, Phase, RemoteContract, Retry, Stage,
};
use postern_broker::journal::events::{
    Channel, Event, EventBody, OperationFacts, ResultFacts, Settlement,
};
use postern_broker::journal::projection::{Projection, ProjectionError};
use postern_broker::retry::{Decision, Verdict};
use proptest::prelude::*;

use crate::support::{FP, T0, operation, snapshot};

const ID: &str = "inv_proj";
const FP2: &str = "blake3:0000000000000000000000000000000000000000000000000000000000000002";

// ---------------------------------------------------------------------------------------
// Event builders

fn accepted() -> EventBody {
    EventBody::ActionAccepted {
        channel: Channel::Http,
        target: "payments".into(),
        summary: "POST https://api.example.test/v1/payments".into(),
        session: Some("session-1".into()),
        parent: None,
    }
}

fn preflight(op: OperationFacts) -> EventBody {
    EventBody::PreflightValidated {
        fingerprint: FP.into(),
        snapshot: snapshot(None),
        operation: op,
    }
}

fn credential() -> EventBody {
    EventBody::CredentialAuthorized {
        credential_id: "payments-key".into(),
        credential_version: "v1-abcdef01".into(),
    }
}

fn attempt(generation: u32) -> EventBody {
    EventBody::AttemptStarted {
        generation,
        holder: "worker-a".into(),
        lease_expires_at_ms: T0 + 60_000,
    }
}

fn dispatch(generation: u32) -> EventBody {
    EventBody::DispatchStarted {
        generation,
        fingerprint: FP.into(),
        connection_id: Some(format!("conn-{generation}")),
        peer_identity: Some("sha256:peer".into()),
    }
}

fn connection_failed(stage: Stage, code: Code) -> EventBody {
    EventBody::ConnectionAttempt {
        n: 1,
        stage,
        outcome: Outcome::NotAttempted,
        code,
        via: None,
    }
}

fn sent() -> EventBody {
    EventBody::RequestSent {
        headers_sent: true,
        body_complete: true,
    }
}

fn response_started(status: u16) -> EventBody {
    EventBody::RemoteResponseStarted {
        http_status: Some(status),
        remote_request_id: Some("req-1".into()),
    }
}

fn response_complete() -> EventBody {
    EventBody::RemoteResponseComplete {
        digest: "blake3:body".into(),
    }
}

fn result(outcome: Outcome, code: Option<Code>, retry: Retry, status: u16) -> EventBody {
    EventBody::ResultCommitted {
        outcome,
        code,
        retry,
        result_id: "res-1".into(),
        digest: "blake3:body".into(),
        facts: ResultFacts {
            http_status: Some(status),
            ..Default::default()
        },
        confidence: ConfidenceSource::RemoteResponse,
        redactions: 0,
    }
}

fn committed() -> EventBody {
    result(Outcome::Committed, None, Retry::Never, 200)
}

fn rate_limited() -> EventBody {
    result(
        Outcome::Rejected,
        Some(Code::RemoteRateLimited),
        Retry::Backoff,
        429,
    )
}

fn failed(phase: Phase, outcome: Outcome, retry: Retry, code: Code) -> EventBody {
    EventBody::Failed {
        phase,
        outcome,
        retry,
        code,
        message: "failed".into(),
        field: None,
    }
}

fn failed_unknown() -> EventBody {
    failed(
        Phase::RemoteExecution,
        Outcome::Unknown,
        Retry::Reconcile,
        Code::RemoteTimeout,
    )
}

fn manifest(for_generation: u32, decision: Decision) -> EventBody {
    EventBody::RetryManifest {
        for_generation,
        verdict: if decision.starts_attempt() {
            Verdict::IdempotencyKeySafe
        } else {
            Verdict::Unsafe
        },
        decision,
        directive: "test".into(),
        digest: format!("blake3:{}", "ab".repeat(32)),
        source_query_predicate: None,
        signature: None,
    }
}

fn reconciled(source: ConfidenceSource, settlement: Settlement) -> EventBody {
    EventBody::Reconciled {
        source,
        settlement,
        by: "operator-1".into(),
        note: "checked the remote".into(),
        http_status: None,
    }
}

// ---------------------------------------------------------------------------------------
// A projection with its own sequence counter

struct Log {
    p: Projection,
    seq: u64,
}

impl Log {
    fn new() -> Log {
        Log {
            p: Projection::new(ID),
            seq: 0,
        }
    }

    /// Accepted, validated (non-idempotent, no key) and holding a credential.
    fn validated() -> Log {
        Log::validated_with(operation(false, None))
    }

    fn validated_with(op: OperationFacts) -> Log {
        let mut log = Log::new();
        log.ok(accepted());
        log.ok(preflight(op));
        log.ok(credential());
        log
    }

    /// Validated and inside attempt 1.
    fn ready() -> Log {
        let mut log = Log::validated();
        log.ok(attempt(1));
        log
    }

    /// Attempt 1 dispatched and ended without a result: unknown.
    fn unknown() -> Log {
        let mut log = Log::ready();
        log.ok(dispatch(1));
        log.ok(sent());
        log.ok(failed_unknown());
        log
    }

    /// Attempt 1 dispatched and settled by a complete response.
    fn settled(body: EventBody) -> Log {
        let mut log = Log::ready();
        log.ok(dispatch(1));
        log.ok(sent());
        log.ok(response_started(200));
        log.ok(response_complete());
        log.ok(body);
        log
    }

    fn ok(&mut self, body: EventBody) -> &Projection {
        self.seq += 1;
        if let Err(e) = self.p.apply(self.seq, &body) {
            panic!("{} should be accepted: {e}", body.kind());
        }
        assert_eq!(self.p.last_seq, self.seq);
        &self.p
    }

    /// The event is refused and the projection is exactly as before.
    fn refused(&mut self, body: EventBody) -> ProjectionError {
        self.seq += 1;
        let before = self.p.clone();
        let err = match self.p.apply(self.seq, &body) {
            Ok(()) => panic!(
                "{} should be refused; projection now {:?}",
                body.kind(),
                self.p
            ),
            Err(e) => e,
        };
        assert_eq!(
            self.p,
            before,
            "a refused {} changed the projection",
            body.kind()
        );
        assert_eq!(err.kind, body.kind());
        assert_eq!(err.seq, self.seq);
        assert_eq!(err.invocation_id, ID);
        err
    }
}

// ---------------------------------------------------------------------------------------
// Unit tests, one rule each

#[test]
fn the_first_event_must_be_action_accepted() {
    for body in [
        preflight(operation(false, None)),
        credential(),
        attempt(1),
        dispatch(1),
        committed(),
        failed(
            Phase::Validation,
            Outcome::NotAttempted,
            Retry::AfterCorrection,
            Code::InvalidRequest,
        ),
    ] {
        let mut log = Log::new();
        let err = log.refused(body);
        assert_eq!(err.reason, "the first event must be ACTION_ACCEPTED");
        assert!(!log.p.exists());
    }
    let mut log = Log::new();
    log.ok(accepted());
    assert!(log.p.exists());
    assert_eq!(log.p.outcome, Outcome::NotAttempted);
    log.refused(accepted());
}

#[test]
fn sequence_numbers_must_increase() {
    let mut p = Projection::new(ID);
    // Journal sequences start at 1; 0 is never a valid sequence.
    assert!(p.apply(0, &accepted()).is_err());
    p.apply(5, &accepted()).unwrap();
    let before = p.clone();
    for seq in [5, 4, 1] {
        let err = p
            .apply(seq, &preflight(operation(false, None)))
            .unwrap_err();
        assert_eq!(err.reason, "sequence numbers must increase");
        assert_eq!(p, before);
    }
    p.apply(9, &preflight(operation(false, None))).unwrap();
    assert_eq!(p.last_seq, 9);
    // Gaps are fine: sequences are global across invocations.
    p.apply(12, &credential()).unwrap();
    assert_eq!(p.last_seq, 12);
}

#[test]
fn before_dispatch_the_outcome_is_not_attempted() {
    let mut log = Log::ready();
    log.ok(connection_failed(Stage::TlsHandshake, Code::TlsRejected));
    let p = log
        .ok(failed(
            Phase::ConnectionSetup,
            Outcome::NotAttempted,
            Retry::AfterCorrection,
            Code::TlsRejected,
        ))
        .clone();
    assert_eq!(p.outcome, Outcome::NotAttempted);
    assert!(!p.ever_dispatched);
    assert_eq!(p.dispatches, 0);
    let env = p.envelope(T0).unwrap();
    assert_eq!(env.error.outcome, Outcome::NotAttempted);
    assert_eq!(env.error.phase, Phase::ConnectionSetup);
    assert_eq!(env.error.retry, Retry::AfterCorrection);
    assert!(!env.evidence.dispatch_started);
    assert_eq!(env.evidence.attempts.len(), 1);
}

#[test]
fn dispatch_makes_the_outcome_unknown() {
    let mut log = Log::ready();
    let p = log.ok(dispatch(1)).clone();
    assert_eq!(p.outcome, Outcome::Unknown);
    assert_eq!(p.phase, Phase::RemoteExecution);
    assert!(p.ever_dispatched);
    assert_eq!(p.dispatches, 1);
    assert_eq!(p.attempt.dispatch_seq, Some(log.seq));
    let env = p.envelope(T0).unwrap();
    assert_eq!(env.error.code, Code::RemoteOutcomeUnknown);
    assert_eq!(env.error.outcome, Outcome::Unknown);
    assert_eq!(env.error.retry, Retry::Reconcile);
    assert!(env.evidence.dispatch_started);
    assert_eq!(env.evidence.dispatch_sequence, Some(log.seq));
    // Request markers do not settle anything.
    log.ok(sent());
    log.ok(response_started(200));
    assert_eq!(log.p.outcome, Outcome::Unknown);
}

#[test]
fn dispatch_needs_the_current_attempt_and_the_bound_fingerprint() {
    let mut log = Log::validated();
    log.refused(dispatch(1)); // no attempt yet
    log.ok(attempt(1));
    log.refused(dispatch(2)); // wrong generation
    log.refused(EventBody::DispatchStarted {
        generation: 1,
        fingerprint: FP2.into(),
        connection_id: None,
        peer_identity: None,
    });
    log.ok(dispatch(1));
    log.refused(dispatch(1)); // an attempt dispatches once
    assert_eq!(log.p.dispatches, 1);
}

#[test]
fn unknown_becomes_committed_only_after_a_complete_response() {
    let mut log = Log::ready();
    log.ok(dispatch(1));
    log.refused(committed());
    log.ok(sent());
    log.refused(committed());
    log.refused(EventBody::RemoteResponseStarted {
        http_status: Some(100),
        remote_request_id: None,
    });
    log.ok(response_started(200));
    log.refused(committed());
    assert_eq!(log.p.outcome, Outcome::Unknown);
    log.ok(response_complete());
    assert_eq!(log.p.outcome, Outcome::Unknown);
    let p = log.ok(committed()).clone();
    assert_eq!(p.outcome, Outcome::Committed);
    assert!(p.terminal);
    assert_eq!(p.confidence, Some(ConfidenceSource::RemoteResponse));
    assert_eq!(p.result_id.as_deref(), Some("res-1"));
    // A plain success carries no code: there is no error envelope.
    assert!(p.envelope(T0).is_none());
}

#[test]
fn unknown_becomes_rejected_only_after_a_complete_response() {
    let mut log = Log::ready();
    log.ok(dispatch(1));
    log.ok(response_started(429));
    log.refused(rate_limited());
    log.ok(response_complete());
    let p = log.ok(rate_limited()).clone();
    assert_eq!(p.outcome, Outcome::Rejected);
    let env = p.envelope(T0).unwrap();
    assert_eq!(env.error.code, Code::RemoteRateLimited);
    assert_eq!(env.error.outcome, Outcome::Rejected);
    assert_eq!(env.error.retry, Retry::Backoff);
}

#[test]
fn a_stored_result_is_committed_or_rejected() {
    for outcome in [Outcome::Unknown, Outcome::NotAttempted] {
        let mut log = Log::ready();
        log.ok(dispatch(1));
        log.ok(response_started(200));
        log.ok(response_complete());
        log.refused(result(outcome, None, Retry::Never, 200));
        assert_eq!(log.p.outcome, Outcome::Unknown);
    }
}

#[test]
fn reconciliation_settles_an_ended_unknown_attempt() {
    let mut log = Log::unknown();
    let p = log
        .ok(reconciled(
            ConfidenceSource::RemoteQuery,
            Settlement::Committed,
        ))
        .clone();
    assert_eq!(p.outcome, Outcome::Committed);
    assert_eq!(p.code, Some(Code::ReconciledCommitted));
    assert_eq!(p.retry(T0), Retry::Never);
    assert_eq!(p.confidence, Some(ConfidenceSource::RemoteQuery));
    assert_eq!(p.reconciled, Some(Settlement::Committed));
    // The original attempt is not rewritten.
    assert!(p.ever_dispatched);
    assert!(p.attempt.dispatched);
    assert_eq!(p.dispatches, 1);

    let mut log = Log::unknown();
    let p = log
        .ok(reconciled(
            ConfidenceSource::OperatorAttested,
            Settlement::NotApplied,
        ))
        .clone();
    assert_eq!(p.outcome, Outcome::Rejected);
    assert_eq!(p.code, Some(Code::ReconciledNotApplied));
    assert_eq!(p.retry(T0), Retry::Backoff);
    assert_eq!(p.confidence, Some(ConfidenceSource::OperatorAttested));
    assert!(p.attempt.dispatched);
}

#[test]
fn reconciliation_needs_an_ended_unknown_attempt_and_an_outside_source() {
    // While the attempt is still open.
    let mut log = Log::ready();
    log.ok(dispatch(1));
    log.refused(reconciled(
        ConfidenceSource::RemoteQuery,
        Settlement::Committed,
    ));
    // Not attempted: nothing to reconcile.
    let mut log = Log::validated();
    log.refused(reconciled(
        ConfidenceSource::RemoteQuery,
        Settlement::NotApplied,
    ));
    // Already settled by a response.
    let mut log = Log::settled(rate_limited());
    log.refused(reconciled(
        ConfidenceSource::OperatorAttested,
        Settlement::Committed,
    ));
    // Reconciled once.
    let mut log = Log::unknown();
    log.ok(reconciled(
        ConfidenceSource::RemoteQuery,
        Settlement::NotApplied,
    ));
    log.refused(reconciled(
        ConfidenceSource::RemoteQuery,
        Settlement::Committed,
    ));
    // A reconciliation cannot masquerade as transport or response evidence.
    for source in [
        ConfidenceSource::TransportObserved,
        ConfidenceSource::RemoteResponse,
    ] {
        let mut log = Log::unknown();
        log.refused(reconciled(source, Settlement::Committed));
    }
}

#[test]
fn a_failure_after_dispatch_cannot_claim_not_attempted() {
    let mut log = Log::ready();
    log.ok(dispatch(1));
    for phase in [
        Phase::Validation,
        Phase::ConnectionSetup,
        Phase::RemoteExecution,
    ] {
        let err = log.refused(failed(
            phase,
            Outcome::NotAttempted,
            Retry::Backoff,
            Code::ConnectionRefused,
        ));
        assert_eq!(
            err.reason,
            "a failure after dispatch leaves the outcome unknown"
        );
    }
    for outcome in [Outcome::Committed, Outcome::Rejected] {
        log.refused(failed(
            Phase::RemoteExecution,
            outcome,
            Retry::Never,
            Code::RemoteTimeout,
        ));
    }
    // Connection setup is over once dispatched.
    log.refused(connection_failed(
        Stage::TcpConnect,
        Code::ConnectionRefused,
    ));
    let p = log.ok(failed_unknown()).clone();
    assert_eq!(p.outcome, Outcome::Unknown);
    assert!(p.terminal);
    assert!(p.attempt.closed);
}

#[test]
fn a_failure_before_dispatch_must_claim_not_attempted() {
    let mut log = Log::ready();
    log.refused(failed_unknown());
    // Nothing was dispatched, so the failure cannot be in a post-dispatch phase.
    for phase in [Phase::RemoteExecution, Phase::ResultDelivery] {
        log.refused(failed(
            phase,
            Outcome::NotAttempted,
            Retry::Backoff,
            Code::BrokerInterrupted,
        ));
    }
    // Connection setup can only prove not_attempted.
    log.refused(EventBody::ConnectionAttempt {
        n: 1,
        stage: Stage::Dns,
        outcome: Outcome::Unknown,
        code: Code::DnsFailed,
        via: None,
    });
    log.ok(failed(
        Phase::CredentialInjection,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        Code::VaultLocked,
    ));
    assert_eq!(log.p.outcome, Outcome::NotAttempted);
}

/// A cancellation after dispatch is not a preflight failure. A failure after
/// dispatch names a post-dispatch phase; a record claiming `phase=validation` (or
/// credential_injection, connection_setup) with `outcome=unknown` is contradictory: every
/// code of those phases proves not_attempted. `Recorder::fail` always writes
/// remote_execution here, but the projection also guards reads of stored records.
#[test]
fn a_failure_after_dispatch_names_a_phase_after_dispatch() {
    for phase in [
        Phase::Validation,
        Phase::CredentialInjection,
        Phase::ConnectionSetup,
    ] {
        let mut log = Log::ready();
        log.ok(dispatch(1));
        log.refused(failed(
            phase,
            Outcome::Unknown,
            Retry::Reconcile,
            Code::CallerCancelled,
        ));
    }
}

#[test]
fn a_retry_attempt_needs_a_manifest_that_starts_an_attempt() {
    let mut log = Log::unknown();
    let err = log.refused(attempt(2));
    assert_eq!(err.reason, "a retry needs a retry manifest that allows it");
    // A manifest must follow an ended attempt and name the next generation.
    log.refused(manifest(3, Decision::RetrySameKey));
    log.refused(manifest(1, Decision::RetrySameKey));
    // A manifest that does not start an attempt is recorded but authorizes nothing.
    for decision in [
        Decision::Reconcile,
        Decision::Fetch,
        Decision::StopForCorrection,
        Decision::ReturnRecordedResult,
        Decision::IdempotencyMismatch,
    ] {
        log.ok(manifest(2, decision));
        assert_eq!(log.p.authorized_generation, None);
        log.refused(attempt(2));
    }
    log.ok(manifest(2, Decision::RetrySameKey));
    assert_eq!(log.p.authorized_generation, Some(2));
    // Generations still increase by one.
    log.refused(attempt(3));
    let p = log.ok(attempt(2)).clone();
    assert_eq!(p.attempt.generation, 2);
    assert_eq!(p.authorized_generation, None);
    assert!(!p.terminal);
    // The retry is still unknown until something settles it.
    assert_eq!(p.outcome, Outcome::Unknown);
    // Inside the attempt, no manifest and no second attempt.
    log.refused(manifest(3, Decision::RetrySameKey));
    log.refused(attempt(3));
    log.ok(dispatch(2));
    assert_eq!(log.p.dispatches, 2);
}

#[test]
fn the_first_attempt_needs_no_manifest_but_a_credential() {
    let mut log = Log::new();
    log.ok(accepted());
    log.refused(attempt(1));
    log.ok(preflight(operation(false, None)));
    log.refused(attempt(1));
    log.ok(credential());
    log.refused(attempt(2));
    log.ok(attempt(1));
    log.refused(attempt(2)); // the previous attempt is still open
}

#[test]
fn a_second_attempt_failing_in_connection_setup_keeps_the_earlier_dispatch() {
    let mut log = Log::validated_with(operation(false, Some("k-1")));
    log.ok(attempt(1));
    log.ok(dispatch(1));
    log.ok(failed_unknown());
    log.ok(manifest(2, Decision::RetrySameKey));
    log.ok(attempt(2));
    log.ok(connection_failed(
        Stage::TcpConnect,
        Code::ConnectionRefused,
    ));
    let p = log
        .ok(failed(
            Phase::ConnectionSetup,
            Outcome::NotAttempted,
            Retry::Backoff,
            Code::ConnectionRefused,
        ))
        .clone();
    assert_eq!(p.outcome, Outcome::Unknown);
    assert!(p.ever_dispatched);
    assert_eq!(p.dispatches, 1);
    let env = p.envelope(T0).unwrap();
    assert_eq!(env.error.outcome, Outcome::Unknown);
    assert_eq!(env.error.code, Code::ConnectionRefused);
    let facts = p.record_facts(T0);
    assert_eq!(facts.outcome, Outcome::Unknown);
    assert_eq!(facts.attempts_used, 1);
}

/// Automatic retry is opt-in only for `backoff` or `same_idempotency_key`, and
/// an `unknown` outcome of a non-idempotent operation must never advertise `backoff`.
/// Attempt 2's connection-setup failure proves only that attempt 2 sent nothing; its
/// `backoff` must not replace the disposition the invocation's unknown outcome derives
/// from the operation (same key while the key lives, reconcile after).
#[test]
fn an_unknown_outcome_keeps_its_derived_retry_after_a_later_setup_failure() {
    let mut log = Log::validated_with(operation(false, Some("k-1")));
    log.ok(attempt(1));
    log.ok(dispatch(1));
    // As `Recorder::fail` writes it: the disposition derived from the operation.
    log.ok(failed(
        Phase::RemoteExecution,
        Outcome::Unknown,
        Retry::SameIdempotencyKey,
        Code::RemoteTimeout,
    ));
    assert_eq!(log.p.retry(T0), Retry::SameIdempotencyKey);
    log.ok(manifest(2, Decision::RetrySameKey));
    log.ok(attempt(2));
    log.ok(connection_failed(
        Stage::TcpConnect,
        Code::ConnectionRefused,
    ));
    log.ok(failed(
        Phase::ConnectionSetup,
        Outcome::NotAttempted,
        Retry::Backoff,
        Code::ConnectionRefused,
    ));
    let p = &log.p;
    assert_eq!(p.outcome, Outcome::Unknown);
    let key_expiry = T0 + 24 * 3600 * 1000;
    assert_eq!(p.retry(T0), Retry::SameIdempotencyKey);
    assert_eq!(
        p.envelope(T0).unwrap().error.retry,
        Retry::SameIdempotencyKey
    );
    assert_eq!(p.retry(key_expiry), Retry::Reconcile);
    assert_eq!(
        p.envelope(key_expiry).unwrap().error.retry,
        Retry::Reconcile
    );
}

#[test]
fn a_second_attempt_after_a_rejection_keeps_the_rejection_when_it_never_dispatches() {
    let mut log = Log::settled(rate_limited());
    log.ok(manifest(2, Decision::RetryWhenAllowed));
    log.ok(attempt(2));
    // While the new attempt is undispatched, the settled rejection still stands.
    assert_eq!(log.p.outcome, Outcome::Rejected);
    log.ok(connection_failed(Stage::Dns, Code::DnsFailed));
    let p = log
        .ok(failed(
            Phase::ConnectionSetup,
            Outcome::NotAttempted,
            Retry::Backoff,
            Code::DnsFailed,
        ))
        .clone();
    assert_eq!(p.outcome, Outcome::Rejected);
    assert!(p.ever_dispatched);
}

#[test]
fn a_rejection_becomes_unknown_again_only_by_a_new_authorized_dispatch() {
    let mut log = Log::settled(rate_limited());
    log.refused(attempt(2));
    log.ok(manifest(2, Decision::RetryWhenAllowed));
    log.ok(attempt(2));
    assert_eq!(log.p.outcome, Outcome::Rejected);
    log.ok(dispatch(2));
    assert_eq!(log.p.outcome, Outcome::Unknown);
    log.ok(response_started(200));
    log.ok(response_complete());
    log.ok(committed());
    assert_eq!(log.p.outcome, Outcome::Committed);
    assert_eq!(log.p.dispatches, 2);
}

#[test]
fn committed_never_changes() {
    let mut log = Log::settled(committed());
    let committed_state = log.p.clone();
    log.refused(attempt(2));
    for decision in [
        Decision::RetryNewAttempt,
        Decision::RetrySameKey,
        Decision::RetryWhenAllowed,
    ] {
        log.refused(manifest(2, decision));
    }
    for source in [
        ConfidenceSource::RemoteQuery,
        ConfidenceSource::OperatorAttested,
    ] {
        for settlement in [Settlement::Committed, Settlement::NotApplied] {
            log.refused(reconciled(source, settlement));
        }
    }
    log.refused(failed_unknown());
    log.refused(failed(
        Phase::Validation,
        Outcome::NotAttempted,
        Retry::Backoff,
        Code::BrokerInterrupted,
    ));
    log.refused(dispatch(1));
    log.refused(dispatch(2));
    log.refused(committed());
    log.refused(preflight(operation(true, None)));
    assert_eq!(log.p, committed_state);
    // A non-starting manifest and delivery records are fine; the outcome stays.
    log.ok(manifest(2, Decision::ReturnRecordedResult));
    log.refused(attempt(2));
    log.ok(EventBody::DeliveryFailed {
        code: Code::ResultDeliveryFailed,
        message: "pipe closed".into(),
    });
    assert_eq!(log.p.outcome, Outcome::Committed);
    assert_eq!(log.p.retry(T0), Retry::FetchResult);
    let env = log.p.envelope(T0).unwrap();
    assert_eq!(env.error.phase, Phase::ResultDelivery);
    assert_eq!(env.error.outcome, Outcome::Committed);
    assert_eq!(env.error.retry, Retry::FetchResult);
    log.ok(EventBody::ResultDelivered);
    assert_eq!(log.p.outcome, Outcome::Committed);
}

#[test]
fn committed_by_reconciliation_never_changes() {
    let mut log = Log::unknown();
    log.ok(reconciled(
        ConfidenceSource::RemoteQuery,
        Settlement::Committed,
    ));
    let state = log.p.clone();
    log.refused(attempt(2));
    log.refused(manifest(2, Decision::RetryNewAttempt));
    log.refused(reconciled(
        ConfidenceSource::OperatorAttested,
        Settlement::NotApplied,
    ));
    log.refused(failed(
        Phase::Validation,
        Outcome::NotAttempted,
        Retry::Never,
        Code::LeaseLost,
    ));
    assert_eq!(log.p, state);
}

/// A manifest authorizes a retry of the state it was decided on. When a reconciliation
/// settles the invocation after the manifest, the authorization is stale: the record is
/// terminal and settled, and a later FAILED (for example the authorized worker's lease
/// loss) must not overwrite the settlement's code, phase and confidence.
#[test]
fn reconciliation_withdraws_an_outstanding_retry_authorization() {
    let mut log = Log::validated_with(operation(false, Some("k-1")));
    log.ok(attempt(1));
    log.ok(dispatch(1));
    log.ok(failed_unknown());
    log.ok(manifest(2, Decision::RetrySameKey));
    log.ok(reconciled(
        ConfidenceSource::RemoteQuery,
        Settlement::Committed,
    ));
    assert_eq!(log.p.outcome, Outcome::Committed);
    let settled = log.p.clone();
    log.refused(failed(
        Phase::Validation,
        Outcome::NotAttempted,
        Retry::Never,
        Code::LeaseLost,
    ));
    assert_eq!(log.p.code, Some(Code::ReconciledCommitted));
    assert_eq!(log.p.confidence, Some(ConfidenceSource::RemoteQuery));
    assert_eq!(log.p, settled);
}

#[test]
fn a_refused_apply_leaves_the_projection_unchanged() {
    // Each state paired with events it must refuse; `Log::refused` compares clones.
    let cases: Vec<(&str, Log, Vec<EventBody>)> = vec![
        ("empty", Log::new(), vec![credential(), dispatch(1)]),
        (
            "validated",
            Log::validated(),
            vec![
                dispatch(1),
                attempt(2),
                response_complete(),
                preflight(operation(true, None)),
            ],
        ),
        (
            "dispatched",
            {
                let mut l = Log::ready();
                l.ok(dispatch(1));
                l
            },
            vec![
                failed(
                    Phase::ConnectionSetup,
                    Outcome::NotAttempted,
                    Retry::Backoff,
                    Code::ConnectTimeout,
                ),
                committed(),
                EventBody::ResultDelivered,
                manifest(2, Decision::RetryNewAttempt),
                reconciled(ConfidenceSource::RemoteQuery, Settlement::NotApplied),
            ],
        ),
        (
            "unknown",
            Log::unknown(),
            vec![
                attempt(2),
                sent(),
                EventBody::ApprovalGranted {
                    fingerprint: FP.into(),
                    approver: "alice".into(),
                    card_digest: None,
                },
                response_complete(),
                dispatch(1),
            ],
        ),
        (
            "committed",
            Log::settled(committed()),
            vec![attempt(2), manifest(2, Decision::RetrySameKey)],
        ),
    ];
    for (name, mut log, bodies) in cases {
        let before = log.p.clone();
        for body in bodies {
            log.refused(body);
        }
        assert_eq!(log.p, before, "state `{name}`");
        // A refused event does not consume the projection's sequence either.
        assert_eq!(log.p.last_seq, before.last_seq, "state `{name}`");
    }
}

#[test]
fn approvals_name_the_bound_fingerprint_and_come_before_dispatch() {
    let mut log = Log::new();
    log.ok(accepted());
    log.refused(EventBody::ApprovalRequested {
        fingerprint: FP.into(),
        mode: "console".into(),
        card: None,
        card_digest: None,
    });
    log.ok(preflight(operation(false, None)));
    log.refused(EventBody::ApprovalGranted {
        fingerprint: FP2.into(),
        approver: "alice".into(),
        card_digest: None,
    });
    log.ok(EventBody::ApprovalRequested {
        fingerprint: FP.into(),
        mode: "console".into(),
        card: None,
        card_digest: None,
    });
    log.ok(EventBody::ApprovalDenied {
        fingerprint: FP.into(),
        approver: "alice".into(),
        card_digest: None,
    });
    assert!(log.p.denied);
    log.refused(credential());
}

// ---------------------------------------------------------------------------------------
// Property tests over random event sequences

const ALL_STAGES: &[Stage] = &[
    Stage::Dns,
    Stage::TcpConnect,
    Stage::TlsHandshake,
    Stage::ProxyTunnel,
    Stage::SshKex,
    Stage::HostKey,
    Stage::UserAuth,
    Stage::ChannelOpen,
];

const NOWS: [i64; 3] = [T0, T0 + 2_000, T0 + 10_000];

/// One of two fingerprints, mostly the one the happy-path prefix binds.
fn fp() -> impl Strategy<Value = String> {
    prop_oneof![3 => Just(FP.to_string()), 1 => Just(FP2.to_string())]
}

/// Generation 1..4, biased to the first two so that second attempts happen.
fn generation() -> impl Strategy<Value = u32> {
    prop_oneof![3 => Just(1u32), 3 => Just(2u32), 1 => Just(3u32)]
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop::sample::select(Outcome::ALL)
}

/// Any outcome, mostly `preferred` (the one the rules accept for that event).
fn outcome_mostly(preferred: &'static [Outcome]) -> impl Strategy<Value = Outcome> {
    prop_oneof![1 => outcome(), 2 => prop::sample::select(preferred)]
}

fn retry() -> impl Strategy<Value = Retry> {
    prop::sample::select(Retry::ALL)
}

fn phase() -> impl Strategy<Value = Phase> {
    prop::sample::select(Phase::ALL)
}

fn code() -> impl Strategy<Value = Code> {
    prop::sample::select(Code::ALL)
}

fn confidence() -> impl Strategy<Value = ConfidenceSource> {
    prop::sample::select(ConfidenceSource::ALL)
}

fn decision() -> impl Strategy<Value = Decision> {
    let starting: Vec<Decision> = Decision::ALL
        .iter()
        .copied()
        .filter(|d| d.starts_attempt())
        .collect();
    prop_oneof![
        1 => prop::sample::select(Decision::ALL),
        1 => prop::sample::select(starting),
    ]
}

fn short() -> impl Strategy<Value = String> {
    "[a-z]{0,3}"
}

fn arb_operation() -> impl Strategy<Value = OperationFacts> {
    (
        any::<bool>(),
        any::<bool>(),
        prop::option::of(prop::sample::select(vec![T0 + 1_000, T0 + 5_000])),
        any::<bool>(),
        any::<bool>(),
        0u32..4,
    )
        .prop_map(
            |(idempotent, configured, expiry, has_key, reconcile_configured, retry_budget)| {
                let remote_contract = if configured {
                    RemoteContract::Configured
                } else {
                    RemoteContract::None
                };
                OperationFacts {
                    idempotent,
                    remote_contract,
                    idempotency: has_key.then(|| IdempotencyEvidence {
                        key: "k-1".into(),
                        scope: None,
                        fingerprint: FP.into(),
                        remote_contract,
                        expires_at_ms: expiry,
                    }),
                    reconcile_configured,
                    source_query: None,
                    batch: None,
                    retry_budget,
                    peer: None,
                }
            },
        )
}

fn arb_connection() -> impl Strategy<Value = EventBody> {
    (
        1u32..3,
        prop::sample::select(ALL_STAGES),
        outcome_mostly(&[Outcome::NotAttempted]),
        code(),
    )
        .prop_map(|(n, stage, outcome, code)| EventBody::ConnectionAttempt {
            n,
            stage,
            outcome,
            code,
            via: None,
        })
}

fn arb_dispatch(generation: impl Strategy<Value = u32>) -> impl Strategy<Value = EventBody> {
    (generation, fp(), prop::option::of(short())).prop_map(
        |(generation, fingerprint, connection_id)| EventBody::DispatchStarted {
            generation,
            fingerprint,
            connection_id,
            peer_identity: None,
        },
    )
}

fn arb_sent() -> impl Strategy<Value = EventBody> {
    (any::<bool>(), any::<bool>()).prop_map(|(headers_sent, body_complete)| {
        EventBody::RequestSent {
            headers_sent,
            body_complete,
        }
    })
}

fn arb_started() -> impl Strategy<Value = EventBody> {
    (
        prop::option::of(prop::sample::select(vec![100u16, 200, 401, 429, 500])),
        prop::option::of(short()),
    )
        .prop_map(
            |(http_status, remote_request_id)| EventBody::RemoteResponseStarted {
                http_status,
                remote_request_id,
            },
        )
}

fn arb_complete() -> impl Strategy<Value = EventBody> {
    short().prop_map(|digest| EventBody::RemoteResponseComplete { digest })
}

fn arb_result() -> impl Strategy<Value = EventBody> {
    (
        outcome_mostly(&[Outcome::Committed, Outcome::Rejected]),
        prop::option::of(code()),
        retry(),
        short(),
        confidence(),
        0u32..3,
    )
        .prop_map(
            |(outcome, code, retry, result_id, confidence, redactions)| {
                EventBody::ResultCommitted {
                    outcome,
                    code,
                    retry,
                    result_id,
                    digest: "blake3:body".into(),
                    facts: ResultFacts::default(),
                    confidence,
                    redactions,
                }
            },
        )
}

fn arb_failed() -> impl Strategy<Value = EventBody> {
    (
        phase(),
        outcome_mostly(&[Outcome::Unknown, Outcome::NotAttempted]),
        retry(),
        code(),
    )
        .prop_map(|(phase, outcome, retry, code)| EventBody::Failed {
            phase,
            outcome,
            retry,
            code,
            message: "x".into(),
            field: None,
        })
}

fn arb_manifest(generation: impl Strategy<Value = u32>) -> impl Strategy<Value = EventBody> {
    (generation, prop::sample::select(Verdict::ALL), decision()).prop_map(
        |(for_generation, verdict, decision)| EventBody::RetryManifest {
            for_generation,
            verdict,
            decision,
            directive: "x".into(),
            digest: "blake3:x".into(),
            source_query_predicate: None,
            signature: None,
        },
    )
}

fn arb_reconciled() -> impl Strategy<Value = EventBody> {
    (
        prop_oneof![
            1 => confidence(),
            2 => prop::sample::select(vec![
                ConfidenceSource::RemoteQuery,
                ConfidenceSource::OperatorAttested,
            ]),
        ],
        prop::sample::select(vec![Settlement::Committed, Settlement::NotApplied]),
        prop::option::of(Just(200u16)),
    )
        .prop_map(|(source, settlement, http_status)| EventBody::Reconciled {
            source,
            settlement,
            by: "op".into(),
            note: "n".into(),
            http_status,
        })
}

/// Any event of any variant, with small random fields.
fn arb_event() -> impl Strategy<Value = EventBody> {
    let accepted = (
        prop::sample::select(vec![Channel::Http, Channel::Ssh]),
        short(),
        prop::option::of(short()),
    )
        .prop_map(|(channel, target, session)| EventBody::ActionAccepted {
            channel,
            target,
            summary: "summary".into(),
            session,
            parent: None,
        });
    let preflight = (fp(), arb_operation()).prop_map(|(fingerprint, operation)| {
        EventBody::PreflightValidated {
            fingerprint,
            snapshot: snapshot(None),
            operation,
        }
    });
    let approval = (fp(), 0u8..3).prop_map(|(fingerprint, which)| match which {
        0 => EventBody::ApprovalRequested {
            fingerprint,
            mode: "console".into(),
            card: None,
            card_digest: None,
        },
        1 => EventBody::ApprovalGranted {
            fingerprint,
            approver: "alice".into(),
            card_digest: None,
        },
        _ => EventBody::ApprovalDenied {
            fingerprint,
            approver: "alice".into(),
            card_digest: None,
        },
    });
    let credential = short().prop_map(|v| EventBody::CredentialAuthorized {
        credential_id: "payments-key".into(),
        credential_version: v,
    });
    let attempt = generation().prop_map(|generation| EventBody::AttemptStarted {
        generation,
        holder: "worker".into(),
        lease_expires_at_ms: T0 + 60_000,
    });
    let delivery_failed = code().prop_map(|code| EventBody::DeliveryFailed {
        code,
        message: "x".into(),
    });
    prop_oneof![
        accepted.boxed(),
        preflight.boxed(),
        approval.boxed(),
        credential.boxed(),
        attempt.boxed(),
        arb_connection().boxed(),
        arb_dispatch(generation()).boxed(),
        arb_sent().boxed(),
        arb_started().boxed(),
        arb_complete().boxed(),
        arb_result().boxed(),
        Just(EventBody::ResultDelivered).boxed(),
        delivery_failed.boxed(),
        arb_failed().boxed(),
        arb_manifest(generation()).boxed(),
        arb_reconciled().boxed(),
    ]
}

/// Attempt `g`'s lifecycle (its start, setup, dispatch, response, ending, maybe a
/// reconciliation, the next manifest), each step usually present and with random
/// fields, so some steps are still refused. Chained for generations 1 to 3 it reaches
/// settled, reconciled and retried states that independent events rarely do.
fn arb_attempt_script(g: u32) -> impl Strategy<Value = Vec<EventBody>> {
    let step = |p: f64, s: BoxedStrategy<EventBody>| prop::option::weighted(p, s);
    let ending = prop_oneof![arb_result(), arb_failed()].boxed();
    (
        step(0.9, Just(attempt(g)).boxed()),
        step(0.2, arb_connection().boxed()),
        step(0.85, arb_dispatch(Just(g)).boxed()),
        step(0.5, arb_sent().boxed()),
        step(0.7, arb_started().boxed()),
        step(0.7, arb_complete().boxed()),
        step(0.9, ending),
        step(0.3, arb_reconciled().boxed()),
        step(0.8, arb_manifest(Just(g + 1)).boxed()),
    )
        .prop_map(move |(a, b, c, d, e, f, h, i, j)| {
            let first = if g == 1 { None } else { a };
            [first, b, c, d, e, f, h, i, j]
                .into_iter()
                .flatten()
                .collect()
        })
}

/// Either up to 40 independent events of any variant, or the scripts of attempts 1 to 3
/// with up to 12 independent events inserted anywhere.
fn arb_tail() -> impl Strategy<Value = Vec<EventBody>> {
    let random = prop::collection::vec(arb_event(), 0..40);
    let scripted = (
        arb_attempt_script(1),
        arb_attempt_script(2),
        arb_attempt_script(3),
        prop::collection::vec((arb_event(), any::<prop::sample::Index>()), 0..12),
    )
        .prop_map(|(a, b, c, noise)| {
            let mut tail: Vec<EventBody> = a.into_iter().chain(b).chain(c).collect();
            for (body, at) in noise {
                let at = at.index(tail.len() + 1);
                tail.insert(at, body);
            }
            tail
        });
    prop_oneof![1 => random, 3 => scripted]
}

/// A random-length prefix of the happy path up to attempt 1 (most sequences get the whole
/// prefix; some start anywhere earlier, including with nothing), then a tail, each event
/// after a random sequence gap.
fn arb_sequence() -> impl Strategy<Value = Vec<(u64, EventBody)>> {
    (
        prop_oneof![1 => 0usize..4, 6 => Just(4usize)],
        arb_operation(),
        arb_tail(),
        prop::collection::vec(1u64..3, 60),
    )
        .prop_map(|(prefix, op, tail, gaps)| {
            let happy = [accepted(), preflight(op), credential(), attempt(1)];
            let mut seq = 0;
            let mut out = Vec::new();
            for (body, gap) in happy.into_iter().take(prefix).chain(tail).zip(gaps) {
                seq += gap;
                out.push((seq, body));
            }
            out
        })
}

/// Whether `before → after` is an edge the rules allow for this event.
/// `response_complete`: the current attempt had recorded a complete response.
fn allowed_edge(
    before: Outcome,
    after: Outcome,
    body: &EventBody,
    attempt_authorized: bool,
    response_complete: bool,
) -> bool {
    use Outcome::*;
    if before == after {
        return true;
    }
    match (before, after, body) {
        (NotAttempted, Unknown, EventBody::DispatchStarted { .. }) => true,
        (Unknown, Rejected | Committed, EventBody::ResultCommitted { .. })
        | (Unknown, Rejected | Committed, EventBody::Reconciled { .. }) => true,
        // The complete response settled it; only its stored copy was lost.
        (
            Unknown,
            Rejected | Committed,
            EventBody::Failed {
                code: Code::ResultStoreFailed,
                phase: Phase::ResultDelivery,
                ..
            },
        ) => response_complete,
        (Rejected, Unknown, EventBody::DispatchStarted { .. }) => attempt_authorized,
        _ => false,
    }
}

/// Applies every event incrementally, checking the invariants after each accepted one.
/// Returns the accepted events and the final projection.
fn run_checked(events: &[(u64, EventBody)]) -> Result<(Vec<Event>, Projection), TestCaseError> {
    let mut p = Projection::new(ID);
    let mut accepted = Vec::new();
    let mut saw_dispatch = false;
    let mut was_committed = false;
    // The generation an accepted starting manifest authorized, and whether the current
    // attempt was opened by such a manifest.
    let mut manifest_for: Option<u32> = None;
    let mut attempt_authorized = false;
    for (seq, body) in events {
        let before = p.clone();
        if p.apply(*seq, body).is_err() {
            prop_assert_eq!(
                &p,
                &before,
                "a refused {} changed the projection",
                body.kind()
            );
            continue;
        }
        let kind = body.kind();
        accepted.push(Event {
            seq: *seq,
            invocation_id: ID.to_string(),
            recorded_at_ms: T0,
            body: body.clone(),
        });
        match body {
            EventBody::DispatchStarted { .. } => saw_dispatch = true,
            EventBody::RetryManifest {
                for_generation,
                decision,
                ..
            } if decision.starts_attempt() => manifest_for = Some(*for_generation),
            EventBody::AttemptStarted { generation, .. } => {
                attempt_authorized = manifest_for == Some(*generation);
                manifest_for = None;
            }
            _ => {}
        }

        prop_assert_eq!(p.last_seq, *seq, "last_seq after {}", kind);
        prop_assert_eq!(
            p.ever_dispatched,
            saw_dispatch,
            "ever_dispatched after {}",
            kind
        );
        if saw_dispatch {
            prop_assert_ne!(p.outcome, Outcome::NotAttempted, "after {}", kind);
        }
        if was_committed {
            prop_assert_eq!(
                p.outcome,
                Outcome::Committed,
                "committed changed by {}",
                kind
            );
        }
        was_committed = p.outcome == Outcome::Committed;
        prop_assert!(
            allowed_edge(
                before.outcome,
                p.outcome,
                body,
                attempt_authorized,
                before.attempt.response_complete
            ),
            "{:?} -> {:?} by {:?}",
            before.outcome,
            p.outcome,
            body
        );
        let dispatched_now = u32::from(matches!(body, EventBody::DispatchStarted { .. }));
        prop_assert_eq!(
            p.dispatches,
            before.dispatches + dispatched_now,
            "after {}",
            kind
        );

        for now in NOWS {
            if let Some(env) = p.envelope(now) {
                prop_assert_eq!(env.error.outcome, p.outcome);
                prop_assert_eq!(&env.invocation_id, ID);
                prop_assert_eq!(env.evidence.journal_sequence, p.last_seq);
                if env.evidence.dispatch_started {
                    prop_assert_ne!(env.error.outcome, Outcome::NotAttempted);
                    prop_assert!(env.evidence.dispatch_sequence.is_some());
                }
            }
            let facts = p.record_facts(now);
            prop_assert_eq!(facts.outcome, p.outcome);
            prop_assert_eq!(facts.attempts_used, p.dispatches);
            prop_assert_eq!(facts.last_seq, p.last_seq);
        }
    }
    Ok((accepted, p))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_event_sequences_keep_the_outcome_invariants(events in arb_sequence()) {
        run_checked(&events)?;
    }

    #[test]
    fn folding_the_accepted_events_reproduces_incremental_apply(events in arb_sequence()) {
        let (accepted, incremental) = run_checked(&events)?;
        let folded = Projection::fold(ID, &accepted).unwrap();
        prop_assert_eq!(&folded, &incremental);
        // Folding everything fails exactly at the first refused event.
        let all: Vec<Event> = events
            .iter()
            .map(|(seq, body)| Event {
                seq: *seq,
                invocation_id: ID.to_string(),
                recorded_at_ms: T0,
                body: body.clone(),
            })
            .collect();
        let first_refused = events
            .iter()
            .map(|(seq, _)| *seq)
            .find(|seq| !accepted.iter().any(|e| e.seq == *seq));
        match (Projection::fold(ID, &all), first_refused) {
            (Ok(p), None) => prop_assert_eq!(&p, &incremental),
            (Err(e), Some(seq)) => prop_assert_eq!(e.seq, seq),
            (got, expected) => {
                return Err(TestCaseError::fail(format!(
                    "fold of all events gave {got:?}, first refused {expected:?}"
                )));
            }
        }
    }
}
