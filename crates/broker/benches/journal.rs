//! Durable appends: one writer, 64 concurrent writers (group commit), and the raw fsync
//! rate of the same disk, measured in the same run. Every iteration is one durable
//! append (or one raw write+fsync), so the reported times compare directly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ed25519_dalek::SigningKey;
use postern_broker::clock::SystemClock;
use postern_broker::journal::events::{Channel, EventBody};
use postern_broker::journal::{Journal, JournalOptions};

fn open(dir: &std::path::Path) -> Journal {
    Journal::open(
        &dir.join("journal.db"),
        JournalOptions::new(Arc::new(SystemClock), SigningKey::from_bytes(&[1u8; 32])),
    )
    .unwrap()
}

/// One durable append: a fresh invocation's first event, committed with fsync.
fn durable_append(journal: &Journal, n: u64) {
    let id = format!("inv_{n:016x}");
    journal
        .write(true, move |ctx| {
            ctx.append_checked(
                &id,
                &EventBody::ActionAccepted {
                    channel: Channel::Http,
                    target: "payments".into(),
                    summary: "POST https://api.example.test/v1/payments".into(),
                    session: Some("session-1".into()),
                    parent: None,
                },
            )
        })
        .unwrap();
}

fn tmpdir() -> tempfile::TempDir {
    // Same disk as the journal files below.
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("durable_append");
    group.throughput(Throughput::Elements(1));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(8));

    let raw_dir = tmpdir();
    group.bench_function("raw_fsync_4k", |b| {
        let mut file = std::fs::File::create(raw_dir.path().join("raw")).unwrap();
        let page = [0x5au8; 4096];
        b.iter(|| {
            file.write_all(&page).unwrap();
            file.sync_data().unwrap();
        })
    });

    let dir = tmpdir();
    let journal = open(dir.path());
    let counter = AtomicU64::new(0);
    group.bench_function("single_writer", |b| {
        b.iter(|| durable_append(&journal, counter.fetch_add(1, Ordering::Relaxed)))
    });

    let counter = Arc::new(AtomicU64::new(1 << 40));
    group.bench_function("concurrent_64", |b| {
        b.iter_custom(|iters| {
            let per_thread = iters.div_ceil(64);
            let start = Instant::now();
            std::thread::scope(|s| {
                for _ in 0..64 {
                    let journal = journal.clone();
                    let counter = counter.clone();
                    s.spawn(move || {
                        for _ in 0..per_thread {
                            durable_append(&journal, counter.fetch_add(1, Ordering::Relaxed));
                        }
                    });
                }
            });
            // Report the time of `iters` appends (the threads did per_thread * 64).
            start
                .elapsed()
                .mul_f64(iters as f64 / (per_thread * 64) as f64)
        })
    });
    group.finish();
    journal.close().unwrap();
}

criterion_group!(benches, bench);
criterion_main!(benches);
