use std::sync::Arc;

use postern_broker::approvals::{ApprovalDetail, ApprovalRequest};
use postern_broker::clock::Clock;
use postern_broker::contract::*;
use postern_broker::invocation::{Recorder, StepError};
use postern_broker::journal::events::{EventBody, Settlement};
use postern_broker::journal::{JournalError, ResultToStore};

use crate::support::*;

fn result(body: Vec<u8>) -> ResultToStore {
    ResultToStore {
        meta: serde_json::json!({"status": 200, "headers": [["content-type", "application/json"]]}),
        streams: vec![("body".to_string(), body)],
    }
}

/// Drives a ready invocation through a complete, stored response.
fn complete(rec: &Recorder, body: Vec<u8>) {
    rec.dispatch_started(FP, Some("conn-1".into()), Some("peer".into()))
        .unwrap();
    rec.request_sent(true, true).unwrap();
    rec.response_started(Some(200), None).unwrap();
    rec.response_complete("blake3:body").unwrap();
    rec.commit_result(result(body), settle_ok()).unwrap();
}

#[test]
fn sequences_are_global_gap_free_and_monotonic_across_invocations() {
    let f = Fixture::new();
    let a = ready(&f.journal, "inv_a", false, None);
    let b = ready(&f.journal, "inv_b", false, None);
    complete(&a, b"one".to_vec());
    complete(&b, b"two".to_vec());
    let mut seqs: Vec<u64> = f
        .journal
        .events("inv_a")
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    seqs.extend(f.journal.events("inv_b").unwrap().iter().map(|e| e.seq));
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    // Interleaved appends: b's events come after a's in global order.
    let a_last = f.journal.events("inv_a").unwrap().last().unwrap().seq;
    let b_first = f.journal.events("inv_b").unwrap()[0].seq;
    assert!(b_first < a_last, "ready(b) ran before complete(a)");
}

#[test]
fn dispatch_without_completion_projects_unknown_never_not_attempted() {
    let f = Fixture::new();
    let rec = ready(&f.journal, "inv_1", false, None);
    rec.dispatch_started(FP, None, None).unwrap();
    let p = f.journal.projection("inv_1").unwrap();
    assert_eq!(p.outcome, Outcome::Unknown);
    assert_eq!(p.phase, Phase::RemoteExecution);
    let env = p.envelope(f.clock.now_ms()).unwrap();
    assert_eq!(env.error.code, Code::RemoteOutcomeUnknown);
    assert_eq!(env.error.retry, Retry::Reconcile);
    assert!(env.evidence.dispatch_started);
    assert_eq!(
        env.evidence.dispatch_sequence,
        Some(p.attempt.dispatch_seq.unwrap())
    );
}

#[test]
fn a_failure_after_dispatch_is_recorded_unknown_whatever_the_caller_claims() {
    let f = Fixture::new();
    let rec = ready(&f.journal, "inv_1", false, None);
    rec.dispatch_started(FP, None, None).unwrap();
    // A channel that thinks "connection reset" means nothing happened.
    let appended = rec
        .fail(
            Phase::ConnectionSetup,
            Code::ConnectionRefused,
            Retry::Backoff,
            "reset",
        )
        .unwrap();
    let p = appended.projection;
    assert_eq!(p.outcome, Outcome::Unknown);
    assert_eq!(p.phase, Phase::RemoteExecution);
    assert_eq!(p.retry(f.clock.now_ms()), Retry::Reconcile);
}

#[test]
fn a_raw_failed_event_claiming_not_attempted_after_dispatch_is_refused() {
    let f = Fixture::new();
    let rec = ready(&f.journal, "inv_1", false, None);
    rec.dispatch_started(FP, None, None).unwrap();
    let err = f
        .journal
        .append(
            "inv_1",
            EventBody::Failed {
                phase: Phase::ConnectionSetup,
                outcome: Outcome::NotAttempted,
                retry: Retry::Backoff,
                code: Code::ConnectionRefused,
                message: "x".into(),
                field: None,
            },
        )
        .unwrap_err();
    assert!(matches!(err, JournalError::Impossible(_)), "{err}");
    assert_eq!(
        f.journal.projection("inv_1").unwrap().outcome,
        Outcome::Unknown
    );
}

#[test]
fn unknown_disposition_follows_the_operation_facts() {
    let f = Fixture::new();
    let idem = ready(&f.journal, "inv_idem", true, None);
    idem.dispatch_started(FP, None, None).unwrap();
    assert_eq!(
        f.journal
            .projection("inv_idem")
            .unwrap()
            .retry(f.clock.now_ms()),
        Retry::Backoff
    );

    let keyed = ready(&f.journal, "inv_key", false, Some("k-1"));
    keyed.dispatch_started(FP, None, None).unwrap();
    let p = f.journal.projection("inv_key").unwrap();
    assert_eq!(p.retry(f.clock.now_ms()), Retry::SameIdempotencyKey);
    // Past the remote's retention window only reconciliation remains.
    f.clock.advance_ms(25 * 3600 * 1000);
    assert_eq!(p.retry(f.clock.now_ms()), Retry::Reconcile);
}

#[test]
fn committed_result_is_stored_and_read_back_without_reexecution() {
    let f = Fixture::new();
    let rec = ready(&f.journal, "inv_1", false, None);
    let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    complete(&rec, body.clone());
    let p = f.journal.projection("inv_1").unwrap();
    assert_eq!(p.outcome, Outcome::Committed);
    let stored = f
        .journal
        .read_result(p.result_id.as_deref().unwrap())
        .unwrap();
    assert_eq!(stored.streams, vec![("body".to_string(), body)]);
    assert_eq!(stored.meta["status"], 200);
    // Reading is a read: the journal did not grow.
    let before = f.journal.events("inv_1").unwrap().len();
    f.journal
        .read_result(p.result_id.as_deref().unwrap())
        .unwrap();
    assert_eq!(f.journal.events("inv_1").unwrap().len(), before);
}

#[test]
fn empty_streams_survive_the_result_store() {
    let f = Fixture::new();
    let rec = ready(&f.journal, "inv_1", false, None);
    rec.dispatch_started(FP, None, None).unwrap();
    rec.response_started(None, None).unwrap();
    rec.response_complete("blake3:x").unwrap();
    let r = ResultToStore {
        meta: serde_json::json!({"exit_status": 3}),
        streams: vec![
            ("stdout".into(), b"hi\n".to_vec()),
            ("stderr".into(), Vec::new()),
        ],
    };
    let a = rec.commit_result(r.clone(), settle_ok()).unwrap();
    let stored = f
        .journal
        .read_result(a.projection.result_id.as_deref().unwrap())
        .unwrap();
    assert_eq!(stored.streams, r.streams);
}

#[test]
fn a_damaged_result_chunk_is_reported_incomplete_not_returned() {
    let f = Fixture::new();
    let rec = ready(&f.journal, "inv_1", false, None);
    complete(&rec, vec![1u8; 200_000]);
    let id = f.journal.projection("inv_1").unwrap().result_id.unwrap();
    let db = f.db();
    let f = f.reopen();
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute("DELETE FROM result_chunks WHERE n = 1", [])
            .unwrap();
    }
    assert!(matches!(
        f.journal.read_result(&id),
        Err(JournalError::ResultIncomplete(_))
    ));
}

#[test]
fn result_commit_without_a_complete_response_is_refused_and_stores_nothing() {
    let f = Fixture::new();
    let rec = ready(&f.journal, "inv_1", false, None);
    rec.dispatch_started(FP, None, None).unwrap();
    rec.response_started(Some(200), None).unwrap();
    let err = rec
        .commit_result(result(b"partial".to_vec()), settle_ok())
        .unwrap_err();
    assert!(matches!(err, JournalError::Impossible(_)));
    let conn = rusqlite::Connection::open(f.db()).unwrap();
    let n: i64 = conn
        .query_row("SELECT count(*) FROM result_chunks", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 0, "a refused commit must not leave chunks behind");
}

#[test]
fn informational_responses_never_start_the_final_response() {
    let f = Fixture::new();
    let rec = ready(&f.journal, "inv_1", false, None);
    rec.dispatch_started(FP, None, None).unwrap();
    rec.response_started(Some(100), None).unwrap();
    f.journal.flush().unwrap();
    let p = f.journal.projection("inv_1").unwrap();
    assert!(!p.attempt.response_headers_received, "a 1xx was refused");
    assert_eq!(p.outcome, Outcome::Unknown);
}

#[test]
fn delivery_failure_keeps_the_outcome_and_says_fetch_result() {
    let f = Fixture::new();
    let rec = ready(&f.journal, "inv_1", false, None);
    complete(&rec, b"ok".to_vec());
    let p = rec.delivery_failed("bridge closed").unwrap().projection;
    assert_eq!(p.outcome, Outcome::Committed);
    let env = p.envelope(f.clock.now_ms()).unwrap();
    assert_eq!(env.error.phase, Phase::ResultDelivery);
    assert_eq!(env.error.retry, Retry::FetchResult);
    assert_eq!(env.error.code, Code::ResultDeliveryFailed);
    // Later delivery succeeds.
    let p = rec.delivered().unwrap().projection;
    assert!(p.delivered);
}

#[test]
fn stale_fingerprint_at_dispatch_is_refused_and_nothing_dispatches() {
    let f = Fixture::new();
    let rec = ready(&f.journal, "inv_1", false, None);
    let other = "blake3:ffff";
    let err = rec.dispatch_started(other, None, None).unwrap_err();
    let StepError::Stopped(env) = err else {
        panic!("expected a recorded stop")
    };
    assert_eq!(env.error.code, Code::FingerprintMismatch);
    assert_eq!(env.error.outcome, Outcome::NotAttempted);
    assert!(!env.evidence.dispatch_started);
    assert!(
        !f.journal
            .events("inv_1")
            .unwrap()
            .iter()
            .any(|e| e.body.kind() == "DISPATCH_STARTED")
    );
}

#[test]
fn approval_of_a_stale_fingerprint_is_refused() {
    let f = Fixture::new();
    let rec = Recorder::accept(&f.journal, new_invocation("inv_1", None)).unwrap();
    rec.preflight(FP, snapshot(None), operation(false, None))
        .unwrap();
    let card = ApprovalRequest::bound(
        "inv_1",
        None,
        "POST /v1/payments".into(),
        FP.into(),
        &snapshot(None),
        ApprovalDetail::default(),
    )
    .card();
    rec.approval_requested(FP, "per_call", card).unwrap();
    let StepError::Stopped(env) = rec
        .approval_granted("blake3:old", "alice", None)
        .unwrap_err()
    else {
        panic!("expected a recorded stop")
    };
    assert_eq!(env.error.code, Code::FingerprintMismatch);
    assert_eq!(env.error.phase, Phase::Validation);
    assert_eq!(env.error.outcome, Outcome::NotAttempted);
}

#[test]
fn approval_denied_is_never_retried() {
    let f = Fixture::new();
    let rec = Recorder::accept(&f.journal, new_invocation("inv_1", None)).unwrap();
    rec.preflight(FP, snapshot(None), operation(false, None))
        .unwrap();
    let StepError::Stopped(env) = rec.approval_denied(FP, "alice", None).unwrap() else {
        panic!("expected a recorded stop")
    };
    assert_eq!(env.error.code, Code::ApprovalDenied);
    assert_eq!(env.error.retry, Retry::Never);
    rec.credential_authorized("payments-key", "v1").unwrap();
    f.journal.flush().unwrap();
    let p = f.journal.projection("inv_1").unwrap();
    assert!(
        p.credential.is_none(),
        "a denied invocation is never authorized"
    );
}

#[test]
fn reusing_an_idempotency_key_with_a_different_fingerprint_fails_before_anything_is_sent() {
    let f = Fixture::new();
    ready(&f.journal, "inv_1", false, Some("key-1"));
    let rec = Recorder::accept(&f.journal, new_invocation("inv_2", Some("key-1"))).unwrap();
    let err = rec.preflight(
        "blake3:other",
        snapshot(Some("key-1")),
        operation(false, Some("key-1")),
    );
    let Err(StepError::Stopped(env)) = err else {
        panic!("expected IDEMPOTENCY_MISMATCH")
    };
    assert_eq!(env.error.code, Code::IdempotencyMismatch);
    assert_eq!(env.error.phase, Phase::Validation);
    assert_eq!(env.error.outcome, Outcome::NotAttempted);
    assert_eq!(env.error.retry, Retry::AfterCorrection);
}

#[test]
fn bound_configuration_is_never_rebound() {
    let f = Fixture::new();
    let rec = Recorder::accept(&f.journal, new_invocation("inv_1", None)).unwrap();
    rec.preflight(FP, snapshot(None), operation(false, None))
        .unwrap();
    let again = rec.preflight("blake3:changed", snapshot(None), operation(false, None));
    assert!(matches!(
        again,
        Err(StepError::Journal(JournalError::Impossible(_)))
    ));
    assert_eq!(
        f.journal
            .projection("inv_1")
            .unwrap()
            .fingerprint
            .as_deref(),
        Some(FP)
    );
}

/// The current attempt fails in connection setup (retryable), and a new attempt is
/// planned.
fn refused_then_retry_planned(rec: &Recorder) {
    rec.fail(
        Phase::ConnectionSetup,
        Code::ConnectionRefused,
        Retry::Backoff,
        "refused",
    )
    .unwrap();
    let plan = rec
        .plan_retry(&postern_broker::retry::RetryRequest {
            fingerprint: FP.into(),
        })
        .unwrap();
    assert_eq!(
        plan.decision,
        postern_broker::retry::Decision::RetryNewAttempt
    );
}

#[test]
fn an_expired_lease_holder_is_stopped_by_the_generation_check_before_dispatch() {
    let f = Fixture::new();
    let mut first = ready(&f.journal, "inv_1", false, None);
    // First holder fails before dispatch with a retryable setup error.
    first
        .connection_attempt(1, Stage::TcpConnect, Code::ConnectionRefused)
        .unwrap();
    refused_then_retry_planned(&first);

    // Worker A takes generation 2, then stalls past its lease.
    first.start_attempt("worker-a", 1_000).unwrap();
    assert_eq!(first.generation(), 2);
    // While A's lease is live, B cannot take the invocation.
    let mut second = Recorder::resume(&f.journal, "inv_1").unwrap();
    assert!(matches!(
        second.start_attempt("worker-b", 1_000),
        Err(JournalError::Impossible(_)) | Err(JournalError::LeaseHeld { .. })
    ));
    f.clock.advance_ms(5_000);
    // B's retry plan first closes A's expired attempt with what it proves.
    let plan = second
        .plan_retry(&postern_broker::retry::RetryRequest {
            fingerprint: FP.into(),
        })
        .unwrap();
    assert_eq!(
        plan.decision,
        postern_broker::retry::Decision::RetryNewAttempt
    );
    second.start_attempt("worker-b", 60_000).unwrap();
    assert_eq!(second.generation(), 3);
    // A resumes and tries to dispatch under generation 2: refused before any byte.
    let StepError::Stopped(env) = first.dispatch_started(FP, None, None).unwrap_err() else {
        panic!("expected LEASE_LOST")
    };
    assert_eq!(env.error.code, Code::LeaseLost);
    assert_eq!(env.error.outcome, Outcome::NotAttempted);
    // B dispatches normally.
    second.dispatch_started(FP, None, None).unwrap();
    let p = f.journal.projection("inv_1").unwrap();
    assert_eq!(p.dispatches, 1);
    assert_eq!(p.attempt.generation, 3);
}

#[test]
fn a_lease_that_expired_blocks_dispatch_even_without_a_competitor() {
    let f = Fixture::new();
    let mut rec = Recorder::accept(&f.journal, new_invocation("inv_1", None)).unwrap();
    rec.preflight(FP, snapshot(None), operation(false, None))
        .unwrap();
    rec.credential_authorized("payments-key", "v1").unwrap();
    rec.start_attempt("worker-a", 1_000).unwrap();
    f.clock.advance_ms(2_000);
    assert!(matches!(
        rec.dispatch_started(FP, None, None),
        Err(StepError::Stopped(_))
    ));
    assert_eq!(
        f.journal.projection("inv_1").unwrap().outcome,
        Outcome::NotAttempted
    );
}

#[test]
fn retry_budget_lives_in_the_record_and_survives_restart() {
    let f = Fixture::new();
    let mut rec = ready(&f.journal, "inv_1", true, None);
    let request = postern_broker::retry::RetryRequest {
        fingerprint: FP.into(),
    };
    for _ in 0..2 {
        rec.dispatch_started(FP, None, None).unwrap();
        rec.fail(
            Phase::RemoteExecution,
            Code::RemoteTimeout,
            Retry::Backoff,
            "timeout",
        )
        .unwrap();
        let plan = rec.plan_retry(&request).unwrap();
        assert_eq!(
            plan.decision,
            postern_broker::retry::Decision::RetryNewAttempt
        );
        rec.start_attempt("worker-a", 60_000).unwrap();
    }
    let f = f.reopen();
    let mut rec = Recorder::resume(&f.journal, "inv_1").unwrap();
    rec.dispatch_started(FP, None, None).unwrap();
    rec.fail(
        Phase::RemoteExecution,
        Code::RemoteTimeout,
        Retry::Backoff,
        "timeout",
    )
    .unwrap();
    // Three dispatches of a budget of three: the restart did not reset the count.
    let plan = rec.plan_retry(&request).unwrap();
    assert_eq!(plan.decision, postern_broker::retry::Decision::Reconcile);
    assert!(rec.start_attempt("worker-a", 60_000).is_err());
}

#[test]
fn reconciliation_settles_unknown_without_rewriting_the_attempt() {
    let f = Fixture::new();
    let rec = ready(&f.journal, "inv_1", false, None);
    rec.dispatch_started(FP, None, None).unwrap();
    rec.fail(
        Phase::RemoteExecution,
        Code::RemoteOutcomeUnknown,
        Retry::Reconcile,
        "closed",
    )
    .unwrap();
    let before = f.journal.events("inv_1").unwrap();
    let p = rec
        .reconcile(
            ConfidenceSource::OperatorAttested,
            Settlement::Committed,
            "alice",
            "checked the ledger",
            None,
        )
        .unwrap()
        .projection;
    assert_eq!(p.outcome, Outcome::Committed);
    assert_eq!(p.confidence, Some(ConfidenceSource::OperatorAttested));
    assert_eq!(p.code, Some(Code::ReconciledCommitted));
    let after = f.journal.events("inv_1").unwrap();
    assert_eq!(&after[..before.len()], &before[..], "history was rewritten");
    // A committed invocation cannot be reconciled again or retried.
    assert!(
        rec.reconcile(
            ConfidenceSource::RemoteQuery,
            Settlement::NotApplied,
            "q",
            "404",
            Some(404)
        )
        .is_err()
    );
}

#[test]
fn concurrent_appenders_all_land_with_distinct_sequences() {
    let f = Fixture::new();
    let journal = f.journal.clone();
    let handles: Vec<_> = (0..32)
        .map(|i| {
            let journal = journal.clone();
            std::thread::spawn(move || {
                let id = format!("inv_{i}");
                let rec = ready(&journal, &id, false, None);
                rec.dispatch_started(FP, None, None).unwrap().seq
            })
        })
        .collect();
    let mut seqs: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), 32);
    drop(journal);
    let db = f.db();
    f.journal.close().unwrap();
    let report = postern_broker::audit::verify_file(&db, &signing_key().verifying_key()).unwrap();
    assert_eq!(report.events, 32 * 5);
}

#[test]
fn interrupted_invocations_are_closed_with_what_the_evidence_proves() {
    let f = Fixture::new();
    let before = ready(&f.journal, "inv_before", false, None);
    let after = ready(&f.journal, "inv_after", false, None);
    after.dispatch_started(FP, None, None).unwrap();
    drop(before);
    let f = f.reopen();
    let mut closed = f.journal.recover_interrupted().unwrap();
    closed.sort();
    assert_eq!(
        closed,
        vec!["inv_after".to_string(), "inv_before".to_string()]
    );
    let a = f.journal.projection("inv_after").unwrap();
    assert_eq!(a.outcome, Outcome::Unknown);
    assert_eq!(a.code, Some(Code::RemoteOutcomeUnknown));
    let b = f.journal.projection("inv_before").unwrap();
    assert_eq!(b.outcome, Outcome::NotAttempted);
    assert_eq!(b.code, Some(Code::BrokerInterrupted));
    assert!(f.journal.recover_interrupted().unwrap().is_empty());
}

#[test]
fn duplicate_invocation_ids_are_refused() {
    let f = Fixture::new();
    Recorder::accept(&f.journal, new_invocation("inv_1", None)).unwrap();
    assert!(matches!(
        Recorder::accept(&f.journal, new_invocation("inv_1", None)),
        Err(JournalError::DuplicateInvocation(_))
    ));
}

#[test]
fn events_for_unknown_invocations_are_refused() {
    let f = Fixture::new();
    let err = f
        .journal
        .append("inv_missing", EventBody::ResultDelivered)
        .unwrap_err();
    assert!(matches!(err, JournalError::UnknownInvocation(_)));
}

#[test]
fn a_failing_job_rolls_back_alone_inside_a_shared_batch() {
    let f = Fixture::new();
    let journal = Arc::new(f.journal.clone());
    let good: Vec<_> = (0..8)
        .map(|i| {
            let j = journal.clone();
            std::thread::spawn(move || ready(&j, &format!("inv_{i}"), false, None).id().to_string())
        })
        .collect();
    let bad: Vec<_> = (0..8)
        .map(|_| {
            let j = journal.clone();
            std::thread::spawn(move || j.append("inv_nope", EventBody::ResultDelivered).is_err())
        })
        .collect();
    for h in good {
        let id = h.join().unwrap();
        assert_eq!(f.journal.events(&id).unwrap().len(), 4);
    }
    assert!(bad.into_iter().all(|h| h.join().unwrap()));
    let db = f.db();
    drop(journal);
    f.journal.close().unwrap();
    postern_broker::audit::verify_file(&db, &signing_key().verifying_key()).unwrap();
}

// ---------------------------------------------------------------------------------
// Peer calls (federation, issue 14): one invocation per (asking broker, caller
// invocation), recorded with its acceptance.

fn peer_call(invocation_id: &str) -> postern_broker::journal::peer_calls::PeerCall {
    postern_broker::journal::peer_calls::PeerCall {
        asker: "postern.local/audit/00aa".into(),
        caller_invocation: "inv_caller".into(),
        invocation_id: invocation_id.into(),
        capability: "payments".into(),
        request_fingerprint: "blake3:req".into(),
        policy_version: "blake3:policy".into(),
        accepted_at_ms: 0,
    }
}

#[test]
fn a_peer_call_is_accepted_once_with_its_invocation_and_a_repeat_finds_that_one() {
    use postern_broker::journal::peer_calls::PeerAccept;
    let f = Fixture::new();
    let accepted = f
        .journal
        .accept_peer_call(peer_call("inv_1"), None, new_invocation("inv_1", None))
        .unwrap();
    assert!(matches!(accepted, PeerAccept::Accepted { .. }));
    assert!(f.journal.projection("inv_1").is_ok());
    // The same caller invocation again: nothing is accepted, the first one answers.
    let again = f
        .journal
        .accept_peer_call(peer_call("inv_2"), None, new_invocation("inv_2", None))
        .unwrap();
    let PeerAccept::Existing(row) = again else {
        panic!("a second invocation was accepted for one peer call")
    };
    assert_eq!(row.invocation_id, "inv_1");
    assert_eq!(row.policy_version, "blake3:policy");
    assert!(matches!(
        f.journal.projection("inv_2"),
        Err(JournalError::UnknownInvocation(_))
    ));
    // Replacing names the invocation the caller found unsent: only that one is replaced.
    let stale = f
        .journal
        .accept_peer_call(
            peer_call("inv_3"),
            Some("inv_other".into()),
            new_invocation("inv_3", None),
        )
        .unwrap();
    assert!(matches!(stale, PeerAccept::Existing(_)));
    let replaced = f
        .journal
        .accept_peer_call(
            peer_call("inv_4"),
            Some("inv_1".into()),
            new_invocation("inv_4", None),
        )
        .unwrap();
    assert!(matches!(replaced, PeerAccept::Accepted { .. }));
    let row = f
        .journal
        .peer_call("postern.local/audit/00aa", "inv_caller")
        .unwrap()
        .unwrap();
    assert_eq!(row.invocation_id, "inv_4");
    assert_eq!(
        f.journal
            .peer_call_of("inv_4")
            .unwrap()
            .map(|r| r.caller_invocation),
        Some("inv_caller".to_string())
    );
    assert_eq!(f.journal.peer_call_of("inv_1").unwrap(), None);
}

#[test]
fn a_peer_call_row_survives_a_restart_and_an_attestation_verifies_with_the_journal_key() {
    use postern_broker::federation::{AttestationKind, Request, Statement};
    let f = Fixture::new();
    f.journal
        .accept_peer_call(peer_call("inv_1"), None, new_invocation("inv_1", None))
        .unwrap();
    let key = f.journal.verifying_key();
    let Fixture {
        dir,
        clock,
        journal,
    } = f;
    journal.close().unwrap();
    let journal = open(&dir.path().join("journal.db"), &clock);
    let row = journal
        .peer_call("postern.local/audit/00aa", "inv_caller")
        .unwrap()
        .unwrap();
    assert_eq!(row.invocation_id, "inv_1");
    let attestation = journal.sign_attestation(Statement {
        kind: AttestationKind::Denial,
        peer: "b".into(),
        capability: "payments".into(),
        request_fingerprint: "blake3:req".into(),
        policy_version: "blake3:policy".into(),
        issued_at_ms: T0,
        outcome_digest: None,
        call: Default::default(),
    });
    let request = Request {
        peer: "b".into(),
        capability: "payments".into(),
        fingerprint: "blake3:req".into(),
        policy_version: None,
        in_flight: None,
        call: Some(Default::default()),
    };
    assert_eq!(attestation.verify(&key, &request), Ok(()));
}

/// Stores `payments-key`'s metadata, as `postern vault set` would: an authorization
/// checks that the credential still exists.
fn store_credential(f: &Fixture) {
    let conn = rusqlite::Connection::open(f.db()).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .unwrap();
    conn.execute(
        "INSERT INTO credentials (id, kind, version, created_at_ms, rotated_at_ms)
         VALUES ('payments-key', 'token', 'v1-abcdef01', 0, 0)",
        [],
    )
    .unwrap();
}

/// The kinds of `id`'s events, in order.
fn kinds_of(f: &Fixture, id: &str) -> Vec<&'static str> {
    let events = f.journal.events(id).unwrap();
    events.iter().map(|e| e.body.kind()).collect()
}

/// `inv_1`, accepted and bound (idempotent or not), before its first attempt.
fn bound(f: &Fixture, idempotent: bool) -> Recorder {
    let rec = Recorder::accept(&f.journal, new_invocation("inv_1", None)).unwrap();
    rec.preflight(FP, snapshot(None), operation(idempotent, None))
        .unwrap();
    rec
}

fn authorization(holder: &str) -> postern_broker::journal::Authorization {
    postern_broker::journal::Authorization {
        credential_id: "payments-key".into(),
        version: "v1-abcdef01".into(),
        holder: holder.into(),
        ttl_ms: 1_000,
    }
}

/// A deferred authorization is recorded with DISPATCH_STARTED, in one transaction, under
/// the generation the attempt's connections were named after.
#[tokio::test]
async fn a_deferred_authorization_is_recorded_with_dispatch_started() {
    let f = Fixture::new();
    store_credential(&f);
    let mut rec = bound(&f, false);
    rec.defer_authorization(authorization("worker-a"));
    assert_eq!(rec.generation(), 1, "the attempt is named as generation 1");
    let before = f.journal.events("inv_1").unwrap().len();
    assert_eq!(before, 2, "nothing is recorded until the gate");
    rec.dispatch_started_async(FP, Some("inv_1/g1/c1".into()), None)
        .await
        .unwrap();
    let events = f.journal.events("inv_1").unwrap();
    let kinds: Vec<_> = events[before..].iter().map(|e| e.body.kind()).collect();
    assert_eq!(
        kinds,
        [
            "CREDENTIAL_AUTHORIZED",
            "ATTEMPT_STARTED",
            "DISPATCH_STARTED"
        ]
    );
    let p = f.journal.projection("inv_1").unwrap();
    assert_eq!((p.attempt.generation, p.dispatches), (1, 1));
}

/// A deferred attempt whose generation another holder took meanwhile (that attempt
/// ended and a retry was planned, so the record would now start a later generation) is
/// stopped with LEASE_LOST before any byte, and records nothing: its connection was
/// named after a generation that is no longer the next one.
#[tokio::test]
async fn a_deferred_attempt_whose_generation_was_taken_records_nothing_and_is_lease_lost() {
    let f = Fixture::new();
    store_credential(&f);
    let mut first = bound(&f, true);
    let mut second = Recorder::resume(&f.journal, "inv_1").unwrap();
    let mut third = Recorder::resume(&f.journal, "inv_1").unwrap();
    first.defer_authorization(authorization("worker-a"));
    third.defer_authorization(authorization("worker-c"));
    // Worker B runs generation 1 to a refused connection and plans a retry.
    second
        .credential_authorized("payments-key", "v1-abcdef01")
        .unwrap();
    second.start_attempt("worker-b", 1_000).unwrap();
    assert_eq!(second.generation(), 1);
    refused_then_retry_planned(&second);
    // B's lease has run out; the invocation waits for its retry.
    f.clock.advance_ms(5_000);
    let before = f.journal.events("inv_1").unwrap();
    let env = match first
        .dispatch_started_async(FP, Some("inv_1/g1/c1".into()), None)
        .await
    {
        Err(StepError::Stopped(env)) => env,
        other => panic!("expected LEASE_LOST, got {other:?}"),
    };
    assert_eq!(env.error.code, Code::LeaseLost);
    assert_eq!(env.error.outcome, Outcome::NotAttempted);
    let after = f.journal.events("inv_1").unwrap();
    assert_eq!(after.len(), before.len(), "nothing was recorded");
    // The same when the attempt ends before its gate and settles the deferred start.
    let env = match third.settle_deferred() {
        Err(StepError::Stopped(env)) => env,
        other => panic!("expected LEASE_LOST, got {other:?}"),
    };
    assert_eq!(env.error.code, Code::LeaseLost);
    assert_eq!(f.journal.events("inv_1").unwrap().len(), before.len());
    assert_eq!(f.journal.projection("inv_1").unwrap().dispatches, 0);
}

/// A credential removed between the read and the gate ends the invocation with
/// CREDENTIAL_MISSING in the gate's own transaction: nothing authorized, no lease, no
/// dispatch.
#[tokio::test]
async fn a_deferred_authorization_of_a_removed_credential_records_credential_missing() {
    let f = Fixture::new();
    let mut rec = bound(&f, false);
    rec.defer_authorization(authorization("worker-a"));
    let StepError::Stopped(env) = rec
        .dispatch_started_async(FP, Some("inv_1/g1/c1".into()), None)
        .await
        .unwrap_err()
    else {
        panic!("expected CREDENTIAL_MISSING")
    };
    assert_eq!(env.error.code, Code::CredentialMissing);
    assert_eq!(env.error.phase, Phase::CredentialInjection);
    assert_eq!(env.error.outcome, Outcome::NotAttempted);
    let kinds = kinds_of(&f, "inv_1");
    assert_eq!(kinds, ["ACTION_ACCEPTED", "PREFLIGHT_VALIDATED", "FAILED"]);
}

/// A new invocation's ACTION_ACCEPTED waits for its first step and is recorded in that
/// step's transaction: nothing of it is in the journal before its binding, then both are.
#[test]
fn a_deferred_acceptance_is_recorded_with_the_binding() {
    let f = Fixture::new();
    let rec = Recorder::accept_deferred(&f.journal, new_invocation("inv_1", None));
    assert!(f.journal.events("inv_1").unwrap().is_empty());
    assert!(f.journal.projection("inv_1").is_err());
    rec.preflight(FP, snapshot(None), operation(false, None))
        .unwrap();
    assert_eq!(
        kinds_of(&f, "inv_1"),
        ["ACTION_ACCEPTED", "PREFLIGHT_VALIDATED"]
    );
    assert_eq!(
        f.journal.newest_invocation().unwrap().as_deref(),
        Some("inv_1")
    );
}

/// An invocation that fails before its binding (a validation error) is recorded as
/// accepted and failed, in one transaction.
#[test]
fn a_deferred_acceptance_is_recorded_with_a_failure_before_the_binding() {
    let f = Fixture::new();
    let rec = Recorder::accept_deferred(&f.journal, new_invocation("inv_1", None));
    let failed = rec
        .fail_field(
            Phase::Validation,
            Code::InvalidRequest,
            Retry::AfterCorrection,
            "bad header",
            Some("headers"),
        )
        .unwrap();
    assert_eq!(failed.projection.outcome, Outcome::NotAttempted);
    let kinds = kinds_of(&f, "inv_1");
    assert_eq!(kinds, ["ACTION_ACCEPTED", "FAILED"]);
}
