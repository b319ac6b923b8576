//! Per-action latency of a pre-approved GET through the HTTP channel against a plain
//! reqwest GET to the same loopback server, with the disk's fsync cost measured in the
//! same run so the gap can be expressed in fsyncs. Run under the test services
//! (`scripts/bench.sh`), since the credential comes from the Secret Service.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use postern_broker::channel::http::HttpRequest;
use postern_broker::contract::Outcome;
use postern_broker::invocation::CallContext;
use postern_broker::vault::KeychainBackend;
use postern_tests::adversary::{Adversary, Behavior};
use postern_tests::fixture::{open_broker_with, test_service};

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt
        .block_on(Adversary::start(Behavior::ok_json("{\"ok\":true}")))
        .unwrap();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let text = format!(
        r#"
[[http]]
name = "api"
base_url = "{}/v1"
methods = ["GET"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "none"
idempotent_methods = ["GET"]
"#,
        server.base_url()
    );
    // Two brokers: the desktop default (Secret Service over D-Bus) and the headless
    // Linux option (kernel keyutils). Same journal code, different keychain cost.
    let mut brokers = Vec::new();
    for (name, backend) in [
        ("secret_service", KeychainBackend::SecretService),
        ("keyutils", KeychainBackend::Keyutils),
    ] {
        let sub = dir.path().join(name);
        std::fs::create_dir_all(&sub).unwrap();
        let broker = open_broker_with(&sub, &text, &test_service(), backend).unwrap();
        broker.set_secret("api-key", "bench-secret-value").unwrap();
        brokers.push((name, broker));
    }
    let url = server.url("/v1/items");

    let mut group = c.benchmark_group("http_get");
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(10));

    group.bench_function("raw_fsync_4k", |b| {
        let mut file = std::fs::File::create(dir.path().join("fsync-probe")).unwrap();
        let page = [0x5au8; 4096];
        b.iter(|| {
            file.write_all(&page).unwrap();
            file.sync_data().unwrap();
        })
    });

    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    group.bench_function("plain_reqwest", |b| {
        b.iter(|| {
            rt.block_on(async {
                let r = plain
                    .get(&url)
                    .header("authorization", "Bearer x")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status().as_u16(), 200);
                r.bytes().await.unwrap();
            })
        })
    });

    for (name, broker) in &brokers {
        group.bench_function(format!("postern_channel_{name}"), |b| {
            b.iter(|| {
                let request = HttpRequest {
                    url: url.clone(),
                    method: "GET".into(),
                    ..Default::default()
                };
                let out = rt.block_on(broker.channel.execute(request, &CallContext::default()));
                assert_eq!(out.outcome, Outcome::Committed);
            })
        });
    }
    group.finish();
    for (_, broker) in &brokers {
        broker.forget(&["api-key"]);
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
