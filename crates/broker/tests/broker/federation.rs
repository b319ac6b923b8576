//! Seed 002's decision boundary, case by case: signed attestations are verdicts, anything
//! unsigned is not, transport errors never count toward a denial, and a policy that
//! moves mid-flight abandons the attempt.

use ed25519_dalek::SigningKey;
use postern_broker::federation::{
    Answer, Attempts, Attestation, AttestationKind, CLOCK_SKEW_MS, CallBinding, InFlight, Incident,
    Next, Owner, Request, Statement, TransportFault, Verdict, classify,
};

fn peer_key() -> SigningKey {
    SigningKey::from_bytes(&[21u8; 32])
}

/// The call the tests' attestations answer.
fn call() -> CallBinding {
    CallBinding {
        caller: "postern.local/audit/a1".into(),
        nonce: "00112233445566778899aabbccddeeff".into(),
        invocation: Some("inv_a_1".into()),
        attempt: Some(1),
    }
}

fn request() -> Request {
    Request {
        peer: "org-b".into(),
        capability: "payments".into(),
        fingerprint: "blake3:feed".into(),
        policy_version: Some("policy-7".into()),
        in_flight: None,
        call: Some(call()),
    }
}

fn statement(kind: AttestationKind) -> Statement {
    Statement {
        kind,
        peer: "org-b".into(),
        capability: "payments".into(),
        request_fingerprint: "blake3:feed".into(),
        policy_version: "policy-7".into(),
        issued_at_ms: 1_800_000_000_000,
        outcome_digest: (kind == AttestationKind::Outcome).then(|| "blake3:0c".into()),
        call: call(),
    }
}

fn signed(kind: AttestationKind) -> Attestation {
    statement(kind).sign(&peer_key())
}

fn verdict_of(answer: Answer) -> Verdict {
    classify(&answer, &peer_key().verifying_key(), &request())
}

fn attested(a: Attestation) -> Answer {
    Answer::Attested(Some(a))
}

#[test]
fn a_signed_denial_is_terminal_and_a_policy_incident_for_the_peering_owner() {
    let verdict = verdict_of(attested(signed(AttestationKind::Denial)));
    assert_eq!(verdict, Verdict::Denial);
    let mut attempts = Attempts::new();
    assert_eq!(attempts.next(&verdict), Next::Stop(Incident::Policy));
    assert_eq!(Incident::Policy.owner(), Owner::PeeringOwner);
    // Asking again changes nothing and spends nothing: a denial is never retried.
    assert_eq!(attempts.next(&verdict), Next::Stop(Incident::Policy));
    assert_eq!((attempts.transient_used, attempts.unknown_used), (0, 0));
}

#[test]
fn signed_unavailable_backs_off_boundedly_then_is_transient_exhaustion() {
    let verdict = verdict_of(attested(signed(AttestationKind::Unavailable)));
    assert_eq!(verdict, Verdict::Unavailable);
    let mut attempts = Attempts::new();
    let waits: Vec<Next> = (0..5).map(|_| attempts.next(&verdict)).collect();
    assert_eq!(
        waits,
        [500, 1000, 2000, 4000, 8000]
            .map(Next::RetryAfterMs)
            .to_vec()
    );
    assert_eq!(
        attempts.next(&verdict),
        Next::Stop(Incident::TransientExhaustion)
    );
    assert_eq!(Incident::TransientExhaustion.owner(), Owner::LocalOperator);
}

#[test]
fn an_unsigned_forged_or_tampered_denial_is_unknown_never_terminal() {
    let other = SigningKey::from_bytes(&[22u8; 32]);
    let mut tampered = signed(AttestationKind::Unavailable);
    tampered.kind = AttestationKind::Denial;
    // Re-digested after the change: the digest matches, the signature does not.
    let mut redigested = tampered.clone();
    redigested.digest = redigested.statement().digest();
    let mut garbled = signed(AttestationKind::Denial);
    garbled.signature = "00".into();
    let cases = [
        ("no envelope", Answer::Attested(None)),
        (
            "signed by another key",
            attested(statement(AttestationKind::Denial).sign(&other)),
        ),
        ("kind changed after signing", attested(tampered)),
        ("kind changed and re-digested", attested(redigested)),
        ("signature not hex of 64 bytes", attested(garbled)),
    ];
    for (name, answer) in cases {
        let verdict = verdict_of(answer);
        assert!(
            matches!(verdict, Verdict::Unknown { .. }),
            "{name}: {verdict:?}"
        );
    }
    // Unknown answers retry a few times, then are a contract violation for B's operator.
    let verdict = verdict_of(Answer::Attested(None));
    let mut attempts = Attempts::new();
    for _ in 0..3 {
        assert!(matches!(attempts.next(&verdict), Next::RetryAfterMs(_)));
    }
    assert_eq!(
        attempts.next(&verdict),
        Next::Stop(Incident::ContractViolation)
    );
    assert_eq!(Incident::ContractViolation.owner(), Owner::PeerOperator);
}

#[test]
fn an_envelope_about_another_peer_capability_or_request_is_unknown() {
    type Edit = fn(&mut Statement);
    let edits: [(&str, Edit); 4] = [
        ("peer", |s| s.peer = "org-c".into()),
        ("capability", |s| s.capability = "refunds".into()),
        ("request", |s| s.request_fingerprint = "blake3:beef".into()),
        ("outcome without digest", |s| {
            s.kind = AttestationKind::Outcome;
            s.outcome_digest = None;
        }),
    ];
    for (name, edit) in edits {
        let mut s = statement(AttestationKind::Denial);
        edit(&mut s);
        let verdict = verdict_of(attested(s.sign(&peer_key())));
        assert!(
            matches!(verdict, Verdict::Unknown { .. }),
            "{name}: {verdict:?}"
        );
    }
}

#[test]
fn a_rate_limiter_answering_a_storm_never_becomes_a_denial() {
    let mut attempts = Attempts {
        transient_budget: 100,
        ..Attempts::new()
    };
    for fault in [
        TransportFault::RateLimited,
        TransportFault::Timeout,
        TransportFault::Reset,
    ]
    .into_iter()
    .cycle()
    .take(100)
    {
        let verdict = verdict_of(Answer::Transport(fault));
        assert_eq!(verdict, Verdict::Transport(fault));
        let next = attempts.next(&verdict);
        assert!(matches!(next, Next::RetryAfterMs(_)), "{next:?}");
    }
    assert_eq!(
        attempts.unknown_used, 0,
        "transport errors spend no unknown budget"
    );
    assert_eq!(
        attempts.next(&Verdict::Transport(TransportFault::RateLimited)),
        Next::Stop(Incident::TransientExhaustion)
    );
    // Backoff is capped.
    assert_eq!(Attempts::new().max_backoff_ms, 30_000);
}

#[test]
fn a_policy_version_that_changes_mid_flight_abandons_the_attempt() {
    let mut s = statement(AttestationKind::Denial);
    s.policy_version = "policy-8".into();
    let verdict = verdict_of(attested(s.sign(&peer_key())));
    assert_eq!(
        verdict,
        Verdict::PolicyChanged {
            from: "policy-7".into(),
            to: "policy-8".into()
        }
    );
    assert_eq!(Attempts::new().next(&verdict), Next::Abandon);
    // Without a version known at the start there is nothing to compare, and a denial
    // under a policy this broker cannot place is not terminal (issue 27): unknown.
    let unknown_start = Request {
        policy_version: None,
        ..request()
    };
    let mut s = statement(AttestationKind::Denial);
    s.policy_version = "policy-8".into();
    let answer = attested(s.sign(&peer_key()));
    assert!(matches!(
        classify(&answer, &peer_key().verifying_key(), &unknown_start),
        Verdict::Unknown { .. }
    ));
}

#[test]
fn a_signed_outcome_is_done_and_survives_a_json_round_trip() {
    let a = signed(AttestationKind::Outcome);
    let wire: Attestation = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
    assert_eq!(wire, a);
    let verdict = verdict_of(attested(wire));
    assert_eq!(verdict, Verdict::Outcome);
    assert_eq!(Attempts::new().next(&verdict), Next::Done);
    // An unknown kind or an extra field is a typed decoding error, not a guess.
    let mut json = serde_json::to_value(&a).unwrap();
    json["kind"] = serde_json::json!("maybe");
    assert!(serde_json::from_value::<Attestation>(json).is_err());
    let mut json = serde_json::to_value(&a).unwrap();
    json["note"] = serde_json::json!("x");
    assert!(serde_json::from_value::<Attestation>(json).is_err());
}

/// Digests computed by an independent implementation of the encoding in the module doc
/// (Python's `blake3` package in derive-key mode, fields length-prefixed by hand), so
/// two brokers of different builds agree on what is signed.
#[test]
fn attestation_digests_match_an_independent_encoding() {
    assert_eq!(
        statement(AttestationKind::Denial).digest(),
        "blake3:dd1896c1919796038f687daa84e49f291c03443a6844d1c77fce401d1a84abde"
    );
    assert_eq!(
        statement(AttestationKind::Outcome).digest(),
        "blake3:8e595e0b8c067d6b7f3b0347e6bf3d7a8d46841ba57741562d9c7d43e116abd7"
    );
}

/// Seed 002 makes a signed denial terminal, so an old one replayed for the same request
/// (the port is plain HTTP; anyone on the path may have kept one) must not end a new
/// call: an attestation issued outside the call it answers is unknown, never a verdict.
#[test]
fn a_denial_issued_outside_the_call_it_answers_is_unknown_never_terminal() {
    let issued = statement(AttestationKind::Denial).issued_at_ms;
    let asked = |sent_at_ms: i64, answered_at_ms: i64| Request {
        in_flight: Some(InFlight {
            sent_at_ms,
            answered_at_ms,
        }),
        ..request()
    };
    let answer = attested(signed(AttestationKind::Denial));
    let key = peer_key().verifying_key();

    // Issued during the call, or within the clock skew either side of it: a denial.
    for (sent, answered) in [
        (issued - 10, issued + 10),
        (issued + CLOCK_SKEW_MS, issued + CLOCK_SKEW_MS + 5),
        (issued - CLOCK_SKEW_MS - 5, issued - CLOCK_SKEW_MS),
    ] {
        assert_eq!(
            classify(&answer, &key, &asked(sent, answered)),
            Verdict::Denial,
            "{sent}..{answered}"
        );
    }
    // A day-old denial replayed, or one from a clock far ahead: unknown.
    for (sent, answered) in [
        (issued + 86_400_000, issued + 86_400_050),
        (issued - CLOCK_SKEW_MS - 100, issued - CLOCK_SKEW_MS - 1),
    ] {
        let verdict = classify(&answer, &key, &asked(sent, answered));
        let Verdict::Unknown { reason } = &verdict else {
            panic!("a stale denial was taken as {verdict:?}");
        };
        assert!(reason.contains("replayed"), "{reason}");
        assert_eq!(Attempts::new().next(&verdict), Next::RetryAfterMs(500));
    }
}

// Regression: issue 27 (item 1). An attestation bound only to the request's content
// was accepted as the answer to any call with that content: a committed outcome B signed
// for one call, replayed by a relay for a new call, settled the new one. Every answer now
// names the call it answers, and one naming another is unknown.
#[test]
fn an_answer_naming_another_call_is_unknown_never_a_verdict() {
    type Edit = fn(&mut CallBinding);
    let edits: [(&str, Edit); 5] = [
        ("nonce", |c| {
            c.nonce = "ffeeddccbbaa99887766554433221100".into()
        }),
        ("caller", |c| c.caller = "postern.local/audit/c3".into()),
        ("invocation", |c| c.invocation = Some("inv_a_2".into())),
        ("attempt", |c| c.attempt = Some(2)),
        ("no invocation", |c| c.invocation = None),
    ];
    for kind in [
        AttestationKind::Outcome,
        AttestationKind::Denial,
        AttestationKind::Unavailable,
    ] {
        assert!(
            !matches!(verdict_of(attested(signed(kind))), Verdict::Unknown { .. }),
            "the answer to this call verifies"
        );
        for (what, edit) in edits {
            let mut other = statement(kind);
            edit(&mut other.call);
            let verdict = verdict_of(attested(other.sign(&peer_key())));
            let Verdict::Unknown { reason } = &verdict else {
                panic!("an answer to another call ({what}) was taken as {verdict:?}");
            };
            assert!(reason.contains("another call"), "{what}: {reason}");
        }
    }
    // An answer checked against no call at all is unknown too.
    let unbound = Request {
        call: None,
        ..request()
    };
    let verdict = classify(
        &attested(signed(AttestationKind::Outcome)),
        &peer_key().verifying_key(),
        &unbound,
    );
    assert!(matches!(verdict, Verdict::Unknown { .. }), "{verdict:?}");
}

// Regression: issue 27 (item 3). A relay broke the asker's signature so that B signed
// its honest "not authenticated" denial (policy `none`); with no policy version known
// (after a restart), A recorded PEER_DENIED, retry never, and a policy incident. Such a
// denial, and one under a policy the asker cannot place, is unknown.
#[test]
fn a_denial_under_no_policy_or_one_the_asker_cannot_place_is_unknown() {
    let mut none = statement(AttestationKind::Denial);
    none.policy_version = postern_broker::federation::serve::NO_POLICY.into();
    let unplaced = Request {
        policy_version: None,
        ..request()
    };
    let key = peer_key().verifying_key();
    for asked in [request(), unplaced.clone()] {
        let verdict = classify(&attested(none.clone().sign(&peer_key())), &key, &asked);
        let Verdict::Unknown { reason } = &verdict else {
            panic!("a denial under no policy was taken as {verdict:?}");
        };
        assert!(reason.contains("could not authenticate"), "{reason}");
    }
    let verdict = classify(&attested(signed(AttestationKind::Denial)), &key, &unplaced);
    let Verdict::Unknown { reason } = &verdict else {
        panic!("a denial under an unplaced policy was taken as {verdict:?}");
    };
    assert!(reason.contains("cannot place"), "{reason}");
    // Under the policy the call began with, it is terminal, as before.
    assert_eq!(
        classify(&attested(signed(AttestationKind::Denial)), &key, &request()),
        Verdict::Denial
    );
    // Outcomes and unavailable need no placed policy.
    assert_eq!(
        classify(&attested(signed(AttestationKind::Outcome)), &key, &unplaced),
        Verdict::Outcome
    );
}
