//! What identifying an agent costs once per bridge connection: hashing an executable
//! with blake3 as the bridge's report does for its parent (issue 26) and as the daemon
//! does for an agent it can read. A fresh bridge has no digest cache, so every iteration
//! changes the file's change time first (the cache is keyed by it) and hashes it again.
//! Sizes: a 5 MiB binary (a shell), a 100 MiB one (a Node.js or Python agent runtime).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use postern_broker::provenance::{ExecutableDigest, digest_file};

const MIB: usize = 1 << 20;

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("executable_digest");
    group.measurement_time(Duration::from_secs(8));
    group.sample_size(20);
    for mib in [5usize, 100] {
        let path = dir.path().join(format!("agent-{mib}"));
        let bytes: Vec<u8> = (0..mib * MIB).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let mut mode = 0o755;
        group.throughput(Throughput::Bytes((mib * MIB) as u64));
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{mib}MiB")),
            &path,
            |b, path| {
                b.iter(|| {
                    // A new change time: the digest is computed, not taken from the cache.
                    mode ^= 0o001;
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
                    let digest = digest_file(path);
                    assert!(matches!(digest, ExecutableDigest::Blake3 { .. }));
                    digest
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
