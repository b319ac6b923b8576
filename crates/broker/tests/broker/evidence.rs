//! What a record proves, the unsettled rule, the status `get_invocation` reports, the
//! operator's attestation, and the journal queries the console builds on them.

use postern_broker::clock::Clock;
use postern_broker::contract::*;
use postern_broker::evidence::{
    self, AttestError, Attestation, InvocationStatus, NotProved, Proved, RecordProof, Step,
};
use postern_broker::invocation::Recorder;
use postern_broker::journal::events::{EventBody, Settlement};
use postern_broker::journal::query;
use postern_broker::retry::RetryRequest;
use rusqlite::{Connection, OpenFlags};

use crate::support::*;

fn read_only(f: &Fixture) -> Connection {
    f.journal.flush().unwrap();
    Connection::open_with_flags(f.db(), OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap()
}

fn proof(f: &Fixture, id: &str) -> RecordProof {
    let events = f.journal.events(id).unwrap();
    let p = f.journal.projection(id).unwrap();
    evidence::what_the_record_proves(&p, &events)
}

/// Dispatched, then the attempt failed with no response: an unknown outcome whose
/// attempt is closed.
fn unknown(f: &Fixture, id: &str, key: Option<&str>) -> Recorder {
    let rec = ready(&f.journal, id, false, key);
    rec.dispatch_started(FP, Some("conn-1".into()), Some("api.example.test".into()))
        .unwrap();
    rec.fail(
        Phase::RemoteExecution,
        Code::RemoteTimeout,
        Retry::Backoff,
        "no answer",
    )
    .unwrap();
    rec
}

/// A complete 200 response, committed.
fn committed(f: &Fixture, id: &str) -> Recorder {
    let rec = ready(&f.journal, id, false, None);
    commit_200(&rec);
    rec
}

/// Stopped in connection setup: nothing crossed dispatch.
fn refused_before_dispatch(f: &Fixture, id: &str) -> Recorder {
    let rec = ready(&f.journal, id, false, None);
    rec.fail(
        Phase::ConnectionSetup,
        Code::ConnectionRefused,
        Retry::Backoff,
        "refused",
    )
    .unwrap();
    rec
}

fn attestation<'a>(id: &'a str, settlement: &'a str, note: &'a str) -> Attestation<'a> {
    Attestation {
        invocation_id: id,
        settlement,
        note,
        by: "console:alice",
    }
}

// ----- what the record proves -------------------------------------------------------------

#[test]
fn a_record_with_no_dispatch_started_proves_nothing_was_sent() {
    let f = Fixture::new();
    refused_before_dispatch(&f, "inv_1");
    let proof = proof(&f, "inv_1");
    assert!(proof.nothing_sent());
    assert_eq!(proof.proves, vec![Proved::NothingSent]);
    assert!(proof.does_not_prove.is_empty(), "{proof:?}");
    assert_eq!(
        proof.proves_sentences(),
        vec![
            "Nothing was sent: the record has no DISPATCH_STARTED, so the remote never saw this \
             request."
                .to_string()
        ]
    );
}

#[test]
fn a_dispatch_without_a_response_does_not_prove_the_remote_received_or_applied_it() {
    let f = Fixture::new();
    unknown(&f, "inv_1", None);
    let seq = f
        .journal
        .events("inv_1")
        .unwrap()
        .iter()
        .find(|e| matches!(e.body, EventBody::DispatchStarted { .. }))
        .unwrap()
        .seq;
    let proof = proof(&f, "inv_1");
    assert!(!proof.nothing_sent());
    assert_eq!(
        proof.proves,
        vec![
            Proved::DispatchStarted { seq },
            Proved::VerifiedPeer {
                peer: "api.example.test".into()
            },
        ]
    );
    assert_eq!(
        proof.does_not_prove,
        vec![
            NotProved::WholeRequestLeft,
            NotProved::RemoteReceived,
            NotProved::CompleteResponse,
            NotProved::RemoteApplied,
        ]
    );
    assert_eq!(
        proof.does_not_prove_sentences(),
        vec![
            "That the whole request left this machine.",
            "That the remote received or processed the request.",
            "A complete response: none was received.",
            "Whether the remote applied the operation.",
        ]
    );
}

#[test]
fn a_complete_response_proves_the_request_was_written_and_answered() {
    let f = Fixture::new();
    committed(&f, "inv_1");
    let proof = proof(&f, "inv_1");
    assert_eq!(proof.proves.len(), 3, "{proof:?}");
    assert!(matches!(proof.proves[0], Proved::DispatchStarted { .. }));
    assert_eq!(proof.proves[1], Proved::RequestComplete);
    assert_eq!(
        proof.proves[2],
        Proved::RemoteAnswered {
            http_status: Some(200)
        }
    );
    assert!(proof.does_not_prove.is_empty(), "{proof:?}");
    assert_eq!(
        proof.proves_sentences()[1..],
        [
            "The whole request was written to the connection.",
            "The remote began answering (HTTP 200).",
        ]
    );
}

#[test]
fn an_idempotency_key_and_repeated_dispatches_are_part_of_what_is_proved() {
    let f = Fixture::new();
    let mut rec = unknown(&f, "inv_1", Some("key-42"));
    let plan = rec
        .plan_retry(&RetryRequest {
            fingerprint: FP.into(),
        })
        .unwrap();
    assert_eq!(plan.next_generation, 2, "{plan:?}");
    rec.start_attempt("worker-a", 60_000).unwrap();
    rec.dispatch_started(FP, None, None).unwrap();
    rec.fail(
        Phase::RemoteExecution,
        Code::RemoteTimeout,
        Retry::Backoff,
        "no answer again",
    )
    .unwrap();
    let proof = proof(&f, "inv_1");
    assert!(proof.proves.contains(&Proved::IdempotencyKey {
        key: "key-42".into()
    }));
    assert!(proof.proves.contains(&Proved::DispatchedTimes { times: 2 }));
    let sentences = proof.proves_sentences();
    assert!(sentences.contains(
        &"It carried idempotency key key-42; the remote can be asked about that key.".to_string()
    ));
    assert!(sentences.contains(&"It was dispatched 2 times.".to_string()));
}

#[test]
fn the_newest_retry_manifest_gives_the_verdict() {
    let f = Fixture::new();
    let rec = unknown(&f, "inv_1", Some("key-42"));
    assert_eq!(
        evidence::latest_retry_verdict(&f.journal.events("inv_1").unwrap()),
        None
    );
    let plan = rec
        .plan_retry(&RetryRequest {
            fingerprint: FP.into(),
        })
        .unwrap();
    assert_eq!(
        evidence::latest_retry_verdict(&f.journal.events("inv_1").unwrap()),
        Some(plan.manifest.verdict)
    );
}

// ----- steps and facts --------------------------------------------------------------------

#[test]
fn each_event_of_a_lifecycle_belongs_to_its_step() {
    let f = Fixture::new();
    let rec = committed(&f, "inv_1");
    rec.delivered().unwrap();
    let steps: Vec<(&str, Step)> = f
        .journal
        .events("inv_1")
        .unwrap()
        .iter()
        .map(|e| (e.body.kind(), evidence::step_of(&e.body)))
        .collect();
    assert_eq!(
        steps,
        vec![
            ("ACTION_ACCEPTED", Step::Accepted),
            ("PREFLIGHT_VALIDATED", Step::Validated),
            ("CREDENTIAL_AUTHORIZED", Step::Authorized),
            ("ATTEMPT_STARTED", Step::Connecting),
            ("DISPATCH_STARTED", Step::Dispatched),
            ("REQUEST_SENT", Step::Dispatched),
            ("REMOTE_RESPONSE_STARTED", Step::Response),
            ("REMOTE_RESPONSE_COMPLETE", Step::Response),
            ("RESULT_COMMITTED", Step::Committed),
            ("RESULT_DELIVERED", Step::Delivered),
        ]
    );
    assert_eq!(Step::Dispatched.as_str(), "dispatched");
    assert_eq!(Step::Reconciled.to_string(), "reconciled");
}

#[test]
fn an_events_facts_are_listed_without_its_kind_or_absent_values_and_escaped() {
    let body = EventBody::DispatchStarted {
        generation: 1,
        fingerprint: "blake3:00".into(),
        connection_id: None,
        peer_identity: Some("evil\u{202e}txt".into()),
    };
    let text = evidence::describe(&body);
    assert_eq!(
        text,
        "fingerprint=blake3:00  generation=1  peer_identity=evil\\u{202e}txt"
    );
    assert!(
        !text.contains('\u{202e}'),
        "the bidi override is escaped: {text}"
    );
    assert_eq!(evidence::describe(&EventBody::ResultDelivered), "");
}

// ----- the unsettled rule -----------------------------------------------------------------

#[test]
fn an_unknown_outcome_whose_attempt_ended_is_unsettled() {
    let f = Fixture::new();
    unknown(&f, "inv_1", None);
    assert!(evidence::is_unsettled(
        &f.journal.projection("inv_1").unwrap()
    ));
}

#[test]
fn an_attempt_still_running_after_dispatch_is_not_unsettled() {
    let f = Fixture::new();
    let rec = ready(&f.journal, "inv_1", false, None);
    rec.dispatch_started(FP, None, None).unwrap();
    let p = f.journal.projection("inv_1").unwrap();
    assert_eq!(p.outcome, Outcome::Unknown);
    assert!(!evidence::is_unsettled(&p));
}

#[test]
fn settled_and_never_sent_outcomes_are_not_unsettled() {
    let f = Fixture::new();
    committed(&f, "inv_1");
    refused_before_dispatch(&f, "inv_2");
    let rec = unknown(&f, "inv_3", None);
    rec.reconcile(
        ConfidenceSource::RemoteQuery,
        Settlement::NotApplied,
        "reconcile-query",
        "404 for the key",
        Some(404),
    )
    .unwrap();
    for id in ["inv_1", "inv_2", "inv_3"] {
        assert!(
            !evidence::is_unsettled(&f.journal.projection(id).unwrap()),
            "{id}"
        );
    }
}

#[test]
fn the_unsettled_query_lists_closed_unreconciled_unknown_outcomes_newest_first() {
    let f = Fixture::new();
    unknown(&f, "inv_1", None);
    f.clock.advance_ms(1000);
    committed(&f, "inv_2");
    f.clock.advance_ms(1000);
    let rec = unknown(&f, "inv_3", None);
    rec.reconcile(
        ConfidenceSource::OperatorAttested,
        Settlement::Committed,
        "console:bob",
        "seen in the dashboard",
        None,
    )
    .unwrap();
    f.clock.advance_ms(1000);
    let running = ready(&f.journal, "inv_4", false, None);
    running.dispatch_started(FP, None, None).unwrap();
    f.clock.advance_ms(1000);
    unknown(&f, "inv_5", None);

    let conn = read_only(&f);
    let now = f.clock.now_ms();
    let ids = |rows: Vec<query::InvocationRow>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(
        ids(query::unsettled(&conn, 200, now).unwrap()),
        ["inv_5", "inv_1"]
    );
    // The limit counts the newest unknown outcomes, settled or not.
    assert_eq!(ids(query::unsettled(&conn, 2, now).unwrap()), ["inv_5"]);
    assert!(query::unsettled(&conn, 0, now).unwrap().is_empty());
}

#[test]
fn last_seq_is_zero_for_an_empty_journal_and_then_the_newest_sequence() {
    let f = Fixture::new();
    assert_eq!(query::last_seq(&read_only(&f)).unwrap(), 0);
    committed(&f, "inv_1");
    let newest = f.journal.events("inv_1").unwrap().last().unwrap().seq;
    assert_eq!(query::last_seq(&read_only(&f)).unwrap(), newest);
}

// ----- status -----------------------------------------------------------------------------

#[test]
fn the_status_reports_the_projection_with_the_retry_of_now() {
    let f = Fixture::new();
    unknown(&f, "inv_1", None);
    let p = f.journal.projection("inv_1").unwrap();
    let now = f.clock.now_ms();
    let status = InvocationStatus::of(&p, now);
    assert_eq!(status.outcome, Outcome::Unknown);
    assert_eq!(status.retry, p.retry(now));
    assert_eq!(status.code, p.effective_code());
    let json = evidence::invocation_status(&p, now);
    let mut keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "code",
            "delivered",
            "evidence",
            "invocation_id",
            "outcome",
            "phase",
            "retry",
            "summary",
            "target"
        ]
    );
    assert_eq!(json["invocation_id"], "inv_1");
    assert_eq!(json["outcome"], "unknown");
    assert_eq!(json["code"], "REMOTE_TIMEOUT");
    assert_eq!(
        json["evidence"],
        serde_json::to_value(p.evidence()).unwrap()
    );
}

// ----- attestation ------------------------------------------------------------------------

fn event_count(f: &Fixture, id: &str) -> usize {
    f.journal.events(id).unwrap().len()
}

#[test]
fn an_attestation_with_an_empty_note_is_refused_and_nothing_is_appended() {
    let f = Fixture::new();
    unknown(&f, "inv_1", None);
    let before = event_count(&f, "inv_1");
    let err =
        evidence::attest(&f.journal, &attestation("inv_1", "committed", "  \n ")).unwrap_err();
    assert!(matches!(err, AttestError::EmptyNote), "{err}");
    assert_eq!(err.field(), Some("note"));
    assert_eq!(
        err.to_string(),
        "Say what you checked: an attestation needs a note."
    );
    assert_eq!(event_count(&f, "inv_1"), before);
}

#[test]
fn an_attestation_with_an_unknown_settlement_is_refused_and_nothing_is_appended() {
    let f = Fixture::new();
    unknown(&f, "inv_1", None);
    let before = event_count(&f, "inv_1");
    let err = evidence::attest(&f.journal, &attestation("inv_1", "maybe", "checked")).unwrap_err();
    assert!(matches!(err, AttestError::UnknownSettlement), "{err}");
    assert_eq!(err.field(), Some("settlement"));
    assert_eq!(event_count(&f, "inv_1"), before);
}

#[test]
fn an_attestation_note_over_2000_characters_is_refused_and_2000_are_accepted() {
    let f = Fixture::new();
    unknown(&f, "inv_1", None);
    let before = event_count(&f, "inv_1");
    let long = "é".repeat(evidence::MAX_NOTE_CHARS + 1);
    let err = evidence::attest(&f.journal, &attestation("inv_1", "committed", &long)).unwrap_err();
    assert!(matches!(err, AttestError::NoteTooLong), "{err}");
    assert_eq!(err.field(), Some("note"));
    assert_eq!(event_count(&f, "inv_1"), before);
    // Counted in characters, not bytes.
    let exact = "é".repeat(evidence::MAX_NOTE_CHARS);
    evidence::attest(&f.journal, &attestation("inv_1", "committed", &exact)).unwrap();
    assert_eq!(event_count(&f, "inv_1"), before + 1);
}

#[test]
fn an_attestation_of_an_invocation_the_journal_does_not_have_names_it() {
    let f = Fixture::new();
    let err =
        evidence::attest(&f.journal, &attestation("inv_nope", "committed", "checked")).unwrap_err();
    assert!(matches!(&err, AttestError::UnknownInvocation(id) if id == "inv_nope"));
    assert_eq!(err.field(), Some("invocation_id"));
    assert_eq!(err.to_string(), "No invocation inv_nope in this journal.");
}

#[test]
fn an_attestation_of_an_outcome_that_is_not_an_unsettled_unknown_is_refused() {
    let f = Fixture::new();
    committed(&f, "inv_1");
    let running = ready(&f.journal, "inv_2", false, None);
    running.dispatch_started(FP, None, None).unwrap();
    for id in ["inv_1", "inv_2"] {
        let before = event_count(&f, id);
        let err =
            evidence::attest(&f.journal, &attestation(id, "not_applied", "checked")).unwrap_err();
        assert!(matches!(err, AttestError::NotUnsettled), "{id}: {err}");
        assert_eq!(err.field(), None);
        assert_eq!(event_count(&f, id), before, "{id}");
    }
}

#[test]
fn an_attestation_settles_an_unknown_outcome_as_operator_attested_and_only_once() {
    let f = Fixture::new();
    unknown(&f, "inv_1", None);
    let appended = evidence::attest(
        &f.journal,
        &attestation("inv_1", "committed", "  the charge is in the dashboard \n"),
    )
    .unwrap();
    assert_eq!(appended.projection.outcome, Outcome::Committed);
    assert_eq!(
        appended.projection.confidence,
        Some(ConfidenceSource::OperatorAttested)
    );
    let events = f.journal.events("inv_1").unwrap();
    let settled = evidence::latest_reconciliation(&events).unwrap();
    assert_eq!(settled.source, ConfidenceSource::OperatorAttested);
    assert_eq!(settled.settlement, Settlement::Committed);
    assert_eq!(settled.by, "console:alice");
    assert_eq!(settled.note, "the charge is in the dashboard");
    assert_eq!(settled.at_ms, events.last().unwrap().recorded_at_ms);
    assert!(!evidence::is_unsettled(
        &f.journal.projection("inv_1").unwrap()
    ));

    let err =
        evidence::attest(&f.journal, &attestation("inv_1", "not_applied", "again")).unwrap_err();
    assert!(matches!(err, AttestError::NotUnsettled), "{err}");
    assert_eq!(f.journal.events("inv_1").unwrap().len(), events.len());
}

#[test]
fn settlements_are_named_and_parsed_by_their_wire_names() {
    for s in [Settlement::Committed, Settlement::NotApplied] {
        let name = evidence::settlement_name(s);
        assert_eq!(serde_json::to_value(s).unwrap(), name);
        assert_eq!(evidence::parse_settlement(name), Some(s));
    }
    assert_eq!(evidence::parse_settlement("Committed"), None);
    assert_eq!(evidence::parse_settlement(""), None);
}
