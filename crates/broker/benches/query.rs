//! The activity view over 1,000,000 invocations: the first page, and the first page
//! after a filter change (outcome = unknown, 1% of rows; one session of 100).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use ed25519_dalek::SigningKey;
use postern_broker::action::ConfigSnapshot;
use postern_broker::clock::SystemClock;
use postern_broker::config::TargetVersion;
use postern_broker::contract::Outcome;
use postern_broker::contract::RemoteContract;
use postern_broker::journal::events::{Channel, EventBody, OperationFacts};
use postern_broker::journal::query::{self, Filter};
use postern_broker::journal::{Journal, JournalOptions};
use rusqlite::params;

const INVOCATIONS: u64 = 1_000_000;

fn build(path: &std::path::Path) {
    let journal = Journal::open(
        path,
        JournalOptions {
            clock: Arc::new(SystemClock),
            signing_key: SigningKey::from_bytes(&[5u8; 32]),
            checkpoint_every: 1024,
        },
    )
    .unwrap();
    let per_batch = 20_000u64;
    for batch in 0..INVOCATIONS / per_batch {
        journal
            .write(false, move |ctx| {
                for i in 0..per_batch {
                    let n = batch * per_batch + i;
                    let id = format!("inv_{n:012x}");
                    let session = format!("sess_{}", n % 100);
                    let target = format!("target-{}", n % 5);
                    let body = EventBody::ActionAccepted {
                        channel: Channel::Http,
                        target: target.clone(),
                        summary: format!("POST https://api.example.test/v1/payments/{n}"),
                        session: Some(session.clone()),
                    };
                    let seq = ctx.append_unchecked_for_bench(&id, &body)?;
                    // The indexed status must be what the events fold to: 1% of the
                    // invocations dispatched and never settled (unknown), the rest
                    // accepted only.
                    let (phase, outcome, code) = if n.is_multiple_of(100) {
                        for event in dispatched_lifecycle(&target) {
                            ctx.append_unchecked_for_bench(&id, &event)?;
                        }
                        (
                            "remote_execution",
                            "unknown",
                            Some("REMOTE_OUTCOME_UNKNOWN"),
                        )
                    } else {
                        ("validation", "not_attempted", None)
                    };
                    ctx.conn()
                        .prepare_cached(
                            "INSERT INTO invocations (id, accepted_seq, accepted_at_ms, channel,
                             target, session_id, phase, outcome, code)
                             VALUES (?1, ?2, ?3, 'http', ?4, ?5, ?6, ?7, ?8)",
                        )?
                        .execute(params![
                            id,
                            seq as i64,
                            ctx.now_ms(),
                            target,
                            session,
                            phase,
                            outcome,
                            code
                        ])?;
                }
                Ok(())
            })
            .unwrap();
    }
    journal.close().unwrap();
}

const FP: &str = "blake3:0000000000000000000000000000000000000000000000000000000000000001";

fn dispatched_lifecycle(target: &str) -> Vec<EventBody> {
    vec![
        EventBody::PreflightValidated {
            fingerprint: FP.into(),
            snapshot: ConfigSnapshot {
                target_id: target.into(),
                target_version: TargetVersion::from_digest([1u8; 32]),
                credential_id: "key".into(),
                credential_version: "v1-00000000".into(),
                injection_mode: "header:authorization".into(),
                idempotency_key: None,
            },
            operation: OperationFacts {
                idempotent: false,
                remote_contract: RemoteContract::None,
                idempotency: None,
                reconcile_configured: false,
                retry_budget: 1,
            },
        },
        EventBody::CredentialAuthorized {
            credential_id: "key".into(),
            credential_version: "v1-00000000".into(),
        },
        EventBody::AttemptStarted {
            generation: 1,
            holder: "bench".into(),
            lease_expires_at_ms: 0,
        },
        EventBody::DispatchStarted {
            generation: 1,
            fingerprint: FP.into(),
            connection_id: None,
            peer_identity: None,
        },
    ]
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let db = dir.path().join("journal.db");
    build(&db);
    let conn =
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let now = 0;
    let page = |filter: Filter| {
        query::list(
            &conn,
            &Filter {
                limit: Some(50),
                ..filter
            },
            now,
        )
        .unwrap()
    };
    assert_eq!(page(Filter::default()).len(), 50);
    let unknown = page(Filter {
        outcome: Some(Outcome::Unknown),
        ..Default::default()
    });
    assert_eq!(unknown.len(), 50);
    assert!(unknown.iter().all(|r| r.outcome == Outcome::Unknown));

    let mut group = c.benchmark_group("activity_1m");
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("first_page", |b| b.iter(|| page(Filter::default())));
    group.bench_function("filter_outcome_unknown", |b| {
        b.iter(|| {
            page(Filter {
                outcome: Some(Outcome::Unknown),
                ..Default::default()
            })
        })
    });
    group.bench_function("filter_session", |b| {
        b.iter(|| {
            page(Filter {
                session: Some("sess_42".into()),
                ..Default::default()
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
