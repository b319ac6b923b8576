//! The HTTP channel against adversarial servers on 127.0.0.1 (plain and TLS). Each case
//! asserts phase, outcome, retry, code, the evidence markers and, where it matters, how
//! many side effects the server applied.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use postern_broker::approvals::Approvals;
use postern_broker::channel::guard::Resolver;
use postern_broker::channel::http::{HttpOutcome, HttpRequest};
use postern_broker::clock::SystemClock;
use postern_broker::contract::{Code, Outcome, Phase, Retry, Stage};
use postern_broker::invocation::CallContext;
use postern_broker::journal::events::{EventBody, JobState, Relation};
use postern_broker::retry::{Decision, Verdict};
use postern_broker::vault::KeychainBackend;
use postern_tests::adversary::{
    Adversary, Behavior, Encoding, TestCert, TestPki, encodings, refused_addr,
};
use postern_tests::calls::{assert_error, error, get, post};
use postern_tests::fixture::{Broker, open_broker, open_broker_resolving, test_service};
use std::sync::Arc;

const CANARY: &str = "pstn-canary-7f3a9c1e5b";

struct Fixture {
    dir: tempfile::TempDir,
    broker: Broker,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.broker.forget(&["api-key"]);
    }
}

fn config(base: &str, extra: &str) -> String {
    format!(
        r#"
[[http]]
name = "api"
base_url = "{base}/v1"
methods = ["GET", "POST", "PUT"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "none"
idempotent_methods = ["GET", "PUT"]
timeout_ms = 3000
{extra}
"#
    )
}

const CONTRACT: &str = r#"
[http.idempotency]
header = "Idempotency-Key"
scope = "payments.create"
retention = "24h"

[http.reconcile]
method = "GET"
path = "/payments?idempotency_key={idempotency_key}"
committed_status = [200]
not_applied_status = [404]
"#;

const LOOKUP: &str = r#"
[http.reconcile]
method = "GET"
path = "/payments/lookup"
committed_status = [200]
not_applied_status = [404]
"#;

fn fixture(config_text: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let broker = open_broker(dir.path(), config_text, &test_service()).unwrap();
    broker.set_secret("api-key", CANARY).unwrap();
    Fixture { dir, broker }
}

async fn run(f: &Fixture, request: HttpRequest) -> HttpOutcome {
    f.broker
        .channel
        .execute(request, &CallContext::default())
        .await
}

/// The canary in the forms the scrubber catches: raw, upper-case, reversed, hex in both
/// cases, the base64 characters its bits fully determine at byte offsets 0 to 2, the
/// same for base32 at offset 0 (both cases), every byte percent-encoded (both cases) and
/// every character as a JSON `\u` escape.
fn canary_forms() -> Vec<(String, String)> {
    use base64::Engine;
    let n = CANARY.len();
    let pure = [
        "raw",
        "upper",
        "reversed",
        "hex",
        "HEX",
        "json",
        "percent",
        "percent-lower",
    ];
    let mut forms: Vec<(String, String)> = encodings(CANARY.as_bytes())
        .into_iter()
        .filter(|(label, _)| pure.contains(&label.as_str()))
        .collect();
    for k in 0..3usize {
        let shifted = [vec![0u8; k], CANARY.as_bytes().to_vec()].concat();
        let text = base64::engine::general_purpose::STANDARD_NO_PAD.encode(&shifted);
        let core = &text[(8 * k).div_ceil(6)..(8 * (k + n)) / 6];
        forms.push((format!("base64 core +{k}"), core.to_string()));
    }
    let (_, b32) = encodings(CANARY.as_bytes())
        .into_iter()
        .find(|(label, _)| label == "base32+0")
        .unwrap();
    let core = &b32[..(8 * n) / 5];
    forms.push(("base32 core".into(), core.to_string()));
    forms.push(("base32 core lower".into(), core.to_lowercase()));
    forms
}

/// No file under the data dir and nothing the agent sees holds the secret, in any of
/// [`canary_forms`].
fn assert_no_canary(f: &Fixture, outcome: &HttpOutcome) {
    let mut seen = format!("{outcome:?}");
    if let Some(response) = &outcome.result {
        seen.push_str(&String::from_utf8_lossy(&response.body));
    }
    for (label, form) in canary_forms() {
        assert!(
            !seen.contains(&form),
            "the secret reached a result ({label}): {seen}"
        );
        let leaked = postern_tests::files_containing(f.dir.path(), form.as_bytes());
        assert!(leaked.is_empty(), "the secret ({label}) reached {leaked:?}");
    }
}

/// The stored result of a settled invocation.
fn stored(f: &Fixture, out: &HttpOutcome) -> postern_broker::journal::StoredResult {
    let p = f.broker.journal.projection(&out.invocation_id).unwrap();
    f.broker
        .journal
        .read_result(p.result_id.as_deref().unwrap())
        .unwrap()
}

fn response_header<'a>(out: &'a HttpOutcome, name: &str) -> Option<&'a str> {
    out.result
        .as_ref()
        .unwrap()
        .headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Every request the server received asked for the identity coding, and only that.
fn assert_asked_for_identity(server: &Adversary) {
    let requests = server.requests();
    assert!(!requests.is_empty());
    for r in requests {
        let asked: Vec<&str> = r
            .headers
            .iter()
            .filter(|(n, _)| n == "accept-encoding")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(asked, ["identity"], "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connection_is_not_attempted_with_every_setup_attempt_recorded() {
    let addr = refused_addr().unwrap();
    let f = fixture(&config(&format!("http://{addr}"), ""));
    let out = run(&f, post(format!("http://{addr}/v1/payments"), "{}")).await;
    assert_error(
        &out,
        Phase::ConnectionSetup,
        Outcome::NotAttempted,
        Retry::Backoff,
        Code::ConnectionRefused,
    );
    let ev = &error(&out).evidence;
    assert!(!ev.dispatch_started);
    assert_eq!(
        ev.attempts.len(),
        2,
        "setup is retried a capped number of times, each recorded"
    );
    assert!(
        ev.attempts
            .iter()
            .all(|a| a.stage == Stage::TcpConnect && a.outcome == Outcome::NotAttempted)
    );
    assert_no_canary(&f, &out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresolvable_host_fails_in_dns_before_anything_is_sent() {
    let f = fixture(&config("https://does-not-exist.invalid", ""));
    let out = run(&f, get("https://does-not-exist.invalid/v1/x".into())).await;
    assert_error(
        &out,
        Phase::ConnectionSetup,
        Outcome::NotAttempted,
        Retry::Backoff,
        Code::DnsFailed,
    );
    assert_eq!(error(&out).evidence.attempts[0].stage, Stage::Dns);
}

async fn tls_case(cert: TestCert) -> (Fixture, Adversary, HttpOutcome) {
    let pki = TestPki::new().unwrap();
    let server = Adversary::start_tls(Behavior::ok_json("{\"ok\":true}"), cert, &pki)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    pki.write_ca(dir.path()).unwrap();
    let text = config(&server.base_url(), "ca_file = \"postern-test-ca.pem\"");
    let broker = open_broker(dir.path(), &text, &test_service()).unwrap();
    broker.set_secret("api-key", CANARY).unwrap();
    let f = Fixture { dir, broker };
    let out = run(&f, post(server.url("/v1/payments"), "{}")).await;
    (f, server, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_certificate_completes_and_binds_the_peer_identity() {
    let (f, server, out) = tls_case(TestCert::Valid).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert_eq!(out.result.as_ref().unwrap().status, 200);
    let p = f.broker.journal.projection(&out.invocation_id).unwrap();
    assert!(
        p.evidence()
            .peer_identity
            .unwrap()
            .starts_with("cert-blake3:")
    );
    assert_eq!(server.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_expired_and_wrong_name_certificates_are_rejected_before_dispatch() {
    for cert in [TestCert::Untrusted, TestCert::Expired, TestCert::WrongName] {
        let (f, server, out) = tls_case(cert).await;
        assert_error(
            &out,
            Phase::ConnectionSetup,
            Outcome::NotAttempted,
            Retry::AfterCorrection,
            Code::TlsRejected,
        );
        let ev = &error(&out).evidence;
        assert_eq!(
            ev.attempts.len(),
            1,
            "a rejected certificate is not retried"
        );
        assert_eq!(ev.attempts[0].stage, Stage::TlsHandshake);
        assert!(!ev.dispatch_started);
        assert_eq!(server.effects(), 0);
        assert!(
            server.requests().is_empty(),
            "{cert:?}: no request may reach the server"
        );
        assert_no_canary(&f, &out);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_before_reading_after_dispatch_is_unknown() {
    let server = Adversary::start(Behavior::CloseBeforeReading)
        .await
        .unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let out = run(&f, post(server.url("/v1/payments"), "{}")).await;
    assert_error(
        &out,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Retry::Reconcile,
        Code::RemoteOutcomeUnknown,
    );
    assert!(error(&out).evidence.dispatch_started);
    assert!(!error(&out).evidence.response_headers_received);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_headers_then_close_is_unknown() {
    let server = Adversary::start(Behavior::ReadHeadersThenClose)
        .await
        .unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let out = run(&f, post(server.url("/v1/payments"), "{\"amount\":5}")).await;
    assert_error(
        &out,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Retry::Reconcile,
        Code::RemoteOutcomeUnknown,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applied_then_closed_without_a_contract_reconciles_through_the_configured_query() {
    let server = Adversary::start(Behavior::ApplyThenCloseWithLookup)
        .await
        .unwrap();
    let f = fixture(&config(&server.base_url(), LOOKUP));
    let out = run(&f, post(server.url("/v1/payments"), "{\"amount\":5}")).await;
    assert_error(
        &out,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Retry::Reconcile,
        Code::RemoteOutcomeUnknown,
    );
    assert_eq!(server.effects(), 1);
    let ev = &error(&out).evidence;
    assert!(
        ev.dispatch_started && ev.request_headers_sent && ev.request_complete,
        "{ev:#?}"
    );

    // retry_invocation refuses to re-send: the manifest says query first.
    let retried = f
        .broker
        .channel
        .retry(&out.invocation_id, &CallContext::default())
        .await;
    let manifest = retried.manifest.clone().unwrap();
    assert_eq!(manifest.decision, Decision::Reconcile);
    assert_eq!(manifest.verdict, Verdict::QueryFirstRequired);
    assert_eq!(server.effects(), 1, "no second payment");
    // The manifest names the query bound at preflight, and the broker's key signs it.
    let query = manifest.source_query_predicate.clone().unwrap();
    assert_eq!(
        (query.method.as_str(), query.path.as_str()),
        ("GET", "/payments/lookup")
    );
    assert!(
        manifest.directive.contains("GET /payments/lookup"),
        "{manifest:?}"
    );
    postern_broker::retry::verify_manifest(&manifest, Some(&f.broker.journal.verifying_key()))
        .expect("the manifest verifies with the broker's public key");
    let recorded = f.broker.journal.events(&out.invocation_id).unwrap();
    assert!(recorded.iter().any(|e| matches!(
        &e.body,
        EventBody::RetryManifest { digest, signature: Some(sig), source_query_predicate: Some(q), .. }
            if *digest == manifest.digest && *sig == manifest.signature && *q == query
    )));

    // The configured query settles it without rewriting the attempt.
    let before = f.broker.journal.events(&out.invocation_id).unwrap();
    let settled = f
        .broker
        .channel
        .reconcile(&out.invocation_id, "operator")
        .await;
    assert_eq!(settled.outcome, Outcome::Committed, "{settled:?}");
    let env = error(&settled);
    assert_eq!(env.error.code, Code::ReconciledCommitted);
    assert_eq!(
        env.evidence.confidence,
        Some(postern_broker::contract::ConfidenceSource::RemoteQuery)
    );
    let after = f.broker.journal.events(&out.invocation_id).unwrap();
    assert_eq!(&after[..before.len()], &before[..]);
    assert_eq!(server.effects(), 1);
    // The query ran as its own invocation, linked to the one it settled.
    let children = f.broker.journal.children(&out.invocation_id).unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    assert_eq!(children[0].relation, Relation::ReconcileQuery);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applied_then_closed_with_a_contract_retries_with_the_same_key_and_applies_once() {
    let server = Adversary::start(Behavior::Idempotent {
        header: "idempotency-key".into(),
        close_after_apply_first: true,
    })
    .await
    .unwrap();
    let f = fixture(&config(&server.base_url(), CONTRACT));
    let out = run(&f, post(server.url("/v1/payments"), "{\"amount\":5}")).await;
    assert_error(
        &out,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Retry::SameIdempotencyKey,
        Code::RemoteOutcomeUnknown,
    );
    let key = error(&out).evidence.idempotency.clone().unwrap();
    assert_eq!(key.scope.as_deref(), Some("payments.create"));
    assert_eq!(server.effects(), 1);

    let retried = f
        .broker
        .channel
        .retry(&out.invocation_id, &CallContext::default())
        .await;
    assert_eq!(
        retried.manifest.as_ref().unwrap().decision,
        Decision::RetrySameKey
    );
    assert_eq!(retried.outcome, Outcome::Committed, "{retried:?}");
    assert_eq!(retried.result.as_ref().unwrap().status, 201);
    assert_eq!(server.effects(), 1, "the server de-duplicated the retry");
    let keys: Vec<String> = server
        .requests()
        .iter()
        .filter_map(|r| r.header("idempotency-key").map(str::to_string))
        .collect();
    assert_eq!(
        keys,
        vec![key.key.clone(), key.key.clone()],
        "the retry reused the key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reusing_a_key_with_a_different_body_fails_locally_and_sends_nothing() {
    let server = Adversary::start(Behavior::idempotent("idempotency-key"))
        .await
        .unwrap();
    let f = fixture(&config(&server.base_url(), CONTRACT));
    let mut first = post(server.url("/v1/payments"), "{\"amount\":5}");
    first.idempotency_key = Some("order-42".into());
    let out = run(&f, first.clone()).await;
    assert_eq!(out.outcome, Outcome::Committed);
    let mut changed = first;
    changed.body = b"{\"amount\":500}".to_vec();
    let out = run(&f, changed).await;
    assert_error(
        &out,
        Phase::Validation,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        Code::IdempotencyMismatch,
    );
    assert_eq!(
        server.requests().len(),
        1,
        "nothing was sent for the mismatched request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_then_500_is_committed_and_never_replayed_for_a_post() {
    let server = Adversary::start(Behavior::ApplyThen500).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let out = run(&f, post(server.url("/v1/payments"), "{}")).await;
    assert_error(
        &out,
        Phase::RemoteExecution,
        Outcome::Committed,
        Retry::Reconcile,
        Code::RemoteServerError,
    );
    assert_eq!(out.result.as_ref().unwrap().status, 500);
    let retried = f
        .broker
        .channel
        .retry(&out.invocation_id, &CallContext::default())
        .await;
    assert_eq!(
        retried.manifest.unwrap().decision,
        Decision::ReturnRecordedResult
    );
    assert_eq!(
        retried.result.unwrap().status,
        500,
        "the recorded result, read back"
    );
    assert_eq!(server.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_401_is_rejected_and_needs_correction() {
    let server = Adversary::start(Behavior::status(401)).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let out = run(&f, get(server.url("/v1/me"))).await;
    assert_error(
        &out,
        Phase::RemoteExecution,
        Outcome::Rejected,
        Retry::AfterCorrection,
        Code::RemoteUnauthorized,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_429_with_retry_after_backs_off_only_when_repeating_is_safe() {
    let server = Adversary::start(Behavior::status(429).header("Retry-After", "2"))
        .await
        .unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let out = run(&f, get(server.url("/v1/items"))).await;
    assert_error(
        &out,
        Phase::RemoteExecution,
        Outcome::Rejected,
        Retry::Backoff,
        Code::RemoteRateLimited,
    );
    assert!(error(&out).evidence.not_before_ms.is_some());
    let out = run(&f, post(server.url("/v1/payments"), "{}")).await;
    assert_error(
        &out,
        Phase::RemoteExecution,
        Outcome::Rejected,
        Retry::Never,
        Code::RemoteRateLimited,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_202_settles_the_submission_and_records_the_status_resource() {
    let server = Adversary::start(Behavior::status(202).header("Location", "/v1/jobs/77"))
        .await
        .unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let out = run(&f, post(server.url("/v1/jobs"), "{}")).await;
    assert_eq!(out.outcome, Outcome::Committed);
    assert!(out.error.is_none());
    let p = f.broker.journal.projection(&out.invocation_id).unwrap();
    assert_eq!(p.evidence().status_resource.as_deref(), Some("/v1/jobs/77"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_another_origin_is_a_result_and_the_credential_never_crosses() {
    let other = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let location = other.url("/steal");
    let server = Adversary::start(Behavior::status(307).header("Location", &location))
        .await
        .unwrap();
    for follow in ["", "follow_redirects = true"] {
        let f = fixture(&config(&server.base_url(), follow));
        let out = run(&f, post(server.url("/v1/payments"), "{}")).await;
        assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
        assert_eq!(out.result.as_ref().unwrap().status, 307);
        let p = f.broker.journal.projection(&out.invocation_id).unwrap();
        assert_eq!(
            p.evidence().redirect_location.as_deref(),
            Some(location.as_str())
        );
    }
    assert_eq!(
        other.connections(),
        0,
        "the other origin was never contacted"
    );
    assert!(!other.saw(CANARY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_100_then_close_never_settles() {
    let server = Adversary::start(Behavior::ContinueThenClose).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let out = run(&f, post(server.url("/v1/payments"), "{\"amount\":5}")).await;
    assert_error(
        &out,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Retry::Reconcile,
        Code::RemoteOutcomeUnknown,
    );
    assert!(
        !error(&out).evidence.response_headers_received,
        "1xx is not the final response"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_body_is_incomplete_and_never_returned_as_a_result() {
    let server = Adversary::start(Behavior::ShortBody {
        declared: 100,
        sent: 50,
    })
    .await
    .unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let out = run(&f, post(server.url("/v1/payments"), "{}")).await;
    assert_error(
        &out,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Retry::Reconcile,
        Code::RemoteResultIncomplete,
    );
    assert!(out.result.is_none());
    let ev = &error(&out).evidence;
    assert!(ev.response_headers_received && !ev.response_complete);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_chunked_encoding_is_incomplete() {
    let server = Adversary::start(Behavior::BrokenChunked).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let out = run(&f, post(server.url("/v1/payments"), "{}")).await;
    assert_error(
        &out,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Retry::Reconcile,
        Code::RemoteResultIncomplete,
    );
    assert!(out.result.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_past_the_timeout_is_unknown_and_the_remote_may_still_run() {
    let server = Adversary::start(Behavior::Stall).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let mut request = post(server.url("/v1/payments"), "{}");
    request.timeout_ms = Some(300);
    let out = run(&f, request).await;
    assert_error(
        &out,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Retry::Reconcile,
        Code::RemoteTimeout,
    );
    assert!(server.wait_for_effects(1, Duration::from_secs(2)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_timeout_may_start_a_new_attempt() {
    let server = Adversary::start(Behavior::Stall).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let mut request = get(server.url("/v1/items"));
    request.timeout_ms = Some(300);
    let out = run(&f, request).await;
    assert_error(
        &out,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Retry::Backoff,
        Code::RemoteTimeout,
    );
    server.release();
    let retried = f
        .broker
        .channel
        .retry(&out.invocation_id, &CallContext::default())
        .await;
    assert_eq!(
        retried.manifest.as_ref().unwrap().verdict,
        Verdict::IdempotentSafe
    );
    assert_eq!(retried.outcome, Outcome::Committed, "{retried:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_cancellation_after_dispatch_keeps_the_outcome_unknown() {
    let server = Adversary::start(Behavior::Stall).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let ctx = CallContext::default();
    let cancel = ctx.cancel.clone();
    let waiter = {
        let server_effects = async {
            server.wait_for_effects(1, Duration::from_secs(3)).await;
            cancel.cancel();
        };
        let call = f
            .broker
            .channel
            .execute(post(server.url("/v1/payments"), "{}"), &ctx);
        let (out, ()) = tokio::join!(call, server_effects);
        out
    };
    assert_error(
        &waiter,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Retry::Reconcile,
        Code::CallerCancelled,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echoed_credential_is_redacted_from_the_result_and_counted() {
    let server = Adversary::start(Behavior::EchoAuthorization).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let out = run(&f, get(server.url("/v1/echo"))).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    let response = out.result.clone().unwrap();
    let body = String::from_utf8_lossy(&response.body);
    assert!(body.contains("[REDACTED]"), "{body}");
    assert!(server.saw(CANARY), "the server did receive the credential");
    let p = f.broker.journal.projection(&out.invocation_id).unwrap();
    assert!(
        p.redactions >= 2,
        "header and body copies counted: {}",
        p.redactions
    );
    let stored = f
        .broker
        .journal
        .read_result(p.result_id.as_deref().unwrap())
        .unwrap();
    assert!(!format!("{stored:?}").contains(CANARY));
    assert_no_canary(&f, &out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_header_is_refused_before_anything_is_touched() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let mut request = get(server.url("/v1/items"));
    request.headers = vec![("Authorization".into(), "Bearer mine".into())];
    let out = run(&f, request).await;
    assert_error(
        &out,
        Phase::Validation,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        Code::ForbiddenHeader,
    );
    assert_eq!(
        error(&out).evidence.field.as_deref(),
        Some("headers[0].name")
    );
    assert_eq!(server.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_body_is_a_payload_limit() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let f = fixture(&config(&server.base_url(), "max_request_body_bytes = 16"));
    let out = run(&f, post(server.url("/v1/payments"), &"x".repeat(17))).await;
    assert_error(
        &out,
        Phase::Validation,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        Code::PayloadLimit,
    );
    assert_eq!(error(&out).evidence.field.as_deref(), Some("body"));
    assert_eq!(server.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_url_is_an_invalid_target() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let out = run(&f, get(server.url("/v2/elsewhere"))).await;
    assert_error(
        &out,
        Phase::Validation,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        Code::InvalidTarget,
    );
    assert_eq!(error(&out).evidence.field.as_deref(), Some("url"));
    assert!(
        !error(&out).error.message.contains("api-key"),
        "no credential naming leaks"
    );
    assert_eq!(server.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_the_target_does_not_allow_is_unsupported() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let mut request = get(server.url("/v1/items"));
    request.method = "DELETE".into();
    let out = run(&f, request).await;
    assert_error(
        &out,
        Phase::Validation,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        Code::UnsupportedAction,
    );
    assert_eq!(error(&out).evidence.field.as_deref(), Some("method"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_credential_fails_in_injection_and_sends_nothing() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    f.broker.forget(&["api-key"]);
    let out = run(&f, get(server.url("/v1/items"))).await;
    assert_error(
        &out,
        Phase::CredentialInjection,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        Code::CredentialMissing,
    );
    assert_eq!(server.connections(), 0);
    // The agent learns that a credential is missing, not which one or where it lives.
    let message = &error(&out).error.message;
    assert!(message.contains("not in the keychain"), "{message}");
    assert!(!message.contains("api-key"), "{message}");
    assert!(!message.contains("postern vault"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_needs_approval_fails_fast_without_an_approver() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let text =
        config(&server.base_url(), "").replace("approval = \"none\"", "approval = \"per_call\"");
    let f = fixture(&text);
    let out = run(&f, get(server.url("/v1/items"))).await;
    assert_error(
        &out,
        Phase::CredentialInjection,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        Code::NoApprover,
    );
    assert_eq!(server.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_change_after_binding_is_refused_before_dispatch() {
    // A successful call first, to show the same request works under the old config.
    let server = Adversary::start(Behavior::Stall).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let mut request = get(server.url("/v1/items"));
    request.timeout_ms = Some(300);
    let out = run(&f, request).await;
    assert_eq!(out.outcome, Outcome::Unknown);
    // The target changes; a retry would now send under a different bound config.
    let changed = config(&server.base_url(), "").replace("timeout_ms = 3000", "timeout_ms = 4000");
    let path = f.dir.path().join("postern.toml");
    std::fs::write(&path, changed).unwrap();
    f.broker
        .config
        .replace(postern_broker::config::Config::load(&path).unwrap());
    let connections = server.connections();
    let retried = f
        .broker
        .channel
        .retry(&out.invocation_id, &CallContext::default())
        .await;
    assert_eq!(
        retried.outcome,
        Outcome::Unknown,
        "the old record is never mutated"
    );
    assert!(
        error(&retried)
            .error
            .message
            .contains("configuration changed")
    );
    assert_eq!(server.connections(), connections, "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_and_query_injection_reach_the_server_and_are_redacted_from_echoes() {
    let server = Adversary::start(Behavior::EchoAuthorization).await.unwrap();
    for inject in [r#"{ basic_user = "svc" }"#, r#"{ query = "api_key" }"#] {
        let text = config(&server.base_url(), "").replace(
            r#"{ header = "Authorization", format = "Bearer {secret}" }"#,
            inject,
        );
        let f = fixture(&text);
        let out = run(&f, get(server.url("/v1/echo"))).await;
        assert_eq!(out.outcome, Outcome::Committed, "{inject}: {out:?}");
        let body = String::from_utf8_lossy(&out.result.as_ref().unwrap().body).into_owned();
        assert!(body.contains("[REDACTED]"), "{inject}: {body}");
        assert_no_canary(&f, &out);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_while_the_server_holds_the_request_recovers_as_unknown() {
    let server = Adversary::start(Behavior::Stall).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let service = test_service();
    let text = config(&server.base_url(), "").replace("timeout_ms = 3000", "timeout_ms = 60000");
    let broker = open_broker(dir.path(), &text, &service).unwrap();
    broker.set_secret("api-key", CANARY).unwrap();
    broker.journal.clone().close().unwrap();

    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_http_child"))
        .arg(dir.path())
        .arg(&service)
        .arg(server.url("/v1/payments"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        server.wait_for_effects(1, Duration::from_secs(20)).await,
        "the request reached the server"
    );
    child.kill().unwrap(); // SIGKILL: no destructor, no clean shutdown
    child.wait().unwrap();

    let (before, env) =
        postern_tests::recovered_after_kill(&dir.path().join("journal.db")).unwrap();
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
            Retry::Reconcile
        )
    );
    broker.forget(&["api-key"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opted_in_same_target_redirect_is_a_new_linked_exchange() {
    let server = Adversary::start(Behavior::Sequence(vec![
        Behavior::status(307).header("Location", "/v1/final"),
        Behavior::ok_json("{\"final\":true}"),
    ]))
    .await
    .unwrap();
    let f = fixture(&config(&server.base_url(), "follow_redirects = true"));
    let out = run(&f, get(server.url("/v1/start"))).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert_eq!(out.result.as_ref().unwrap().status, 200);
    let seen = server.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].path(), "/v1/final");
    // Two invocations, each with its own dispatch record.
    let conn = rusqlite::Connection::open(f.dir.path().join("journal.db")).unwrap();
    let dispatches: i64 = conn
        .query_row(
            "SELECT count(*) FROM events WHERE kind = 'DISPATCH_STARTED'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(dispatches, 2);
    // The child names its parent; the parent lists the child.
    let child = f.broker.journal.projection(&out.invocation_id).unwrap();
    let link = child
        .evidence()
        .parent
        .expect("the followed request names its parent");
    assert_eq!(link.relation, Relation::Redirect);
    let parent = f.broker.journal.projection(&link.invocation_id).unwrap();
    assert_eq!(parent.evidence().http_status, Some(307));
    assert_eq!(parent.evidence().parent, None);
    let children = f.broker.journal.children(&link.invocation_id).unwrap();
    assert_eq!(children.len(), 1);
    assert_eq!(children[0].invocation_id, out.invocation_id);
    assert_eq!(children[0].relation, Relation::Redirect);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_idempotency_header_is_sent_to_a_target_without_a_contract() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let mut request = post(server.url("/v1/payments"), "{}");
    request.idempotency_key = Some("order-7".into());
    let out = run(&f, request).await;
    assert_eq!(out.outcome, Outcome::Committed);
    assert!(
        !server.saw("order-7"),
        "a key alone proves nothing; it is not sent"
    );
    let p = f.broker.journal.projection(&out.invocation_id).unwrap();
    let idem = p.evidence().idempotency.unwrap();
    assert_eq!(
        idem.remote_contract,
        postern_broker::contract::RemoteContract::None
    );
}

async fn compressed_echo(encoding: Encoding) -> (Fixture, Adversary, HttpOutcome) {
    let server = Adversary::start(Behavior::EchoCompressed { encoding })
        .await
        .unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let mut request = get(server.url("/v1/echo"));
    request.headers = vec![("accept".into(), "*/*".into())];
    let out = run(&f, request).await;
    (f, server, out)
}

/// A decoded echo: the decoded, scrubbed body, no coding left, the length corrected, the
/// coding recorded in the response and the stored meta, the echo counted.
fn assert_decoded_echo(f: &Fixture, server: &Adversary, out: &HttpOutcome, from: &str) {
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    let response = out.result.as_ref().unwrap();
    assert_eq!(response.body, b"secret=[REDACTED]", "{from}");
    assert_eq!(response.decoded_from.as_deref(), Some(from));
    assert_eq!(response.body_withheld, None);
    assert_eq!(response_header(out, "content-encoding"), None);
    assert_eq!(
        response_header(out, "content-length"),
        Some(response.body.len().to_string().as_str())
    );
    let stored = stored(f, out);
    assert_eq!(stored.meta["decoded_from"], from);
    assert_eq!(stored.streams[0].1, b"secret=[REDACTED]");
    let p = f.broker.journal.projection(&out.invocation_id).unwrap();
    assert!(p.redactions >= 1, "{}", p.redactions);
    assert!(server.saw(CANARY), "the server did receive the credential");
    assert_asked_for_identity(server);
    assert_no_canary(f, out);
}

// Regression: issue 10
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_echo_of_the_secret_is_decoded_before_scrubbing() {
    let (f, server, out) = compressed_echo(Encoding::Gzip).await;
    assert_decoded_echo(&f, &server, &out, "gzip");
}

// Regression: issue 10
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deflate_echo_in_zlib_or_raw_form_or_stacked_is_decoded_before_scrubbing() {
    for (encoding, from) in [
        (Encoding::Zlib, "deflate"),
        (Encoding::RawDeflate, "deflate"),
        (Encoding::GzipThenDeflate, "gzip, deflate"),
        (Encoding::Labelled("x-gzip".into()), "x-gzip"),
    ] {
        let (f, server, out) = compressed_echo(encoding).await;
        assert_decoded_echo(&f, &server, &out, from);
    }
}

// Regression: issue 10
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_transfer_coding_is_decoded_before_scrubbing() {
    let (f, server, out) = compressed_echo(Encoding::TransferGzip).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert_eq!(out.result.as_ref().unwrap().body, b"secret=[REDACTED]");
    assert_eq!(
        out.result.as_ref().unwrap().decoded_from.as_deref(),
        Some("gzip")
    );
    assert_asked_for_identity(&server);
    assert_no_canary(&f, &out);
}

// Regression: issue 10
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_encoding_is_a_committed_result_with_the_body_withheld() {
    use postern_broker::channel::http::BodyWithheld;
    let cases = [
        (
            Encoding::Labelled("br".into()),
            BodyWithheld::UnsupportedEncoding {
                coding: "br".into(),
            },
        ),
        (
            Encoding::Labelled("zstd".into()),
            BodyWithheld::UnsupportedEncoding {
                coding: "zstd".into(),
            },
        ),
        (
            Encoding::Labelled("gzip, x-unknown".into()),
            BodyWithheld::UnsupportedEncoding {
                coding: "x-unknown".into(),
            },
        ),
        (
            Encoding::Corrupt,
            BodyWithheld::UndecodableBody {
                coding: "gzip".into(),
            },
        ),
    ];
    for (encoding, reason) in cases {
        let (f, server, out) = compressed_echo(encoding).await;
        assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
        assert!(out.error.is_none(), "{out:?}");
        let response = out.result.as_ref().unwrap();
        assert_eq!(response.status, 200);
        assert!(response.body.is_empty(), "{response:?}");
        assert_eq!(response.body_withheld.as_ref(), Some(&reason));
        assert_eq!(response_header(&out, "content-encoding"), None);
        let stored = stored(&f, &out);
        assert!(stored.streams[0].1.is_empty());
        assert_eq!(
            serde_json::from_value::<BodyWithheld>(stored.meta["body_withheld"].clone()).unwrap(),
            reason
        );
        assert!(
            stored.meta["body_withheld"]["message"]
                .as_str()
                .unwrap()
                .contains("withheld")
        );
        // A read of the record gives the same withheld response.
        let rec =
            postern_broker::invocation::Recorder::resume(&f.broker.journal, &out.invocation_id)
                .unwrap();
        let again = f.broker.channel.recorded_outcome(&rec);
        assert_eq!(again.result.as_ref(), Some(response));
        assert_asked_for_identity(&server);
        assert_no_canary(&f, &out);
    }
}

// Regression: issue 10
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decompression_bomb_is_not_a_result() {
    let server = Adversary::start(Behavior::CompressionBomb { inflated: 64 << 20 })
        .await
        .unwrap();
    let f = fixture(&config(&server.base_url(), "max_response_bytes = 1048576"));
    let out = run(&f, get(server.url("/v1/bomb"))).await;
    let env = error(&out);
    assert_eq!(
        (env.error.phase, env.error.code),
        (Phase::RemoteExecution, Code::RemoteResultIncomplete),
        "{env:#?}"
    );
    assert!(out.result.is_none());
    let p = f.broker.journal.projection(&out.invocation_id).unwrap();
    assert!(p.result_id.is_none(), "nothing stored as a result");
    assert_no_canary(&f, &out);
}

// Regression: issue 10
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_set_accept_encoding_is_refused_before_anything_is_sent() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    for value in ["gzip", "identity", "br;q=1"] {
        let mut request = get(server.url("/v1/items"));
        request.headers = vec![("Accept-Encoding".into(), value.into())];
        let out = run(&f, request).await;
        assert_error(
            &out,
            Phase::Validation,
            Outcome::NotAttempted,
            Retry::AfterCorrection,
            Code::ForbiddenHeader,
        );
        assert_eq!(
            error(&out).evidence.field.as_deref(),
            Some("headers[0].name")
        );
        assert!(!error(&out).evidence.dispatch_started);
    }
    assert_eq!(server.connections(), 0);
}

// Regression: issue 10
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_asks_for_the_identity_coding() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let out = run(&f, post(server.url("/v1/payments"), "{}")).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert_eq!(out.result.as_ref().unwrap().decoded_from, None);
    assert_asked_for_identity(&server);
}

// Regression: issue 10
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoes_of_the_request_headers_in_many_encodings_are_all_scrubbed() {
    let server = Adversary::start(Behavior::EchoHeadersEncoded)
        .await
        .unwrap();
    for inject in [
        r#"{ header = "Authorization", format = "Bearer {secret}" }"#,
        r#"{ basic_user = "svc" }"#,
        r#"{ query = "api_key" }"#,
    ] {
        let text = config(&server.base_url(), "").replace(
            r#"{ header = "Authorization", format = "Bearer {secret}" }"#,
            inject,
        );
        let f = fixture(&text);
        let out = run(&f, get(server.url("/v1/echo"))).await;
        assert_eq!(out.outcome, Outcome::Committed, "{inject}: {out:?}");
        let response = out.result.as_ref().unwrap();
        let body = String::from_utf8_lossy(&response.body).into_owned();
        assert!(body.contains("[REDACTED]"), "{inject}: {body}");
        for (name, value) in &response.headers {
            let lower = value.to_lowercase();
            assert!(
                !lower.contains("pstn-canary") && !lower.contains(&hex::encode("canary")),
                "{inject}: header {name}: {value}"
            );
        }
        let p = f.broker.journal.projection(&out.invocation_id).unwrap();
        assert!(
            p.redactions >= 20,
            "{inject}: every echoed form counted: {}",
            p.redactions
        );
        assert!(
            !format!("{:?}", p.evidence()).contains(CANARY),
            "{inject}: the secret reached the evidence"
        );
        assert_no_canary(&f, &out);
    }
}

// ---- hardening: what cannot be sent is refused at validation ---------------------------

/// A validation refusal: nothing touched, the caller corrects `field`.
fn assert_refused(outcome: &HttpOutcome, code: Code, field: &str) {
    assert_error(
        outcome,
        Phase::Validation,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        code,
    );
    assert_eq!(
        error(outcome).evidence.field.as_deref(),
        Some(field),
        "{outcome:?}"
    );
    assert!(!error(outcome).evidence.dispatch_started);
}

/// What a case got instead of the expected validation refusal, if anything.
fn refusal_mismatch(outcome: &HttpOutcome, code: Code, field: &str) -> Option<String> {
    let Some(env) = outcome.error.as_ref() else {
        return Some(format!("no refusal: {:?}", outcome.outcome));
    };
    let got = (
        env.error.phase,
        env.error.outcome,
        env.error.retry,
        env.error.code,
        env.evidence.field.as_deref(),
    );
    let want = (
        Phase::Validation,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        code,
        Some(field),
    );
    (got != want || env.evidence.dispatch_started).then(|| format!("{got:?}"))
}

/// The server saw no connection and no request.
fn assert_server_untouched(server: &Adversary, case: &str) {
    assert_eq!(server.connections(), 0, "{case}: a connection was opened");
    assert!(
        server.requests().is_empty(),
        "{case}: a request reached the server"
    );
}

// Regression: issue 10
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_the_http_stack_cannot_build_are_refused_at_validation_and_send_nothing() {
    let server = Adversary::start(Behavior::idempotent("idempotency-key"))
        .await
        .unwrap();
    // The contract makes the key travel as a header value.
    let f = fixture(&config(&server.base_url(), CONTRACT));
    let keyed = |key: &str| {
        let mut request = post(server.url("/v1/payments"), "{}");
        request.idempotency_key = Some(key.to_string());
        request
    };
    let with_query = |query: Vec<(String, String)>| {
        let mut request = get(server.url("/v1/items"));
        request.query = query;
        request
    };
    let with_header = |name: &str, value: &str| {
        let mut request = get(server.url("/v1/items"));
        request.headers = vec![(name.to_string(), value.to_string())];
        request
    };
    let pairs = |n: usize, value: &str| -> Vec<(String, String)> {
        (0..n)
            .map(|i| (format!("p{i}"), value.to_string()))
            .collect()
    };
    let cases: Vec<(&str, HttpRequest, Code, &str)> = vec![
        (
            "key with CR LF",
            keyed("k\r\nX-Evil: 1"),
            Code::InvalidRequest,
            "idempotency_key",
        ),
        (
            "key with LF",
            keyed("k\nx"),
            Code::InvalidRequest,
            "idempotency_key",
        ),
        (
            "key with NUL",
            keyed("k\0x"),
            Code::InvalidRequest,
            "idempotency_key",
        ),
        (
            "key with DEL",
            keyed("k\u{7f}"),
            Code::InvalidRequest,
            "idempotency_key",
        ),
        (
            "key with a space",
            keyed("order 42"),
            Code::InvalidRequest,
            "idempotency_key",
        ),
        (
            "key not ASCII",
            keyed("ключ"),
            Code::InvalidRequest,
            "idempotency_key",
        ),
        (
            "empty key",
            keyed(""),
            Code::InvalidRequest,
            "idempotency_key",
        ),
        (
            "key of 256 bytes",
            keyed(&"k".repeat(256)),
            Code::PayloadLimit,
            "idempotency_key",
        ),
        (
            "key of 1 MB",
            keyed(&"k".repeat(1 << 20)),
            Code::PayloadLimit,
            "idempotency_key",
        ),
        (
            "URL of 1 MB",
            get(server.url(&format!("/v1/{}", "a".repeat(1 << 20)))),
            Code::PayloadLimit,
            "url",
        ),
        (
            "URL one byte over 8 KiB",
            get(format!(
                "{}{}",
                server.url("/v1/"),
                "a".repeat(8 * 1024 + 1 - server.url("/v1/").len())
            )),
            Code::PayloadLimit,
            "url",
        ),
        (
            "URL with 100k query pairs",
            get(format!(
                "{}?{}",
                server.url("/v1/items"),
                "a=1&".repeat(100_000)
            )),
            Code::PayloadLimit,
            "url",
        ),
        (
            "100k query pairs",
            with_query(pairs(100_000, "x")),
            Code::PayloadLimit,
            "query",
        ),
        (
            "1025 query pairs",
            with_query(pairs(1025, "")),
            Code::PayloadLimit,
            "query",
        ),
        (
            "query over 8 KiB once encoded",
            with_query(pairs(3, &"é".repeat(1000))),
            Code::PayloadLimit,
            "query",
        ),
        (
            "header value with CR LF",
            with_header("x-note", "a\r\nX-Evil: 1"),
            Code::InvalidRequest,
            "headers[0].value",
        ),
        (
            "header value with NUL",
            with_header("x-note", "a\0b"),
            Code::InvalidRequest,
            "headers[0].value",
        ),
        (
            "header name with a colon",
            with_header("x-note:", "a"),
            Code::InvalidRequest,
            "headers[0].name",
        ),
        (
            "header name with a space",
            with_header("x note", "a"),
            Code::InvalidRequest,
            "headers[0].name",
        ),
    ];
    let total = cases.len();
    let mut wrong = Vec::new();
    for (case, request, code, field) in cases {
        let out = run(&f, request).await;
        assert_no_canary(&f, &out);
        if let Some(got) = refusal_mismatch(&out, code, field) {
            wrong.push(format!("{case}: {got}"));
        }
    }
    println!(
        "header-build matrix: {}/{total} cases refused at validation with their code and field; \
         the server saw {} connections and {} requests",
        total - wrong.len(),
        server.connections(),
        server.requests().len()
    );
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert_server_untouched(&server, "header-build matrix");

    // The limits are limits, not bans: a key of 255 visible bytes and a URL of exactly
    // 8 KiB are sent.
    let out = run(&f, keyed(&format!("{}~", "K".repeat(254)))).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    let url = format!(
        "{}{}",
        server.url("/v1/"),
        "a".repeat(8 * 1024 - server.url("/v1/").len())
    );
    // The API answers an unknown GET with 404: a response, so the request went out.
    let out = run(&f, get(url)).await;
    assert_eq!(out.result.as_ref().map(|r| r.status), Some(404), "{out:?}");
    assert_eq!(server.requests().len(), 2);
}

// Regression: issue 10
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_the_http_stack_cannot_send_is_not_reported_as_a_connection_failure() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    // A secret pasted with its line break renders an invalid Authorization value.
    f.broker
        .set_secret("api-key", &format!("{CANARY}\r\nX-Injected: 1"))
        .unwrap();
    let out = run(&f, get(server.url("/v1/items"))).await;
    assert_error(
        &out,
        Phase::Validation,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        Code::InvalidRequest,
    );
    assert!(
        error(&out).evidence.attempts.is_empty(),
        "no connection attempt was made or recorded: {out:?}"
    );
    assert_server_untouched(&server, "secret with CR LF");
    assert_no_canary(&f, &out);
}

// Regression: issue 10
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_timeout_is_refused_at_validation() {
    let server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let f = fixture(&config(&server.base_url(), ""));
    let mut request = get(server.url("/v1/items"));
    request.timeout_ms = Some(0);
    let out = run(&f, request).await;
    assert_refused(&out, Code::InvalidRequest, "timeout_ms");
    assert_server_untouched(&server, "timeout_ms 0");
    // One millisecond is small but means something; the target's timeout caps the rest.
    let mut request = get(server.url("/v1/items"));
    request.timeout_ms = Some(u64::MAX);
    let out = run(&f, request).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
}

// Regression: issue 10
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parameter_a_server_could_read_as_the_injected_one_is_refused() {
    let server = Adversary::start(Behavior::EchoAuthorization).await.unwrap();
    let text = config(&server.base_url(), "").replace(
        r#"{ header = "Authorization", format = "Bearer {secret}" }"#,
        r#"{ query = "token" }"#,
    );
    let f = fixture(&text);
    let in_url = [
        "token=x",
        "TOKEN=x",
        "Token=x",
        "token[]=x",
        "token%5B%5D=x",
        "token%5b%5d=x",
        "Token[0]=x",
        "token[a][b]=x",
        "%20token=x",
        "+token=x",
        "token%20=x",
        "%74oken=x",
        "%54OKEN=x",
        "a=1;token=x",
        "ok=1&token",
    ];
    let as_argument = ["token", "TOKEN", "token[]", "Token[0]", " token", "token "];
    let mut requests: Vec<(String, HttpRequest, &str)> = Vec::new();
    for query in in_url {
        let url = format!("{}?{query}", server.url("/v1/echo"));
        requests.push((format!("url ?{query}"), get(url), "url"));
    }
    for name in as_argument {
        let mut request = get(server.url("/v1/echo"));
        request.query = vec![("page".into(), "2".into()), (name.to_string(), "x".into())];
        requests.push((format!("query {name:?}"), request, "query[1].name"));
    }
    let total = requests.len();
    let mut wrong = Vec::new();
    for (case, request, field) in requests {
        let before = server.requests().len();
        let out = run(&f, request).await;
        let sent = server.requests().len() - before;
        if let Some(got) = refusal_mismatch(&out, Code::InvalidRequest, field) {
            wrong.push(format!("{case}: {got}, {sent} request(s) sent"));
        }
    }
    println!(
        "query pollution: {}/{total} spellings refused at validation; {} reached the server",
        total - wrong.len(),
        server.requests().len()
    );
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert_server_untouched(&server, "query pollution");

    // Names that only contain it are other parameters, and are sent.
    let mut request = get(format!(
        "{}?tokens=1&my_token=2&token_id=3",
        server.url("/v1/echo")
    ));
    request.query = vec![("x-token".into(), "4".into())];
    let out = run(&f, request).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    let seen = server.requests();
    assert_eq!(seen.len(), 1);
    let sent = seen[0].query().unwrap_or_default().to_string();
    assert!(
        sent.starts_with("tokens=1&my_token=2&token_id=3&x-token=4&token="),
        "{sent}"
    );
}

const JOB: &str = r#"
[http.job]
id_pointer = "/id"
state_pointer = "/state"
pending = ["queued", "running"]
succeeded = ["done"]
failed = ["error"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_202_starts_a_linked_job_that_polls_settle_and_the_submission_stays_committed() {
    let server = Adversary::start(Behavior::Sequence(vec![
        Behavior::respond(202, "{\"id\":\"job-7\"}").header("Location", "/v1/jobs/7"),
        Behavior::respond(202, "{\"state\":\"queued\"}"),
        Behavior::ok_json("{\"state\":\"running\"}"),
        Behavior::ok_json("{\"state\":\"done\"}"),
    ]))
    .await
    .unwrap();
    let f = fixture(&config(&server.base_url(), JOB));
    let submitted = run(&f, post(server.url("/v1/exports"), "{}")).await;
    assert_eq!(submitted.outcome, Outcome::Committed, "{submitted:?}");
    let submission = &submitted.invocation_id;

    // The job is its own invocation, named by the submission's children.
    let children = f.broker.journal.children(submission).unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    assert_eq!(children[0].relation, Relation::Job);
    let job_id = children[0].invocation_id.clone();
    let job = f.broker.journal.projection(&job_id).unwrap();
    let facts = job.job.clone().unwrap();
    assert_eq!(facts.job_id.as_deref(), Some("job-7"));
    assert_eq!(facts.status_resource, server.url("/v1/jobs/7"));
    assert!(facts.pollable);
    assert_eq!(job.outcome, Outcome::Unknown);
    assert_eq!(job.effective_code(), Some(Code::JobPending));
    assert_eq!(job.retry(0), Retry::Reconcile);

    // Polling through the submission's id or the job's: pending, pending, done.
    let ctx = CallContext::default();
    for (by, expected) in [
        (submission.as_str(), JobState::Pending),
        (job_id.as_str(), JobState::Pending),
        (job_id.as_str(), JobState::Succeeded),
    ] {
        let polled = f.broker.channel.poll_job(by, &ctx).await.unwrap();
        let poll = polled.poll.expect("a pending job is read");
        assert_eq!(poll.outcome, Outcome::Committed, "{poll:?}");
        let p = f.broker.journal.projection(&poll.invocation_id).unwrap();
        assert_eq!(
            p.parent
                .as_ref()
                .map(|l| (l.invocation_id.as_str(), l.relation)),
            Some((job_id.as_str(), Relation::JobPoll))
        );
        assert_eq!(
            f.broker
                .journal
                .projection(&job_id)
                .unwrap()
                .job
                .unwrap()
                .state,
            expected
        );
    }
    let job = f.broker.journal.projection(&job_id).unwrap();
    assert_eq!(job.outcome, Outcome::Committed);
    assert_eq!(job.effective_code(), None);
    assert_eq!(job.job.as_ref().unwrap().polls, 3);
    // A settled job is answered from its record: nothing more is sent.
    let again = f.broker.channel.poll_job(&job_id, &ctx).await.unwrap();
    assert!(again.poll.is_none());
    assert_eq!(again.job.outcome, Outcome::Committed);
    let seen = server.requests();
    assert_eq!(seen.len(), 4, "one submission, three reads");
    assert!(seen[1..].iter().all(|r| r.path() == "/v1/jobs/7"));
    assert_eq!(
        seen.iter().filter(|r| r.path() == "/v1/exports").count(),
        1,
        "the submission is never repeated"
    );
    // The submission itself is unchanged: committed by its 202.
    let sub = f.broker.journal.projection(submission).unwrap();
    assert_eq!(sub.outcome, Outcome::Committed);
    assert_eq!(sub.evidence().http_status, Some(202));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_reports_failure_is_committed_with_job_failed_and_a_foreign_status_url_is_never_read()
 {
    let server = Adversary::start(Behavior::Sequence(vec![
        Behavior::respond(202, "{}").header("Location", "/v1/jobs/8"),
        Behavior::ok_json("{\"state\":\"error\"}"),
        Behavior::respond(202, "{}").header("Location", "https://elsewhere.example.test/jobs/9"),
    ]))
    .await
    .unwrap();
    let f = fixture(&config(&server.base_url(), &format!("{JOB}{LOOKUP}")));
    let ctx = CallContext::default();
    let first = run(&f, post(server.url("/v1/exports"), "{}")).await;
    let polled = f
        .broker
        .channel
        .poll_job(&first.invocation_id, &ctx)
        .await
        .unwrap();
    assert_eq!(polled.job.outcome, Outcome::Committed);
    let env = polled.job.error.expect("a failed job carries its code");
    assert_eq!(env.error.code, Code::JobFailed);
    assert_eq!(env.error.retry, Retry::Reconcile);

    // A status resource outside the target is recorded, and the credential never goes there.
    let second = run(&f, post(server.url("/v1/exports"), "{}")).await;
    let polled = f
        .broker
        .channel
        .poll_job(&second.invocation_id, &ctx)
        .await
        .unwrap();
    assert!(polled.poll.is_none());
    assert_eq!(polled.job.outcome, Outcome::Unknown);
    let job = f
        .broker
        .journal
        .projection(&polled.job.invocation_id)
        .unwrap();
    assert!(!job.job.unwrap().pollable);
    assert_eq!(server.requests().len(), 3);
    // The target's query is about submissions: it never settles a job.
    let reconciled = f
        .broker
        .channel
        .reconcile(&polled.job.invocation_id, "operator")
        .await;
    assert_eq!(reconciled.outcome, Outcome::Unknown);
    assert_eq!(server.requests().len(), 3);

    // A plain 200 queued nothing: poll_job refuses, naming why.
    let plain = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let g = fixture(&config(&plain.base_url(), ""));
    let done = run(&g, get(plain.url("/v1/items"))).await;
    let refused = g.broker.channel.poll_job(&done.invocation_id, &ctx).await;
    assert!(
        matches!(
            refused,
            Err(postern_broker::operations::PollRefused::NotAJob(_))
        ),
        "{refused:?}"
    );
}

const BATCH: &str = r#"
[http.batch]
path = "/batch"
members = "/items"
member_id = "/id"
results = "/results"
result_id = "/id"
status = "/status"
applied = ["201"]
not_applied = ["409", "422"]
partial_header = "X-Partial"

[http.batch.query]
method = "GET"
path = "/items/{member_id}"
committed_status = [200]
not_applied_status = [404]
"#;

const FIVE: &str = r#"{"items":[{"id":"a"},{"id":"b"},{"id":"c"},{"id":"d"},{"id":"e"}]}"#;

fn member_outcomes(p: &postern_broker::journal::projection::Projection) -> Vec<(String, Outcome)> {
    p.members
        .iter()
        .map(|m| (m.id.clone(), m.outcome))
        .collect()
}

fn expect_members(
    p: &postern_broker::journal::projection::Projection,
    expected: &[(&str, Outcome)],
) {
    let expected: Vec<(String, Outcome)> = expected
        .iter()
        .map(|(id, o)| (id.to_string(), *o))
        .collect();
    assert_eq!(member_outcomes(p), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_applied_three_of_five_then_closed_is_reconciled_member_by_member() {
    let server = Adversary::start(Behavior::BatchApplyThenCloseWithLookup { apply: 3 })
        .await
        .unwrap();
    let f = fixture(&config(&server.base_url(), BATCH));
    let out = run(&f, post(server.url("/v1/batch"), FIVE)).await;
    assert_error(
        &out,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Retry::Reconcile,
        Code::RemoteOutcomeUnknown,
    );
    assert_eq!(server.effects(), 3, "the origin applied three members");
    let p = f.broker.journal.projection(&out.invocation_id).unwrap();
    use Outcome::{Committed, Rejected, Unknown};
    expect_members(
        &p,
        &[
            ("a", Unknown),
            ("b", Unknown),
            ("c", Unknown),
            ("d", Unknown),
            ("e", Unknown),
        ],
    );

    // retry_invocation never resends the batch; the manifest lists what each member needs.
    let retried = f
        .broker
        .channel
        .retry(&out.invocation_id, &CallContext::default())
        .await;
    let manifest = retried.manifest.clone().unwrap();
    assert_eq!(manifest.decision, Decision::Reconcile);
    assert_eq!(manifest.verdict, Verdict::QueryFirstRequired);
    assert_eq!(manifest.facts.members.len(), 5);
    let queries: Vec<String> = manifest
        .facts
        .members
        .iter()
        .map(|m| m.query.as_ref().unwrap().path.clone())
        .collect();
    assert_eq!(
        queries,
        ["/items/a", "/items/b", "/items/c", "/items/d", "/items/e"]
    );
    assert!(
        manifest
            .directive
            .contains("0 applied, 0 not applied, 5 unknown"),
        "{}",
        manifest.directive
    );
    postern_broker::retry::verify_manifest(&manifest, Some(&f.broker.journal.verifying_key()))
        .unwrap();
    assert_eq!(server.effects(), 3, "nothing was resent");

    // Reconciliation asks about each member, then settles the batch as a whole.
    let settled = f
        .broker
        .channel
        .reconcile(&out.invocation_id, "operator")
        .await;
    assert_eq!(settled.outcome, Outcome::Committed, "{settled:?}");
    assert_eq!(error(&settled).error.code, Code::ReconciledCommitted);
    let p = f.broker.journal.projection(&out.invocation_id).unwrap();
    expect_members(
        &p,
        &[
            ("a", Committed),
            ("b", Committed),
            ("c", Committed),
            ("d", Rejected),
            ("e", Rejected),
        ],
    );
    assert_eq!(
        error(&settled).evidence.members.len(),
        5,
        "the evidence carries every member"
    );
    let lookups: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.method == "GET")
        .map(|r| r.path().to_string())
        .collect();
    assert_eq!(
        lookups,
        [
            "/v1/items/a",
            "/v1/items/b",
            "/v1/items/c",
            "/v1/items/d",
            "/v1/items/e"
        ]
    );
    let children = f.broker.journal.children(&out.invocation_id).unwrap();
    assert_eq!(children.len(), 5);
    assert!(
        children
            .iter()
            .all(|c| c.relation == Relation::ReconcileQuery)
    );

    // Afterwards the manifest says which members may be resent: only those not applied.
    let after = f
        .broker
        .channel
        .retry(&out.invocation_id, &CallContext::default())
        .await;
    let manifest = after.manifest.unwrap();
    assert_eq!(manifest.decision, Decision::ReturnRecordedResult);
    assert!(
        manifest
            .directive
            .contains("3 applied, 2 not applied, 0 unknown"),
        "{}",
        manifest.directive
    );
    assert!(manifest.facts.members.iter().all(|m| m.query.is_none()));
    assert_eq!(server.effects(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_partial_batch_response_settles_each_member_and_is_never_resent_whole() {
    let body = r#"{"results":[
        {"id":"a","status":201},{"id":"b","status":201},{"id":"c","status":409},
        {"id":"d","status":201}]}"#;
    let server = Adversary::start(
        Behavior::respond(207, body)
            .header("content-type", "application/json")
            .header("X-Partial", "true"),
    )
    .await
    .unwrap();
    let f = fixture(&config(&server.base_url(), BATCH));
    let out = run(&f, post(server.url("/v1/batch"), FIVE)).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    let env = error(&out);
    assert_eq!(env.error.code, Code::BatchPartial);
    assert_eq!(env.error.retry, Retry::Never);
    let p = f.broker.journal.projection(&out.invocation_id).unwrap();
    use Outcome::{Committed, Rejected, Unknown};
    expect_members(
        &p,
        &[
            ("a", Committed),
            ("b", Committed),
            ("c", Rejected),
            ("d", Committed),
            ("e", Unknown),
        ],
    );
    let facts = p.result_facts.clone().unwrap().batch.unwrap();
    assert!(facts.partial_signature);
    assert_eq!(facts.members[2].status.as_deref(), Some("409"));

    // A refused batch (all members not applied) is rejected as a whole.
    let refused = r#"{"results":[{"id":"a","status":422},{"id":"b","status":409}]}"#;
    let server = Adversary::start(Behavior::respond(200, refused))
        .await
        .unwrap();
    let f = fixture(&config(&server.base_url(), BATCH));
    let two = r#"{"items":[{"id":"a"},{"id":"b"}]}"#;
    let out = run(&f, post(server.url("/v1/batch"), two)).await;
    assert_eq!(out.outcome, Outcome::Rejected, "{out:?}");
    assert_eq!(error(&out).error.code, Code::RemoteRejected);

    // A batch body the contract cannot read is refused before anything is sent.
    let out = run(&f, post(server.url("/v1/batch"), r#"{"items":[{"x":1}]}"#)).await;
    assert_error(
        &out,
        Phase::Validation,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        Code::InvalidRequest,
    );
    assert_eq!(error(&out).evidence.field.as_deref(), Some("body"));
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atomic_batch_applies_every_member_with_one_answer() {
    let server = Adversary::start(Behavior::respond(200, "{}"))
        .await
        .unwrap();
    let atomic = BATCH.replace("partial_header = \"X-Partial\"", "atomic = true");
    let f = fixture(&config(&server.base_url(), &atomic));
    let out = run(&f, post(server.url("/v1/batch"), FIVE)).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert!(out.error.is_none(), "{out:?}");
    let p = f.broker.journal.projection(&out.invocation_id).unwrap();
    assert!(p.members.iter().all(|m| m.outcome == Outcome::Committed));
    assert_eq!(p.members.len(), 5);
}

// ---- the resolved-address guard (issue 13, item 4) ----------------------------------

/// A broker whose resolver maps `other.test` (the name `TestCert::WrongName` carries) to
/// `addrs`, with a TLS origin for that name on 127.0.0.1. `extra` is appended to the
/// target; `approval` replaces its approval mode.
async fn guarded_case(
    addrs: &[&str],
    extra: &str,
    approval: &str,
) -> (Fixture, Adversary, Resolver) {
    let pki = TestPki::new().unwrap();
    let server = Adversary::start_tls(
        Behavior::ok_json("{\"ok\":true}"),
        TestCert::WrongName,
        &pki,
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    pki.write_ca(dir.path()).unwrap();
    let base = format!("https://other.test:{}", server.addr().port());
    let text = config(
        &base,
        &format!("ca_file = \"postern-test-ca.pem\"\n{extra}"),
    )
    .replace("approval = \"none\"", &format!("approval = \"{approval}\""));
    let resolver = Resolver::with_hosts([(
        "other.test",
        addrs.iter().map(|a| a.parse().unwrap()).collect(),
    )]);
    let broker = open_broker_resolving(
        dir.path(),
        &text,
        &test_service(),
        KeychainBackend::SecretService,
        resolver.clone(),
    )
    .unwrap();
    broker.set_secret("api-key", CANARY).unwrap();
    (Fixture { dir, broker }, server, resolver)
}

fn other_url(server: &Adversary, path: &str) -> String {
    format!("https://other.test:{}{path}", server.addr().port())
}

fn assert_address_refused(outcome: &HttpOutcome, address: &str) {
    assert_error(
        outcome,
        Phase::ConnectionSetup,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        Code::AddressRefused,
    );
    let env = error(outcome);
    assert_eq!(env.evidence.attempts.len(), 1, "{env:#?}");
    assert_eq!(env.evidence.attempts[0].stage, Stage::AddressGuard);
    assert_eq!(env.evidence.attempts[0].code, Code::AddressRefused);
    assert!(!env.evidence.dispatch_started);
    assert!(env.error.message.contains(address), "{}", env.error.message);
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_resolving_to_the_metadata_address_is_refused_before_any_connection() {
    // The reachable loopback address comes first: a client that tried addresses in order
    // and skipped the refused one would connect to it. Even allow_private does not open
    // the metadata service.
    let (f, server, _) = guarded_case(
        &["127.0.0.1", "169.254.169.254"],
        "allow_private = true",
        "none",
    )
    .await;
    let out = run(&f, post(other_url(&server, "/v1/payments"), "{}")).await;
    assert_address_refused(&out, "169.254.169.254");
    assert_eq!(server.connections(), 0, "no TCP connection was made");
    // The IPv4-mapped form is the same address.
    let (f, server, _) =
        guarded_case(&["::ffff:169.254.169.254"], "allow_private = true", "none").await;
    let out = run(&f, get(other_url(&server, "/v1/x"))).await;
    assert_address_refused(&out, "169.254.169.254");
    assert_eq!(server.connections(), 0);
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_name_resolving_to_loopback_is_refused_unless_the_target_allows_private() {
    let (f, server, _) = guarded_case(&["127.0.0.1"], "", "none").await;
    let out = run(&f, get(other_url(&server, "/v1/x"))).await;
    assert_address_refused(&out, "127.0.0.1");
    assert_eq!(server.connections(), 0, "no TCP connection was made");

    let (f, server, _) = guarded_case(&["127.0.0.1"], "allow_private = true", "none").await;
    let out = run(&f, get(other_url(&server, "/v1/x"))).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert_eq!(out.result.as_ref().unwrap().status, 200);
    assert_eq!(server.connections(), 1);
    assert_eq!(server.requests().len(), 1);
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approval_card_shows_the_resolved_address_and_the_guard_rechecks_at_connect() {
    let (f, server, resolver) =
        guarded_case(&["127.0.0.1"], "allow_private = true", "per_call").await;
    let approvals = Arc::new(Approvals::new(
        Duration::from_secs(10),
        Arc::new(SystemClock),
    ));
    let ctx = CallContext {
        session: Some("s1".into()),
        approver: Some(approvals.clone()),
        ..Default::default()
    };
    let request = get(other_url(&server, "/v1/x"));
    let (out, ()) = tokio::join!(f.broker.channel.execute(request, &ctx), async {
        let p = loop {
            if let Some(p) = approvals.pending().into_iter().next() {
                break p;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(p.request.card().resolved.as_deref(), Some("127.0.0.1"));
        // The name rebinds to the metadata address after the person saw the card.
        assert!(resolver.set_host("other.test", vec!["169.254.169.254".parse().unwrap()]));
        approvals
            .approve(&p.request.invocation_id, &p.request.fingerprint, "alice")
            .unwrap();
    });
    assert_address_refused(&out, "169.254.169.254");
    assert_eq!(server.connections(), 0);
}
