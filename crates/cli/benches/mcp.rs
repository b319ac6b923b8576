//! End to end through `postern daemon` and `postern mcp`: latency of one pre-approved GET
//! against a direct HTTP call to the same loopback server, and throughput with 32 calls
//! in flight. Run under the test services (`scripts/bench.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

use postern_broker::vault::KeychainBackend;
use postern_tests::adversary::{Adversary, Behavior};

#[path = "support/daemon.rs"]
mod daemon;

use daemon::BenchDaemon;

const POSTERN: &str = env!("CARGO_BIN_EXE_postern");

fn bench(c: &mut Criterion) {
    for backend in [KeychainBackend::SecretService, KeychainBackend::Keyutils] {
        bench_backend(c, backend);
    }
}

fn bench_backend(c: &mut Criterion, backend: KeychainBackend) {
    let label = match backend {
        KeychainBackend::Keyutils => "keyutils",
        _ => "secret_service",
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt
        .block_on(Adversary::start(Behavior::ok_json("{\"ok\":true}")))
        .unwrap();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let daemon = BenchDaemon::start(Path::new(POSTERN), dir.path(), backend, &server.base_url());
    let socket = daemon.socket.clone();
    let client = rt.block_on(async {
        let mut command = tokio::process::Command::new(POSTERN);
        command.arg("mcp").arg("--socket").arg(&socket);
        ().serve(TokioChildProcess::new(command).unwrap())
            .await
            .unwrap()
    });
    let url = server.url("/v1/items");
    let Value::Object(args) = json!({"url": url, "method": "GET"}) else {
        unreachable!()
    };
    let call = || {
        let args = args.clone();
        let client = &client;
        async move {
            let r = client
                .call_tool(CallToolRequestParams::new("http_request").with_arguments(args))
                .await
                .unwrap();
            assert_eq!(r.structured_content.unwrap()["outcome"], "committed");
        }
    };

    let mut group = c.benchmark_group(format!("mcp_get_{label}"));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(10));
    let direct = reqwest::Client::builder().no_proxy().build().unwrap();
    group.bench_function("direct_http", |b| {
        b.iter(|| {
            rt.block_on(async {
                direct
                    .get(&url)
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap()
            })
        })
    });
    group.bench_function("through_postern_mcp", |b| b.iter(|| rt.block_on(call())));
    group.throughput(Throughput::Elements(32));
    group.bench_function("32_concurrent", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                rt.block_on(futures::future::join_all((0..32).map(|_| call())));
            }
            start.elapsed()
        })
    });
    group.finish();

    drop(client);
    drop(daemon);
}

criterion_group!(benches, bench);
criterion_main!(benches);
