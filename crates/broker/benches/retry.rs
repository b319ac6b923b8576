//! What a retry manifest costs: building and signing one (the broker, before any
//! retry) and checking one (another party, with the public key alone), for a plain
//! invocation and for batches of 5 and 1,000 members.
#![allow(clippy::unwrap_used)]

use criterion::{Criterion, criterion_group, criterion_main};
use ed25519_dalek::SigningKey;
use postern_broker::contract::{Outcome, RemoteContract, Retry};
use postern_broker::retry::{
    Decision, MemberDisposition, RecordFacts, SourceQueryPredicate, manifest, verify_manifest,
};

fn query(path: &str) -> SourceQueryPredicate {
    SourceQueryPredicate {
        method: "GET".into(),
        path: path.into(),
        committed_status: vec![200],
        not_applied_status: vec![404],
    }
}

fn facts(members: usize) -> RecordFacts {
    RecordFacts {
        invocation_id: "inv_0123456789abcdef0123456789abcdef".into(),
        last_seq: 1_000_000,
        outcome: Outcome::Unknown,
        retry: Retry::Reconcile,
        code: None,
        fingerprint: format!("blake3:{}", "ab".repeat(32)),
        idempotent: false,
        remote_contract: RemoteContract::None,
        idempotency_key: None,
        idempotency_expires_at_ms: None,
        reconcile_configured: true,
        attempts_used: 1,
        retry_budget: 3,
        not_before_ms: None,
        source_query: Some(query("/v1/payments/lookup")),
        members: (0..members)
            .map(|i| MemberDisposition {
                id: format!("member-{i}"),
                outcome: Outcome::Unknown,
                query: Some(query(&format!("/v1/items/member-{i}"))),
            })
            .collect(),
    }
}

fn bench(c: &mut Criterion) {
    let key = SigningKey::from_bytes(&[9u8; 32]);
    let public = key.verifying_key();
    let mut group = c.benchmark_group("retry_manifest");
    for members in [0usize, 5, 1000] {
        let f = facts(members);
        group.bench_function(format!("sign_{members}_members"), |b| {
            b.iter(|| manifest(&f, Decision::Reconcile, 2, 1_800_000_000_000, &key))
        });
        let m = manifest(&f, Decision::Reconcile, 2, 1_800_000_000_000, &key);
        group.bench_function(format!("verify_{members}_members"), |b| {
            b.iter(|| verify_manifest(&m, Some(&public)).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
