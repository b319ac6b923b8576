//! End to end through `postern daemon` and `postern mcp`: latency of one pre-approved GET
//! against a direct HTTP call to the same loopback server, and throughput with 32 calls
//! in flight. Run under the test services (`scripts/bench.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

use postern_broker::vault::{CredentialKind, Keychain, KeychainBackend, Secret, Vault};
use postern_tests::adversary::{Adversary, Behavior};
use postern_tests::fixture::test_service;

const POSTERN: &str = env!("CARGO_BIN_EXE_postern");

fn bench(c: &mut Criterion) {
    for backend in [KeychainBackend::SecretService, KeychainBackend::Keyutils] {
        bench_backend(c, backend);
    }
}

fn bench_backend(c: &mut Criterion, backend: KeychainBackend) {
    let (label, flag) = match backend {
        KeychainBackend::Keyutils => ("keyutils", "keyutils"),
        _ => ("secret_service", "secret-service"),
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
    let service = test_service();
    let db = dir.path().join("journal.db");
    let vault = Vault::open(Keychain::new(backend, &service).unwrap(), &db).unwrap();
    vault
        .set(
            "api-key",
            CredentialKind::Token,
            &Secret::from("bench-secret".to_string()),
            1,
        )
        .unwrap();
    let config = dir.path().join("postern.toml");
    std::fs::write(
        &config,
        format!(
            "[[http]]\nname = \"api\"\nbase_url = \"{}/v1\"\nmethods = [\"GET\"]\ncredential = \"api-key\"\n\
             inject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" }}\napproval = \"none\"\n\
             idempotent_methods = [\"GET\"]\n",
            server.base_url()
        ),
    )
    .unwrap();
    let socket = dir.path().join("run").join("postern.sock");
    let mut daemon = Command::new(POSTERN)
        .args(["daemon", "--data-dir"])
        .arg(dir.path())
        .arg("--config")
        .arg(&config)
        .args(["--keychain-service", &service, "--keychain", flag])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    while !socket.exists() {
        std::thread::sleep(Duration::from_millis(20));
    }
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
    let _ = daemon.kill();
    let _ = daemon.wait();
    let _ = vault.remove("api-key");
    let _ = vault.remove("postern-audit-signing");
}

criterion_group!(benches, bench);
criterion_main!(benches);
