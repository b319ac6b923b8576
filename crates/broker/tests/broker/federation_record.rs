//! What the journal accepts of a call through a peer: its answers (and the budgets they
//! spend, counted again on every read), and a not_attempted after dispatch only on the
//! peer's verified "did not run" recorded just before it.

use ed25519_dalek::SigningKey;
use postern_broker::contract::{Code, Outcome, Phase, Retry};
use postern_broker::federation::record::{
    Budget, PeerAnswer, PeerOperation, PeerStage, SignatureCheck, VerdictKind,
};
use postern_broker::federation::{Attempts, AttestationKind, Statement};
use postern_broker::invocation::Recorder;
use postern_broker::journal::events::Channel;

use crate::support::*;

const ID: &str = "inv_peer";

fn operation() -> postern_broker::journal::events::OperationFacts {
    let mut facts = crate::support::operation(false, Some(ID));
    facts.peer = Some(Box::new(PeerOperation {
        peer: "org-b".into(),
        key_name: "postern.local/audit/0102030405060708".into(),
        capability: "payments".into(),
        policy_version: Some("policy-v1".into()),
        attempts: Attempts::new(),
        timeout_ms: 1000,
    }));
    facts
}

/// Accepted, validated, holding attempt 1 (no credential) and dispatched.
fn dispatched(f: &Fixture) -> Recorder {
    let mut new = new_invocation(ID, None);
    new.channel = Channel::Peer;
    new.target = "peer/org-b/payments".into();
    let mut rec = Recorder::accept(&f.journal, new).unwrap();
    rec.preflight(FP, snapshot(None), operation()).unwrap();
    rec.start_attempt("worker-a", 60_000).unwrap();
    rec.dispatch_started(FP, Some("c1".into()), Some("org-b".into()))
        .unwrap();
    rec
}

fn answer(n: u32, kind: AttestationKind, signature: SignatureCheck) -> PeerAnswer {
    let attestation = Statement {
        kind,
        peer: "postern.local/audit/0102030405060708".into(),
        capability: "payments".into(),
        request_fingerprint: FP.into(),
        policy_version: "policy-v1".into(),
        issued_at_ms: T0,
        outcome_digest: None,
        call: Default::default(),
    }
    .sign(&SigningKey::from_bytes(&[9u8; 32]));
    PeerAnswer {
        n,
        stage: PeerStage::Call,
        verdict: match (kind, signature) {
            (_, SignatureCheck::Failed) => VerdictKind::Unknown,
            (AttestationKind::Denial, _) => VerdictKind::Denial,
            (AttestationKind::Unavailable, _) => VerdictKind::Unavailable,
            (AttestationKind::Outcome, _) => VerdictKind::Outcome,
        },
        signature,
        transport: None,
        reason: None,
        attestation: Some(attestation),
        peer_invocation: None,
        peer_outcome: None,
        peer_error: None,
        spent: None,
    }
}

#[test]
fn not_attempted_after_dispatch_needs_the_peers_verified_did_not_run_just_before() {
    let f = Fixture::new();
    let rec = dispatched(&f);
    // Nothing from the peer yet: refused.
    assert!(
        rec.peer_not_run(Code::PeerDenied, Retry::Never, "denied", "blake3:x")
            .is_err()
    );
    // A denial whose signature failed is no proof.
    let forged = answer(1, AttestationKind::Denial, SignatureCheck::Failed);
    let digest = forged.attestation.as_ref().unwrap().digest.clone();
    rec.peer_answer(forged).unwrap();
    assert!(
        rec.peer_not_run(Code::PeerDenied, Retry::Never, "denied", &digest)
            .is_err()
    );
    // A verified denial is, for exactly its own attestation.
    let denial = answer(2, AttestationKind::Denial, SignatureCheck::Verified);
    let digest = denial.attestation.as_ref().unwrap().digest.clone();
    rec.peer_answer(denial).unwrap();
    assert!(
        rec.peer_not_run(Code::PeerDenied, Retry::Never, "denied", "blake3:other")
            .is_err()
    );
    let p = rec
        .peer_not_run(Code::PeerDenied, Retry::Never, "denied", &digest)
        .unwrap()
        .projection;
    assert_eq!(p.outcome, Outcome::NotAttempted);
    assert!(p.ever_dispatched, "the dispatch stays recorded");
    let env = p.envelope(T0).unwrap();
    assert_eq!(env.error.code, Code::PeerDenied);
    assert_eq!(env.error.phase, Phase::RemoteExecution);
    assert_eq!(env.error.retry, Retry::Never);
    assert!(env.evidence.dispatch_started);
    let proof = env.evidence.peer.unwrap();
    assert_eq!(proof.signature, Some(SignatureCheck::Verified));
    assert_eq!(proof.answers, 2);
}

#[test]
fn a_verified_outcome_that_ran_is_no_proof_of_not_running() {
    let f = Fixture::new();
    let rec = dispatched(&f);
    let mut ran = answer(1, AttestationKind::Outcome, SignatureCheck::Verified);
    ran.peer_outcome = Some(Outcome::Committed);
    ran.peer_invocation = Some("inv_b".into());
    let digest = ran.attestation.as_ref().unwrap().digest.clone();
    rec.peer_answer(ran).unwrap();
    assert!(
        rec.peer_not_run(Code::PeerDenied, Retry::Never, "x", &digest)
            .is_err()
    );
}

#[test]
fn budgets_are_counted_from_the_answers_and_survive_a_reopen() {
    let f = Fixture::new();
    let rec = dispatched(&f);
    let spend = [
        Some(Budget::Transient),
        Some(Budget::Unknown),
        Some(Budget::Transient),
        None,
    ];
    for (i, spent) in spend.into_iter().enumerate() {
        let mut a = answer(
            i as u32 + 1,
            AttestationKind::Unavailable,
            SignatureCheck::Verified,
        );
        a.spent = spent;
        rec.peer_answer(a).unwrap();
    }
    // Numbered one after another: a gap is refused.
    assert!(
        rec.peer_answer(answer(
            9,
            AttestationKind::Unavailable,
            SignatureCheck::Verified
        ))
        .is_err()
    );
    let f = f.reopen();
    let state = f.journal.projection(ID).unwrap().peer.unwrap();
    assert_eq!(
        (state.answers, state.transient_used, state.unknown_used),
        (4, 2, 1)
    );
}

#[test]
fn only_a_call_through_a_peer_records_peer_answers() {
    let f = Fixture::new();
    let rec = ready(&f.journal, "inv_http", false, None);
    rec.dispatch_started(FP, None, None).unwrap();
    assert!(
        rec.peer_answer(answer(1, AttestationKind::Denial, SignatureCheck::Verified))
            .is_err()
    );
}

#[test]
fn a_peer_answer_before_dispatch_is_setup_only() {
    let f = Fixture::new();
    let mut new = new_invocation(ID, None);
    new.channel = Channel::Peer;
    let mut rec = Recorder::accept(&f.journal, new).unwrap();
    rec.preflight(FP, snapshot(None), operation()).unwrap();
    rec.start_attempt("worker-a", 60_000).unwrap();
    let call = answer(1, AttestationKind::Unavailable, SignatureCheck::Verified);
    assert!(
        rec.peer_answer(call.clone()).is_err(),
        "a call answer follows dispatch"
    );
    let setup = PeerAnswer {
        stage: PeerStage::Setup,
        ..call
    };
    rec.peer_answer(setup).unwrap();
}
