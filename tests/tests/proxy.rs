//! The HTTP channel through an HTTP proxy (issue 13, item 6): a CONNECT tunnel for https
//! and plain http alike, the tunnel recorded as its own setup stage (`proxy_tunnel`),
//! and every proxy failure before dispatch proven `not_attempted` with the proxy named
//! as the hop that answered. The proxy and the origins are real sockets on 127.0.0.1.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use postern_broker::approvals::Approvals;
use postern_broker::channel::guard::Resolver;
use postern_broker::channel::http::{HttpOutcome, HttpRequest};
use postern_broker::clock::SystemClock;
use postern_broker::config::proxy::ProxyEnv;
use postern_broker::contract::{Code, Outcome, Phase, Retry, Stage};
use postern_broker::invocation::CallContext;
use postern_broker::journal::events::EventBody;
use postern_broker::vault::KeychainBackend;
use postern_tests::adversary::{Adversary, Behavior, TestCert, TestPki, refused_addr};
use postern_tests::calls::{assert_error, error, get, post};
use postern_tests::fixture::{Broker, open_broker_in_env, test_service};
use postern_tests::proxy::{ProxyBehavior, TestProxy};

const CANARY: &str = "pstn-canary-proxy-51d0e2";
const PROXY_USER: &str = "proxy-user";
const PROXY_PASSWORD: &str = "pxy-pass-9c1e77a0";

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
methods = ["GET", "POST"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "none"
idempotent_methods = ["GET"]
timeout_ms = 3000
{extra}
"#
    )
}

/// A broker in a fresh dir (with the test CA as `postern-test-ca.pem`) whose targets are
/// loaded under `env` and whose resolver is `resolver`.
fn fixture_with(text: &str, pki: Option<&TestPki>, env: &ProxyEnv, resolver: Resolver) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    if let Some(pki) = pki {
        pki.write_ca(dir.path()).unwrap();
    }
    let broker = open_broker_in_env(
        dir.path(),
        text,
        &test_service(),
        KeychainBackend::SecretService,
        resolver,
        env,
    )
    .unwrap();
    broker.set_secret("api-key", CANARY).unwrap();
    Fixture { dir, broker }
}

fn fixture(text: &str, pki: Option<&TestPki>) -> Fixture {
    fixture_with(text, pki, &ProxyEnv::default(), Resolver::system())
}

/// The body every payment in these tests carries.
const PAYMENT: &str = "{\"amount\":1}";

/// `proxy = "<url>"` plus the test CA.
fn via(proxy: &str) -> String {
    format!("proxy = \"{proxy}\"\nca_file = \"postern-test-ca.pem\"")
}

async fn run(f: &Fixture, request: HttpRequest) -> HttpOutcome {
    f.broker
        .channel
        .execute(request, &CallContext::default())
        .await
}

/// Every recorded setup attempt is at `stage` with `code`, through `proxy`.
fn assert_attempts(outcome: &HttpOutcome, n: usize, stage: Stage, code: Code, proxy: &str) {
    let ev = &error(outcome).evidence;
    assert_eq!(ev.attempts.len(), n, "{ev:#?}");
    for a in &ev.attempts {
        assert_eq!(
            (a.stage, a.code, a.outcome),
            (stage, code, Outcome::NotAttempted)
        );
        assert_eq!(
            a.via.as_deref(),
            Some(proxy),
            "the proxy is named as the hop"
        );
    }
    assert!(!ev.dispatch_started);
}

async fn tls_origin(pki: &TestPki, cert: TestCert) -> Adversary {
    Adversary::start_tls(Behavior::ok_json("{\"ok\":true}"), cert, pki)
        .await
        .unwrap()
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_origin_is_reached_through_the_tunnel_with_its_certificate_verified() {
    let pki = TestPki::new().unwrap();
    let origin = tls_origin(&pki, TestCert::Valid).await;
    let proxy = TestProxy::start(ProxyBehavior::Tunnel).await.unwrap();
    let f = fixture(&config(&origin.base_url(), &via(&proxy.url())), Some(&pki));
    let out = run(&f, post(origin.url("/v1/payments"), PAYMENT)).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert_eq!(out.result.as_ref().unwrap().status, 200);
    assert_eq!(proxy.tunnels(), 1);
    let connects = proxy.connects();
    assert_eq!(connects.len(), 1);
    assert_eq!(
        connects[0].target,
        format!("localhost:{}", origin.addr().port())
    );
    assert!(connects[0].proxy_authorization.is_none());
    // The origin got the request itself, in origin form, with the credential: the proxy
    // only saw the CONNECT line and TLS bytes.
    let requests = origin.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].target, "/v1/payments");
    assert_eq!(
        requests[0].header("authorization"),
        Some(format!("Bearer {CANARY}").as_str())
    );
    assert!(!connects[0].head.contains(CANARY));
    let p = f.broker.journal.projection(&out.invocation_id).unwrap();
    assert!(
        p.evidence()
            .peer_identity
            .unwrap()
            .starts_with("cert-blake3:"),
        "the origin's identity is verified and bound as without a proxy"
    );
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_name_certificate_is_still_rejected_through_the_tunnel() {
    let pki = TestPki::new().unwrap();
    let origin = tls_origin(&pki, TestCert::WrongName).await;
    let proxy = TestProxy::start(ProxyBehavior::Tunnel).await.unwrap();
    let f = fixture(&config(&origin.base_url(), &via(&proxy.url())), Some(&pki));
    let out = run(&f, post(origin.url("/v1/payments"), PAYMENT)).await;
    assert_error(
        &out,
        Phase::ConnectionSetup,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        Code::TlsRejected,
    );
    assert_attempts(
        &out,
        1,
        Stage::TlsHandshake,
        Code::TlsRejected,
        &proxy.authority(),
    );
    let message = &error(&out).error.message;
    assert!(
        message.contains("not valid for this host name"),
        "{message}"
    );
    assert_eq!(
        proxy.tunnels(),
        1,
        "the tunnel opened; the origin's identity failed"
    );
    assert!(
        origin.requests().is_empty(),
        "no request reached the origin"
    );
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_origin_is_tunnelled_too() {
    let origin = Adversary::start(Behavior::ok_json("{\"ok\":true}"))
        .await
        .unwrap();
    let proxy = TestProxy::start(ProxyBehavior::Tunnel).await.unwrap();
    let text = config(&origin.base_url(), &format!("proxy = \"{}\"", proxy.url()));
    let f = fixture(&text, None);
    let out = run(&f, post(origin.url("/v1/payments?x=1"), PAYMENT)).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert_eq!(proxy.tunnels(), 1);
    assert_eq!(
        proxy.connects()[0].target,
        format!("127.0.0.1:{}", origin.addr().port())
    );
    let requests = origin.requests();
    assert_eq!(requests.len(), 1);
    // Origin form through the tunnel, never the absolute form a forwarding proxy gets.
    assert_eq!(requests[0].target, "/v1/payments?x=1");
    assert_eq!(
        requests[0].header("host"),
        Some(format!("127.0.0.1:{}", origin.addr().port()).as_str())
    );
    assert_eq!(requests[0].body, b"{\"amount\":1}");
    assert_eq!(origin.effects(), 1);
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_407_from_the_proxy_is_proxy_refused_and_the_origin_sees_nothing() {
    let pki = TestPki::new().unwrap();
    let origin = tls_origin(&pki, TestCert::Valid).await;
    let proxy =
        TestProxy::start_with_credentials(ProxyBehavior::Tunnel, PROXY_USER, PROXY_PASSWORD)
            .await
            .unwrap();
    let f = fixture(&config(&origin.base_url(), &via(&proxy.url())), Some(&pki));
    let out = run(&f, post(origin.url("/v1/payments"), PAYMENT)).await;
    assert_error(
        &out,
        Phase::ConnectionSetup,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        Code::ProxyRefused,
    );
    assert_attempts(
        &out,
        1,
        Stage::ProxyTunnel,
        Code::ProxyRefused,
        &proxy.authority(),
    );
    let message = &error(&out).error.message;
    assert!(
        message.contains("407") && message.contains("the proxy's answer, not the origin's"),
        "{message}"
    );
    assert_eq!(proxy.tunnels(), 0);
    assert_eq!(origin.connections(), 0, "the origin was never contacted");
    assert!(origin.requests().is_empty());
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_refusal_is_retried_by_status_403_after_correction_502_after_backoff() {
    let origin = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    for (status, retry, attempts) in [(403, Retry::AfterCorrection, 1), (502, Retry::Backoff, 2)] {
        let proxy = TestProxy::start(ProxyBehavior::Answer(status))
            .await
            .unwrap();
        let text = config(&origin.base_url(), &format!("proxy = \"{}\"", proxy.url()));
        let f = fixture(&text, None);
        let out = run(&f, post(origin.url("/v1/payments"), PAYMENT)).await;
        assert_error(
            &out,
            Phase::ConnectionSetup,
            Outcome::NotAttempted,
            retry,
            Code::ProxyRefused,
        );
        // A backoff refusal is tried once more inside the attempt, each try recorded.
        assert_attempts(
            &out,
            attempts,
            Stage::ProxyTunnel,
            Code::ProxyRefused,
            &proxy.authority(),
        );
        assert_eq!(proxy.connects().len(), attempts);
        assert!(error(&out).error.message.contains(&status.to_string()));
    }
    assert_eq!(origin.connections(), 0);
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_is_down_is_proxy_unreachable() {
    let origin = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let down = refused_addr().unwrap();
    let text = config(&origin.base_url(), &format!("proxy = \"http://{down}\""));
    let f = fixture(&text, None);
    let out = run(&f, post(origin.url("/v1/payments"), PAYMENT)).await;
    assert_error(
        &out,
        Phase::ConnectionSetup,
        Outcome::NotAttempted,
        Retry::Backoff,
        Code::ProxyUnreachable,
    );
    assert_attempts(
        &out,
        2,
        Stage::ProxyTunnel,
        Code::ProxyUnreachable,
        &down.to_string(),
    );
    assert_eq!(origin.connections(), 0);
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_breaks_the_connect_exchange_is_tunnel_failed() {
    let origin = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    for behavior in [ProxyBehavior::CloseMidConnect, ProxyBehavior::HalfAnswer] {
        let proxy = TestProxy::start(behavior).await.unwrap();
        let text = config(&origin.base_url(), &format!("proxy = \"{}\"", proxy.url()));
        let f = fixture(&text, None);
        let out = run(&f, post(origin.url("/v1/payments"), PAYMENT)).await;
        assert_error(
            &out,
            Phase::ConnectionSetup,
            Outcome::NotAttempted,
            Retry::Backoff,
            Code::ProxyTunnelFailed,
        );
        assert_attempts(
            &out,
            2,
            Stage::ProxyTunnel,
            Code::ProxyTunnelFailed,
            &proxy.authority(),
        );
        assert_eq!(proxy.connects().len(), 2, "{behavior:?}");
    }
    assert_eq!(origin.connections(), 0);
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_never_answers_times_out_in_the_tunnel_stage() {
    let origin = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let proxy = TestProxy::start(ProxyBehavior::Stall).await.unwrap();
    let text = config(&origin.base_url(), &format!("proxy = \"{}\"", proxy.url()))
        .replace("timeout_ms = 3000", "timeout_ms = 400");
    let f = fixture(&text, None);
    let out = run(&f, post(origin.url("/v1/payments"), PAYMENT)).await;
    assert_error(
        &out,
        Phase::ConnectionSetup,
        Outcome::NotAttempted,
        Retry::Backoff,
        Code::ConnectTimeout,
    );
    assert_attempts(
        &out,
        1,
        Stage::ProxyTunnel,
        Code::ConnectTimeout,
        &proxy.authority(),
    );
    assert_eq!(origin.connections(), 0);
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_that_dies_after_dispatch_is_unknown_and_the_origin_got_the_request() {
    let origin = Adversary::start(Behavior::ok_json("{\"ok\":true}"))
        .await
        .unwrap();
    let proxy = TestProxy::start(ProxyBehavior::DieAfterRequest)
        .await
        .unwrap();
    let text = config(&origin.base_url(), &format!("proxy = \"{}\"", proxy.url()));
    let f = fixture(&text, None);
    let out = run(&f, post(origin.url("/v1/payments"), PAYMENT)).await;
    assert_error(
        &out,
        Phase::RemoteExecution,
        Outcome::Unknown,
        Retry::Reconcile,
        Code::RemoteOutcomeUnknown,
    );
    let env = error(&out);
    assert!(env.evidence.dispatch_started);
    assert!(env.evidence.attempts.is_empty(), "setup finished: {env:#?}");
    assert!(
        env.error.message.contains(&proxy.authority()),
        "{}",
        env.error.message
    );
    assert_eq!(proxy.tunnels(), 1);
    assert_eq!(
        origin.requests().len(),
        1,
        "the origin received the request"
    );
    assert_eq!(
        origin.effects(),
        1,
        "and applied it: unknown is the honest answer"
    );
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_on_a_metadata_address_is_refused_before_any_connection() {
    let origin = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let text = config(
        &origin.base_url(),
        "proxy = \"http://169.254.169.254:3128\"",
    );
    let f = fixture(&text, None);
    let out = run(&f, post(origin.url("/v1/payments"), PAYMENT)).await;
    assert_error(
        &out,
        Phase::ConnectionSetup,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        Code::AddressRefused,
    );
    assert_attempts(
        &out,
        1,
        Stage::AddressGuard,
        Code::AddressRefused,
        "169.254.169.254:3128",
    );
    let message = &error(&out).error.message;
    assert!(
        message.contains("proxy") && message.contains("169.254.169.254"),
        "{message}"
    );
    assert_eq!(origin.connections(), 0);
}

/// An https target named `other.test` (the name `TestCert::WrongName` carries) on
/// 127.0.0.1 that sets no `proxy`, loaded under the proxy variables `vars(proxy)`. The
/// test proxy resolves the name to 127.0.0.1 itself; the broker's resolver maps it too,
/// so a direct connection also succeeds when no proxy applies.
async fn env_case(
    vars: impl Fn(&TestProxy) -> Vec<(&'static str, String)>,
) -> (Fixture, Adversary, TestProxy) {
    let pki = TestPki::new().unwrap();
    let origin = tls_origin(&pki, TestCert::WrongName).await;
    let proxy = TestProxy::start(ProxyBehavior::Tunnel).await.unwrap();
    proxy.map_host("other.test", "127.0.0.1".parse().unwrap());
    let base = format!("https://other.test:{}", origin.addr().port());
    let text = config(
        &base,
        "ca_file = \"postern-test-ca.pem\"\nallow_private = true",
    );
    let vars = vars(&proxy);
    let env = ProxyEnv::from_lookup(|name| {
        vars.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
    });
    let resolver = Resolver::with_hosts([("other.test", vec!["127.0.0.1".parse().unwrap()])]);
    let f = fixture_with(&text, Some(&pki), &env, resolver);
    (f, origin, proxy)
}

fn other_url(origin: &Adversary) -> String {
    format!("https://other.test:{}/v1/x", origin.addr().port())
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_proxy_from_the_environment_applies_and_no_proxy_opts_a_host_out() {
    // HTTPS_PROXY applies to an https target that sets no proxy.
    let (f, origin, proxy) = env_case(|p| vec![("HTTPS_PROXY", p.url())]).await;
    let out = run(&f, get(other_url(&origin))).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert_eq!(proxy.tunnels(), 1);
    assert_eq!(
        proxy.connects()[0].target,
        format!("other.test:{}", origin.addr().port()),
        "the proxy, not the broker, resolves the origin's name"
    );

    // NO_PROXY names the host: the broker connects directly.
    let (f, origin, proxy) = env_case(|p| {
        vec![
            ("https_proxy", p.url()),
            ("NO_PROXY", "localhost, .other.test".into()),
        ]
    })
    .await;
    let out = run(&f, get(other_url(&origin))).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert_eq!((proxy.connections(), origin.requests().len()), (0, 1));

    // HTTP_PROXY is for http targets only.
    let (f, origin, proxy) = env_case(|p| vec![("HTTP_PROXY", p.url())]).await;
    let out = run(&f, get(other_url(&origin))).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert_eq!(proxy.connections(), 0);
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_targets_ignore_the_environment_proxy_unless_they_name_one() {
    let origin = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let proxy = TestProxy::start(ProxyBehavior::Tunnel).await.unwrap();
    let env = ProxyEnv::from_lookup(|name| (name == "http_proxy").then(|| proxy.url()));
    let f = fixture_with(
        &config(&origin.base_url(), ""),
        None,
        &env,
        Resolver::system(),
    );
    let out = run(&f, get(origin.url("/v1/x"))).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert_eq!(proxy.connections(), 0, "a loopback target stays direct");
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_credentials_reach_only_the_proxy_and_never_a_record_or_answer() {
    use base64::Engine;
    let pki = TestPki::new().unwrap();
    let origin = tls_origin(&pki, TestCert::Valid).await;
    let proxy =
        TestProxy::start_with_credentials(ProxyBehavior::Tunnel, PROXY_USER, PROXY_PASSWORD)
            .await
            .unwrap();
    let with_creds = format!("http://{PROXY_USER}:{PROXY_PASSWORD}@{}", proxy.authority());
    let f = fixture(&config(&origin.base_url(), &via(&with_creds)), Some(&pki));
    let ok = run(&f, post(origin.url("/v1/payments"), PAYMENT)).await;
    assert_eq!(ok.outcome, Outcome::Committed, "{ok:?}");
    let token =
        base64::engine::general_purpose::STANDARD.encode(format!("{PROXY_USER}:{PROXY_PASSWORD}"));
    assert_eq!(
        proxy.connects()[0].proxy_authorization.as_deref(),
        Some(format!("Basic {token}").as_str()),
        "the proxy got its credentials on CONNECT"
    );
    assert!(
        !origin.saw(PROXY_PASSWORD) && !origin.saw(&token),
        "the origin never did"
    );
    assert!(origin.requests()[0].header("proxy-authorization").is_none());

    // A refused tunnel (wrong password) must not echo them either.
    let wrong = format!(
        "http://{PROXY_USER}:wrong-{PROXY_PASSWORD}@{}",
        proxy.authority()
    );
    let text = config(&origin.base_url(), &via(&wrong));
    let g = fixture(&text, Some(&pki));
    let refused = run(&g, post(origin.url("/v1/payments"), PAYMENT)).await;
    assert_eq!(error(&refused).error.code, Code::ProxyRefused);

    for (fx, out) in [(&f, &ok), (&g, &refused)] {
        let answer = format!("{out:?} {}", serde_json::to_string(&out.error).unwrap());
        assert!(!answer.contains(PROXY_PASSWORD), "{answer}");
        assert!(!answer.contains(&token));
        let config_shown = format!("{:?}", fx.broker.config.current());
        assert!(!config_shown.contains(PROXY_PASSWORD), "{config_shown}");
        // The operator's targets file holds the password (the search finds it there);
        // nothing the broker wrote (journal, its WAL, result store) may.
        let found = postern_tests::files_containing(fx.dir.path(), PROXY_PASSWORD.as_bytes());
        assert!(
            found.iter().any(|p| p.ends_with("postern.toml")),
            "{found:?}"
        );
        assert!(fx.dir.path().join("journal.db").exists());
        for needle in [PROXY_PASSWORD, token.as_str()] {
            let leaked: Vec<_> = postern_tests::files_containing(fx.dir.path(), needle.as_bytes())
                .into_iter()
                .filter(|p| !p.ends_with("postern.toml"))
                .collect();
            assert!(leaked.is_empty(), "{needle} reached {leaked:?}");
        }
    }
}

// Regression: issue 13
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approval_card_names_the_proxy_and_not_its_credentials() {
    let pki = TestPki::new().unwrap();
    let origin = tls_origin(&pki, TestCert::Valid).await;
    let proxy =
        TestProxy::start_with_credentials(ProxyBehavior::Tunnel, PROXY_USER, PROXY_PASSWORD)
            .await
            .unwrap();
    let with_creds = format!("http://{PROXY_USER}:{PROXY_PASSWORD}@{}", proxy.authority());
    let text = config(&origin.base_url(), &via(&with_creds))
        .replace("approval = \"none\"", "approval = \"per_call\"");
    let f = fixture(&text, Some(&pki));
    let approvals = Arc::new(Approvals::new(
        Duration::from_secs(10),
        Arc::new(SystemClock),
    ));
    let ctx = CallContext {
        session: Some("s1".into()),
        approver: Some(approvals.clone()),
        ..Default::default()
    };
    let (out, ()) = tokio::join!(
        f.broker.channel.execute(get(origin.url("/v1/x")), &ctx),
        async {
            let p = loop {
                if let Some(p) = approvals.pending().into_iter().next() {
                    break p;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            let card = p.request.card();
            assert_eq!(card.proxy.as_deref(), Some(proxy.authority().as_str()));
            assert_eq!(
                card.resolved, None,
                "the proxy resolves the host, not the broker"
            );
            let shown = serde_json::to_string(&card).unwrap();
            assert!(
                !shown.contains(PROXY_PASSWORD) && !shown.contains(PROXY_USER),
                "{shown}"
            );
            approvals
                .approve(&p.request.invocation_id, &p.request.fingerprint, "alice")
                .unwrap();
        }
    );
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert_eq!(proxy.tunnels(), 1);
}

/// curl, as a third-party client, tunnels through the test proxy: it is a real CONNECT
/// proxy, not one shaped to the broker. Skipped (with a notice) without curl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_tunnels_through_the_test_proxy() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("curl is not installed; skipping");
        return;
    }
    let pki = TestPki::new().unwrap();
    let origin = tls_origin(&pki, TestCert::Valid).await;
    let proxy = TestProxy::start(ProxyBehavior::Tunnel).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = pki.write_ca(dir.path()).unwrap();
    let output = tokio::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "--proxy",
            &proxy.url(),
            "--cacert",
        ])
        .arg(&ca)
        .arg(origin.url("/v1/curl"))
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), "{\"ok\":true}");
    assert_eq!(proxy.tunnels(), 1);
    assert_eq!(origin.requests()[0].target, "/v1/curl");
}

/// The kinds of `id`'s events, in order.
fn kinds(f: &Fixture, id: &str) -> Vec<&'static str> {
    let events = f.broker.journal.events(id).unwrap();
    events.iter().map(|e| e.body.kind()).collect()
}

/// Waits until the held proxy has read a CONNECT, then returns the invocation in flight.
async fn held_invocation(f: &Fixture, proxy: &TestProxy) -> String {
    for _ in 0..500 {
        if !proxy.connects().is_empty() {
            return f.broker.journal.newest_invocation().unwrap().unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the proxy never read a CONNECT");
}

/// An origin, a proxy that holds each CONNECT until released, and a broker whose target
/// goes through it.
async fn held(behavior: ProxyBehavior) -> (Adversary, TestProxy, Fixture) {
    let origin = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let proxy = TestProxy::start_held(behavior).await.unwrap();
    let text = config(&origin.base_url(), &format!("proxy = \"{}\"", proxy.url()));
    let f = fixture(&text, None);
    (origin, proxy, f)
}

/// Once the held proxy has a CONNECT: the invocation in flight and its record's kinds
/// at that moment; then lets the CONNECT go on.
async fn record_while_held(f: &Fixture, proxy: &TestProxy) -> (String, Vec<&'static str>) {
    let id = held_invocation(f, proxy).await;
    let seen = kinds(f, &id);
    proxy.release();
    (id, seen)
}

/// The credential's authorization and the attempt's lease wait for the dispatch gate and
/// are recorded in DISPATCH_STARTED's own transaction: while the tunnel is being set up
/// the record has neither, and afterwards the three records are one commit (consecutive,
/// one timestamp) naming the generation the connection was named after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authorization_and_lease_are_recorded_with_dispatch_started_after_connection_setup() {
    let (origin, proxy, f) = held(ProxyBehavior::Tunnel).await;
    let during = record_while_held(&f, &proxy);
    let (out, (id, during)) = tokio::join!(run(&f, get(origin.url("/v1/items"))), during);
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert_eq!(during, ["ACTION_ACCEPTED", "PREFLIGHT_VALIDATED"]);
    let events = f.broker.journal.events(&id).unwrap();
    let at = events
        .iter()
        .position(|e| e.body.kind() == "CREDENTIAL_AUTHORIZED")
        .unwrap();
    let three = &events[at..at + 3];
    assert_eq!(
        three.iter().map(|e| e.body.kind()).collect::<Vec<_>>(),
        [
            "CREDENTIAL_AUTHORIZED",
            "ATTEMPT_STARTED",
            "DISPATCH_STARTED"
        ]
    );
    assert!(three.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    assert!(
        three
            .iter()
            .all(|e| e.recorded_at_ms == three[0].recorded_at_ms)
    );
    match &three[2].body {
        EventBody::DispatchStarted {
            generation,
            connection_id,
            ..
        } => {
            assert_eq!(*generation, 1);
            assert_eq!(
                connection_id.as_deref(),
                Some(format!("{id}/g1/c1").as_str())
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(origin.requests().len(), 1);
}

/// A credential removed while the connection is being set up is honoured up to the first
/// byte: the secret read before is dropped unused, the invocation ends
/// CREDENTIAL_MISSING, not_attempted, and the origin gets no request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_removed_while_the_tunnel_opens_is_missing_and_nothing_is_sent() {
    let (origin, proxy, f) = held(ProxyBehavior::Tunnel).await;
    let during = async {
        let id = held_invocation(&f, &proxy).await;
        f.broker.vault.remove("api-key").unwrap();
        proxy.release();
        id
    };
    let (out, id) = tokio::join!(run(&f, post(origin.url("/v1/payments"), PAYMENT)), during);
    assert_error(
        &out,
        Phase::CredentialInjection,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        Code::CredentialMissing,
    );
    assert!(!error(&out).evidence.dispatch_started);
    assert_eq!(
        kinds(&f, &id),
        ["ACTION_ACCEPTED", "PREFLIGHT_VALIDATED", "FAILED"]
    );
    assert!(origin.requests().is_empty(), "nothing reached the origin");
    assert_eq!(origin.effects(), 0);
}

/// An attempt that ends in connection setup, before the gate, records the deferred
/// authorization and lease first: the record reads as it always did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setup_failure_before_the_gate_records_the_authorization_and_lease_first() {
    let (origin, proxy, f) = held(ProxyBehavior::Answer(403)).await;
    let during = record_while_held(&f, &proxy);
    let (out, (id, during)) =
        tokio::join!(run(&f, post(origin.url("/v1/payments"), PAYMENT)), during);
    assert_error(
        &out,
        Phase::ConnectionSetup,
        Outcome::NotAttempted,
        Retry::AfterCorrection,
        Code::ProxyRefused,
    );
    assert_eq!(during, ["ACTION_ACCEPTED", "PREFLIGHT_VALIDATED"]);
    assert_eq!(
        kinds(&f, &id),
        [
            "ACTION_ACCEPTED",
            "PREFLIGHT_VALIDATED",
            "CREDENTIAL_AUTHORIZED",
            "ATTEMPT_STARTED",
            "CONNECTION_ATTEMPT",
            "FAILED"
        ]
    );
    assert_eq!(error(&out).evidence.attempt_generation, 1);
    assert_eq!(origin.connections(), 0);
}
