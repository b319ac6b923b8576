//! Federation, the answering side (issue 14): a real `postern daemon --peer-listen` (broker
//! B) against the adversarial origin, called over MCP Streamable HTTP by a test-only
//! rmcp client standing in for broker A, which signs its calls with its own key.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use base64::Engine;
use ed25519_dalek::SigningKey;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::ServiceError;
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::{Value, json};

use postern_broker::federation::wire::{
    self, CallAnswer, CapabilitiesAnswer, PeerAuth, PeerRequest, TOOL_CALL, TOOL_CAPABILITIES,
    TOOL_RECONCILE,
};
use postern_broker::federation::{
    Answer, Attestation, AttestationKind, Request, Verdict, classify,
};
use postern_broker::transparency::note::VerifierKey;
use postern_tests::adversary::{Adversary, Behavior};

mod support;

use support::peers::{Asker, nonce, now_ms};
use support::{Daemon, SECRET};

/// The `peer_call` arguments an asker signs.
trait Calls {
    fn call(&self, request: &PeerRequest, caller_invocation: &str) -> Value;
    fn call_under(
        &self,
        request: &PeerRequest,
        caller_invocation: &str,
        policy_version: Option<&str>,
    ) -> Value;
}

impl Calls for Asker {
    fn call(&self, request: &PeerRequest, caller_invocation: &str) -> Value {
        self.call_under(request, caller_invocation, None)
    }

    /// A call whose signed auth says the asker saw B's policy at `policy_version`.
    fn call_under(
        &self,
        request: &PeerRequest,
        caller_invocation: &str,
        policy_version: Option<&str>,
    ) -> Value {
        let fingerprint = request.fingerprint(&body_of(request));
        let subject = wire::call_subject(&fingerprint, caller_invocation, 1, policy_version);
        json!({
            "auth": self.auth(TOOL_CALL, &subject),
            "request": request,
            "caller_invocation": caller_invocation,
            "caller_attempt": 1,
            "policy_version": policy_version,
        })
    }
}

fn body_of(request: &PeerRequest) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(&request.body_base64)
        .unwrap()
}

fn post(capability: &str, path: &str, body: &str) -> PeerRequest {
    PeerRequest {
        capability: capability.into(),
        method: "POST".into(),
        path: path.into(),
        headers: vec![("content-type".into(), "application/json".into())],
        body_base64: base64::engine::general_purpose::STANDARD.encode(body),
        ..PeerRequest::default()
    }
}

/// B's targets: `payments` (exported to `org-a`, with a reconcile query) and
/// `internal` (not exported), both at `origin`; `approval` for `payments`.
fn b_config(origin: &str, a: &Asker, approval: &str) -> String {
    format!(
        r#"
[[http]]
name = "payments"
base_url = "{origin}/v1"
methods = ["GET", "POST"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "{approval}"
idempotent_methods = ["GET"]
timeout_ms = 5000

[http.reconcile]
method = "GET"
path = "/lookup"
committed_status = [200]
not_applied_status = [404]

[[http]]
name = "internal"
base_url = "{origin}/internal"
methods = ["GET", "POST"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "none"
idempotent_methods = ["GET"]

[[peer]]
name = "org-a"
key = "{}"
exports = ["payments"]
"#,
        a.pin()
    )
}

/// Broker B, serving peers on a loopback port of its choosing.
struct B {
    daemon: Daemon,
    url: String,
    key: VerifierKey,
}

impl B {
    fn start(config: &str) -> B {
        let daemon = support::start_daemon_args(config, &["--peer-listen", "127.0.0.1:0"]);
        let url = peering_url(&daemon);
        let key = b_key(&daemon);
        B { daemon, url, key }
    }

    /// SIGKILL, then a new daemon over the same data dir (on a new port).
    fn kill_9_and_restart(&mut self) {
        self.daemon.restart();
        self.url = peering_url(&self.daemon);
    }

    /// Checks B's signature and what the attestation is about. Which call it answers is
    /// A's to check (tests/tests/federation.rs); here it must name one.
    fn verify(&self, attestation: &Attestation, capability: &str, fingerprint: &str) {
        assert_eq!(attestation.call.nonce.len(), 32, "{attestation:?}");
        assert!(!attestation.call.caller.is_empty(), "{attestation:?}");
        let request = Request {
            peer: self.key.name.clone(),
            capability: capability.into(),
            fingerprint: fingerprint.into(),
            policy_version: None,
            in_flight: None,
            call: Some(attestation.call.clone()),
        };
        attestation
            .verify(&self.key.key, &request)
            .unwrap_or_else(|e| panic!("B's attestation does not verify: {e}: {attestation:?}"));
    }

    fn session_of(&self, invocation_id: &str) -> Option<String> {
        self.daemon
            .journal()
            .query_row(
                "SELECT session_id FROM invocations WHERE id = ?1",
                [invocation_id],
                |r| r.get(0),
            )
            .unwrap()
    }
}

fn peering_url(daemon: &Daemon) -> String {
    let line = daemon
        .stderr_line("postern: peering on ", Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no peering line: {}", daemon.stderr()));
    let url = line
        .trim()
        .trim_start_matches("postern: peering on ")
        .to_string();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"),
        "{url}"
    );
    url
}

/// B's broker key, as `postern audit key` prints it.
fn b_key(daemon: &Daemon) -> VerifierKey {
    VerifierKey::parse(&daemon.audit_key()).unwrap()
}

/// Calls `tool` with `args` on a fresh client: the structured answer, or the JSON-RPC
/// error.
async fn tool(url: &str, name: &str, args: Value) -> Result<Value, rmcp::ErrorData> {
    let client = ().serve(StreamableHttpClientTransport::from_uri(url.to_string())).await.unwrap();
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    let result = client
        .call_tool(CallToolRequestParams::new(name.to_string()).with_arguments(args))
        .await;
    let _ = client.cancel().await;
    match result {
        Ok(result) => {
            let value = result.structured_content.expect("a structured answer");
            assert!(
                !value.to_string().contains(SECRET),
                "the credential reached an answer: {value}"
            );
            Ok(value)
        }
        Err(ServiceError::McpError(e)) => Err(e),
        Err(other) => panic!("transport failure: {other}"),
    }
}

async fn call(b: &B, a: &Asker, request: &PeerRequest, caller: &str) -> CallAnswer {
    let value = tool(&b.url, TOOL_CALL, a.call(request, caller))
        .await
        .unwrap();
    serde_json::from_value(value).unwrap()
}

/// Every file under `dir` holding `needle`.
fn files_holding(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_holding(&path, needle));
        } else if std::fs::read(&path)
            .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
        {
            found.push(path);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exported_call_runs_once_on_b_under_a_peer_session_and_comes_back_signed() {
    let origin = Adversary::start(Behavior::EchoAuthorization).await.unwrap();
    let a = Asker::new(7);
    let b = B::start(&b_config(&origin.base_url(), &a, "none"));

    // Exactly the three peering tools, nothing an agent or an operator uses.
    let client = ().serve(StreamableHttpClientTransport::from_uri(b.url.clone())).await.unwrap();
    let mut names: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["peer_call", "peer_capabilities", "peer_reconcile"]);
    let _ = client.cancel().await;
    for agent_tool in ["http_request", "list_targets", "fetch_result"] {
        let refused = tool(&b.url, agent_tool, json!({})).await.unwrap_err();
        assert_eq!(refused.code, rmcp::model::ErrorCode::INVALID_PARAMS);
        assert!(
            refused.message.contains("unknown tool"),
            "{}",
            refused.message
        );
    }

    // The capabilities exported to A, signed as an outcome about `*`.
    let listed: CapabilitiesAnswer = serde_json::from_value(
        tool(
            &b.url,
            TOOL_CAPABILITIES,
            json!({"auth": a.auth(TOOL_CAPABILITIES, "")}),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    assert_eq!(listed.attestation.kind, AttestationKind::Outcome);
    let names: Vec<&str> = listed
        .capabilities
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["payments"], "only what is exported to A");
    assert_eq!(listed.capabilities[0].methods, ["GET", "POST"]);
    assert_eq!(listed.capabilities[0].approval, "none");
    b.verify(
        &listed.attestation,
        "*",
        &wire::capabilities_digest(&listed.capabilities),
    );
    let policy = listed.attestation.policy_version.clone();

    // One call: B runs it under session peer:<A's key name> and signs its record.
    let request = post("payments", "/charges?amount=5", r#"{"amount":5}"#);
    let fingerprint = request.fingerprint(&body_of(&request));
    let first = call(&b, &a, &request, "inv_a_1").await;
    b.verify(&first.attestation, "payments", &fingerprint);
    assert_eq!(first.attestation.kind, AttestationKind::Outcome);
    assert_eq!(first.attestation.policy_version, policy);
    let outcome = first.outcome.clone().expect("an outcome");
    assert_eq!(first.attestation.outcome_digest, Some(outcome.digest()));
    assert_eq!(serde_json::to_value(outcome.outcome).unwrap(), "committed");
    let response = outcome.response.clone().expect("the origin's response");
    assert_eq!(response.status, 200);
    let body: Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(&response.body_base64)
            .unwrap(),
    )
    .unwrap();
    // The origin echoed the Authorization it got: B injected it and scrubbed it out.
    assert!(
        body["authorization"]
            .as_str()
            .is_some_and(|v| !v.contains(SECRET))
    );
    assert_eq!(body["query"], "amount=5");
    assert_eq!(origin.requests().len(), 1);
    assert_eq!(origin.requests()[0].path(), "/v1/charges");
    assert!(origin.saw(SECRET), "B injected its credential");
    assert_eq!(
        b.session_of(&outcome.invocation_id).as_deref(),
        Some(format!("peer:{}", a.name).as_str())
    );

    // The same caller invocation again (a fresh auth): B's record, nothing re-sent.
    let again = call(&b, &a, &request, "inv_a_1").await;
    b.verify(&again.attestation, "payments", &fingerprint);
    assert_eq!(again.outcome, Some(outcome.clone()));
    assert_eq!(
        origin.requests().len(),
        1,
        "one request for one caller invocation"
    );

    // The same caller invocation for another request is refused, not attested.
    let other = post("payments", "/charges", r#"{"amount":6}"#);
    let refused = tool(&b.url, TOOL_CALL, a.call(&other, "inv_a_1"))
        .await
        .unwrap_err();
    assert_eq!(refused.code, rmcp::model::ErrorCode::INVALID_PARAMS);
    assert!(refused.message.contains("inv_a_1"), "{}", refused.message);

    // Malformed arguments are invalid_params, not a panic and not a verdict.
    let bad = tool(
        &b.url,
        TOOL_CALL,
        json!({"auth": a.auth(TOOL_CALL, ""), "request": 5}),
    )
    .await
    .unwrap_err();
    assert_eq!(bad.code, rmcp::model::ErrorCode::INVALID_PARAMS);
    assert_eq!(origin.requests().len(), 1);

    // The credential is in B's keychain only: no file of B's holds it.
    assert_eq!(
        files_holding(b.daemon.dir.path(), SECRET.as_bytes()),
        Vec::<std::path::PathBuf>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capability_not_exported_and_one_that_does_not_exist_get_the_same_signed_denial() {
    let origin = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let a = Asker::new(7);
    let b = B::start(&b_config(&origin.base_url(), &a, "none"));

    let not_exported = call(&b, &a, &post("internal", "/x", "{}"), "inv_1").await;
    let missing = call(&b, &a, &post("nope", "/x", "{}"), "inv_2").await;
    for (answer, capability) in [(&not_exported, "internal"), (&missing, "nope")] {
        assert_eq!(answer.attestation.kind, AttestationKind::Denial);
        assert_eq!(answer.outcome, None);
        let request = post(capability, "/x", "{}");
        b.verify(&answer.attestation, capability, &request.fingerprint(b"{}"));
    }
    // Nothing but the names and times differ: B does not say which one exists.
    let strip = |a: &Attestation| {
        json!({"kind": a.kind, "peer": a.peer, "policy": a.policy_version,
               "outcome_digest": a.outcome_digest})
    };
    assert_eq!(
        strip(&not_exported.attestation),
        strip(&missing.attestation)
    );

    // A path that climbs out of the exported target is the same denial.
    let escape = call(&b, &a, &post("payments", "/../internal/x", "{}"), "inv_3").await;
    assert_eq!(escape.attestation.kind, AttestationKind::Denial);
    assert_eq!(strip(&escape.attestation), strip(&missing.attestation));

    // A key B does not pin, and A's name signed with another key: denials too.
    let stranger = Asker::new(9);
    let unknown = call(&b, &stranger, &post("payments", "/x", "{}"), "inv_4").await;
    assert_eq!(unknown.attestation.kind, AttestationKind::Denial);
    // Unauthenticated: no policy version, so an A that knows B's version never takes
    // a denial provoked by breaking its signature as final.
    assert_eq!(unknown.attestation.policy_version, "none");
    assert_ne!(not_exported.attestation.policy_version, "none");
    b.verify(
        &unknown.attestation,
        "payments",
        &post("payments", "/x", "{}").fingerprint(b"{}"),
    );
    let forged = Asker {
        key: SigningKey::from_bytes(&[9; 32]),
        name: a.name.clone(),
    };
    let bad_signature = call(&b, &forged, &post("payments", "/x", "{}"), "inv_5").await;
    assert_eq!(bad_signature.attestation.kind, AttestationKind::Denial);
    let listed: CapabilitiesAnswer = serde_json::from_value(
        tool(
            &b.url,
            TOOL_CAPABILITIES,
            json!({"auth": stranger.auth(TOOL_CAPABILITIES, "")}),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    assert_eq!(listed.attestation.kind, AttestationKind::Denial);
    assert!(listed.capabilities.is_empty());
    assert_eq!(
        origin.requests().len(),
        0,
        "nothing refused reached the origin"
    );

    // A replayed request (same nonce) is refused without a signed answer, and runs once.
    let request = post("payments", "/charges", "{}");
    let args = a.call(&request, "inv_6");
    let first: CallAnswer =
        serde_json::from_value(tool(&b.url, TOOL_CALL, args.clone()).await.unwrap()).unwrap();
    assert_eq!(first.attestation.kind, AttestationKind::Outcome);
    let replayed = tool(&b.url, TOOL_CALL, args).await.unwrap_err();
    assert_eq!(replayed.code, rmcp::model::ErrorCode::INVALID_REQUEST);
    assert!(replayed.message.contains("nonce"), "{}", replayed.message);
    assert_eq!(origin.requests().len(), 1);

    // An attempt that began under another export policy is not run: B answers a signed
    // `unavailable` carrying the current version, which A classifies as a policy change
    // (abandon, seed 002), and keeps no record, so the call may be made again.
    let request = post("payments", "/charges", r#"{"n":7}"#);
    let args = a.call_under(&request, "inv_7", Some("blake3:an-older-policy"));
    let moved: CallAnswer =
        serde_json::from_value(tool(&b.url, TOOL_CALL, args).await.unwrap()).unwrap();
    assert_eq!(moved.attestation.kind, AttestationKind::Unavailable);
    assert_eq!(
        moved.attestation.policy_version,
        first.attestation.policy_version
    );
    let fingerprint = request.fingerprint(&body_of(&request));
    let moved_call = moved.attestation.call.clone();
    let verdict = classify(
        &Answer::Attested(Some(moved.attestation)),
        &b.key.key,
        &Request {
            peer: b.key.name.clone(),
            capability: "payments".into(),
            fingerprint: fingerprint.clone(),
            policy_version: Some("blake3:an-older-policy".into()),
            in_flight: None,
            call: Some(moved_call),
        },
    );
    assert!(
        matches!(verdict, Verdict::PolicyChanged { .. }),
        "{verdict:?}"
    );
    assert_eq!(
        origin.requests().len(),
        1,
        "nothing ran for the abandoned attempt"
    );
    let current: CallAnswer = serde_json::from_value(
        tool(&b.url, TOOL_CALL, a.call(&request, "inv_7"))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(current.attestation.kind, AttestationKind::Outcome);
    assert_eq!(origin.requests().len(), 2);

    // B's log says what was refused and why, naming the asker and the capability.
    let log = b.daemon.stderr();
    assert!(log.contains("peer_call refused: asker"), "{log}");
    assert!(
        log.contains("capability internal: the capability is not exported"),
        "{log}"
    );
    assert!(log.contains("the asker is not a pinned peer"), "{log}");
    assert!(log.contains("does not verify"), "{log}");
    assert!(log.contains("already used"), "{log}");
    assert!(!log.contains(SECRET));
}

// Regression: issue 27 (item 1). B kept the nonces it had seen in memory only: a
// captured call replayed after B restarted (inside the auth's time window) was answered
// again, signed. B now journals them before answering; and every answer names the call
// (caller, nonce, invocation, attempt) it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_call_replayed_after_b_restarts_is_not_answered_again() {
    let origin = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let a = Asker::new(7);
    let mut b = B::start(&b_config(&origin.base_url(), &a, "none"));
    let request = post("payments", "/charges", r#"{"amount":9}"#);
    let args = a.call(&request, "inv_r_1");
    let first: CallAnswer =
        serde_json::from_value(tool(&b.url, TOOL_CALL, args.clone()).await.unwrap()).unwrap();
    assert_eq!(first.attestation.kind, AttestationKind::Outcome);
    let auth: PeerAuth = serde_json::from_value(args["auth"].clone()).unwrap();
    assert_eq!(first.attestation.call.caller, a.name);
    assert_eq!(first.attestation.call.nonce, auth.nonce);
    assert_eq!(
        first.attestation.call.invocation.as_deref(),
        Some("inv_r_1")
    );
    assert_eq!(first.attestation.call.attempt, Some(1));
    // The listing is bound to its call too.
    let listing_auth = a.auth(TOOL_CAPABILITIES, "");
    let listing = tool(&b.url, TOOL_CAPABILITIES, json!({"auth": listing_auth}))
        .await
        .unwrap();
    assert_eq!(
        listing["attestation"]["call"]["nonce"],
        json!(listing_auth.nonce)
    );

    b.kill_9_and_restart();
    let replayed = tool(&b.url, TOOL_CALL, args).await.unwrap_err();
    assert_eq!(replayed.code, rmcp::model::ErrorCode::INVALID_REQUEST);
    assert!(replayed.message.contains("nonce"), "{}", replayed.message);
    let relisted = tool(&b.url, TOOL_CAPABILITIES, json!({"auth": listing_auth}))
        .await
        .unwrap_err();
    assert!(relisted.message.contains("nonce"), "{}", relisted.message);
    assert_eq!(origin.requests().len(), 1, "the call ran once");
}

// Regression: issue 27 (item 5). A stale auth under a pinned key name got an unsigned
// error while an unknown name got a signed denial: anyone could learn which names are
// pinned. Both are now refused the same way, unsigned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_auth_is_refused_the_same_way_whether_or_not_its_name_is_pinned() {
    let origin = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let a = Asker::new(7);
    let stranger = Asker::new(8);
    let b = B::start(&b_config(&origin.base_url(), &a, "none"));
    let stale = now_ms() - 10 * 60 * 1000;
    let mut answers = Vec::new();
    for asker in [&a, &stranger] {
        let auth = PeerAuth::sign(
            &asker.key,
            TOOL_CAPABILITIES,
            &asker.name,
            "",
            stale,
            nonce(),
        );
        let refused = tool(&b.url, TOOL_CAPABILITIES, json!({"auth": auth}))
            .await
            .unwrap_err();
        answers.push((refused.code, refused.message.replace(&asker.name, "NAME")));
    }
    assert_eq!(answers[0].0, answers[1].0, "{answers:?}");
    assert_eq!(answers[0].0, rmcp::model::ErrorCode::INVALID_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cut_by_kill_9_of_b_is_answered_from_b_s_record_and_reconciled_over_peering() {
    // The first request stalls after the origin applied it; the second connection is
    // the reconcile query, which finds it applied.
    let origin = Adversary::start(Behavior::Sequence(vec![
        Behavior::Stall,
        Behavior::ok_json(r#"{"applied":1}"#),
    ]))
    .await
    .unwrap();
    let a = Asker::new(7);
    let mut b = B::start(&b_config(&origin.base_url(), &a, "none"));
    let request = post("payments", "/charges", r#"{"amount":5}"#);
    let fingerprint = request.fingerprint(&body_of(&request));

    let in_flight = {
        let (url, args) = (b.url.clone(), a.call(&request, "inv_a_9"));
        tokio::spawn(async move { tool(&url, TOOL_CALL, args).await })
    };
    assert!(origin.wait_for_effects(1, Duration::from_secs(20)).await);
    b.kill_9_and_restart();
    // A's first call never got an answer.
    let _ = tokio::time::timeout(Duration::from_secs(10), in_flight).await;

    // Asked again, B answers what its record proves: sent, outcome unknown. Nothing is
    // sent again.
    let repeat = call(&b, &a, &request, "inv_a_9").await;
    b.verify(&repeat.attestation, "payments", &fingerprint);
    assert_eq!(repeat.attestation.kind, AttestationKind::Outcome);
    let outcome = repeat.outcome.expect("B's record");
    assert_eq!(serde_json::to_value(outcome.outcome).unwrap(), "unknown");
    let envelope = outcome.error.clone().expect("the unknown envelope");
    assert_eq!(envelope.error.code.as_str(), "REMOTE_OUTCOME_UNKNOWN");
    assert!(envelope.evidence.dispatch_started);
    assert_eq!(
        origin.requests().len(),
        1,
        "nothing re-sent after the restart"
    );

    // Reconcile over peering: B runs its query, the settlement comes back signed.
    let args = json!({
        "auth": a.auth(
            TOOL_RECONCILE,
            &wire::reconcile_subject(&outcome.invocation_id, "payments", &fingerprint)
        ),
        "capability": "payments",
        "invocation_id": outcome.invocation_id,
        "request_fingerprint": fingerprint,
    });
    let settled: CallAnswer =
        serde_json::from_value(tool(&b.url, TOOL_RECONCILE, args).await.unwrap()).unwrap();
    b.verify(&settled.attestation, "payments", &fingerprint);
    let settled_outcome = settled.outcome.expect("the settled record");
    assert_eq!(
        settled.attestation.outcome_digest,
        Some(settled_outcome.digest())
    );
    assert_eq!(settled_outcome.invocation_id, outcome.invocation_id);
    assert_eq!(
        serde_json::to_value(settled_outcome.outcome).unwrap(),
        "committed"
    );
    assert_eq!(origin.requests().len(), 2);
    assert_eq!(origin.requests()[1].path(), "/v1/lookup");

    // Another asker cannot reconcile (or learn of) A's invocation.
    let c = Asker::new(8);
    let args = json!({
        "auth": c.auth(
            TOOL_RECONCILE,
            &wire::reconcile_subject(&outcome.invocation_id, "payments", &fingerprint)
        ),
        "capability": "payments",
        "invocation_id": outcome.invocation_id,
        "request_fingerprint": fingerprint,
    });
    let denied: CallAnswer =
        serde_json::from_value(tool(&b.url, TOOL_RECONCILE, args).await.unwrap()).unwrap();
    assert_eq!(denied.attestation.kind, AttestationKind::Denial);
    assert_eq!(origin.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_s_operator_decides_a_per_call_capability_and_a_denial_is_a_signed_outcome() {
    let origin = Adversary::start(Behavior::ok_json("{}")).await.unwrap();
    let a = Asker::new(7);
    let b = B::start(&b_config(&origin.base_url(), &a, "per_call"));
    let request = post("payments", "/charges", "{}");
    let fingerprint = request.fingerprint(b"{}");
    let pending = {
        let (url, args) = (b.url.clone(), a.call(&request, "inv_a_2"));
        tokio::spawn(async move { tool(&url, TOOL_CALL, args).await })
    };
    // The card is on B's operator socket, under A's peer session.
    let operator = |args: &[&str]| b.daemon.operator(args);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let card = loop {
        if let Some(card) = operator(&["approvals"])
            .as_array()
            .and_then(|c| c.first().cloned())
        {
            break card;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no approval card on B"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let summary = card["summary"].as_str().unwrap();
    assert!(
        summary.starts_with(&format!("for peer broker org-a ({}): POST ", a.name)),
        "{summary}"
    );
    // A repeat while the card is pending waits for B's invocation: no second card.
    let repeat = {
        let (url, args) = (b.url.clone(), a.call(&request, "inv_a_2"));
        tokio::spawn(async move { tool(&url, TOOL_CALL, args).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(operator(&["approvals"]).as_array().map(Vec::len), Some(1));
    operator(&[
        "deny",
        card["invocation_id"].as_str().unwrap(),
        card["fingerprint"].as_str().unwrap(),
        card["card_digest"].as_str().unwrap(),
    ]);
    let answer: CallAnswer = serde_json::from_value(pending.await.unwrap().unwrap()).unwrap();
    b.verify(&answer.attestation, "payments", &fingerprint);
    assert_eq!(answer.attestation.kind, AttestationKind::Outcome);
    let outcome = answer.outcome.unwrap();
    let envelope = outcome.error.unwrap();
    assert_eq!(envelope.error.code.as_str(), "APPROVAL_DENIED");
    assert_eq!(
        serde_json::to_value(outcome.outcome).unwrap(),
        "not_attempted"
    );
    let repeated: CallAnswer = serde_json::from_value(repeat.await.unwrap().unwrap()).unwrap();
    b.verify(&repeated.attestation, "payments", &fingerprint);
    assert_eq!(
        repeated.outcome.map(|o| o.invocation_id),
        Some(outcome.invocation_id)
    );
    assert!(origin.requests().is_empty());
}

#[test]
fn peering_listens_on_loopback_only_unless_told_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.toml"), "").unwrap();
    let (status, stderr) = support::daemon_refusal(&[
        "--data-dir".as_ref(),
        dir.path().join("data").as_os_str(),
        "--config".as_ref(),
        dir.path().join("t.toml").as_os_str(),
        "--peer-listen".as_ref(),
        "0.0.0.0:0".as_ref(),
    ]);
    assert!(!status.success());
    assert!(stderr.contains("not a loopback address"), "{stderr}");
    assert!(stderr.contains("--peer-listen-any"), "{stderr}");
    assert!(
        !dir.path().join("data").exists(),
        "nothing created before refusing"
    );
}
