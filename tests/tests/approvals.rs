//! The approval API the desktop console drives: list pending, approve a fingerprint,
//! deny, time out; a stale fingerprint is refused and nothing is sent; session approvals
//! ask once per agent session.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use postern_broker::approvals::Approvals;
use postern_broker::channel::http::{HttpOutcome, HttpRequest};
use postern_broker::clock::SystemClock;
use postern_broker::contract::{Code, Outcome, Phase, Retry};
use postern_broker::invocation::CallContext;
use postern_tests::adversary::{Adversary, Behavior};
use postern_tests::fixture::{Broker, open_broker, test_service};

struct Fixture {
    _dir: tempfile::TempDir,
    broker: Broker,
    approvals: Arc<Approvals>,
    server: Adversary,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.broker.forget(&["api-key"]);
    }
}

async fn fixture(mode: &str, timeout: Duration) -> Fixture {
    let server = Adversary::start(Behavior::ok_json("{\"ok\":true}"))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
[[http]]
name = "api"
base_url = "{}/v1"
methods = ["GET", "POST"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "{mode}"
"#,
        server.base_url()
    );
    let broker = open_broker(dir.path(), &text, &test_service()).unwrap();
    broker
        .set_secret("api-key", "approval-test-secret")
        .unwrap();
    let approvals = Arc::new(Approvals::new(timeout, Arc::new(SystemClock)));
    Fixture {
        _dir: dir,
        broker,
        approvals,
        server,
    }
}

fn ctx(f: &Fixture, session: &str) -> CallContext {
    CallContext {
        session: Some(session.into()),
        approver: Some(f.approvals.clone()),
        ..Default::default()
    }
}

async fn call(f: &Fixture, session: &str, path: &str) -> HttpOutcome {
    let request = HttpRequest {
        url: f.server.url(path),
        method: "GET".into(),
        ..Default::default()
    };
    f.broker.channel.execute(request, &ctx(f, session)).await
}

/// Waits until one approval is pending and returns it.
async fn pending(f: &Fixture) -> postern_broker::approvals::Pending {
    for _ in 0..200 {
        if let Some(p) = f.approvals.pending().into_iter().next() {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no approval became pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_fingerprint_is_sent() {
    let f = fixture("per_call", Duration::from_secs(10)).await;
    let (out, ()) = tokio::join!(call(&f, "s1", "/v1/items"), async {
        let p = pending(&f).await;
        assert_eq!(p.request.target, "api");
        assert!(p.request.fingerprint.starts_with("blake3:"));
        f.approvals
            .approve(&p.request.invocation_id, &p.request.fingerprint, "alice")
            .unwrap();
    });
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert_eq!(f.server.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_is_never_retried_and_nothing_is_sent() {
    let f = fixture("per_call", Duration::from_secs(10)).await;
    let (out, ()) = tokio::join!(call(&f, "s1", "/v1/items"), async {
        let p = pending(&f).await;
        f.approvals.deny(&p.request.invocation_id, "alice").unwrap();
    });
    let env = out.error.unwrap();
    assert_eq!(
        (env.error.code, env.error.retry),
        (Code::ApprovalDenied, Retry::Never)
    );
    assert_eq!(env.error.outcome, Outcome::NotAttempted);
    assert!(f.server.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approving_a_stale_fingerprint_is_refused_and_nothing_is_sent() {
    let f = fixture("per_call", Duration::from_secs(10)).await;
    let (out, ()) = tokio::join!(call(&f, "s1", "/v1/items"), async {
        let p = pending(&f).await;
        let stale = "blake3:0000000000000000000000000000000000000000000000000000000000000000";
        f.approvals
            .approve(&p.request.invocation_id, stale, "alice")
            .unwrap();
    });
    let env = out.error.unwrap();
    assert_eq!(
        (env.error.phase, env.error.code),
        (Phase::Validation, Code::FingerprintMismatch)
    );
    assert!(f.server.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_request_times_out_without_sending() {
    let f = fixture("per_call", Duration::from_millis(200)).await;
    let out = call(&f, "s1", "/v1/items").await;
    let env = out.error.unwrap();
    assert_eq!(
        (env.error.code, env.error.outcome),
        (Code::ApprovalTimeout, Outcome::NotAttempted)
    );
    assert!(
        f.approvals.pending().is_empty(),
        "a timed-out request is no longer pending"
    );
    assert!(f.server.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_approval_is_asked_once_per_agent_session() {
    let f = fixture("session", Duration::from_secs(10)).await;
    let (first, ()) = tokio::join!(call(&f, "s1", "/v1/a"), async {
        let p = pending(&f).await;
        f.approvals
            .approve(&p.request.invocation_id, &p.request.fingerprint, "alice")
            .unwrap();
    });
    assert_eq!(first.outcome, Outcome::Committed);
    // Same session: no new card.
    let second = call(&f, "s1", "/v1/b").await;
    assert_eq!(second.outcome, Outcome::Committed);
    // Another session asks again (and times out unanswered here).
    let other = tokio::time::timeout(Duration::from_millis(300), call(&f, "s2", "/v1/c")).await;
    assert!(other.is_err(), "a new session waits for its own approval");
}
