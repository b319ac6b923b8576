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
    fixture_serving(mode, timeout, Behavior::ok_json("{\"ok\":true}"), "").await
}

/// A target under `mode` (with `extra` lines) in front of a server behaving as `behavior`.
async fn fixture_serving(
    mode: &str,
    timeout: Duration,
    behavior: Behavior,
    extra: &str,
) -> Fixture {
    let server = Adversary::start(behavior).await.unwrap();
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
{extra}
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

/// Approves the first card that becomes pending, as alice, and returns it.
async fn approve_first(f: &Fixture) -> postern_broker::provenance::ApprovalCard {
    let p = pending(f).await;
    let card = p.request.card();
    f.approvals
        .approve(&p.request.invocation_id, &p.request.fingerprint, "alice")
        .unwrap();
    card
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

// Regression: issue 26 (item 1). The card showed `GET …/items/42` and no headers; the
// origin then received a method override, an identity claim, a cookie and a header a
// 60 KiB pad had pushed out of sight, plus the credential.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_card_shows_every_header_the_origin_receives_and_flags_the_dangerous_ones_first() {
    let f = fixture("per_call", Duration::from_secs(10)).await;
    let sent: Vec<(String, String)> = [
        ("X-HTTP-Method-Override", "DELETE".to_string()),
        ("X-Forwarded-User", "admin".to_string()),
        ("Cookie", "session=stolen".to_string()),
        ("X-Pad", "A".repeat(60 * 1024)),
        ("X-Do", "wire-transfer".to_string()),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v))
    .collect();
    let request = HttpRequest {
        url: f.server.url("/v1/items/42"),
        method: "GET".into(),
        headers: sent.clone(),
        ..Default::default()
    };
    let context = ctx(&f, "s1");
    let (out, card) = tokio::join!(
        f.broker.channel.execute(request, &context),
        approve_first(&f)
    );
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");

    // Every header the agent supplied is on the card, in the order sent.
    let names: Vec<&str> = card.headers.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "X-HTTP-Method-Override",
            "X-Forwarded-User",
            "Cookie",
            "X-Pad",
            "X-Do"
        ]
    );
    let pad = &card.headers[3];
    assert!(pad.truncated && pad.size == 60 * 1024, "{pad:?}");
    assert_eq!(card.headers[4].value, "wire-transfer");
    // The three that change what the request means are flagged and come first.
    for name in ["X-HTTP-Method-Override", "X-Forwarded-User", "Cookie"] {
        assert!(
            card.cautions
                .iter()
                .any(|c| c.starts_with(&format!("header {name}:"))),
            "{name} not among the cautions: {:?}",
            card.cautions
        );
    }
    assert_eq!(card.cautions.len(), 3, "{:?}", card.cautions);

    // The card against the bytes the origin received: every received header is one the
    // card shows (the agent's by value or digest, the broker's by its line), and every
    // header the card shows was received.
    let seen = f.server.requests();
    assert_eq!(seen.len(), 1);
    let mut unshown = Vec::new();
    let mut agent_headers = card.headers.iter();
    for (name, value) in &seen[0].headers {
        let shown_by_agent = card.headers.iter().any(|h| {
            h.name.eq_ignore_ascii_case(name)
                && if h.truncated {
                    h.digest == blake3::hash(value.as_bytes()).to_hex().to_string()
                } else {
                    h.value == *value
                }
        });
        let shown_as_added = card.added.iter().any(|line| {
            line.strip_prefix(&format!("{name}: "))
                .is_some_and(|shown| {
                    // The credential is shown by id, never by value.
                    shown == value
                        || (name == "authorization" && shown.contains("<credential api-key>"))
                })
        });
        if shown_by_agent {
            let next = agent_headers.next().expect("more agent headers than shown");
            assert!(next.name.eq_ignore_ascii_case(name), "out of order: {name}");
        } else if !shown_as_added {
            unshown.push(format!("{name}: {value}"));
        }
    }
    assert!(
        unshown.is_empty(),
        "received but not on the card: {unshown:?}\ncard added: {:?}",
        card.added
    );
    assert!(
        agent_headers.next().is_none(),
        "on the card but never received"
    );
    assert!(
        card.added
            .iter()
            .all(|line| !line.contains("approval-test-secret"))
    );
}

// Regression: issue 26 (item 7). `retry_invocation` of an approved GET that got 503 with
// `Retry-After: 0` re-sent it with no new card. What one approval covers is now decided and
// on the card: one send and the resends the record allows, up to the retry budget, of
// exactly the approved bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_call_approval_covers_the_resends_its_card_names_and_no_more() {
    let f = fixture_serving(
        "per_call",
        Duration::from_secs(10),
        Behavior::status(503).header("Retry-After", "0"),
        "idempotent_methods = [\"GET\"]",
    )
    .await;
    let (out, card) = tokio::join!(call(&f, "s1", "/v1/items"), approve_first(&f));
    assert_eq!(out.outcome, Outcome::Rejected, "{out:?}");
    assert!(
        card.covers
            .contains("one send, and at most 2 resends of exactly these bytes"),
        "{}",
        card.covers
    );
    // The resends the card names go out without another card, each the same request.
    for sent in 2..=3 {
        let retried = f
            .broker
            .channel
            .retry(&out.invocation_id, &ctx(&f, "s1"))
            .await;
        assert_eq!(retried.outcome, Outcome::Rejected, "{retried:?}");
        assert!(
            f.approvals.pending().is_empty(),
            "no new card for a covered resend"
        );
        assert_eq!(f.server.requests().len(), sent);
    }
    // Past them nothing more is sent under this approval.
    let after = f
        .broker
        .channel
        .retry(&out.invocation_id, &ctx(&f, "s1"))
        .await;
    assert_eq!(f.server.requests().len(), 3, "{after:?}");
    let seen = f.server.requests();
    assert!(
        seen.windows(2)
            .all(|w| w[0].target == w[1].target && w[0].headers == w[1].headers)
    );
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
