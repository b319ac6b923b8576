//! Audit verification over 1,000,000 journal events (realistic lifecycle bodies).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ed25519_dalek::SigningKey;
use postern_broker::audit::{verify_file, verify_since};
use postern_broker::clock::SystemClock;
use postern_broker::contract::{ConfidenceSource, Outcome, Retry};
use postern_broker::journal::events::{Channel, EventBody, ResultFacts};
use postern_broker::journal::{Journal, JournalOptions};

const EVENTS: u64 = 1_000_000;

fn lifecycle(fp: &str) -> Vec<EventBody> {
    vec![
        EventBody::ActionAccepted {
            channel: Channel::Http,
            target: "payments".into(),
            summary: "POST https://api.example.test/v1/payments?account=acct_123".into(),
            session: Some("session-4242".into()),
            parent: None,
        },
        EventBody::CredentialAuthorized {
            credential_id: "payments-key".into(),
            credential_version: "v3-1a2b3c4d".into(),
        },
        EventBody::RequestSent {
            headers_sent: true,
            body_complete: true,
        },
        EventBody::RemoteResponseStarted {
            http_status: Some(201),
            remote_request_id: Some("req_9f8e7d".into()),
        },
        EventBody::ResultCommitted {
            outcome: Outcome::Committed,
            code: None,
            retry: Retry::Never,
            result_id: "inv/r1".into(),
            digest: fp.into(),
            facts: ResultFacts {
                http_status: Some(201),
                ..Default::default()
            },
            confidence: ConfidenceSource::RemoteResponse,
            redactions: 0,
        },
    ]
}

/// Appends `n` lifecycle events (after `first`) in batches of 20,000: raw chained
/// appends, one transaction each; the audit chain does not care about lifecycle order,
/// and skipping the projection keeps the build quick.
fn append(path: &std::path::Path, first: u64, n: u64) {
    let journal = Journal::open(
        path,
        JournalOptions::new(Arc::new(SystemClock), SigningKey::from_bytes(&[9u8; 32])),
    )
    .unwrap();
    let fp = format!("blake3:{}", "ab".repeat(32));
    let bodies = lifecycle(&fp);
    let per_batch = 20_000u64;
    for start in (first..first + n).step_by(per_batch as usize) {
        let end = (start + per_batch).min(first + n);
        let bodies = bodies.clone();
        journal
            .write(false, move |ctx| {
                for n in start..end {
                    let body = &bodies[(n % bodies.len() as u64) as usize];
                    ctx.append_unchecked_for_bench(&format!("inv_{:08x}", n / 5), body)?;
                }
                Ok(())
            })
            .unwrap();
    }
    journal.close().unwrap();
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let db = dir.path().join("journal.db");
    append(&db, 0, EVENTS);
    let key = SigningKey::from_bytes(&[9u8; 32]).verifying_key();
    let report = verify_file(&db, &key).unwrap();
    assert_eq!(report.events, EVENTS);

    let mut group = c.benchmark_group("audit_verify");
    group.throughput(Throughput::Elements(EVENTS));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    group.bench_function("1m_events", |b| b.iter(|| verify_file(&db, &key).unwrap()));
    // The parts: the chain, tree and checkpoints alone, and the page check alone.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("PRAGMA mmap_size = 4294967296").unwrap();
    group.bench_function("1m_events_chain_tree_checkpoints", |b| {
        b.iter(|| verify_since(&conn, &key, None).unwrap())
    });
    group.bench_function("1m_events_quick_check", |b| {
        b.iter(|| {
            conn.query_row("PRAGMA quick_check(20)", [], |r| r.get::<_, String>(0))
                .unwrap()
        })
    });
    drop(conn);
    group.finish();

    // The console's banner: from the last verified prefix, over what came since.
    let conn = rusqlite::Connection::open(&db).unwrap();
    let (_, prefix) = verify_since(&conn, &key, None).unwrap();
    drop(conn);
    append(&db, EVENTS, 1_000);
    let conn = rusqlite::Connection::open(&db).unwrap();
    let mut group = c.benchmark_group("audit_verify_incremental");
    group.throughput(Throughput::Elements(1_000));
    group.bench_function("1k_new_after_1m", |b| {
        b.iter(|| verify_since(&conn, &key, Some(&prefix)).unwrap())
    });
    group.finish();

    // Signing one checkpoint: what every commit now pays (Merkle root from the
    // frontier, ed25519 over head and root).
    let signing = SigningKey::from_bytes(&[9u8; 32]);
    let mut frontier = postern_broker::audit::merkle::Frontier::default();
    for i in 0..EVENTS {
        frontier.push_leaf(postern_broker::audit::merkle::leaf_hash(i + 1, &[3; 32]));
    }
    let mut group = c.benchmark_group("audit_checkpoint");
    group.bench_function("sign_one", |b| {
        b.iter(|| {
            postern_broker::audit::Checkpoint::sign(&signing, EVENTS, [1; 32], frontier.root(), 0)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
