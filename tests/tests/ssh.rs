//! The SSH channel against a real OpenSSH server on 127.0.0.1 (started by each test) and
//! against adversarial russh servers. Each case asserts phase, outcome, code and, where
//! it matters, the stored evidence.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use postern_broker::channel::ssh::{SshChannel, SshOutcome, SshRequest};
use postern_broker::contract::{Code, Outcome, Phase, Retry, Stage};
use postern_broker::invocation::CallContext;
use postern_broker::vault::{CredentialKind, Secret};
use postern_tests::fixture::{Broker, open_broker, test_service};
use postern_tests::ssh_fixture::{KeyPair, Sshd, keygen};

const KEY_ID: &str = "box-key";

struct Fixture {
    data: tempfile::TempDir,
    broker: Broker,
    channel: SshChannel,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.broker.forget(&[KEY_ID]);
    }
}

fn config(port: u16, host_key: Option<&str>, extra: &str) -> String {
    let pin = host_key.map_or(String::new(), |k| format!("host_key = \"{k}\"\n"));
    format!(
        r#"
[[ssh]]
name = "box"
host = "127.0.0.1"
port = {port}
user = "{user}"
credential = "{KEY_ID}"
{pin}approval = "none"
timeout_ms = 15000
{extra}
"#,
        user = Sshd::user()
    )
}

fn fixture(config_text: &str, key: &str) -> Fixture {
    let data = tempfile::tempdir().unwrap();
    let broker = open_broker(data.path(), config_text, &test_service()).unwrap();
    broker
        .vault
        .set(
            KEY_ID,
            CredentialKind::SshKey,
            &Secret::from(key.to_string()),
            broker.journal.now_ms(),
        )
        .unwrap();
    let channel = SshChannel::new(
        broker.journal.clone(),
        broker.vault.clone(),
        broker.config.clone(),
    );
    Fixture {
        data,
        broker,
        channel,
    }
}

/// Starts sshd, or prints why the test is skipped.
fn sshd() -> Option<Sshd> {
    if !Sshd::available() {
        eprintln!("SKIPPED: /usr/sbin/sshd is not installed");
        return None;
    }
    Some(Sshd::start().unwrap())
}

fn against(sshd: &Sshd, key: &KeyPair, extra: &str) -> Fixture {
    fixture(
        &config(sshd.port, Some(&sshd.host_key), extra),
        &key.private,
    )
}

fn cmd(command: &str) -> SshRequest {
    SshRequest {
        host: "box".into(),
        command: command.into(),
        stdin: None,
        timeout_ms: None,
    }
}

async fn run(f: &Fixture, request: SshRequest) -> SshOutcome {
    f.channel.execute(request, &CallContext::default()).await
}

/// A console that answers approvals, and a call context that asks it.
fn approving() -> (
    std::sync::Arc<postern_broker::approvals::Approvals>,
    CallContext,
) {
    let approvals = std::sync::Arc::new(postern_broker::approvals::Approvals::new(
        Duration::from_secs(10),
        std::sync::Arc::new(postern_broker::clock::SystemClock),
    ));
    let ctx = CallContext {
        approver: Some(approvals.clone()),
        ..Default::default()
    };
    (approvals, ctx)
}

/// The first approval to become pending.
async fn first_pending(
    approvals: &postern_broker::approvals::Approvals,
) -> postern_broker::approvals::Pending {
    loop {
        if let Some(p) = approvals.pending().into_iter().next() {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn assert_error(o: &SshOutcome, phase: Phase, outcome: Outcome, code: Code) {
    let env = o
        .error
        .as_ref()
        .unwrap_or_else(|| panic!("expected an envelope: {o:?}"));
    assert_eq!(
        (env.error.phase, env.error.outcome, env.error.code),
        (phase, outcome, code),
        "{env:#?}"
    );
    assert_eq!(o.outcome, outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_status_three_is_a_committed_result() {
    let Some(sshd) = sshd() else { return };
    let f = against(&sshd, &sshd.user_ed25519, "");
    let o = run(&f, cmd("echo hi; exit 3")).await;
    assert_eq!(o.outcome, Outcome::Committed, "{o:?}");
    assert!(o.error.is_none(), "{o:?}");
    let r = o.result.as_ref().unwrap();
    assert_eq!(r.exit_status, Some(3));
    assert_eq!(r.exit_signal, None);
    assert_eq!(r.stdout, b"hi\n");
    assert!(r.stdout_complete && r.stderr_complete);
    assert!(r.host_key_fingerprint.starts_with("SHA256:"), "{r:?}");
    // The record agrees: dispatched against the verified host, result stored.
    let p = f.broker.journal.projection(&o.invocation_id).unwrap();
    assert_eq!(p.outcome, Outcome::Committed);
    let stored = f
        .broker
        .journal
        .read_result(p.result_id.as_ref().unwrap())
        .unwrap();
    let text = format!("{stored:?}");
    assert!(text.contains(&r.host_key_fingerprint), "{text}");
    assert_eq!(
        p.evidence().peer_identity.as_deref(),
        Some(r.host_key_fingerprint.as_str())
    );
    assert!(p.evidence().dispatch_started);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_is_a_committed_result_with_the_signal() {
    let Some(sshd) = sshd() else { return };
    let f = against(&sshd, &sshd.user_ed25519, "");
    let o = run(&f, cmd("kill -TERM $$")).await;
    assert_eq!(o.outcome, Outcome::Committed, "{o:?}");
    let r = o.result.as_ref().unwrap();
    assert_eq!(r.exit_status, None, "{r:?}");
    assert_eq!(
        r.exit_signal.as_ref().map(|s| s.name.as_str()),
        Some("TERM")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_pinned_host_key_stops_before_anything_runs() {
    let Some(sshd) = sshd() else { return };
    let other = keygen("ed25519", &sshd.dir.join("other_host")).unwrap();
    let marker = sshd.dir.join("ran");
    let f = fixture(
        &config(sshd.port, Some(&other.public), ""),
        &sshd.user_ed25519.private,
    );
    let o = run(&f, cmd(&format!("touch {}", marker.display()))).await;
    assert_error(
        &o,
        Phase::ConnectionSetup,
        Outcome::NotAttempted,
        Code::HostKeyMismatch,
    );
    let env = o.error.as_ref().unwrap();
    assert!(!env.evidence.dispatch_started);
    assert!(
        env.evidence
            .attempts
            .iter()
            .any(|a| a.stage == Stage::HostKey && a.code == Code::HostKeyMismatch),
        "{env:#?}"
    );
    assert!(!marker.exists(), "the command ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpinned_host_key_is_unknown() {
    let Some(sshd) = sshd() else { return };
    let f = fixture(&config(sshd.port, None, ""), &sshd.user_ed25519.private);
    let o = run(&f, cmd("true")).await;
    assert_error(
        &o,
        Phase::ConnectionSetup,
        Outcome::NotAttempted,
        Code::HostKeyUnknown,
    );
    assert!(o.error.unwrap().error.message.contains("SHA256:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_user_key_is_auth_failed() {
    let Some(sshd) = sshd() else { return };
    let f = against(&sshd, &sshd.stranger, "");
    let o = run(&f, cmd("true")).await;
    assert_error(
        &o,
        Phase::ConnectionSetup,
        Outcome::NotAttempted,
        Code::SshAuthFailed,
    );
    let env = o.error.as_ref().unwrap();
    assert!(
        env.evidence
            .attempts
            .iter()
            .any(|a| a.stage == Stage::UserAuth),
        "{env:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_is_connection_refused() {
    let Some(sshd) = sshd() else { return };
    let port = postern_tests::ssh_fixture::free_port().unwrap();
    // A real key and pin, so the failure is the TCP stage and nothing later.
    let f = fixture(
        &config(port, Some(&sshd.host_key), ""),
        &sshd.user_ed25519.private,
    );
    let o = run(&f, cmd("true")).await;
    assert_error(
        &o,
        Phase::ConnectionSetup,
        Outcome::NotAttempted,
        Code::ConnectionRefused,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_round_trips() {
    let Some(sshd) = sshd() else { return };
    let f = against(&sshd, &sshd.user_ed25519, "");
    let input: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let mut request = cmd("cat");
    request.stdin = Some(input.clone());
    let o = run(&f, request).await;
    assert_eq!(o.outcome, Outcome::Committed, "{o:?}");
    let r = o.result.unwrap();
    assert_eq!(r.exit_status, Some(0));
    assert_eq!(r.stdout.len(), input.len());
    assert!(r.stdout == input);
    assert!(r.stdout_complete);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_over_the_limit_is_flagged_incomplete() {
    let Some(sshd) = sshd() else { return };
    let f = against(&sshd, &sshd.user_ed25519, "max_output_bytes = 1000");
    let o = run(&f, cmd("head -c 5000 /dev/zero | tr '\\0' a; echo err >&2")).await;
    assert_eq!(o.outcome, Outcome::Committed, "{o:?}");
    let r = o.result.unwrap();
    assert_eq!(r.exit_status, Some(0));
    assert_eq!(r.stdout, vec![b'a'; 1000]);
    assert!(!r.stdout_complete, "a cut stream is never complete");
    assert_eq!(r.stderr, b"err\n");
    assert!(r.stderr_complete);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_after_dispatch_is_unknown() {
    let Some(sshd) = sshd() else { return };
    let f = against(&sshd, &sshd.user_ed25519, "");
    let mut request = cmd("sleep 5");
    request.timeout_ms = Some(300);
    let started = std::time::Instant::now();
    let o = run(&f, request).await;
    assert!(started.elapsed() < Duration::from_secs(4));
    // The deadline covers setup too; on a slow machine it may end before dispatch,
    // which is then not_attempted. Here setup is a few milliseconds.
    assert_error(
        &o,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Code::RemoteTimeout,
    );
    let env = o.error.unwrap();
    assert!(env.evidence.dispatch_started);
    assert!(
        env.error.message.contains("may still be running"),
        "{env:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_after_dispatch_is_unknown() {
    let Some(sshd) = sshd() else { return };
    let f = against(&sshd, &sshd.user_ed25519, "");
    let ctx = CallContext::default();
    let cancel = ctx.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        cancel.cancel();
    });
    let o = f.channel.execute(cmd("sleep 5"), &ctx).await;
    assert_error(
        &o,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Code::CallerCancelled,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rsa_user_key_works() {
    let Some(sshd) = sshd() else { return };
    let f = against(&sshd, &sshd.user_rsa, "");
    let o = run(&f, cmd("echo rsa")).await;
    assert_eq!(o.outcome, Outcome::Committed, "{o:?}");
    assert_eq!(o.result.unwrap().stdout, b"rsa\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_without_an_approver_is_no_approver() {
    let Some(sshd) = sshd() else { return };
    let text = config(sshd.port, Some(&sshd.host_key), "")
        .replace("approval = \"none\"", "approval = \"per_call\"");
    let f = fixture(&text, &sshd.user_ed25519.private);
    let o = run(&f, cmd("true")).await;
    assert_error(
        &o,
        Phase::CredentialInjection,
        Outcome::NotAttempted,
        Code::NoApprover,
    );
}

// Regression: issue 26 (item 8). `bash -s` with `touch victim` on stdin was approved
// from a card that showed only `bash -s`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_card_shows_stdin_and_says_when_an_interpreter_runs_it() {
    let Some(sshd) = sshd() else { return };
    let text = config(sshd.port, Some(&sshd.host_key), "")
        .replace("approval = \"none\"", "approval = \"per_call\"");
    let f = fixture(&text, &sshd.user_ed25519.private);
    let (approvals, ctx) = approving();
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    let script = format!("touch {}", victim.display());
    let mut request = cmd("bash -s");
    request.stdin = Some(script.clone().into_bytes());
    let (out, card) = tokio::join!(f.channel.execute(request, &ctx), async {
        let pending = first_pending(&approvals).await;
        // Nothing has run while the card waits.
        assert!(!victim.exists());
        let card = pending.request.card();
        approvals
            .approve(
                &pending.request.invocation_id,
                &pending.request.fingerprint,
                "alice",
            )
            .unwrap();
        card
    });
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert!(victim.exists(), "the approved script ran");
    let stdin = card.stdin.as_ref().expect("the card shows stdin");
    assert_eq!(stdin.text, script);
    assert_eq!(stdin.size, script.len() as u64);
    assert_eq!(
        stdin.digest,
        blake3::hash(script.as_bytes()).to_hex().to_string()
    );
    assert!(
        card.cautions.iter().any(|c| c.contains("starts bash")),
        "{:?}",
        card.cautions
    );
    // The card the journal recorded with the request is the one shown.
    let record = postern_broker::provenance::ApprovalRecord::of(
        &f.broker.journal.events(&out.invocation_id).unwrap(),
    )
    .unwrap();
    assert_eq!(record.card.as_ref(), Some(&card));
    assert!(record.card_intact);
}

// Regression: issue 26 (item 8). A 300 KB command reached sshd, which refused the packet
// after dispatch, and came back `unknown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_too_long_for_one_packet_is_refused_before_anything_is_sent() {
    let Some(sshd) = sshd() else { return };
    let f = against(&sshd, &sshd.user_ed25519, "");
    let command = format!("echo {}", "x".repeat(300 * 1024));
    let o = run(&f, cmd(&command)).await;
    assert_error(
        &o,
        Phase::Validation,
        Outcome::NotAttempted,
        Code::PayloadLimit,
    );
    let env = o.error.unwrap();
    assert_eq!(env.error.retry, Retry::AfterCorrection);
    assert_eq!(env.evidence.field.as_deref(), Some("command"));
    assert!(!env.evidence.dispatch_started);
    // stdin past the payload limit, as it arrives below the bridge's 16 MiB line.
    let mut big = cmd("cat >/dev/null");
    big.stdin = Some(vec![b'z'; 11 * 1024 * 1024]);
    let o = run(&f, big).await;
    assert_error(
        &o,
        Phase::Validation,
        Outcome::NotAttempted,
        Code::PayloadLimit,
    );
    assert_eq!(o.error.unwrap().evidence.field.as_deref(), Some("stdin"));
    // The largest command allowed still runs.
    let limit = postern_broker::channel::ssh::MAX_COMMAND_BYTES;
    let longest = format!("echo {}", "y".repeat(limit - 5));
    let o = run(&f, cmd(&longest)).await;
    assert_eq!(o.outcome, Outcome::Committed, "{o:?}");
}

// Regression: issue 26 (item 8). A first-seen host-key card showed `resolved: null`, and
// its approval left only a message in a FAILED event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_seen_host_key_card_says_where_the_key_came_from_and_is_journaled() {
    use postern_broker::journal::events::EventBody;
    use postern_broker::provenance::ApprovalRecord;
    let Some(sshd) = sshd() else { return };
    let (approvals, ctx) = approving();
    for approve in [false, true] {
        let f = fixture(&config(sshd.port, None, ""), &sshd.user_ed25519.private);
        let (out, card) = tokio::join!(f.channel.execute(cmd("echo first"), &ctx), async {
            let pending = first_pending(&approvals).await;
            let card = pending.request.card();
            let id = &pending.request.invocation_id;
            let digest = card.digest();
            if approve {
                approvals
                    .approve_card(id, &pending.request.fingerprint, &digest, "alice")
                    .unwrap();
            } else {
                approvals.deny_card(id, &digest, "alice").unwrap();
            }
            card
        });
        assert_eq!(card.mode, "host_key");
        let resolved = card
            .resolved
            .as_deref()
            .expect("the card says where the key came from");
        assert!(
            resolved.contains(&format!("key presented by 127.0.0.1:{}", sshd.port)),
            "{resolved}"
        );
        assert!(resolved.contains("127.0.0.1 resolved to"), "{resolved}");
        let events = f.broker.journal.events(&out.invocation_id).unwrap();
        let record = ApprovalRecord::of(&events).expect("the host-key approval is journaled");
        assert_eq!(record.mode, "host_key");
        assert_eq!(record.card.as_ref(), Some(&card));
        assert!(record.card_intact);
        let answer = record.answer.clone().expect("the answer is journaled");
        assert_eq!(answer.granted, approve);
        assert_eq!(answer.by, "alice");
        assert!(events.iter().any(|e| matches!(
            e.body,
            EventBody::ApprovalGranted { .. } | EventBody::ApprovalDenied { .. }
        )));
        // Either way this invocation ran nothing: it was bound without a pin.
        assert_eq!(out.outcome, Outcome::NotAttempted, "{out:?}");
        assert_eq!(record.answer_matches_card(), Some(true));
    }
}

/// The user key is the canary: the remote prints it, and neither the outcome nor any
/// file under the data dir may contain it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_private_key_never_reaches_the_data_dir_or_the_outcome() {
    let Some(sshd) = sshd() else { return };
    let key = &sshd.user_ed25519;
    let f = against(&sshd, key, "");
    let command = format!("cat {p}; grep -v -- ----- {p} >&2", p = key.path.display());
    let o = run(&f, cmd(&command)).await;
    assert_eq!(o.outcome, Outcome::Committed, "{o:?}");
    let r = o.result.as_ref().unwrap();
    let body_lines: Vec<&str> = key
        .private
        .lines()
        .filter(|l| !l.starts_with("-----") && !l.trim().is_empty())
        .collect();
    assert!(!body_lines.is_empty());
    let shown = format!(
        "{o:?}{}{}",
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(shown.contains("[REDACTED]"), "{shown}");
    for line in &body_lines {
        assert!(!shown.contains(line), "key line in the outcome: {line}");
    }
    drop(o);
    // Every file the broker wrote, WAL included.
    let mut stack = vec![f.data.path().to_path_buf()];
    let mut files = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            files += 1;
            let bytes = std::fs::read(&path).unwrap();
            for line in &body_lines {
                assert!(
                    memfind(&bytes, line.as_bytes()).is_none(),
                    "key material in {}",
                    path.display()
                );
            }
        }
    }
    assert!(files > 0);
}

fn memfind(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

// ---- adversarial russh servers ---------------------------------------------------------

mod adversary {
    use std::sync::Arc;

    use russh::server::{
        self, Auth, ChannelOpenHandle, Msg, Server as _, Session, VerifiedPublicKey,
    };
    use russh::{Channel, ChannelId};

    /// What the server does with an exec request.
    #[derive(Clone, Copy, Debug)]
    pub enum Exec {
        /// Channel success, some output, EOF, then close without exit-status.
        CloseWithoutStatus,
        /// Channel failure.
        Refuse,
        /// Channel success, output, exit-status 0, then close without EOF.
        StatusThenBreak,
        /// Channel success, then nothing.
        Stall,
        /// Channel success, some output, then the whole connection goes away.
        Disconnect,
    }

    #[derive(Clone)]
    struct Srv {
        behavior: Exec,
    }

    impl server::Server for Srv {
        type Handler = Srv;
        fn new_client(&mut self, _: Option<std::net::SocketAddr>) -> Srv {
            self.clone()
        }
    }

    impl server::Handler for Srv {
        type Error = russh::Error;

        async fn auth_publickey(
            &mut self,
            _: &str,
            _: VerifiedPublicKey<'_>,
        ) -> Result<Auth, Self::Error> {
            Ok(Auth::Accept)
        }

        async fn channel_open_session(
            &mut self,
            _: Channel<Msg>,
            reply: ChannelOpenHandle,
            _: &mut Session,
        ) -> Result<(), Self::Error> {
            reply.accept().await;
            Ok(())
        }

        async fn exec_request(
            &mut self,
            channel: ChannelId,
            _: &[u8],
            session: &mut Session,
        ) -> Result<(), Self::Error> {
            match self.behavior {
                Exec::Refuse => {
                    session.channel_failure(channel)?;
                }
                Exec::CloseWithoutStatus => {
                    session.channel_success(channel)?;
                    session.data(channel, b"partial\n".to_vec())?;
                    session.eof(channel)?;
                    session.close(channel)?;
                }
                Exec::StatusThenBreak => {
                    session.channel_success(channel)?;
                    session.data(channel, b"half".to_vec())?;
                    session.exit_status_request(channel, 0)?;
                    session.close(channel)?;
                }
                Exec::Stall => {
                    session.channel_success(channel)?;
                }
                Exec::Disconnect => {
                    session.channel_success(channel)?;
                    session.data(channel, b"started\n".to_vec())?;
                    session.disconnect(russh::Disconnect::ByApplication, "gone", "en")?;
                }
            }
            Ok(())
        }
    }

    /// Starts a server on 127.0.0.1; returns its port and pinned host key text.
    pub async fn start(behavior: Exec, dir: &std::path::Path) -> (u16, String) {
        let pair = postern_tests::ssh_fixture::keygen("ed25519", &dir.join("host")).unwrap();
        let key = russh::keys::decode_secret_key(&pair.private, None).unwrap();
        let host_key = pair.public;
        let config = Arc::new(server::Config {
            keys: vec![key],
            auth_rejection_time: std::time::Duration::from_millis(0),
            ..Default::default()
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut srv = Srv { behavior };
        tokio::spawn(async move {
            let _ = srv.run_on_socket(config, &listener).await;
        });
        (port, host_key)
    }
}

async fn against_adversary(behavior: adversary::Exec) -> (Fixture, SshOutcome) {
    let dir = tempfile::tempdir().unwrap();
    let (port, host_key) = adversary::start(behavior, dir.path()).await;
    let user = keygen("ed25519", &dir.path().join("user")).unwrap();
    let f = fixture(
        &config(port, Some(&host_key), "").replace("timeout_ms = 15000", "timeout_ms = 2000"),
        &user.private,
    );
    let o = run(&f, cmd("deploy")).await;
    (f, o)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_without_exit_status_is_incomplete_and_unknown() {
    let (_f, o) = against_adversary(adversary::Exec::CloseWithoutStatus).await;
    assert_error(
        &o,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Code::RemoteResultIncomplete,
    );
    assert!(o.result.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_exec_is_rejected() {
    let (_f, o) = against_adversary(adversary::Exec::Refuse).await;
    assert_error(
        &o,
        Phase::RemoteExecution,
        Outcome::Rejected,
        Code::ExecRefused,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_status_before_a_broken_stream_is_committed_incomplete() {
    let (_f, o) = against_adversary(adversary::Exec::StatusThenBreak).await;
    assert_eq!(o.outcome, Outcome::Committed, "{o:?}");
    let r = o.result.unwrap();
    assert_eq!(r.exit_status, Some(0));
    assert_eq!(r.stdout, b"half");
    assert!(!r.stdout_complete);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_command_times_out_unknown() {
    let (_f, o) = against_adversary(adversary::Exec::Stall).await;
    assert_error(
        &o,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Code::RemoteTimeout,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_lost_after_exec_is_unknown() {
    let (_f, o) = against_adversary(adversary::Exec::Disconnect).await;
    assert_error(
        &o,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Code::RemoteOutcomeUnknown,
    );
    assert!(o.error.unwrap().evidence.dispatch_started);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_while_a_command_runs_recovers_as_unknown() {
    let Some(sshd) = sshd() else { return };
    let data = tempfile::tempdir().unwrap();
    let service = test_service();
    let text = config(sshd.port, Some(&sshd.host_key), "");
    let broker = open_broker(data.path(), &text, &service).unwrap();
    broker
        .vault
        .set(
            KEY_ID,
            CredentialKind::SshKey,
            &Secret::from(sshd.user_ed25519.private.clone()),
            1,
        )
        .unwrap();
    broker.journal.clone().close().unwrap();
    let marker = data.path().join("started");
    let command = format!("touch {}; sleep 5", marker.display());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ssh_child"))
        .arg(data.path())
        .arg(&service)
        .arg("box")
        .arg(&command)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The remote command is running once its marker exists.
    let mut started = false;
    for _ in 0..400 {
        if marker.exists() {
            started = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    child.kill().unwrap(); // SIGKILL: no destructor, no clean shutdown
    child.wait().unwrap();
    assert!(started, "the command started on the server");

    let (before, env) =
        postern_tests::recovered_after_kill(&data.path().join("journal.db")).unwrap();
    assert_eq!(
        before.outcome,
        Outcome::Unknown,
        "never not_attempted after dispatch"
    );
    assert!(before.ever_dispatched);
    assert_eq!(
        (env.error.code, env.error.outcome, env.error.retry),
        (
            Code::RemoteOutcomeUnknown,
            Outcome::Unknown,
            postern_broker::contract::Retry::Reconcile
        )
    );
    broker.forget(&[KEY_ID]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_seen_host_key_is_pinned_after_approval_as_a_new_config_version() {
    let Some(sshd) = sshd() else { return };
    let f = fixture(&config(sshd.port, None, ""), &sshd.user_ed25519.private);
    let (approvals, ctx) = approving();
    let version_before = f
        .broker
        .config
        .current()
        .ssh_target("box")
        .unwrap()
        .version();

    let (first, ()) = tokio::join!(f.channel.execute(cmd("echo first"), &ctx), async {
        let pending = first_pending(&approvals).await;
        assert_eq!(pending.request.mode, "host_key");
        assert!(pending.request.fingerprint.starts_with("SHA256:"));
        assert!(
            pending
                .request
                .summary
                .contains(&pending.request.fingerprint)
        );
        approvals
            .approve(
                &pending.request.invocation_id,
                &pending.request.fingerprint,
                "alice",
            )
            .unwrap();
    });
    // The approved key is pinned; this invocation (bound without a pin) stops, nothing ran.
    let env = first.error.clone().unwrap();
    assert_eq!(
        (env.error.code, env.error.outcome),
        (Code::HostKeyUnknown, Outcome::NotAttempted)
    );
    assert!(
        env.error.message.contains("now pinned"),
        "{}",
        env.error.message
    );
    let text = std::fs::read_to_string(f.data.path().join("postern.toml")).unwrap();
    assert!(
        text.contains(&sshd.host_key),
        "the key is pinned in the config file"
    );
    let current = f.broker.config.current();
    assert_ne!(
        current.ssh_target("box").unwrap().version(),
        version_before,
        "a new config version"
    );

    let second = f.channel.execute(cmd("echo second"), &ctx).await;
    assert_eq!(second.outcome, Outcome::Committed, "{second:?}");
    assert_eq!(second.result.unwrap().stdout, b"second\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_first_seen_host_key_is_not_pinned() {
    let Some(sshd) = sshd() else { return };
    let f = fixture(&config(sshd.port, None, ""), &sshd.user_ed25519.private);
    let (approvals, ctx) = approving();
    let (out, ()) = tokio::join!(f.channel.execute(cmd("echo x"), &ctx), async {
        let pending = first_pending(&approvals).await;
        approvals
            .deny(&pending.request.invocation_id, "alice")
            .unwrap();
    });
    assert_eq!(out.error.unwrap().error.code, Code::HostKeyUnknown);
    let text = std::fs::read_to_string(f.data.path().join("postern.toml")).unwrap();
    assert!(!text.contains(&sshd.host_key));
}

// Regression: issue 10
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_timeout_is_refused_at_validation_before_connecting() {
    // A listener that only counts: a refusal at validation never reaches it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = accepted.clone();
    let accepting = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(stream);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let user = keygen("ed25519", &dir.path().join("user")).unwrap();
    let f = fixture(&config(port, None, ""), &user.private);
    let mut request = cmd("true");
    request.timeout_ms = Some(0);
    let o = run(&f, request).await;
    assert_error(
        &o,
        Phase::Validation,
        Outcome::NotAttempted,
        Code::InvalidRequest,
    );
    let env = o.error.as_ref().unwrap();
    assert_eq!(
        env.error.retry,
        postern_broker::contract::Retry::AfterCorrection
    );
    assert_eq!(
        env.evidence.field.as_deref(),
        Some("timeout_ms"),
        "{env:#?}"
    );
    assert!(env.evidence.attempts.is_empty(), "{env:#?}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing connected to the server"
    );
    accepting.abort();
}

// ---- the resolved-address guard (issue 13, item 4) ----------------------------------

/// An SSH channel whose resolver maps `box.example.test` to `addrs`, for a target on
/// that name and `port`.
fn guarded(port: u16, addrs: &[&str], host_key: Option<&str>, extra: &str, key: &str) -> Fixture {
    use postern_broker::channel::guard::Resolver;
    let text = config(port, host_key, extra).replace("\"127.0.0.1\"", "\"box.example.test\"");
    let mut f = fixture(&text, key);
    f.channel = SshChannel::with_resolver(
        f.broker.journal.clone(),
        f.broker.vault.clone(),
        f.broker.config.clone(),
        Resolver::with_hosts([(
            "box.example.test",
            addrs.iter().map(|a| a.parse().unwrap()).collect(),
        )]),
    );
    f
}

/// A listener on 127.0.0.1 that counts the TCP connections it accepts.
async fn counting_listener() -> (u16, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(AtomicU64::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            drop(socket);
        }
    });
    (port, accepted)
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_to_a_name_resolving_to_a_refused_address_is_refused_before_tcp_connect() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let user_key = keygen("ed25519", &dir.path().join("id")).unwrap();
    let (port, accepted) = counting_listener().await;
    for (addrs, extra, refused) in [
        (&["127.0.0.1"][..], "", "127.0.0.1"),
        (
            &["127.0.0.1", "169.254.169.254"][..],
            "allow_private = true",
            "169.254.169.254",
        ),
        (
            &["::ffff:169.254.169.254"][..],
            "allow_private = true",
            "169.254.169.254",
        ),
    ] {
        let f = guarded(port, addrs, None, extra, &user_key.private);
        let o = run(&f, cmd("touch /tmp/never")).await;
        assert_error(
            &o,
            Phase::ConnectionSetup,
            Outcome::NotAttempted,
            Code::AddressRefused,
        );
        let env = o.error.as_ref().unwrap();
        assert_eq!(env.evidence.attempts[0].stage, Stage::AddressGuard);
        assert!(env.error.message.contains(refused), "{}", env.error.message);
        assert!(!env.evidence.dispatch_started);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "no TCP connection was made"
    );
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_allow_private_lets_a_name_reach_a_private_address() {
    let Some(sshd) = sshd() else { return };
    let f = guarded(
        sshd.port,
        &["127.0.0.1"],
        Some(&sshd.host_key),
        "allow_private = true",
        &sshd.user_ed25519.private,
    );
    let o = run(&f, cmd("echo through")).await;
    assert_eq!(o.outcome, Outcome::Committed, "{o:?}");
    assert_eq!(o.result.as_ref().unwrap().stdout, b"through\n");
}
