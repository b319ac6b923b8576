//! Latency of `ssh_exec` of `true` through the SSH channel against the OpenSSH client
//! (`ssh -i KEY -p PORT host true`) on the same local sshd. Both open a fresh connection
//! (key exchange, host key check, public-key auth, exec) per call. Run under the test
//! services (`scripts/bench.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Stdio};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use postern_broker::channel::ssh::{SshChannel, SshRequest};
use postern_broker::contract::Outcome;
use postern_broker::invocation::CallContext;
use postern_broker::vault::{CredentialKind, Secret};
use postern_tests::fixture::{open_broker, test_service};
use postern_tests::ssh_fixture::Sshd;

fn bench(c: &mut Criterion) {
    if !Sshd::available() {
        eprintln!("skipped: no OpenSSH server installed");
        return;
    }
    let sshd = Sshd::start().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let text = format!(
        "[[ssh]]\nname = \"box\"\nhost = \"127.0.0.1\"\nport = {}\nuser = \"{}\"\ncredential = \"box-key\"\n\
         host_key = \"{}\"\napproval = \"none\"\n",
        sshd.port,
        Sshd::user(),
        sshd.host_key
    );
    let broker = open_broker(dir.path(), &text, &test_service()).unwrap();
    broker
        .vault
        .set(
            "box-key",
            CredentialKind::SshKey,
            &Secret::from(sshd.user_ed25519.private.clone()),
            1,
        )
        .unwrap();
    let channel = SshChannel::new(
        broker.journal.clone(),
        broker.vault.clone(),
        broker.config.clone(),
    );

    let mut group = c.benchmark_group("ssh_exec_true");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(15));
    group.bench_function("openssh_client", |b| {
        b.iter(|| {
            let status = Command::new("ssh")
                .args(["-q", "-i"])
                .arg(&sshd.user_ed25519.path)
                .args(["-p", &sshd.port.to_string()])
                .args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no"])
                .args(["-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"])
                .arg(format!("{}@127.0.0.1", Sshd::user()))
                .arg("true")
                .stdin(Stdio::null())
                .status()
                .unwrap();
            assert!(status.success());
        })
    });
    group.bench_function("postern_ssh_channel", |b| {
        b.iter(|| {
            let request = SshRequest {
                host: "box".into(),
                command: "true".into(),
                stdin: None,
                timeout_ms: None,
            };
            let out = rt.block_on(channel.execute(request, &CallContext::default()));
            assert_eq!(out.outcome, Outcome::Committed);
        })
    });
    group.finish();
    broker.forget(&["box-key"]);
}

criterion_group!(benches, bench);
criterion_main!(benches);
