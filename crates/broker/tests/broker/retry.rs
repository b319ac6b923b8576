//! `decide()`, `disposition_for_unknown()` and the retry manifest, driven by hand-built
//! `RecordFacts` (no journal): retry code is a pure function of the record, so every
//! case is tested here, with the manifest that binds its evidence.

use postern_broker::contract::{Code, Outcome, RemoteContract, Retry};
use postern_broker::retry::{
    self, Decision, ManifestError, RecordFacts, RetryManifest, RetryRequest, SourceQueryPredicate,
    Verdict, decide, disposition_for_unknown, verify_manifest,
};

use crate::support::{FP, T0};

const OTHER_FP: &str = "blake3:0000000000000000000000000000000000000000000000000000000000000002";
const KEY_EXPIRES: i64 = T0 + 24 * 3600 * 1000;

/// A non-idempotent record with one dispatch used out of three, no key, no contract.
fn facts(outcome: Outcome, retry: Retry) -> RecordFacts {
    RecordFacts {
        invocation_id: "inv_retry".to_string(),
        last_seq: 7,
        outcome,
        retry,
        code: None,
        fingerprint: FP.to_string(),
        idempotent: false,
        remote_contract: RemoteContract::None,
        idempotency_key: None,
        idempotency_expires_at_ms: None,
        reconcile_configured: false,
        attempts_used: 1,
        retry_budget: 3,
        not_before_ms: None,
        source_query: None,
        members: Vec::new(),
    }
}

fn broker_key() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[7u8; 32])
}

/// The manifest as the broker makes it, signed with the test broker key.
fn manifest(f: &RecordFacts, decision: Decision, generation: u32, now_ms: i64) -> RetryManifest {
    retry::manifest(f, decision, generation, now_ms, &broker_key())
}

fn predicate() -> SourceQueryPredicate {
    SourceQueryPredicate {
        method: "GET".into(),
        path: "/v1/payments/k-1".into(),
        committed_status: vec![200],
        not_applied_status: vec![404],
    }
}

/// An unknown outcome under a configured idempotency contract with a live key.
fn keyed_unknown() -> RecordFacts {
    RecordFacts {
        remote_contract: RemoteContract::Configured,
        idempotency_key: Some("k-1".to_string()),
        idempotency_expires_at_ms: Some(KEY_EXPIRES),
        ..facts(Outcome::Unknown, Retry::SameIdempotencyKey)
    }
}

fn with(base: RecordFacts, edit: impl FnOnce(&mut RecordFacts)) -> RecordFacts {
    let mut f = base;
    edit(&mut f);
    f
}

struct Row {
    name: &'static str,
    facts: RecordFacts,
    request_fingerprint: &'static str,
    now_ms: i64,
    expected: Decision,
}

fn row(name: &'static str, facts: RecordFacts, expected: Decision) -> Row {
    Row {
        name,
        facts,
        request_fingerprint: FP,
        now_ms: T0,
        expected,
    }
}

fn decide_table() -> Vec<Row> {
    use Decision::*;
    use Outcome::*;
    let spent = |f: &mut RecordFacts| {
        f.attempts_used = 3;
        f.retry_budget = 3;
    };
    vec![
        row(
            "fetch_result on a committed record is fetched",
            facts(Committed, Retry::FetchResult),
            Fetch,
        ),
        row(
            "fetch_result wins even with the budget spent",
            with(facts(Committed, Retry::FetchResult), spent),
            Fetch,
        ),
        row(
            "not_attempted with backoff starts a new attempt",
            with(facts(NotAttempted, Retry::Backoff), |f| f.attempts_used = 0),
            RetryNewAttempt,
        ),
        row(
            "not_attempted with backoff but the budget spent stops",
            with(facts(NotAttempted, Retry::Backoff), spent),
            StopForCorrection,
        ),
        row(
            "not_attempted after_correction stops for correction",
            facts(NotAttempted, Retry::AfterCorrection),
            StopForCorrection,
        ),
        row(
            "not_attempted never stops for correction",
            facts(NotAttempted, Retry::Never),
            StopForCorrection,
        ),
        row(
            "unknown and idempotent starts a new attempt",
            with(facts(Unknown, Retry::Backoff), |f| f.idempotent = true),
            RetryNewAttempt,
        ),
        row(
            "unknown, idempotent, but recorded reconcile still starts a new attempt",
            with(facts(Unknown, Retry::Reconcile), |f| f.idempotent = true),
            RetryNewAttempt,
        ),
        row(
            "unknown, same key, same fingerprint, live key, configured contract",
            keyed_unknown(),
            RetrySameKey,
        ),
        row(
            "unknown, same key, key without a published expiry",
            with(keyed_unknown(), |f| f.idempotency_expires_at_ms = None),
            RetrySameKey,
        ),
        Row {
            request_fingerprint: OTHER_FP,
            ..row(
                "unknown, same key reused with a changed fingerprint",
                keyed_unknown(),
                IdempotencyMismatch,
            )
        },
        Row {
            now_ms: KEY_EXPIRES,
            ..row(
                "unknown, same key, retention ends exactly now: reconcile, not retry",
                keyed_unknown(),
                Reconcile,
            )
        },
        Row {
            now_ms: KEY_EXPIRES + 1,
            ..row(
                "unknown, same key, retention expired: reconcile, not retry",
                keyed_unknown(),
                Reconcile,
            )
        },
        row(
            "unknown, same key disposition but no configured contract",
            with(keyed_unknown(), |f| {
                f.remote_contract = RemoteContract::None
            }),
            Reconcile,
        ),
        row(
            "unknown with reconcile reconciles",
            facts(Unknown, Retry::Reconcile),
            Reconcile,
        ),
        row(
            "unknown with backoff but not idempotent reconciles (never upgraded)",
            facts(Unknown, Retry::Backoff),
            Reconcile,
        ),
        row(
            "unknown, idempotent, budget spent: reconcile",
            with(facts(Unknown, Retry::Backoff), |f| {
                f.idempotent = true;
                spent(f);
            }),
            Reconcile,
        ),
        row(
            "unknown, live same key, budget spent: reconcile",
            with(keyed_unknown(), spent),
            Reconcile,
        ),
        row(
            "rejected with backoff retries when allowed",
            with(facts(Rejected, Retry::Backoff), |f| {
                f.code = Some(Code::RemoteRateLimited);
            }),
            RetryWhenAllowed,
        ),
        row(
            "rejected with backoff and the budget spent returns the recorded result",
            with(facts(Rejected, Retry::Backoff), spent),
            ReturnRecordedResult,
        ),
        row(
            "rejected after_correction returns the recorded result",
            facts(Rejected, Retry::AfterCorrection),
            ReturnRecordedResult,
        ),
        row(
            "committed returns the recorded result",
            facts(Committed, Retry::Reconcile),
            ReturnRecordedResult,
        ),
        row(
            "committed with never returns the recorded result",
            facts(Committed, Retry::Never),
            ReturnRecordedResult,
        ),
        row(
            "committed with backoff is still never re-run",
            with(facts(Committed, Retry::Backoff), |f| f.idempotent = true),
            ReturnRecordedResult,
        ),
    ]
}

#[test]
fn decide_follows_the_table() {
    for r in decide_table() {
        let request = RetryRequest {
            fingerprint: r.request_fingerprint.to_string(),
        };
        let got = decide(&r.facts, &request, r.now_ms);
        assert_eq!(got, r.expected, "row `{}`: facts {:?}", r.name, r.facts);
    }
}

#[test]
fn decide_table_reaches_every_decision() {
    let reached: Vec<Decision> = decide_table().iter().map(|r| r.expected).collect();
    for d in Decision::ALL {
        assert!(reached.contains(d), "no row expects {d:?}");
    }
}

#[test]
fn disposition_for_unknown_follows_the_table() {
    // (name, idempotent, contract, expiry, has_key, now, expected)
    type DispositionRow = (
        &'static str,
        bool,
        RemoteContract,
        Option<i64>,
        bool,
        i64,
        Retry,
    );
    let rows: Vec<DispositionRow> = vec![
        (
            "idempotent backs off",
            true,
            RemoteContract::None,
            None,
            false,
            T0,
            Retry::Backoff,
        ),
        (
            "idempotent backs off even with an expired key",
            true,
            RemoteContract::Configured,
            Some(T0 - 1),
            true,
            T0,
            Retry::Backoff,
        ),
        (
            "configured contract, key, alive",
            false,
            RemoteContract::Configured,
            Some(KEY_EXPIRES),
            true,
            T0,
            Retry::SameIdempotencyKey,
        ),
        (
            "configured contract, key, no published expiry",
            false,
            RemoteContract::Configured,
            None,
            true,
            T0,
            Retry::SameIdempotencyKey,
        ),
        (
            "configured contract, key, expires exactly now",
            false,
            RemoteContract::Configured,
            Some(T0),
            true,
            T0,
            Retry::Reconcile,
        ),
        (
            "configured contract, key, expired",
            false,
            RemoteContract::Configured,
            Some(T0 - 1),
            true,
            T0,
            Retry::Reconcile,
        ),
        (
            "no contract, key present",
            false,
            RemoteContract::None,
            Some(KEY_EXPIRES),
            true,
            T0,
            Retry::Reconcile,
        ),
        (
            "no contract, no key",
            false,
            RemoteContract::None,
            None,
            false,
            T0,
            Retry::Reconcile,
        ),
        (
            "configured contract but no key",
            false,
            RemoteContract::Configured,
            None,
            false,
            T0,
            Retry::Reconcile,
        ),
    ];
    for (name, idempotent, contract, expiry, has_key, now, expected) in rows {
        assert_eq!(
            disposition_for_unknown(idempotent, contract, expiry, has_key, now),
            expected,
            "row `{name}`"
        );
    }
}

#[test]
fn manifest_verdict_follows_the_decision_and_its_evidence() {
    use Decision::*;
    // (name, facts, decision, expected verdict)
    let rows: Vec<(&str, RecordFacts, Decision, Verdict)> = vec![
        (
            "never dispatched retry is proven not applied",
            facts(Outcome::NotAttempted, Retry::Backoff),
            RetryNewAttempt,
            Verdict::NotApplied,
        ),
        (
            "idempotent unknown retry is idempotent-safe",
            with(facts(Outcome::Unknown, Retry::Backoff), |f| {
                f.idempotent = true;
            }),
            RetryNewAttempt,
            Verdict::IdempotentSafe,
        ),
        (
            "same-key retry rests on the remote de-duplication",
            keyed_unknown(),
            RetrySameKey,
            Verdict::IdempotencyKeySafe,
        ),
        (
            "reconcile with a configured query is query-first",
            with(facts(Outcome::Unknown, Retry::Reconcile), |f| {
                f.reconcile_configured = true;
            }),
            Reconcile,
            Verdict::QueryFirstRequired,
        ),
        (
            "reconcile without a configured query is unsafe",
            facts(Outcome::Unknown, Retry::Reconcile),
            Reconcile,
            Verdict::Unsafe,
        ),
        (
            "retry after reconciliation proved not applied is query-first",
            with(facts(Outcome::Rejected, Retry::Backoff), |f| {
                f.code = Some(Code::ReconciledNotApplied);
            }),
            RetryWhenAllowed,
            Verdict::QueryFirstRequired,
        ),
        (
            "retry after a complete refusal is not applied",
            with(facts(Outcome::Rejected, Retry::Backoff), |f| {
                f.code = Some(Code::RemoteRateLimited);
            }),
            RetryWhenAllowed,
            Verdict::NotApplied,
        ),
        (
            "fetch never re-runs",
            facts(Outcome::Committed, Retry::FetchResult),
            Fetch,
            Verdict::Unsafe,
        ),
        (
            "stop for correction",
            facts(Outcome::NotAttempted, Retry::AfterCorrection),
            StopForCorrection,
            Verdict::Unsafe,
        ),
        (
            "return recorded result",
            facts(Outcome::Committed, Retry::Never),
            ReturnRecordedResult,
            Verdict::Unsafe,
        ),
        (
            "idempotency mismatch",
            keyed_unknown(),
            IdempotencyMismatch,
            Verdict::Unsafe,
        ),
    ];
    for (name, f, decision, verdict) in rows {
        let m = manifest(&f, decision, 2, T0);
        assert_eq!(m.verdict, verdict, "row `{name}`");
        assert_eq!(m.decision, decision, "row `{name}`");
        assert_eq!(m.for_generation, 2, "row `{name}`");
        assert_eq!(m.invocation_id, f.invocation_id, "row `{name}`");
        assert_eq!(
            m.directive.starts_with("PROCEED"),
            decision.starts_attempt(),
            "row `{name}`: directive {:?}",
            m.directive
        );
        assert!(
            m.directive.starts_with("PROCEED") || m.directive.starts_with("HALT"),
            "row `{name}`: directive {:?}",
            m.directive
        );
    }
}

#[test]
fn manifest_for_decide_output_never_proceeds_on_unsafe_evidence() {
    // Whatever decide() returns, a PROCEED manifest has a safe verdict.
    for r in decide_table() {
        let request = RetryRequest {
            fingerprint: r.request_fingerprint.to_string(),
        };
        let decision = decide(&r.facts, &request, r.now_ms);
        let m = manifest(&r.facts, decision, 2, r.now_ms);
        if decision.starts_attempt() {
            assert_ne!(m.verdict, Verdict::Unsafe, "row `{}`", r.name);
        } else {
            assert!(
                matches!(m.verdict, Verdict::Unsafe | Verdict::QueryFirstRequired),
                "row `{}`: {:?}",
                r.name,
                m.verdict
            );
        }
    }
}

fn is_digest(s: &str) -> bool {
    s.strip_prefix("blake3:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// A record where every optional fact is present, so each edit below is a real change.
fn full_facts() -> RecordFacts {
    RecordFacts {
        code: Some(Code::RemoteTimeout),
        reconcile_configured: false,
        not_before_ms: Some(T0 + 5_000),
        source_query: Some(predicate()),
        ..keyed_unknown()
    }
}

#[test]
fn manifest_digest_is_deterministic_and_well_formed() {
    let a = manifest(&full_facts(), Decision::RetrySameKey, 2, T0);
    let b = manifest(&full_facts(), Decision::RetrySameKey, 2, T0);
    assert_eq!(a, b);
    assert!(is_digest(&a.digest), "{}", a.digest);
    let plain = manifest(
        &facts(Outcome::NotAttempted, Retry::Backoff),
        Decision::RetryNewAttempt,
        1,
        T0,
    );
    assert!(is_digest(&plain.digest), "{}", plain.digest);
}

#[test]
fn manifest_digest_changes_when_any_single_fact_changes() {
    type Edit = fn(&mut RecordFacts);
    let edits: Vec<(&str, Edit)> = vec![
        ("invocation_id", |f| f.invocation_id.push('x')),
        ("last_seq", |f| f.last_seq += 1),
        ("outcome", |f| f.outcome = Outcome::Rejected),
        ("retry", |f| f.retry = Retry::Reconcile),
        ("code", |f| f.code = Some(Code::RemoteOutcomeUnknown)),
        ("code removed", |f| f.code = None),
        ("fingerprint", |f| f.fingerprint = OTHER_FP.to_string()),
        ("idempotent", |f| f.idempotent = true),
        ("remote_contract", |f| {
            f.remote_contract = RemoteContract::None
        }),
        ("idempotency_key", |f| {
            f.idempotency_key = Some("k-2".into())
        }),
        ("idempotency_key removed", |f| f.idempotency_key = None),
        ("expiry", |f| {
            f.idempotency_expires_at_ms = Some(KEY_EXPIRES + 1)
        }),
        ("expiry removed", |f| f.idempotency_expires_at_ms = None),
        ("reconcile_configured", |f| f.reconcile_configured = true),
        ("attempts_used", |f| f.attempts_used += 1),
        ("retry_budget", |f| f.retry_budget += 1),
        ("not_before_ms", |f| f.not_before_ms = Some(T0 + 6_000)),
        ("not_before_ms removed", |f| f.not_before_ms = None),
        ("query method", |f| {
            if let Some(q) = &mut f.source_query {
                q.method = "HEAD".into();
            }
        }),
        ("query path", |f| {
            if let Some(q) = &mut f.source_query {
                q.path = "/v1/payments/k-2".into();
            }
        }),
        ("query committed statuses", |f| {
            if let Some(q) = &mut f.source_query {
                q.committed_status.push(204);
            }
        }),
        ("query not-applied statuses", |f| {
            if let Some(q) = &mut f.source_query {
                q.not_applied_status = vec![410];
            }
        }),
        ("query removed", |f| f.source_query = None),
    ];
    let base = full_facts();
    let decision = Decision::RetrySameKey;
    let reference = manifest(&base, decision, 2, T0).digest;
    let mut seen = vec![reference.clone()];
    for (name, edit) in edits {
        let mut changed = base.clone();
        edit(&mut changed);
        assert_ne!(changed, base, "edit `{name}` must change the facts");
        let digest = manifest(&changed, decision, 2, T0).digest;
        assert!(is_digest(&digest), "edit `{name}`: {digest}");
        assert!(
            !seen.contains(&digest),
            "edit `{name}` left the digest equal"
        );
        seen.push(digest);
    }
    // The arguments beside the facts are bound too.
    let now = manifest(&base, decision, 2, T0 + 1).digest;
    let generation = manifest(&base, decision, 3, T0).digest;
    let other_decision = manifest(&base, Decision::Reconcile, 2, T0).digest;
    for (name, digest) in [
        ("now", now),
        ("generation", generation),
        ("decision", other_decision),
    ] {
        assert!(
            !seen.contains(&digest),
            "changing `{name}` left the digest equal"
        );
        seen.push(digest);
    }
}

#[test]
fn a_manifest_names_the_bound_query_and_halts_on_it() {
    let f = with(facts(Outcome::Unknown, Retry::Reconcile), |f| {
        f.reconcile_configured = true;
        f.source_query = Some(predicate());
    });
    let decision = decide(
        &f,
        &RetryRequest {
            fingerprint: FP.into(),
        },
        T0,
    );
    assert_eq!(decision, Decision::Reconcile);
    let m = manifest(&f, decision, 2, T0);
    assert_eq!(m.verdict, Verdict::QueryFirstRequired);
    assert_eq!(m.source_query_predicate, Some(predicate()));
    assert!(m.directive.starts_with("HALT"), "{}", m.directive);
    assert!(
        m.directive
            .contains("GET /v1/payments/k-1 (200 = applied; 404 = not applied)"),
        "{}",
        m.directive
    );
}

#[test]
fn a_signed_manifest_verifies_with_the_broker_key_and_only_as_made() {
    let m = manifest(&full_facts(), Decision::Reconcile, 2, T0);
    let key = broker_key().verifying_key();
    assert_eq!(m.public_key, hex::encode(key.to_bytes()));
    verify_manifest(&m, Some(&key)).expect("as made, it verifies");
    verify_manifest(&m, None).expect("and with the key it names");
    // Through JSON, as another party receives it.
    let wire: RetryManifest =
        serde_json::from_str(&serde_json::to_string(&m).expect("encodes")).expect("decodes");
    verify_manifest(&wire, Some(&key)).expect("a JSON round trip keeps it valid");

    let other = ed25519_dalek::SigningKey::from_bytes(&[8u8; 32]).verifying_key();
    assert!(matches!(
        verify_manifest(&m, Some(&other)),
        Err(ManifestError::WrongKey { .. })
    ));
    type Tamper = fn(&mut RetryManifest);
    let digest_changes: Vec<(&str, Tamper)> = vec![
        ("decision", |m| m.decision = Decision::RetryNewAttempt),
        ("verdict", |m| m.verdict = Verdict::IdempotentSafe),
        ("directive", |m| m.directive = "PROCEED: go ahead.".into()),
        ("generation", |m| m.for_generation = 3),
        ("time", |m| m.made_at_ms += 1),
        ("attempts used", |m| m.facts.attempts_used = 0),
        ("outcome", |m| m.facts.outcome = Outcome::NotAttempted),
    ];
    for (name, tamper) in digest_changes {
        let mut t = m.clone();
        tamper(&mut t);
        assert_eq!(
            verify_manifest(&t, Some(&key)),
            Err(ManifestError::DigestMismatch),
            "{name}"
        );
    }
    // A query swapped in both places, digest recomputed: the signature no longer holds.
    let mut t = m.clone();
    t.facts.source_query = None;
    t.source_query_predicate = None;
    t.digest = retry::manifest_digest(
        &t.facts,
        t.decision,
        t.verdict,
        &t.directive,
        t.for_generation,
        t.made_at_ms,
    );
    assert_eq!(
        verify_manifest(&t, Some(&key)),
        Err(ManifestError::BadSignature)
    );
    // The query shown beside the facts must be the one the digest covers.
    let mut t = m.clone();
    t.source_query_predicate = None;
    assert_eq!(
        verify_manifest(&t, Some(&key)),
        Err(ManifestError::Inconsistent)
    );
    let mut t = m.clone();
    t.signature = "zz".into();
    assert_eq!(
        verify_manifest(&t, Some(&key)),
        Err(ManifestError::Malformed)
    );
}
