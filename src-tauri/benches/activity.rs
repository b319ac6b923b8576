//! The console's activity screen over 1,000,000 invocations, through the same
//! `Console::activity` the `query_activity` command calls: the first page (100 rows, as
//! the screen asks), and the first page after each kind of filter change.
//!
//! The console opens a real broker over the generated journal, so this runs under the
//! test keychain: `./scripts/bench.sh --bench activity`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use ed25519_dalek::SigningKey;
use postern_broker::action::ConfigSnapshot;
use postern_broker::clock::SystemClock;
use postern_broker::config::TargetVersion;
use postern_broker::contract::RemoteContract;
use postern_broker::journal::events::{Channel, EventBody, OperationFacts};
use postern_broker::journal::{Journal, JournalOptions};
use postern_desktop::app::{Args, start};
use postern_desktop::dto::ActivityFilter;
use postern_tests::fixture::test_service;
use rusqlite::params;

const INVOCATIONS: u64 = 1_000_000;

fn build(path: &std::path::Path) {
    let journal = Journal::open(
        path,
        JournalOptions::new(Arc::new(SystemClock), SigningKey::from_bytes(&[5u8; 32])),
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
                    let summary = format!("POST https://api.example.test/v1/payments/{n}");
                    let body = EventBody::ActionAccepted {
                        channel: Channel::Http,
                        target: target.clone(),
                        summary: summary.clone(),
                        session: Some(session.clone()),
                        parent: None,
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
                             target, session_id, phase, outcome, code, summary)
                             VALUES (?1, ?2, ?3, 'http', ?4, ?5, ?6, ?7, ?8, ?9)",
                        )?
                        .execute(params![
                            id,
                            seq as i64,
                            ctx.now_ms(),
                            target,
                            session,
                            phase,
                            outcome,
                            code,
                            summary
                        ])?;
                    ctx.conn()
                        .prepare_cached(
                            "INSERT INTO invocation_search (rowid, text) VALUES (?1, ?2)",
                        )?
                        .execute(params![seq as i64, format!("{target} {summary}")])?;
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
                source_query: None,
                batch: None,
                retry_budget: 1,
                peer: None,
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
    std::fs::write(dir.path().join("postern.toml"), "").unwrap();
    let started = start(&Args::in_dir(dir.path(), &test_service())).unwrap();
    let console = started.console;
    let page = |filter: ActivityFilter| console.activity(&filter, None, 100).unwrap();
    assert_eq!(page(ActivityFilter::default()).rows.len(), 100);
    let unknown = page(ActivityFilter {
        outcome: Some("unknown".into()),
        ..Default::default()
    });
    assert_eq!(unknown.rows.len(), 100);
    assert!(unknown.rows.iter().all(|r| r.outcome == "unknown"));
    let one = page(ActivityFilter {
        text: Some("payments/999999".into()),
        ..Default::default()
    });
    assert_eq!(one.rows.len(), 1);
    // The next page continues where the first stopped.
    let first = page(ActivityFilter::default());
    let next = console
        .activity(&ActivityFilter::default(), first.next_before_seq, 100)
        .unwrap();
    assert!(next.rows[0].accepted_seq < first.rows[99].accepted_seq);

    let mut group = c.benchmark_group("activity_1m");
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("first_page", |b| b.iter(|| page(ActivityFilter::default())));
    group.bench_function("next_page", |b| {
        b.iter(|| {
            console
                .activity(&ActivityFilter::default(), first.next_before_seq, 100)
                .unwrap()
        })
    });
    group.bench_function("filter_outcome_unknown", |b| {
        b.iter(|| {
            page(ActivityFilter {
                outcome: Some("unknown".into()),
                ..Default::default()
            })
        })
    });
    group.bench_function("filter_session", |b| {
        b.iter(|| {
            page(ActivityFilter {
                session: Some("sess_42".into()),
                ..Default::default()
            })
        })
    });
    group.bench_function("text_search_short", |b| {
        b.iter(|| {
            page(ActivityFilter {
                text: Some("/9".into()),
                ..Default::default()
            })
        })
    });
    group.bench_function("filter_target_and_text", |b| {
        b.iter(|| {
            page(ActivityFilter {
                target: Some("target-3".into()),
                text: Some("payments/".into()),
                ..Default::default()
            })
        })
    });
    group.bench_function("text_search_single_match", |b| {
        b.iter(|| {
            page(ActivityFilter {
                text: Some("payments/999999".into()),
                ..Default::default()
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
