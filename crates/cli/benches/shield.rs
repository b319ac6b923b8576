//! What a shield costs: the start-up of `postern shield -- true` (asking the broker for a
//! socket, bubblewrap setting up the sandbox, the broker inspecting it, the command
//! running), and the latency of one pre-approved GET through `postern mcp` inside a
//! shield against the same call from an unshielded bridge. Linux, with bubblewrap; run
//! under the test services (`scripts/bench.sh --bench shield`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Stdio};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

use postern_broker::vault::{CredentialKind, Keychain, KeychainBackend, Secret, Vault};
use postern_tests::adversary::{Adversary, Behavior};
use postern_tests::fixture::test_service;

const POSTERN: &str = env!("CARGO_BIN_EXE_postern");

fn bench(c: &mut Criterion) {
    if !std::path::Path::new("/usr/bin/bwrap").is_file() {
        eprintln!("shield benchmark skipped: bubblewrap is not installed");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt
        .block_on(Adversary::start(Behavior::ok_json("{\"ok\":true}")))
        .unwrap();
    // Outside /tmp, which a shield empties: the binary, the project and the data dir.
    let base = tempfile::Builder::new()
        .prefix("postern-shield-bench-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let postern = base.path().join("postern");
    std::fs::copy(POSTERN, &postern).unwrap();
    let project = base.path().join("project");
    let data = base.path().join("state/data");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    let service = test_service();
    let vault = Vault::open(
        Keychain::new(KeychainBackend::Keyutils, &service).unwrap(),
        &data.join("journal.db"),
    )
    .unwrap();
    vault
        .set(
            "api-key",
            CredentialKind::Token,
            &Secret::from("bench-secret".to_string()),
            1,
        )
        .unwrap();
    let config = data.join("postern.toml");
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
    let socket = data.join("run").join("postern.sock");
    let mut daemon = Command::new(&postern)
        .args(["daemon", "--data-dir"])
        .arg(&data)
        .arg("--config")
        .arg(&config)
        .args(["--keychain-service", &service, "--keychain", "keyutils"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    while !socket.exists() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let shield = |args: &[&str]| {
        let mut command = Command::new(&postern);
        command
            .current_dir(&project)
            .env("POSTERN_SOCKET", &socket)
            .arg("shield")
            .arg("--")
            .args(args);
        command
    };

    let mut group = c.benchmark_group("shield");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(10));
    group.bench_function("start_true", |b| {
        b.iter(|| {
            let status = shield(&["true"]).stderr(Stdio::null()).status().unwrap();
            assert!(status.success());
        })
    });
    group.bench_function("unshielded_true", |b| {
        b.iter(|| assert!(Command::new("true").status().unwrap().success()))
    });

    let connect = |shielded: bool| -> RunningService<RoleClient, ()> {
        let mut command = tokio::process::Command::new(&postern);
        if shielded {
            command
                .current_dir(&project)
                .env("POSTERN_SOCKET", &socket)
                .arg("shield")
                .arg("--")
                .arg(&postern)
                .arg("mcp")
                .stderr(Stdio::null());
        } else {
            command.arg("mcp").arg("--socket").arg(&socket);
        }
        rt.block_on(async { ().serve(TokioChildProcess::new(command).unwrap()).await.unwrap() })
    };
    let Value::Object(args) = json!({"url": server.url("/v1/items"), "method": "GET"}) else {
        unreachable!()
    };
    for (name, shielded) in [("get_unshielded", false), ("get_shielded", true)] {
        let client = connect(shielded);
        group.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(async {
                    let r = client
                        .call_tool(
                            CallToolRequestParams::new("http_request").with_arguments(args.clone()),
                        )
                        .await
                        .unwrap();
                    assert_eq!(r.structured_content.unwrap()["outcome"], "committed");
                })
            })
        });
        drop(client);
    }
    group.finish();

    let _ = daemon.kill();
    let _ = daemon.wait();
    let _ = vault.remove("api-key");
    let _ = vault.remove("postern-audit-signing");
}

criterion_group!(benches, bench);
criterion_main!(benches);
