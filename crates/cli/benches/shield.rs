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

use postern_broker::vault::KeychainBackend;
use postern_tests::adversary::{Adversary, Behavior};

#[path = "support/daemon.rs"]
mod daemon;

use daemon::BenchDaemon;

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
    let daemon = BenchDaemon::start(
        &postern,
        &data,
        KeychainBackend::Keyutils,
        &server.base_url(),
    );
    let socket = daemon.socket.clone();
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

    drop(daemon);
}

criterion_group!(benches, bench);
criterion_main!(benches);
