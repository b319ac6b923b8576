//! Crash recovery: a child process runs an invocation and aborts right after each
//! durable transition in turn; the parent reopens the journal and checks what the
//! recovered record claims. After DISPATCH_STARTED without completion the outcome must be
//! `unknown`, never `not_attempted`; after RESULT_COMMITTED the result is retrievable.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use postern_broker::audit::verify_file;
use postern_broker::contract::{Code, Outcome, Phase, Retry};
use postern_tests::{INVOCATION, RESULT_BODY, STEPS, open_journal, test_signing_key};

fn crash_after(step: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("journal.db");
    let status = Command::new(env!("CARGO_BIN_EXE_crash_child"))
        .arg(&db)
        .arg(step.to_string())
        .status()
        .unwrap();
    assert_eq!(
        status.signal(),
        Some(6),
        "child should abort after step {step}: {status:?}"
    );
    dir
}

#[test]
fn every_durable_transition_recovers_to_what_its_evidence_proves() {
    for (index, name) in STEPS.iter().enumerate() {
        let step = index + 1;
        let dir = crash_after(step);
        let db = dir.path().join("journal.db");

        // The chain the crashed process wrote verifies (no final checkpoint was signed).
        verify_file(&db, &test_signing_key().verifying_key())
            .unwrap_or_else(|e| panic!("after {name}: audit failed: {e}"));

        let journal = open_journal(&db).unwrap();
        let events = journal.events(INVOCATION).unwrap();
        assert_eq!(
            events.len(),
            step,
            "after {name}: every durable event survived"
        );
        assert_eq!(events.last().unwrap().body.kind(), *name);

        let p = journal.projection(INVOCATION).unwrap();
        let now = journal.now_ms();
        let dispatched = step >= 5;
        if !dispatched {
            assert_eq!(p.outcome, Outcome::NotAttempted, "after {name}");
            assert!(!p.ever_dispatched);
        } else if step < 9 {
            assert_eq!(
                p.outcome,
                Outcome::Unknown,
                "after {name}: never not_attempted"
            );
            let env = p.envelope(now).unwrap();
            assert_eq!(env.error.code, Code::RemoteOutcomeUnknown);
            assert_eq!(env.error.phase, Phase::RemoteExecution);
            assert_eq!(env.error.retry, Retry::Reconcile, "POST without a contract");
            assert!(env.evidence.dispatch_started);
        } else {
            assert_eq!(p.outcome, Outcome::Committed, "after {name}");
            let stored = journal
                .read_result(p.result_id.as_deref().unwrap())
                .unwrap();
            assert_eq!(
                stored.streams,
                vec![("body".to_string(), RESULT_BODY.to_vec())]
            );
            assert_eq!(p.delivered, step == 10);
        }

        // Recovery closes what the crash interrupted, saying the same thing.
        let closed = journal.recover_interrupted().unwrap();
        let p = journal.projection(INVOCATION).unwrap();
        if step < 9 {
            assert_eq!(closed, vec![INVOCATION.to_string()], "after {name}");
            let env = p.envelope(now).unwrap();
            if dispatched {
                assert_eq!(env.error.outcome, Outcome::Unknown);
                assert_eq!(env.error.code, Code::RemoteOutcomeUnknown);
            } else {
                assert_eq!(env.error.outcome, Outcome::NotAttempted);
                assert_eq!(env.error.code, Code::BrokerInterrupted);
                assert_eq!(env.error.retry, Retry::Backoff);
            }
        } else {
            assert!(
                closed.is_empty(),
                "after {name}: a settled record is not touched"
            );
            assert_eq!(p.outcome, Outcome::Committed);
        }
        journal.close().unwrap();
        verify_file(&db, &test_signing_key().verifying_key()).unwrap();
    }
}

#[test]
fn an_uninterrupted_child_runs_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("journal.db");
    let status = Command::new(env!("CARGO_BIN_EXE_crash_child"))
        .arg(&db)
        .arg("0")
        .status()
        .unwrap();
    assert!(status.success(), "{status:?}");
    let journal = open_journal(&db).unwrap();
    assert_eq!(journal.events(INVOCATION).unwrap().len(), STEPS.len());
}
