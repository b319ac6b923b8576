//! Calls through a peer broker (issue 14, seed 002) against a scripted peer on
//! 127.0.0.1 over real MCP Streamable HTTP: each case asserts the outcome and code this
//! broker records, how many requests reached the peer (no retry storms), how often the
//! peer ran the request (never twice), and the incident raised for its owner.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use postern_broker::channel::http::{HttpOutcome, HttpRequest};
use postern_broker::channel::peer::PeerChannel;
use postern_broker::config::{Config, ConfigHandle};
use postern_broker::contract::{Code, ConfidenceSource, Outcome, Phase, Retry};
use postern_broker::federation::record::{PeerIncident, SignatureCheck, VerdictKind};
use postern_broker::federation::wire::PeerRequest;
use postern_broker::federation::{AttestationKind, Incident, Owner};
use postern_broker::invocation::CallContext;
use postern_broker::journal::Journal;
use postern_broker::journal::events::EventBody;
use postern_broker::vault::{Keychain, KeychainBackend, Vault};
use postern_tests::fixture::test_service;
use postern_tests::peer::{Step, TestPeer};

struct Fixture {
    _dir: tempfile::TempDir,
    dir_path: std::path::PathBuf,
    journal: Journal,
    channel: PeerChannel,
    service: String,
}

fn peer_key() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[7u8; 32])
}

async fn start_peer(script: Vec<Step>) -> TestPeer {
    let caller = postern_tests::test_signing_key().verifying_key();
    TestPeer::start(peer_key(), caller, script).await.unwrap()
}

fn config(peer: &TestPeer, extra: &str) -> String {
    format!(
        r#"
[[peer]]
name = "org-b"
key = "{}"
url = "{}"
timeout_ms = 3000
backoff_ms = 10
max_backoff_ms = 40
{extra}
"#,
        peer.key_line(),
        peer.url()
    )
}

fn open(dir: &std::path::Path, config_text: &str, service: &str) -> (Journal, PeerChannel) {
    let path = dir.join("postern.toml");
    std::fs::write(&path, config_text).unwrap();
    let config = ConfigHandle::new(Config::load(&path).unwrap());
    let db = dir.join("journal.db");
    let journal = postern_tests::open_journal(&db).unwrap();
    let vault = Arc::new(
        Vault::open(
            Keychain::new(KeychainBackend::SecretService, service.to_string()).unwrap(),
            &db,
        )
        .unwrap(),
    );
    let channel = PeerChannel::new(journal.clone(), vault, config);
    (journal, channel)
}

fn fixture(config_text: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let service = test_service();
    let (journal, channel) = open(dir.path(), config_text, &service);
    Fixture {
        dir_path: dir.path().to_path_buf(),
        _dir: dir,
        journal,
        channel,
        service,
    }
}

impl Fixture {
    /// Closes this broker and opens another over the same data dir (a restart).
    fn restart(self, config_text: &str) -> Fixture {
        let Fixture {
            _dir,
            dir_path,
            journal,
            channel,
            service,
        } = self;
        drop(channel);
        journal.close().unwrap();
        let (journal, channel) = open(&dir_path, config_text, &service);
        journal.recover_interrupted().unwrap();
        Fixture {
            _dir,
            dir_path,
            journal,
            channel,
            service,
        }
    }

    fn events(&self, id: &str) -> Vec<EventBody> {
        self.journal
            .events(id)
            .unwrap()
            .into_iter()
            .map(|e| e.body)
            .collect()
    }

    /// The retry the last FAILED event of `id` records.
    fn recorded_retry(&self, id: &str) -> Retry {
        self.events(id)
            .into_iter()
            .rev()
            .find_map(|b| match b {
                EventBody::Failed { retry, .. } => Some(retry),
                _ => None,
            })
            .expect("a FAILED event")
    }

    fn incidents(&self, id: &str) -> Vec<PeerIncident> {
        self.events(id)
            .into_iter()
            .filter_map(|b| match b {
                EventBody::PeerIncident(i) => Some(*i),
                _ => None,
            })
            .collect()
    }
}

fn charge() -> HttpRequest {
    HttpRequest {
        url: "peer://org-b/payments/charges?currency=eur".into(),
        method: "POST".into(),
        headers: vec![("content-type".into(), "application/json".into())],
        query: vec![],
        body: b"{\"amount\":100}".to_vec(),
        idempotency_key: None,
        timeout_ms: None,
    }
}

async fn call(f: &Fixture, request: HttpRequest) -> HttpOutcome {
    f.channel.execute(request, &CallContext::default()).await
}

fn code(out: &HttpOutcome) -> Option<Code> {
    out.error.as_ref().map(|e| e.error.code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_outcome_settles_with_the_peers_result_and_its_verified_proof() {
    let peer = start_peer(vec![Step::Outcome {
        status: 201,
        body: "{\"charge\":\"ch_1\"}".into(),
    }])
    .await;
    let f = fixture(&config(&peer, ""));
    let out = call(&f, charge()).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert!(out.error.is_none(), "{out:?}");
    let response = out.result.clone().unwrap();
    assert_eq!(response.status, 201);
    assert_eq!(response.body, b"{\"charge\":\"ch_1\"}");

    let seen = peer.seen();
    assert_eq!(seen.calls, vec![out.invocation_id.clone()]);
    assert_eq!(seen.runs, vec![out.invocation_id.clone()]);
    assert_eq!(
        seen.bad_auth, 0,
        "every auth verified with this broker's key"
    );
    assert_eq!(
        seen.listings, 1,
        "the call bound the listing's policy version"
    );

    let p = f.journal.projection(&out.invocation_id).unwrap();
    assert_eq!(p.target.as_deref(), Some("peer/org-b/payments"));
    assert_eq!(p.confidence, Some(ConfidenceSource::RemoteResponse));
    // The invocation's fingerprint is the peer request's, as the peer computes it.
    let wire = PeerRequest {
        capability: "payments".into(),
        method: "POST".into(),
        path: "/charges?currency=eur".into(),
        headers: vec![("content-type".into(), "application/json".into())],
        query: vec![],
        body_base64: "eyJhbW91bnQiOjEwMH0=".into(),
        idempotency_key: None,
        timeout_ms: None,
    };
    assert_eq!(
        p.fingerprint.as_deref(),
        Some(wire.fingerprint(b"{\"amount\":100}").as_str())
    );
    let op = p.operation.as_ref().unwrap().peer.as_ref().unwrap();
    assert_eq!(op.policy_version.as_deref(), Some("policy-v1"));

    let evidence = p.evidence();
    let proof = evidence.peer.unwrap();
    assert_eq!(proof.signature, Some(SignatureCheck::Verified));
    assert_eq!(proof.last_verdict, Some(VerdictKind::Outcome));
    assert_eq!(
        proof.peer_invocation_id.as_deref(),
        Some(format!("inv_peer_{}", out.invocation_id).as_str())
    );
    assert_eq!(proof.peer_outcome, Some(Outcome::Committed));
    assert_eq!(
        proof.attestation.as_ref().map(|a| a.kind),
        Some(AttestationKind::Outcome)
    );
    assert!(evidence.dispatch_started);

    // No credential of this broker's: the keychain was never read.
    let events = f.events(&out.invocation_id);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, EventBody::CredentialAuthorized { .. })),
        "{events:?}"
    );
    let dispatch = events
        .iter()
        .position(|e| matches!(e, EventBody::DispatchStarted { .. }))
        .unwrap();
    let answer = events
        .iter()
        .position(|e| matches!(e, EventBody::PeerAnswer(_)))
        .unwrap();
    assert!(
        dispatch < answer,
        "DISPATCH_STARTED is durable before the call leaves"
    );
    assert!(f.incidents(&out.invocation_id).is_empty());

    // Read back, it is the stored result, never a second call.
    let stored = f.channel.recorded_projection(&p).unwrap();
    assert_eq!(stored.result.unwrap().status, 201);
    assert_eq!(peer.seen().calls.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_denial_is_terminal_after_exactly_one_request_with_a_policy_incident() {
    let peer = start_peer(vec![Step::Denial, Step::Denial, Step::Denial]).await;
    let f = fixture(&config(&peer, ""));
    let out = call(&f, charge()).await;
    let env = out.error.clone().unwrap();
    assert_eq!(env.error.code, Code::PeerDenied);
    assert_eq!(
        env.error.outcome,
        Outcome::NotAttempted,
        "the peer attests it did not run it"
    );
    assert_eq!(env.error.retry, Retry::Never);
    assert_eq!(env.error.phase, Phase::RemoteExecution);
    assert!(env.evidence.dispatch_started);
    let proof = env.evidence.peer.unwrap();
    assert_eq!(proof.signature, Some(SignatureCheck::Verified));
    assert_eq!(proof.incident, Some(Incident::Policy));
    assert_eq!(peer.seen().calls.len(), 1, "a denial is never retried");
    assert!(peer.seen().runs.is_empty());

    let incidents = f.incidents(&out.invocation_id);
    assert_eq!(incidents.len(), 1);
    assert_eq!(incidents[0].incident, Incident::Policy);
    assert_eq!(incidents[0].owner, Owner::PeeringOwner);
    assert_eq!(incidents[0].signature, SignatureCheck::Verified);
    assert!(incidents[0].attestation_digest.is_some());

    // Asked to retry, the broker answers the record: still one request at the peer.
    let again = f
        .channel
        .retry(&out.invocation_id, &CallContext::default())
        .await;
    assert_eq!(code(&again), Some(Code::PeerDenied));
    assert_eq!(peer.seen().calls.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_twice_then_an_outcome_commits_after_backoff_running_once() {
    let peer = start_peer(vec![
        Step::Unavailable,
        Step::Unavailable,
        Step::Outcome {
            status: 200,
            body: "{}".into(),
        },
    ])
    .await;
    let f = fixture(&config(&peer, ""));
    let started = Instant::now();
    let out = call(&f, charge()).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    // backoff 10 ms, then 20 ms
    assert!(started.elapsed() >= Duration::from_millis(30));
    let seen = peer.seen();
    assert_eq!(
        seen.calls,
        vec![out.invocation_id.clone(); 3],
        "same caller invocation"
    );
    assert_eq!(seen.runs.len(), 1);
    let p = f.journal.projection(&out.invocation_id).unwrap();
    let state = p.peer.unwrap();
    assert_eq!((state.transient_used, state.unknown_used), (2, 0));
    assert_eq!(p.dispatches, 1, "one dispatch, asked three times");
    assert!(f.incidents(&out.invocation_id).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_forever_exhausts_the_budget_and_a_restart_does_not_reset_it() {
    let peer = start_peer(vec![Step::Unavailable; 20]).await;
    let text = config(&peer, "");
    let f = fixture(&text);
    let out = call(&f, charge()).await;
    let env = out.error.clone().unwrap();
    assert_eq!(env.error.code, Code::PeerUnavailable);
    assert_eq!(
        env.error.outcome,
        Outcome::NotAttempted,
        "its last signed answer says it did not run"
    );
    assert_eq!(env.error.retry, Retry::Backoff);
    assert_eq!(peer.seen().calls.len(), 6, "the first ask and five retries");
    let incidents = f.incidents(&out.invocation_id);
    assert_eq!(incidents.len(), 1);
    assert_eq!(incidents[0].incident, Incident::TransientExhaustion);
    assert_eq!(incidents[0].owner, Owner::LocalOperator);
    assert_eq!(incidents[0].transient_used, 5);

    // After a restart the budget is what the journal says: spent. A retry asks once.
    let f = f.restart(&text);
    let again = f
        .channel
        .retry(&out.invocation_id, &CallContext::default())
        .await;
    assert_eq!(code(&again), Some(Code::PeerUnavailable));
    assert_eq!(peer.seen().calls.len(), 7, "one more ask, not another six");
    let state = f
        .journal
        .projection(&out.invocation_id)
        .unwrap()
        .peer
        .unwrap();
    assert_eq!(state.transient_used, 5);
    assert_eq!(state.answers, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_envelope_is_unknown_never_a_denial_and_a_contract_violation_after_limited_retries() {
    let peer = start_peer(vec![Step::NoEnvelope; 10]).await;
    let f = fixture(&config(&peer, ""));
    let out = call(&f, charge()).await;
    let env = out.error.clone().unwrap();
    assert_eq!(env.error.code, Code::PeerContractViolation);
    assert_eq!(env.error.outcome, Outcome::Unknown, "it was dispatched");
    assert_eq!(env.error.retry, Retry::Reconcile);
    assert_eq!(
        peer.seen().calls.len(),
        4,
        "the first ask and three retries"
    );
    // Regression: issue 27 (item 5): the record said same_idempotency_key.
    assert_eq!(f.recorded_retry(&out.invocation_id), Retry::Reconcile);
    let incidents = f.incidents(&out.invocation_id);
    assert_eq!(incidents.len(), 1);
    assert_eq!(incidents[0].incident, Incident::ContractViolation);
    assert_eq!(incidents[0].owner, Owner::PeerOperator);
    assert_eq!(incidents[0].signature, SignatureCheck::Absent);
    assert_eq!(incidents[0].unknown_used, 3);
    assert_eq!(incidents[0].transient_used, 0);
}

// Regression: issue 27 (item 1). An answer genuinely signed by the peer and about the
// same request, but naming another call (another nonce: what a relay replays), settled
// the call as committed. It is unknown, never a verdict, and the record says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_bound_to_another_call_is_unknown_never_committed() {
    let peer = start_peer(vec![Step::OutcomeForAnotherCall; 10]).await;
    let f = fixture(&config(&peer, ""));
    let out = call(&f, charge()).await;
    let env = out.error.clone().unwrap();
    assert_eq!(env.error.code, Code::PeerContractViolation, "{env:?}");
    assert_eq!(env.error.outcome, Outcome::Unknown);
    assert_eq!(env.error.retry, Retry::Reconcile);
    assert!(
        out.result.is_none(),
        "no result is taken from another call's answer"
    );
    let answers: Vec<_> = f
        .events(&out.invocation_id)
        .into_iter()
        .filter_map(|b| match b {
            EventBody::PeerAnswer(a) => Some(*a),
            _ => None,
        })
        .collect();
    assert_eq!(answers.len(), 4, "the first ask and three retries");
    for a in &answers {
        assert_eq!(a.verdict, VerdictKind::Unknown);
        assert!(
            a.reason
                .as_deref()
                .unwrap_or_default()
                .contains("another call"),
            "{a:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_signed_by_another_key_is_unknown_and_never_terminal() {
    let peer = start_peer(vec![Step::Forged; 10]).await;
    let f = fixture(&config(&peer, ""));
    let out = call(&f, charge()).await;
    let env = out.error.clone().unwrap();
    assert_ne!(env.error.code, Code::PeerDenied);
    assert_eq!(env.error.code, Code::PeerContractViolation);
    assert_eq!(env.error.outcome, Outcome::Unknown);
    assert_eq!(
        peer.seen().calls.len(),
        4,
        "retried like any unattested answer"
    );
    let proof = env.evidence.peer.unwrap();
    assert_eq!(proof.signature, Some(SignatureCheck::Failed));
    assert_eq!(proof.last_verdict, Some(VerdictKind::Unknown));
    // The forged envelope is kept as received, for the operator to see.
    assert_eq!(
        proof.attestation.map(|a| a.kind),
        Some(AttestationKind::Denial)
    );
    // Regression: issue 27 (item 5): the record said same_idempotency_key.
    assert_eq!(f.recorded_retry(&out.invocation_id), Retry::Reconcile);
    let incidents = f.incidents(&out.invocation_id);
    assert_eq!(incidents.len(), 1);
    assert_eq!(incidents[0].incident, Incident::ContractViolation);
    assert_eq!(incidents[0].signature, SignatureCheck::Failed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limiter_answering_429_ten_times_is_transient_never_a_denial_or_violation() {
    let mut script = vec![Step::RateLimited; 10];
    script.push(Step::Outcome {
        status: 200,
        body: "{\"ok\":1}".into(),
    });
    let peer = start_peer(script).await;
    let f = fixture(&config(&peer, "transient_retries = 12"));
    let out = call(&f, charge()).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    let seen = peer.seen();
    assert_eq!(seen.rate_limited, 10);
    assert_eq!(seen.calls.len(), 1, "the eleventh reached the peer");
    assert_eq!(seen.runs.len(), 1);
    let state = f
        .journal
        .projection(&out.invocation_id)
        .unwrap()
        .peer
        .unwrap();
    assert_eq!(state.transient_used, 10);
    assert_eq!(
        state.unknown_used, 0,
        "a transport error never spends the unknown budget"
    );
    assert!(f.incidents(&out.invocation_id).is_empty());
    let answers: Vec<_> = f
        .events(&out.invocation_id)
        .into_iter()
        .filter_map(|e| match e {
            EventBody::PeerAnswer(a) => Some(*a),
            _ => None,
        })
        .collect();
    assert_eq!(answers.len(), 11);
    assert!(
        answers[..10]
            .iter()
            .all(|a| a.verdict == VerdictKind::Transport
                && a.transport == Some(postern_broker::federation::TransportFault::RateLimited)),
        "{answers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_version_that_changes_mid_flight_abandons_the_attempt() {
    let peer = start_peer(vec![
        Step::Unavailable,
        Step::PolicyMoves {
            to: "policy-v2".into(),
            then: Box::new(Step::Unavailable),
        },
    ])
    .await;
    let f = fixture(&config(&peer, ""));
    let out = call(&f, charge()).await;
    let env = out.error.clone().unwrap();
    assert_eq!(env.error.code, Code::PeerPolicyChanged);
    assert_eq!(
        env.error.outcome,
        Outcome::NotAttempted,
        "the signed answer says not run"
    );
    assert_eq!(env.error.retry, Retry::AfterCorrection);
    assert_eq!(peer.seen().calls.len(), 2, "abandoned, not retried");
    assert!(
        f.incidents(&out.invocation_id).is_empty(),
        "abandoned, not classified"
    );
    // The listing is asked again, and a new request binds the new version.
    peer.push(vec![Step::Outcome {
        status: 200,
        body: "{}".into(),
    }]);
    let next = call(&f, charge()).await;
    assert_eq!(next.outcome, Outcome::Committed, "{next:?}");
    let p = f.journal.projection(&next.invocation_id).unwrap();
    let op = p.operation.unwrap().peer.unwrap();
    assert_eq!(op.policy_version.as_deref(), Some("policy-v2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_after_dispatch_is_asked_again_with_the_same_caller_and_run_once() {
    let peer = start_peer(vec![Step::Stall {
        ms: 2500,
        then: Box::new(Step::Outcome {
            status: 200,
            body: "{\"ran\":1}".into(),
        }),
    }])
    .await;
    let f = fixture(&config(&peer, "").replace("timeout_ms = 3000", "timeout_ms = 800"));
    let out = call(&f, charge()).await;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert_eq!(out.result.unwrap().body, b"{\"ran\":1}");
    let seen = peer.seen();
    assert_eq!(seen.calls, vec![out.invocation_id.clone(); 2]);
    assert_eq!(seen.runs, vec![out.invocation_id.clone()], "run once");
    let answers: Vec<_> = f
        .events(&out.invocation_id)
        .into_iter()
        .filter_map(|e| match e {
            EventBody::PeerAnswer(a) => Some(*a),
            _ => None,
        })
        .collect();
    assert_eq!(
        answers[0].transport,
        Some(postern_broker::federation::TransportFault::Timeout)
    );
    assert_eq!(answers[1].verdict, VerdictKind::Outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peers_own_not_run_and_unknown_are_kept_and_an_unknown_reconciles_on_the_peer() {
    let peer = start_peer(vec![Step::NotRun, Step::PeerUnknown]).await;
    let f = fixture(&config(&peer, ""));
    let refused = call(&f, charge()).await;
    let env = refused.error.clone().unwrap();
    assert_eq!(env.error.code, Code::ApprovalDenied, "the peer's own code");
    assert_eq!(env.error.outcome, Outcome::NotAttempted);
    assert_eq!(env.error.retry, Retry::Never);

    let out = call(&f, charge()).await;
    let env = out.error.clone().unwrap();
    assert_eq!(env.error.code, Code::PeerOutcomeUnknown);
    assert_eq!(env.error.outcome, Outcome::Unknown);
    assert_eq!(env.error.retry, Retry::Reconcile);
    let proof = env.evidence.peer.unwrap();
    assert_eq!(proof.peer_outcome, Some(Outcome::Unknown));
    assert_eq!(proof.peer_error.map(|e| e.code), Some(Code::RemoteTimeout));

    let (settled, report) = f.channel.reconcile(&out.invocation_id, "operator").await;
    assert_eq!(settled.outcome, Outcome::Committed, "{settled:?}");
    let report = report.unwrap();
    assert_eq!(report.signature, SignatureCheck::Verified);
    assert_eq!(
        peer.seen().reconciles,
        1,
        "asked by the peer's invocation id"
    );
    let p = f.journal.projection(&out.invocation_id).unwrap();
    assert_eq!(p.confidence, Some(ConfidenceSource::RemoteQuery));
    assert_eq!(p.code, Some(Code::ReconciledCommitted));
    assert_eq!(peer.seen().runs.len(), 1, "reconciling never runs it again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cannot_name_a_peer_that_is_not_configured_or_a_capability_it_does_not_list() {
    let peer = start_peer(vec![]).await;
    let f = fixture(&config(&peer, ""));
    let out = call(
        &f,
        HttpRequest {
            url: "peer://org-c/payments/x".into(),
            ..charge()
        },
    )
    .await;
    assert_eq!(code(&out), Some(Code::InvalidTarget));
    assert_eq!(out.outcome, Outcome::NotAttempted);
    let out = call(
        &f,
        HttpRequest {
            url: "peer://org-b/refunds/x".into(),
            ..charge()
        },
    )
    .await;
    assert_eq!(code(&out), Some(Code::InvalidTarget));
    let out = call(
        &f,
        HttpRequest {
            headers: vec![("authorization".into(), "Bearer mine".into())],
            ..charge()
        },
    )
    .await;
    assert_eq!(code(&out), Some(Code::ForbiddenHeader));
    assert!(peer.seen().calls.is_empty(), "nothing reached the peer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_brokers_own_approval_for_a_peer_applies_before_anything_is_sent() {
    let peer = start_peer(vec![]).await;
    let f = fixture(&config(&peer, "approval = \"per_call\""));
    let out = call(&f, charge()).await;
    let env = out.error.clone().unwrap();
    assert_eq!(env.error.code, Code::NoApprover);
    assert_eq!(env.error.outcome, Outcome::NotAttempted);
    assert!(!env.evidence.dispatch_started);
    assert!(peer.seen().calls.is_empty(), "nothing reached the peer");
}

/// The operator's side: the console lists the incidents (newest first, each routed to
/// its owner, with the envelope and the signature check) and reconciles a peer's
/// unknown on the peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_lists_incidents_by_owner_and_reconciles_a_peer_unknown() {
    use postern_broker::approvals::Approvals;
    use postern_broker::sealed_store::VaultKey;
    use postern_broker::{Broker, BrokerOptions};
    use postern_console::console::{Console, Paths};
    use postern_mcp::server::Sessions;

    let placeholder = ed25519_dalek::SigningKey::from_bytes(&[1u8; 32]).verifying_key();
    let peer = TestPeer::start(
        peer_key(),
        placeholder,
        vec![
            Step::Denial,
            Step::NoEnvelope,
            Step::NoEnvelope,
            Step::NoEnvelope,
            Step::NoEnvelope,
            Step::PeerUnknown,
        ],
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("postern.toml");
    std::fs::write(&config, config_text_for(&peer)).unwrap();
    let broker = Broker::open(BrokerOptions {
        data_dir: dir.path().to_path_buf(),
        config: config.clone(),
        keychain: KeychainBackend::File,
        service: "postern".into(),
        approver: None,
        anchor: None,
        vault_key: Some(VaultKey::from_bytes(&[9; 32]).unwrap()),
    })
    .unwrap()
    .operator;
    peer.set_caller(broker.journal().verifying_key());
    let ctx = CallContext::default();
    let denied = broker.peer().execute(charge(), &ctx).await;
    let violated = broker.peer().execute(charge(), &ctx).await;
    let unknown = broker.peer().execute(charge(), &ctx).await;
    assert_eq!(code(&denied), Some(Code::PeerDenied));
    assert_eq!(code(&violated), Some(Code::PeerContractViolation));
    assert_eq!(code(&unknown), Some(Code::PeerOutcomeUnknown));
    assert_eq!(peer.seen().bad_auth, 0);

    let console = Arc::new(Console::new(
        broker.clone(),
        Arc::new(Sessions::default()),
        Arc::new(Approvals::new(
            Duration::from_secs(5),
            Arc::new(postern_broker::clock::SystemClock),
        )),
        Paths {
            data_dir: dir.path().to_path_buf(),
            config,
            socket: dir.path().join("postern.sock"),
            keychain: "file".into(),
        },
    ));
    let rows =
        postern_console::dispatch::dispatch(&console, "peer_incidents", serde_json::Value::Null)
            .await
            .unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0]["kind"], "contract_violation", "newest first");
    assert_eq!(rows[0]["owner"], "peer_operator");
    assert_eq!(rows[0]["signature"], "absent");
    assert_eq!(
        rows[0]["envelope"]["error"]["code"],
        "PEER_CONTRACT_VIOLATION"
    );
    assert_eq!(rows[1]["kind"], "policy");
    assert_eq!(rows[1]["owner"], "peering_owner");
    assert_eq!(rows[1]["peer"], "org-b");
    assert_eq!(rows[1]["capability"], "payments");
    assert_eq!(rows[1]["signature"], "verified");
    assert_eq!(rows[1]["attestation"]["kind"], "denial");
    assert_eq!(rows[1]["invocation_id"], denied.invocation_id.as_str());

    // The peer's unknown is listed for reconciliation, and settled on the peer.
    let open = console.needs_reconciliation().unwrap();
    let item = open
        .iter()
        .find(|d| d.row.id == unknown.invocation_id)
        .unwrap();
    assert!(item.can_query);
    let settled = console
        .run_reconcile_query(&unknown.invocation_id)
        .await
        .unwrap();
    assert!(!settled.unsettled);
    assert_eq!(peer.seen().reconciles, 1);
    assert_eq!(peer.seen().runs.len(), 1, "only the unknown call ran, once");
}

fn config_text_for(peer: &TestPeer) -> String {
    config(peer, "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_errors_after_dispatch_leave_it_unknown_and_reconcile_asks_the_same_call_again() {
    let peer = start_peer(vec![Step::RateLimited, Step::RateLimited]).await;
    let f = fixture(&config(&peer, "transient_retries = 1"));
    let out = call(&f, charge()).await;
    let env = out.error.clone().unwrap();
    assert_eq!(env.error.code, Code::PeerUnavailable);
    assert_eq!(
        env.error.outcome,
        Outcome::Unknown,
        "a 429 after dispatch proves nothing"
    );
    assert_eq!(
        env.error.retry,
        Retry::SameIdempotencyKey,
        "the peer runs this invocation at most once"
    );
    assert_eq!(f.recorded_retry(&out.invocation_id), env.error.retry);
    assert_eq!(
        env.evidence.idempotency.map(|i| i.key),
        Some(out.invocation_id.clone())
    );
    assert_eq!(
        f.incidents(&out.invocation_id)[0].incident,
        Incident::TransientExhaustion
    );
    assert!(peer.seen().calls.is_empty());

    // No invocation on the peer is known: reconciling repeats the same peer_call, which
    // the peer answers from its record (or runs, once, if it never received it).
    let (settled, report) = f.channel.reconcile(&out.invocation_id, "operator").await;
    assert_eq!(settled.outcome, Outcome::Committed, "{settled:?}");
    assert_eq!(report.unwrap().verdict, VerdictKind::Outcome);
    let seen = peer.seen();
    assert_eq!(seen.calls, vec![out.invocation_id.clone()]);
    assert_eq!(seen.reconciles, 0);
    assert_eq!(seen.runs.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_listing_lists_nothing_and_is_kept_only_briefly() {
    use postern_broker::channel::peer::listing::ListingError;
    let peer = start_peer(vec![]).await;
    peer.deny_listing();
    let f = fixture(&config(&peer, ""));
    let all = f.channel.listings().all().await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].0, "org-b");
    assert_eq!(all[0].1, Err(ListingError::Denied));
    assert_eq!(f.channel.listings().cached("org-b"), None);
    // Asked again within the failure window: from memory, not the peer.
    let _ = f.channel.listings().all().await;
    assert_eq!(peer.seen().listings, 1);
}
