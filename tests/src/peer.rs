//! A scripted peer broker for the federation tests: an rmcp Streamable HTTP server on
//! 127.0.0.1 serving `peer_capabilities`, `peer_call` and `peer_reconcile`, signing with
//! its own test key, and answering each `peer_call` as its script says, including the
//! answers a real peer never gives (no envelope, a denial signed by another key, HTTP
//! 429 from a rate limiter in front of it).
//!
//! Like a real peer it checks the asking broker's signed auth against the key pinned for
//! it, and runs a request at most once per caller invocation: a repeat is answered from
//! its record. Everything is counted, so a test can tell a retry storm from one call.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use ed25519_dalek::{SigningKey, VerifyingKey};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use rmcp::ErrorData as McpError;
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use postern_broker::audit::log_origin;
use postern_broker::contract::{Code, Envelope, ErrorBody, Evidence, Outcome, Phase, Retry};
use postern_broker::federation::wire::{
    self, ALL_CAPABILITIES, CallAnswer, CallArgs, CapabilitiesAnswer, CapabilitiesArgs, Capability,
    PeerOutcome, PeerResponse, ReconcileArgs, TOOL_CALL, TOOL_CAPABILITIES, TOOL_RECONCILE,
};
use postern_broker::federation::{AttestationKind, CallBinding, Statement};
use postern_broker::transparency::note::{KeyAlg, VerifierKey};

/// How the peer answers one `peer_call`.
#[derive(Debug, Clone)]
pub enum Step {
    /// Runs the request and answers a signed outcome: the target answered `status`.
    Outcome { status: u16, body: String },
    /// Runs it; its own record says unknown (REMOTE_TIMEOUT).
    PeerUnknown,
    /// Its approver refused: a signed outcome whose record says not_attempted.
    NotRun,
    /// A signed denial.
    Denial,
    /// A signed unavailable.
    Unavailable,
    /// A tool result without an attestation (an empty descriptor).
    NoEnvelope,
    /// A committed outcome, genuinely signed and about this request, but bound to another
    /// call (another nonce): a replayed answer.
    OutcomeForAnotherCall,
    /// A denial signed by another key.
    Forged,
    /// HTTP 429 from a rate limiter in front of the MCP endpoint (the call never reaches
    /// the tool).
    RateLimited,
    /// Runs `then`, but answers only after `ms` (the caller may have given up).
    Stall { ms: u64, then: Box<Step> },
    /// The export policy version becomes `to`, then `then` is answered under it.
    PolicyMoves { to: String, then: Box<Step> },
}

/// What the peer saw.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// `peer_call`s that reached the tool, in order, by caller invocation.
    pub calls: Vec<String>,
    /// `peer_call`s refused with HTTP 429 before reaching the tool.
    pub rate_limited: u32,
    /// Requests run (side effects), by caller invocation.
    pub runs: Vec<String>,
    pub listings: u32,
    pub reconciles: u32,
    /// Auths that did not verify with the asking broker's pinned key.
    pub bad_auth: u32,
}

struct State {
    script: VecDeque<Step>,
    policy_version: String,
    seen: Seen,
    /// caller invocation → the outcome recorded when it ran.
    records: HashMap<String, PeerOutcome>,
    capabilities: Vec<Capability>,
    deny_listing: bool,
    /// The asking broker's key, pinned.
    caller: VerifyingKey,
}

/// A running test peer.
pub struct TestPeer {
    pub addr: SocketAddr,
    key: SigningKey,
    state: Arc<Mutex<State>>,
    stop: CancellationToken,
}

impl Drop for TestPeer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[derive(Clone)]
struct Tools {
    key: SigningKey,
    state: Arc<Mutex<State>>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The capability every test peer exports.
pub fn payments() -> Capability {
    Capability {
        name: "payments".into(),
        methods: vec!["GET".into(), "POST".into()],
        idempotent_methods: vec!["GET".into()],
        approval: "per_call".into(),
    }
}

impl TestPeer {
    /// Starts a peer on 127.0.0.1 signing with `key`, trusting `caller` (the asking
    /// broker's key) and answering `peer_call`s as `script` says (then with outcomes).
    pub async fn start(
        key: SigningKey,
        caller: VerifyingKey,
        script: Vec<Step>,
    ) -> std::io::Result<TestPeer> {
        let state = Arc::new(Mutex::new(State {
            script: script.into(),
            policy_version: "policy-v1".into(),
            seen: Seen::default(),
            records: HashMap::new(),
            capabilities: vec![payments()],
            deny_listing: false,
            caller,
        }));
        let tools = Tools {
            key: key.clone(),
            state: state.clone(),
        };
        let stop = CancellationToken::new();
        let mut config = StreamableHttpServerConfig::default();
        config.cancellation_token = stop.child_token();
        let service = StreamableHttpService::new(
            move || Ok(tools.clone()),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let accept_stop = stop.clone();
        let front_state = state.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    () = accept_stop.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        Err(_) => continue,
                    },
                };
                let service = service.clone();
                let state = front_state.clone();
                let conn_stop = accept_stop.clone();
                tokio::spawn(async move {
                    let handler = hyper::service::service_fn(move |req| {
                        front(req, service.clone(), state.clone())
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), handler);
                    tokio::select! {
                        _ = conn => {}
                        () = conn_stop.cancelled() => {}
                    }
                });
            }
        });
        Ok(TestPeer {
            addr,
            key,
            state,
            stop,
        })
    }

    /// The base URL a `[[peer]] url` names.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its key as `[[peer]] key` pins it (named by its log origin, as a real broker's).
    pub fn key_line(&self) -> String {
        let vk = self.key.verifying_key();
        VerifierKey::new(&log_origin(&vk), KeyAlg::Ed25519, vk)
            .map(|k| k.encode())
            .unwrap_or_default()
    }

    pub fn seen(&self) -> Seen {
        self.state
            .lock()
            .map(|s| s.seen.clone())
            .unwrap_or_default()
    }

    /// More answers for the next calls.
    pub fn push(&self, steps: Vec<Step>) {
        if let Ok(mut s) = self.state.lock() {
            s.script.extend(steps);
        }
    }

    pub fn set_policy_version(&self, version: &str) {
        if let Ok(mut s) = self.state.lock() {
            s.policy_version = version.to_string();
        }
    }

    /// Pins the asking broker's key (known only once that broker has started).
    pub fn set_caller(&self, caller: VerifyingKey) {
        if let Ok(mut s) = self.state.lock() {
            s.caller = caller;
        }
    }

    pub fn deny_listing(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.deny_listing = true;
        }
    }
}

/// The HTTP front: a rate limiter that answers 429 to a `peer_call` while the script
/// says so, before the MCP endpoint sees it.
async fn front(
    req: hyper::Request<hyper::body::Incoming>,
    service: StreamableHttpService<Tools, LocalSessionManager>,
    state: Arc<Mutex<State>>,
) -> Result<hyper::Response<BoxBody<Bytes, Infallible>>, Infallible> {
    use tower_service::Service;
    let (parts, body) = req.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let is_call = serde_json::from_slice::<Value>(&bytes)
        .is_ok_and(|v| v["method"] == "tools/call" && v["params"]["name"] == TOOL_CALL);
    if is_call {
        let limited = state.lock().is_ok_and(|mut s| {
            if matches!(s.script.front(), Some(Step::RateLimited)) {
                s.script.pop_front();
                s.seen.rate_limited += 1;
                true
            } else {
                false
            }
        });
        if limited {
            let mut response = hyper::Response::new(
                Full::new(Bytes::from_static(b"slow down"))
                    .map_err(|never| match never {})
                    .boxed(),
            );
            *response.status_mut() = hyper::StatusCode::TOO_MANY_REQUESTS;
            response
                .headers_mut()
                .insert("retry-after", hyper::header::HeaderValue::from_static("1"));
            return Ok(response);
        }
    }
    let req = hyper::Request::from_parts(parts, Full::new(bytes));
    let mut service = service;
    service.call(req).await
}

fn schema() -> Arc<serde_json::Map<String, Value>> {
    Arc::new(
        json!({"type": "object"})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    )
}

fn error_envelope(invocation_id: &str, code: Code, outcome: Outcome, retry: Retry) -> Envelope {
    Envelope {
        invocation_id: invocation_id.to_string(),
        error: ErrorBody {
            code,
            phase: code.spec().phase.unwrap_or(Phase::RemoteExecution),
            outcome,
            retry,
            message: code.spec().meaning.to_string(),
        },
        evidence: Evidence::default(),
    }
}

impl Tools {
    #[allow(clippy::too_many_arguments)]
    fn sign(
        &self,
        kind: AttestationKind,
        capability: &str,
        fingerprint: &str,
        policy_version: &str,
        outcome_digest: Option<String>,
        call: &CallBinding,
        key: &SigningKey,
    ) -> postern_broker::federation::Attestation {
        Statement {
            kind,
            peer: log_origin(&self.key.verifying_key()),
            capability: capability.to_string(),
            request_fingerprint: fingerprint.to_string(),
            policy_version: policy_version.to_string(),
            issued_at_ms: now_ms(),
            outcome_digest,
            call: call.clone(),
        }
        .sign(key)
    }

    fn answer(
        &self,
        attestation: postern_broker::federation::Attestation,
        outcome: Option<PeerOutcome>,
    ) -> CallToolResult {
        let value = serde_json::to_value(CallAnswer {
            attestation,
            outcome,
        })
        .unwrap_or(Value::Null);
        CallToolResult::structured(value)
    }

    fn capabilities(&self, args: CapabilitiesArgs) -> CallToolResult {
        let (caps, version, deny) = match self.state.lock() {
            Ok(mut s) => {
                s.seen.listings += 1;
                (
                    s.capabilities.clone(),
                    s.policy_version.clone(),
                    s.deny_listing,
                )
            }
            Err(_) => return CallToolResult::structured_error(json!({"error": "poisoned"})),
        };
        self.check_auth(&args.auth, TOOL_CAPABILITIES, "");
        let (kind, caps) = if deny {
            (AttestationKind::Denial, Vec::new())
        } else {
            (AttestationKind::Outcome, caps)
        };
        let digest = wire::capabilities_digest(&caps);
        let attestation = self.sign(
            kind,
            ALL_CAPABILITIES,
            &digest,
            &version,
            (kind == AttestationKind::Outcome).then(|| digest.clone()),
            &CallBinding::of(&args.auth, None, None),
            &self.key,
        );
        CallToolResult::structured(
            serde_json::to_value(CapabilitiesAnswer {
                attestation,
                capabilities: caps,
            })
            .unwrap_or(Value::Null),
        )
    }

    fn check_auth(&self, auth: &wire::PeerAuth, tool: &str, subject: &str) {
        let Ok(mut s) = self.state.lock() else { return };
        let caller = s.caller;
        let ok = auth.peer == log_origin(&caller)
            && auth.verify(&caller, tool, subject, now_ms()).is_ok();
        if !ok {
            s.seen.bad_auth += 1;
        }
    }

    async fn call(&self, args: CallArgs) -> CallToolResult {
        let body = base64::engine::general_purpose::STANDARD
            .decode(args.request.body_base64.as_bytes())
            .unwrap_or_default();
        let fingerprint = args.request.fingerprint(&body);
        self.check_auth(
            &args.auth,
            TOOL_CALL,
            &wire::call_subject(
                &fingerprint,
                &args.caller_invocation,
                args.caller_attempt,
                args.policy_version.as_deref(),
            ),
        );
        let (step, recorded) = match self.state.lock() {
            Ok(mut s) => {
                s.seen.calls.push(args.caller_invocation.clone());
                let step = s.script.pop_front();
                let recorded = s.records.get(&args.caller_invocation).cloned();
                (step, recorded)
            }
            Err(_) => return CallToolResult::structured_error(json!({"error": "poisoned"})),
        };
        let capability = args.request.capability.clone();
        // At most once per caller invocation: a repeat is answered from the record.
        if let Some(record) = recorded {
            let version = self.policy_version();
            let attestation = self.sign(
                AttestationKind::Outcome,
                &capability,
                &fingerprint,
                &version,
                Some(record.digest()),
                &bound_to(&args),
                &self.key,
            );
            return self.answer(attestation, Some(record));
        }
        let step = step.unwrap_or(Step::Outcome {
            status: 200,
            body: "{\"ok\":true}".into(),
        });
        self.play(step, &args, &capability, &fingerprint).await
    }

    fn policy_version(&self) -> String {
        self.state
            .lock()
            .map(|s| s.policy_version.clone())
            .unwrap_or_default()
    }

    fn run(&self, caller: &str, outcome: PeerOutcome) {
        if let Ok(mut s) = self.state.lock() {
            s.seen.runs.push(caller.to_string());
            s.records.insert(caller.to_string(), outcome);
        }
    }

    fn play<'a>(
        &'a self,
        step: Step,
        args: &'a CallArgs,
        capability: &'a str,
        fingerprint: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = CallToolResult> + Send + 'a>> {
        Box::pin(async move {
            let version = self.policy_version();
            let b_invocation = format!("inv_peer_{}", args.caller_invocation);
            let call = bound_to(args);
            let signed = |kind, digest| {
                self.sign(
                    kind,
                    capability,
                    fingerprint,
                    &version,
                    digest,
                    &call,
                    &self.key,
                )
            };
            match step {
                Step::Outcome { status, body } => {
                    let outcome = PeerOutcome {
                        invocation_id: b_invocation,
                        outcome: Outcome::Committed,
                        error: None,
                        response: Some(PeerResponse {
                            status,
                            headers: vec![("content-type".into(), "application/json".into())],
                            body_base64: base64::engine::general_purpose::STANDARD
                                .encode(body.as_bytes()),
                        }),
                    };
                    self.run(&args.caller_invocation, outcome.clone());
                    self.answer(
                        signed(AttestationKind::Outcome, Some(outcome.digest())),
                        Some(outcome),
                    )
                }
                Step::PeerUnknown => {
                    let outcome = PeerOutcome {
                        error: Some(error_envelope(
                            &b_invocation,
                            Code::RemoteTimeout,
                            Outcome::Unknown,
                            Retry::Reconcile,
                        )),
                        invocation_id: b_invocation,
                        outcome: Outcome::Unknown,
                        response: None,
                    };
                    self.run(&args.caller_invocation, outcome.clone());
                    self.answer(
                        signed(AttestationKind::Outcome, Some(outcome.digest())),
                        Some(outcome),
                    )
                }
                Step::NotRun => {
                    let outcome = PeerOutcome {
                        error: Some(error_envelope(
                            &b_invocation,
                            Code::ApprovalDenied,
                            Outcome::NotAttempted,
                            Retry::Never,
                        )),
                        invocation_id: b_invocation,
                        outcome: Outcome::NotAttempted,
                        response: None,
                    };
                    self.answer(
                        signed(AttestationKind::Outcome, Some(outcome.digest())),
                        Some(outcome),
                    )
                }
                Step::Denial => self.answer(signed(AttestationKind::Denial, None), None),
                Step::OutcomeForAnotherCall => {
                    let outcome = PeerOutcome {
                        invocation_id: b_invocation,
                        outcome: Outcome::Committed,
                        error: None,
                        response: None,
                    };
                    // Genuinely signed, about this request, but naming another call's
                    // nonce: what a relay replaying an earlier answer hands over.
                    let other = CallBinding {
                        nonce: "0".repeat(32),
                        ..call.clone()
                    };
                    let attestation = self.sign(
                        AttestationKind::Outcome,
                        capability,
                        fingerprint,
                        &version,
                        Some(outcome.digest()),
                        &other,
                        &self.key,
                    );
                    self.answer(attestation, Some(outcome))
                }
                Step::Unavailable => self.answer(signed(AttestationKind::Unavailable, None), None),
                Step::NoEnvelope => CallToolResult::structured(
                    json!({"error": "capability_not_found", "descriptor": null}),
                ),
                Step::Forged => {
                    let other = SigningKey::from_bytes(&[99u8; 32]);
                    let forged = self.sign(
                        AttestationKind::Denial,
                        capability,
                        fingerprint,
                        &version,
                        None,
                        &call,
                        &other,
                    );
                    self.answer(forged, None)
                }
                // Reached only when a 429 step was queued behind another answer.
                Step::RateLimited => CallToolResult::structured_error(json!({"error": "429"})),
                Step::Stall { ms, then } => {
                    let answer = self.play(*then, args, capability, fingerprint).await;
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    answer
                }
                Step::PolicyMoves { to, then } => {
                    if let Ok(mut s) = self.state.lock() {
                        s.policy_version = to;
                    }
                    self.play(*then, args, capability, fingerprint).await
                }
            }
        })
    }

    fn reconcile(&self, args: ReconcileArgs) -> CallToolResult {
        self.check_auth(
            &args.auth,
            TOOL_RECONCILE,
            &wire::reconcile_subject(
                &args.invocation_id,
                &args.capability,
                &args.request_fingerprint,
            ),
        );
        let record = match self.state.lock() {
            Ok(mut s) => {
                s.seen.reconciles += 1;
                s.records
                    .values()
                    .find(|r| r.invocation_id == args.invocation_id)
                    .cloned()
            }
            Err(_) => None,
        };
        let Some(mut record) = record else {
            return CallToolResult::structured_error(json!({"error": "no such invocation"}));
        };
        // Reconciled on the peer: an unknown settles as applied.
        if record.outcome == Outcome::Unknown {
            record.outcome = Outcome::Committed;
            record.error = Some(error_envelope(
                &record.invocation_id,
                Code::ReconciledCommitted,
                Outcome::Committed,
                Retry::Never,
            ));
        }
        let attestation = self.sign(
            AttestationKind::Outcome,
            &args.capability,
            &args.request_fingerprint,
            &self.policy_version(),
            Some(record.digest()),
            &CallBinding::of(&args.auth, None, None),
            &self.key,
        );
        self.answer(attestation, Some(record))
    }
}

/// The call `args` is, as a real peer binds its answer to it.
fn bound_to(args: &CallArgs) -> CallBinding {
    CallBinding::of(
        &args.auth,
        Some(&args.caller_invocation),
        Some(args.caller_attempt),
    )
}

fn parse<T: serde::de::DeserializeOwned>(request: &CallToolRequestParams) -> Result<T, McpError> {
    let args = Value::Object(request.arguments.clone().unwrap_or_default());
    serde_json::from_value(args).map_err(|e| McpError::invalid_params(e.to_string(), None))
}

impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new(TOOL_CAPABILITIES, "List exported capabilities", schema()),
            Tool::new(TOOL_CALL, "Run one request", schema()),
            Tool::new(TOOL_RECONCILE, "Settle an unknown", schema()),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let result = match request.name.as_ref() {
            TOOL_CAPABILITIES => self.capabilities(parse(&request)?),
            TOOL_CALL => self.call(parse(&request)?).await,
            TOOL_RECONCILE => self.reconcile(parse(&request)?),
            other => {
                return Err(McpError::invalid_params(
                    format!("unknown tool {other}"),
                    None,
                ));
            }
        };
        Ok(result.into())
    }
}
