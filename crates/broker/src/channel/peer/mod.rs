//! The peer channel: an agent's `http_request` to `peer://<peer>/<capability>/<path>`,
//! run by another broker (seed 002). The peer holds the credential and its approver
//! decides; this broker holds no credential for it, so the channel declares none
//! ([`Channel::NEEDS_CREDENTIAL`]) and the keychain is never read.
//!
//! One attempt: PREFLIGHT_VALIDATED binds the peer request's fingerprint
//! ([`PeerRequest::fingerprint`]), the peer's policy version last seen and the retry
//! budgets ([`PeerOperation`]); DISPATCH_STARTED is durable before the `peer_call`
//! leaves; each answer is classified by [`federation::classify`], recorded as a
//! PEER_ANSWER (which is where the budgets are counted, across restarts) and followed
//! as [`Attempts::next`] says:
//!
//! - a signed outcome settles this invocation with the peer's outcome (its response
//!   stored as this broker's result; the peer's unknown stays unknown here);
//! - a signed denial ends it not_attempted (PEER_NOT_RUN, `PEER_DENIED`, never
//!   retried) with a policy incident;
//! - signed `unavailable` and transport errors back off and ask again with the same
//!   caller invocation (the peer runs it at most once), then `PEER_UNAVAILABLE` with a
//!   transient-exhaustion incident;
//! - unattested answers are asked again a few times, then `PEER_CONTRACT_VIOLATION`
//!   (unknown: the call may have run) with a contract-violation incident;
//! - a policy version that moved abandons the attempt (`PEER_POLICY_CHANGED`), its
//!   outcome what the peer's signed answer says it did.
//!
//! [`listing`] keeps what each peer lists (`peer_capabilities`) for `list_targets` and
//! for the policy version a call binds.

pub mod listing;
mod validate;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::action::ConfigSnapshot;
use crate::approvals::ApprovalDetail;
use crate::channel::http::stored_request;
use crate::channel::http::{HttpOutcome, HttpRequest, HttpResponse, stored_response};
use crate::config::{ApprovalMode, Config, ConfigHandle, TargetVersion};
use crate::contract::{
    Code, ConfidenceSource, IdempotencyEvidence, Outcome as Settled, Phase, RemoteContract, Retry,
};
use crate::federation::client::Session;
use crate::federation::record::{
    Budget, MAX_RECORDED_ATTESTATION, PeerAnswer, PeerIncident, PeerOperation, PeerStage,
    SignatureCheck, VerdictKind,
};
use crate::federation::wire::{
    self, CallAnswer, CallArgs, PeerOutcome, PeerRequest, ReconcileArgs, TOOL_CALL, TOOL_RECONCILE,
};
use crate::federation::{
    self, Answer, Attempts, Attestation, CallBinding, InFlight, Incident, Next, Request as Asked,
    Verdict,
};
use crate::invocation::outcome::unrecorded;
use crate::invocation::{
    Accepted, Attempt, Bound, CallContext, Channel, Exchange, Failure, GateShut, Invalid, Pipeline,
    Recorder, Validated,
};
use crate::journal::events::ResultFacts;
use crate::journal::events::{self, OperationFacts, Settlement};
use crate::journal::projection::Projection;
use crate::journal::{Journal, ResultToStore, Settle, StoredResult};
use crate::vault::{Secret, Vault};
use listing::Listings;

/// Dispatches an invocation through a peer may make in total, across retries and
/// restarts (each may ask the peer several times within its budgets).
const RETRY_BUDGET: u32 = 3;

/// The `url` scheme an agent names a peer capability with.
pub const SCHEME: &str = "peer://";

/// The peer channel, run by the invocation pipeline.
pub type PeerChannel = Pipeline<Peer>;

/// What validation found.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The peer's name in `[[peer]]`.
    peer: String,
    capability: String,
    /// What goes to the peer (its fingerprint is the invocation's).
    request: PeerRequest,
    /// The body bytes (sent base64 in `request`).
    body: Vec<u8>,
    /// The peer lists the method as idempotent.
    idempotent: bool,
    /// The peer's policy version in the listing this broker last saw.
    policy_version: Option<String>,
    /// The agent's request, for the approval card.
    summary: String,
}

/// The peer channel's steps of the pipeline, and what it knows of each peer's listing.
pub struct Peer {
    listings: Listings,
}

/// Whether `url` names a peer capability (`peer://...`).
pub fn is_peer_url(url: &str) -> bool {
    url.get(..SCHEME.len())
        .is_some_and(|s| s.eq_ignore_ascii_case(SCHEME))
}

/// The target name of a peer capability: `peer/<peer>/<capability>`.
pub fn target_name(peer: &str, capability: &str) -> String {
    format!("peer/{peer}/{capability}")
}

/// The version of a `[[peer]]` entry as a call binds it: its key, URL, approval, timeout
/// and budgets. A change between binding and dispatch stops the call.
pub fn peer_version(config: &Config, peer: &str) -> Option<TargetVersion> {
    let p = config.peer(peer)?;
    let mut h = blake3::Hasher::new_derive_key("postern 2026 peer-config v1");
    let mut field = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(p.name.as_bytes());
    field(p.key.encode().as_bytes());
    field(p.url.as_ref().map(|u| u.as_str()).unwrap_or("").as_bytes());
    field(p.approval.as_str().as_bytes());
    field(
        &u64::try_from(p.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .to_le_bytes(),
    );
    let a = &p.attempts;
    field(&a.transient_budget.to_le_bytes());
    field(&a.unknown_budget.to_le_bytes());
    field(&a.base_backoff_ms.to_le_bytes());
    field(&a.max_backoff_ms.to_le_bytes());
    Some(TargetVersion::from_digest(*h.finalize().as_bytes()))
}

/// How long one attempt may take at most: every try of both budgets with its backoff,
/// so the attempt's lease outlives the loop that asks the peer.
fn attempt_window(attempts: &Attempts, per_try: Duration) -> Duration {
    let tries = 1 + attempts.transient_budget + attempts.unknown_budget;
    let mut backoff = 0u64;
    for n in 0..attempts.transient_budget.max(attempts.unknown_budget) {
        let wait = attempts
            .base_backoff_ms
            .saturating_mul(1u64 << n.min(20))
            .min(attempts.max_backoff_ms);
        backoff = backoff.saturating_add(wait.saturating_mul(2));
    }
    // Each try opens a session and calls once, each within `per_try`.
    per_try
        .saturating_mul(2 * tries)
        .saturating_add(Duration::from_millis(backoff))
}

impl Channel for Peer {
    type Request = HttpRequest;
    type Plan = Plan;
    type Armed = ();
    type Result = HttpResponse;

    const KIND: events::Channel = events::Channel::Peer;
    const TARGET_FIELD: &'static str = "url";
    const NEEDS_CREDENTIAL: bool = false;

    fn accepted(&self, request: &HttpRequest, config: &Config) -> Accepted {
        Accepted {
            target: validate::parse(&request.url)
                .ok()
                .filter(|(peer, _, _)| config.peer(peer).is_some())
                .map(|(peer, capability, _)| target_name(&peer, &capability)),
            summary: validate::summary(request),
            idempotency_key: request.idempotency_key.clone(),
        }
    }

    fn validate(&self, request: &HttpRequest, config: &Config) -> Result<Validated<Plan>, Invalid> {
        validate::validate(request, config, &self.listings)
    }

    fn bind_bare(&self, config: &Config, v: &Validated<Plan>) -> Result<ConfigSnapshot, Invalid> {
        let version = peer_version(config, &v.plan.peer).ok_or_else(|| {
            Invalid::new(
                Code::InvalidTarget,
                "url",
                "The peer disappeared from the configuration.",
            )
        })?;
        Ok(ConfigSnapshot {
            target_id: v.target.clone(),
            target_version: version,
            // The peer holds the credential: none of this broker's is bound.
            credential_id: String::new(),
            credential_version: String::new(),
            injection_mode: "peer".into(),
            idempotency_key: v.idempotency_key.clone(),
        })
    }

    fn fingerprint(action: &crate::action::NormalizedAction, snapshot: &ConfigSnapshot) -> String {
        match action {
            crate::action::NormalizedAction::Peer(p) => p.request_fingerprint.clone(),
            other => crate::action::Fingerprint::compute(other, snapshot).to_string(),
        }
    }

    fn fingerprint_now(
        config: &Config,
        _target: &str,
        action: &crate::action::NormalizedAction,
        bound: &ConfigSnapshot,
    ) -> String {
        let crate::action::NormalizedAction::Peer(p) = action else {
            return String::from("not-a-peer-call");
        };
        match peer_version(config, &p.peer) {
            Some(v) if v == bound.target_version => p.request_fingerprint.clone(),
            Some(_) => String::from("peer-changed"),
            None => String::from("peer-removed"),
        }
    }

    fn approval_mode(&self, config: &Config, target: &str) -> ApprovalMode {
        let peer = target.split('/').nth(1).unwrap_or_default();
        config.peer(peer).map_or(ApprovalMode::None, |p| p.approval)
    }

    fn operation(&self, config: &Config, bound: &Bound<Plan>, now_ms: i64) -> OperationFacts {
        self.operation_for(config, bound, now_ms, "")
    }

    fn operation_for(
        &self,
        config: &Config,
        bound: &Bound<Plan>,
        _now_ms: i64,
        invocation_id: &str,
    ) -> OperationFacts {
        let plan = &bound.plan;
        let peer = config.peer(&plan.peer);
        OperationFacts {
            idempotent: plan.idempotent,
            // The peer runs a call at most once per caller invocation: asking again with
            // the same one is a configured de-duplication contract.
            remote_contract: RemoteContract::Configured,
            idempotency: Some(IdempotencyEvidence {
                key: invocation_id.to_string(),
                scope: Some(format!("{} (caller invocation)", bound.target)),
                fingerprint: bound.fingerprint.clone(),
                remote_contract: RemoteContract::Configured,
                expires_at_ms: None,
            }),
            reconcile_configured: true,
            source_query: None,
            batch: None,
            retry_budget: RETRY_BUDGET,
            peer: Some(Box::new(PeerOperation {
                peer: plan.peer.clone(),
                key_name: peer.map(|p| p.key.name.clone()).unwrap_or_default(),
                capability: plan.capability.clone(),
                policy_version: plan.policy_version.clone(),
                attempts: peer.map(|p| p.attempts.clone()).unwrap_or_default(),
                timeout_ms: peer
                    .map(|p| u64::try_from(p.timeout.as_millis()).unwrap_or(u64::MAX))
                    .unwrap_or(crate::config::peer::DEFAULT_PEER_TIMEOUT_MS),
            })),
        }
    }

    async fn approval(&self, bound: &Bound<Plan>) -> (String, ApprovalDetail) {
        let p = &bound.plan;
        let detail = ApprovalDetail {
            method: Some(p.request.method.clone()),
            url: Some(format!(
                "{SCHEME}{}/{}{}",
                p.peer, p.capability, p.request.path
            )),
            body: (!p.body.is_empty()).then(|| crate::display::BodyPreview::of(&p.body)),
            ..Default::default()
        };
        (p.summary.clone(), detail)
    }

    fn arm(&self, _config: &Config, _bound: &Bound<Plan>, _secret: Secret) -> Result<(), Failure> {
        // Never called: the channel declares no credential. Refuse rather than hold one.
        Err(Failure {
            phase: Phase::CredentialInjection,
            code: Code::UnsupportedInjection,
            retry: Retry::AfterCorrection,
            message: "A call through a peer carries no credential of this broker.".into(),
        })
    }

    fn arm_bare(&self, config: &Config, bound: &Bound<Plan>) -> Result<(), Failure> {
        match config.peer(&bound.plan.peer) {
            Some(p) if p.url.is_some() => Ok(()),
            _ => Err(Failure {
                phase: Phase::Validation,
                code: Code::InvalidTarget,
                retry: Retry::AfterCorrection,
                message: "The peer is no longer configured with a URL; nothing was sent.".into(),
            }),
        }
    }

    async fn attempt(
        &self,
        attempt: Attempt<'_, Self>,
        _armed: (),
        ctx: &CallContext,
    ) -> HttpOutcome {
        let run = Run::new(&attempt, &self.listings);
        match run {
            Ok(run) => run.go(ctx).await,
            Err(outcome) => *outcome,
        }
    }

    fn stored_result(stored: &StoredResult) -> Option<HttpResponse> {
        stored_response(stored)
    }
}

/// One attempt's loop: what it asks, of whom, with which budgets.
struct Run<'a, 'b> {
    attempt: &'a Attempt<'b, Peer>,
    listings: &'a Listings,
    url: url::Url,
    pinned: ed25519_dalek::VerifyingKey,
    op: PeerOperation,
    asked: Asked,
    budgets: Attempts,
    answers: u32,
    per_try: Duration,
}

/// An answer as it came back, before it is classified.
struct Received {
    answer: Answer,
    /// The peer's record, when the answer carried one.
    outcome: Option<PeerOutcome>,
    stage: PeerStage,
    /// When the call was sent and its answer arrived (absent when no call left).
    in_flight: Option<InFlight>,
    /// The call sent (absent when no call left): its answer must name exactly it.
    call: Option<CallBinding>,
}

/// An answer classified and checked: the verdict, and what is recorded of it.
struct Classified {
    verdict: Verdict,
    record: PeerAnswer,
    outcome: Option<PeerOutcome>,
    response: Option<HttpResponse>,
}

impl<'a, 'b> Run<'a, 'b> {
    fn new(
        attempt: &'a Attempt<'b, Peer>,
        listings: &'a Listings,
    ) -> Result<Run<'a, 'b>, Box<HttpOutcome>> {
        let fail = |message: &str| {
            Box::new(attempt.fail(
                Phase::Validation,
                Code::InvalidTarget,
                Retry::AfterCorrection,
                message,
            ))
        };
        let projection = match attempt.journal().projection(attempt.invocation_id()) {
            Ok(p) => p,
            Err(e) => return Err(Box::new(unrecorded(attempt.invocation_id(), &e))),
        };
        let Some(op) = projection
            .operation
            .as_ref()
            .and_then(|o| o.peer.as_deref())
            .cloned()
        else {
            return Err(fail(
                "The record binds no peer for this call; nothing was sent.",
            ));
        };
        let config = attempt.config().current();
        let Some(peer) = config.peer(&op.peer) else {
            return Err(fail("The peer is no longer configured; nothing was sent."));
        };
        let Some(url) = peer.url.clone() else {
            return Err(fail("The peer has no URL to call; nothing was sent."));
        };
        let state = projection.peer.clone().unwrap_or_default();
        let mut budgets = op.attempts.clone();
        budgets.transient_used = state.transient_used;
        budgets.unknown_used = state.unknown_used;
        let asked = Asked {
            peer: op.key_name.clone(),
            capability: op.capability.clone(),
            fingerprint: attempt.bound().fingerprint.clone(),
            policy_version: op.policy_version.clone(),
            in_flight: None,
            call: None,
        };
        Ok(Run {
            attempt,
            listings,
            url,
            pinned: peer.key.key,
            per_try: Duration::from_millis(op.timeout_ms.max(1)),
            op,
            asked,
            budgets,
            answers: state.answers,
        })
    }

    /// Asks until an answer settles, a budget is spent, or the policy moves.
    async fn go(mut self, ctx: &CallContext) -> HttpOutcome {
        let gate = self.attempt.gate(self.attempt.connection_id(1));
        let mut dispatched = false;
        loop {
            let asked = tokio::select! {
                r = self.ask(&gate, &mut dispatched) => Some(r),
                () = ctx.cancel.cancelled() => None,
            };
            let received = match asked {
                None => return self.cancelled(dispatched),
                Some(Ok(r)) => r,
                Some(Err(stopped)) => return *stopped,
            };
            let classified = self.classify(received);
            let before = (self.budgets.transient_used, self.budgets.unknown_used);
            let next = self.budgets.next(&classified.verdict);
            let spent = if self.budgets.transient_used > before.0 {
                Some(Budget::Transient)
            } else if self.budgets.unknown_used > before.1 {
                Some(Budget::Unknown)
            } else {
                None
            };
            let mut record = classified.record.clone();
            record.spent = spent;
            self.answers += 1;
            record.n = self.answers;
            if let Err(e) = self.attempt.peer_answer(record.clone()) {
                return self.attempt.stopped(e.into());
            }
            if matches!(classified.verdict, Verdict::PolicyChanged { .. }) {
                self.listings.forget(&self.op.peer);
            }
            match next {
                Next::Done => return self.settle(&record, classified, None).await,
                Next::RetryAfterMs(ms) => {
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(ms)) => {}
                        () = ctx.cancel.cancelled() => return self.cancelled(dispatched),
                    }
                }
                Next::Abandon => return self.abandon(&record, classified).await,
                Next::Stop(incident) => return self.stop(incident, &record, dispatched),
            }
        }
    }

    /// One try: a session (setup), DISPATCH_STARTED before the first call leaves,
    /// then the call.
    async fn ask(
        &self,
        gate: &crate::invocation::Gate,
        dispatched: &mut bool,
    ) -> Result<Received, Box<HttpOutcome>> {
        let stage = if *dispatched {
            PeerStage::Call
        } else {
            PeerStage::Setup
        };
        let me = self.attempt.journal().peer_name();
        let session = match Session::open_as(&self.url, self.per_try, &me).await {
            Ok(s) => s,
            Err(fault) => {
                return Ok(Received {
                    answer: Answer::Transport(fault.fault),
                    outcome: None,
                    stage,
                    in_flight: None,
                    call: None,
                });
            }
        };
        if !*dispatched {
            match gate.open(Some(self.peer_identity())).await {
                Ok(()) => *dispatched = true,
                Err(GateShut::Refused(e)) => return Err(Box::new(self.attempt.stopped(e))),
                Err(GateShut::Interrupted) => {
                    return Err(Box::new(self.attempt.fail(
                        Phase::Validation,
                        Code::BrokerUnavailable,
                        Retry::Backoff,
                        "The dispatch record did not finish; nothing was sent.",
                    )));
                }
            }
        }
        let journal = self.attempt.journal();
        let id = self.attempt.invocation_id().to_string();
        let plan = &self.attempt.bound().plan;
        let generation = self.attempt.recorder().generation();
        let auth = journal.sign_peer_auth(
            TOOL_CALL,
            &wire::call_subject(
                &self.attempt.bound().fingerprint,
                &id,
                generation,
                self.op.policy_version.as_deref(),
            ),
            journal.now_ms(),
            nonce(),
        );
        let call = CallBinding::of(&auth, Some(&id), Some(generation));
        let args = CallArgs {
            auth,
            request: plan.request.clone(),
            caller_invocation: id,
            caller_attempt: generation,
            policy_version: self.op.policy_version.clone(),
        };
        let sent_at_ms = journal.now_ms();
        let answered = session
            .call(
                TOOL_CALL,
                serde_json::to_value(&args).unwrap_or_default(),
                self.per_try,
            )
            .await;
        session.close().await;
        Ok(received_call(
            answered,
            PeerStage::Call,
            sent_at_ms,
            journal,
            call,
        ))
    }

    /// What DISPATCH_STARTED names as the peer: its name here and the name of the key
    /// its answers must verify with. Never its URL: agents read this record.
    fn peer_identity(&self) -> String {
        format!("peer {} (key {})", self.op.peer, self.op.key_name)
    }

    fn classify(&self, received: Received) -> Classified {
        classify_answer(received, &self.pinned, &self.asked)
    }

    /// Signed outcome: this invocation settles with the peer's.
    async fn settle(
        &self,
        record: &PeerAnswer,
        classified: Classified,
        code_override: Option<Code>,
    ) -> HttpOutcome {
        let Some(outcome) = classified.outcome else {
            // classify() never yields Outcome without one.
            return self.attempt.recorded();
        };
        let digest = record
            .attestation
            .as_ref()
            .map(|a| a.digest.clone())
            .unwrap_or_default();
        let peer_code = outcome.error.as_ref().map(|e| e.error.code);
        let peer_retry = outcome.error.as_ref().map(|e| e.error.retry);
        match outcome.outcome {
            Settled::Committed | Settled::Rejected => {
                let response = classified.response;
                let body = response
                    .as_ref()
                    .map(|r| r.body.clone())
                    .unwrap_or_default();
                let status = response.as_ref().map(|r| r.status);
                let meta = serde_json::json!({
                    "status": status,
                    "headers": response.as_ref().map(|r| r.headers.clone()).unwrap_or_default(),
                    "peer": {
                        "peer": self.op.peer,
                        "invocation_id": outcome.invocation_id,
                        "attestation_digest": digest,
                    },
                });
                let stored = ResultToStore {
                    meta,
                    streams: vec![("body".to_string(), body)],
                };
                let code = code_override.or(peer_code);
                let retry = if code_override.is_some() {
                    Retry::Never
                } else {
                    retry_here(outcome.outcome, peer_retry)
                };
                let settle = Settle {
                    outcome: outcome.outcome,
                    code,
                    retry,
                    facts: ResultFacts {
                        http_status: status,
                        remote_request_id: Some(outcome.invocation_id.clone()),
                        ..Default::default()
                    },
                    confidence: ConfidenceSource::RemoteResponse,
                    redactions: 0,
                };
                let exchange = Exchange::peer(status, outcome.invocation_id.clone(), digest);
                self.attempt
                    .commit(exchange, stored, settle, response)
                    .await
            }
            Settled::Unknown => {
                let code = code_override.unwrap_or(Code::PeerOutcomeUnknown);
                self.attempt.fail(
                    Phase::RemoteExecution,
                    code,
                    Retry::Reconcile,
                    &format!(
                        "The peer ran the call (its invocation {}) and its record says the outcome is unknown ({}); it is reconciled on the peer.",
                        outcome.invocation_id,
                        peer_code.map_or("no code", Code::as_str)
                    ),
                )
            }
            Settled::NotAttempted => {
                let code = code_override.or(peer_code).unwrap_or(Code::PeerDenied);
                let retry = if code_override.is_some() {
                    Retry::AfterCorrection
                } else {
                    retry_here(Settled::NotAttempted, peer_retry)
                };
                let message = format!(
                    "The peer attests it did not run the call (its invocation {}, {}): {}",
                    outcome.invocation_id,
                    peer_code.map_or("no code", Code::as_str),
                    outcome
                        .error
                        .as_ref()
                        .map_or("", |e| e.error.message.as_str())
                );
                self.not_run(code, retry, &message, &digest)
            }
        }
    }

    /// PEER_NOT_RUN: the peer's verified attestation, recorded just before, says it did
    /// not run the call.
    fn not_run(&self, code: Code, retry: Retry, message: &str, digest: &str) -> HttpOutcome {
        match self.attempt.peer_not_run(code, retry, message, digest) {
            Ok(p) => HttpOutcome::of_projection(&p, self.attempt.now_ms()),
            Err(e) => self.attempt.stopped(e.into()),
        }
    }

    /// The policy moved during the attempt: abandoned, its outcome what the peer's
    /// signed answer says it did.
    async fn abandon(&self, record: &PeerAnswer, classified: Classified) -> HttpOutcome {
        let digest = record
            .attestation
            .as_ref()
            .map(|a| a.digest.clone())
            .unwrap_or_default();
        let moved = record.reason.clone().unwrap_or_default();
        if classified.outcome.is_some() {
            // The peer ran it under the new policy: its outcome stands, marked.
            return self
                .settle(record, classified, Some(Code::PeerPolicyChanged))
                .await;
        }
        if record.attests_not_run() {
            return self.not_run(
                Code::PeerPolicyChanged,
                Retry::AfterCorrection,
                &format!(
                    "The peer's export policy changed during the attempt ({moved}); it attests it did not run the call. List the targets again before a new request."
                ),
                &digest,
            );
        }
        self.attempt.fail(
            Phase::RemoteExecution,
            Code::PeerPolicyChanged,
            Retry::AfterCorrection,
            &format!("The peer's export policy changed during the attempt ({moved})."),
        )
    }

    /// A budget ran out, or the peer denied: the terminal record and the incident.
    fn stop(&self, incident: Incident, record: &PeerAnswer, dispatched: bool) -> HttpOutcome {
        let digest = record.attestation.as_ref().map(|a| a.digest.clone());
        let outcome = match incident {
            Incident::Policy => self.not_run(
                Code::PeerDenied,
                Retry::Never,
                "The peer's policy refused this call (a signed, verified denial); it did not run it. Do not repeat it: the peering owner has a policy incident.",
                digest.as_deref().unwrap_or_default(),
            ),
            Incident::TransientExhaustion => {
                let message = format!(
                    "The peer stayed unavailable through {} retries; the local operator has an incident.",
                    self.budgets.transient_budget
                );
                if record.attests_not_run() {
                    self.not_run(
                        Code::PeerUnavailable,
                        Retry::Backoff,
                        &format!("{message} Its last answer, signed, says it did not run the call."),
                        digest.as_deref().unwrap_or_default(),
                    )
                } else {
                    let phase = if dispatched {
                        Phase::RemoteExecution
                    } else {
                        Phase::ConnectionSetup
                    };
                    self.attempt
                        .fail(phase, Code::PeerUnavailable, Retry::Backoff, &message)
                }
            }
            Incident::ContractViolation => self.attempt.fail(
                Phase::RemoteExecution,
                Code::PeerContractViolation,
                Retry::Reconcile,
                &format!(
                    "The peer answered without a verifiable attestation through {} retries ({}); this is not a denial. The peer's operator has an incident.",
                    self.budgets.unknown_budget,
                    record.reason.as_deref().unwrap_or("no reason recorded"),
                ),
            ),
        };
        let code = outcome
            .error
            .as_ref()
            .map_or(Code::PeerUnavailable, |e| e.error.code);
        let raised = PeerIncident {
            incident,
            owner: incident.owner(),
            peer: self.op.peer.clone(),
            capability: self.op.capability.clone(),
            code,
            attestation_digest: digest,
            signature: record.signature,
            answers: self.answers,
            transient_used: self.budgets.transient_used,
            unknown_used: self.budgets.unknown_used,
        };
        // The outcome is recorded; an incident that cannot be is still answered.
        let _ = self.attempt.peer_incident(raised);
        match self
            .attempt
            .journal()
            .projection(self.attempt.invocation_id())
        {
            Ok(p) => HttpOutcome {
                result: outcome.result,
                ..HttpOutcome::of_projection(&p, self.attempt.now_ms())
            },
            Err(_) => outcome,
        }
    }

    /// The caller cancelled: before dispatch nothing was sent; after it the record
    /// makes the outcome unknown.
    fn cancelled(&self, dispatched: bool) -> HttpOutcome {
        let phase = if dispatched {
            Phase::RemoteExecution
        } else {
            Phase::ConnectionSetup
        };
        self.attempt.fail(
            phase,
            Code::CallerCancelled,
            Retry::Reconcile,
            "The caller cancelled while the peer was being asked.",
        )
    }
}

/// What a `peer_call` (or `peer_reconcile`) sent at `sent_at_ms` came back with, and
/// when (both by `journal`'s clock).
fn received_call(
    answered: Result<Option<serde_json::Value>, crate::federation::client::Fault>,
    stage: PeerStage,
    sent_at_ms: i64,
    journal: &Journal,
    call: CallBinding,
) -> Received {
    let in_flight = Some(InFlight {
        sent_at_ms,
        answered_at_ms: journal.now_ms(),
    });
    let (answer, outcome) = match answered {
        Err(fault) => (Answer::Transport(fault.fault), None),
        Ok(None) => (Answer::Attested(None), None),
        Ok(Some(value)) => match serde_json::from_value::<CallAnswer>(value) {
            Ok(a) => (Answer::Attested(Some(a.attestation)), a.outcome),
            Err(_) => (Answer::Attested(None), None),
        },
    };
    Received {
        answer,
        outcome,
        stage,
        in_flight,
        call: Some(call),
    }
}

/// Classifies an answer (seed 002), then checks what an outcome carries: the outcome
/// itself, its digest against the attestation's, and a body that decodes. An outcome
/// that fails these is unknown, like an unsigned one.
fn classify_answer(
    received: Received,
    pinned: &ed25519_dalek::VerifyingKey,
    asked: &Asked,
) -> Classified {
    let asked = Asked {
        in_flight: received.in_flight,
        call: received.call.clone(),
        ..asked.clone()
    };
    let mut verdict = federation::classify(&received.answer, pinned, &asked);
    let attestation = match &received.answer {
        Answer::Attested(Some(a)) => Some(a.clone()),
        _ => None,
    };
    let mut outcome = None;
    let mut response = None;
    let binds_outcome = matches!(verdict, Verdict::Outcome)
        || (matches!(verdict, Verdict::PolicyChanged { .. })
            && attestation
                .as_ref()
                .is_some_and(|a| a.kind == federation::AttestationKind::Outcome));
    if binds_outcome {
        match check_outcome(attestation.as_ref(), received.outcome) {
            Ok((o, r)) => {
                outcome = Some(o);
                response = r;
            }
            Err(reason) => verdict = Verdict::Unknown { reason },
        }
    }
    let signature = match (&received.answer, &verdict) {
        (Answer::Transport(_), _) => SignatureCheck::NotApplicable,
        (Answer::Attested(None), _) => SignatureCheck::Absent,
        (Answer::Attested(Some(_)), Verdict::Unknown { .. }) => SignatureCheck::Failed,
        (Answer::Attested(Some(_)), _) => SignatureCheck::Verified,
    };
    let reason = match &verdict {
        Verdict::Unknown { reason } => Some(reason.clone()),
        Verdict::PolicyChanged { from, to } => Some(format!("policy version {from} became {to}")),
        _ => None,
    };
    let record = PeerAnswer {
        n: 0,
        stage: received.stage,
        verdict: VerdictKind::of(&verdict),
        signature,
        transport: match received.answer {
            Answer::Transport(f) => Some(f),
            Answer::Attested(_) => None,
        },
        reason,
        attestation: attestation
            .filter(|a| serde_json::to_vec(a).map_or(0, |b| b.len()) <= MAX_RECORDED_ATTESTATION),
        peer_invocation: outcome
            .as_ref()
            .map(|o: &PeerOutcome| o.invocation_id.clone()),
        peer_outcome: outcome.as_ref().map(|o| o.outcome),
        peer_error: outcome
            .as_ref()
            .and_then(|o| o.error.as_ref().map(|e| e.error.clone())),
        spent: None,
    };
    Classified {
        verdict,
        record,
        outcome,
        response,
    }
}

/// The outcome an `outcome` attestation binds, checked: present, the digest the
/// attestation signed, a record that says what it did, and a body that decodes.
fn check_outcome(
    attestation: Option<&Attestation>,
    outcome: Option<PeerOutcome>,
) -> Result<(PeerOutcome, Option<HttpResponse>), String> {
    let Some(outcome) = outcome else {
        return Err("an outcome attestation came without the outcome it binds".into());
    };
    let signed = attestation.and_then(|a| a.outcome_digest.clone());
    if signed.as_deref() != Some(outcome.digest().as_str()) {
        return Err("the outcome is not the one the attestation signed (digest mismatch)".into());
    }
    if outcome.invocation_id.is_empty() {
        return Err("the outcome names no invocation on the peer".into());
    }
    if outcome.outcome != Settled::Committed && outcome.error.is_none() {
        return Err(format!(
            "an outcome of {} carries no envelope saying why",
            outcome.outcome.as_str()
        ));
    }
    let response = match &outcome.response {
        None => None,
        Some(r) if !(200..=599).contains(&r.status) => {
            return Err(format!(
                "the response status {} is not a final HTTP status",
                r.status
            ));
        }
        Some(r) => {
            use base64::Engine;
            let body = base64::engine::general_purpose::STANDARD
                .decode(r.body_base64.as_bytes())
                .map_err(|e| format!("the response body is not base64: {e}"))?;
            Some(HttpResponse {
                status: r.status,
                headers: r.headers.clone(),
                body,
                decoded_from: None,
                body_withheld: None,
            })
        }
    };
    Ok((outcome, response))
}

/// This broker's retry advice for the peer's settled answer. The peer answers a repeat
/// of this invocation from its record, so repeating it never reruns anything: what the
/// peer would retry needs a new request here.
fn retry_here(outcome: Settled, peer_retry: Option<Retry>) -> Retry {
    match (outcome, peer_retry) {
        (_, Some(Retry::Never) | Some(Retry::FetchResult)) => Retry::Never,
        (Settled::Committed, None) => Retry::Never,
        (_, Some(Retry::Reconcile)) => Retry::Reconcile,
        (_, _) => Retry::AfterCorrection,
    }
}

/// 16 fresh random bytes for a peer auth.
pub(super) fn nonce() -> [u8; 16] {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // Unique within this process without randomness: the peer refuses repeats.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes.copy_from_slice(&nanos.to_le_bytes());
    }
    bytes
}

/// What one reconciliation asked and found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileReport {
    pub verdict: VerdictKind,
    pub signature: SignatureCheck,
    pub settled: Option<Settlement>,
}

impl Pipeline<Peer> {
    pub fn new(journal: Journal, vault: std::sync::Arc<Vault>, config: ConfigHandle) -> Self {
        Pipeline::with(
            Peer {
                listings: Listings::new(journal.clone(), config.clone()),
            },
            journal,
            vault,
            config,
        )
    }

    /// What each peer lists, refreshed where stale (see [`Listings`]).
    pub fn listings(&self) -> &Listings {
        &self.channel().listings
    }

    /// Runs one agent request to a peer capability as a new invocation. The peer's
    /// listing is refreshed first when stale, so the call binds the policy version the
    /// peer last published.
    pub async fn execute(&self, request: HttpRequest, ctx: &CallContext) -> HttpOutcome {
        if let Ok((peer, _, _)) = validate::parse(&request.url) {
            let _ = self.listings().listing(&peer).await;
        }
        self.run(&request, ctx).await
    }

    /// Reconciles an unknown outcome on the peer: `peer_reconcile` with the peer's
    /// invocation when a verified answer named it, otherwise `peer_call` again with
    /// the same caller invocation (the peer answers its record; one that never reached
    /// it runs now, still at most once). A signed, verified settlement is recorded as
    /// RECONCILED (`remote_query`); a response that comes with it stays at the peer.
    pub async fn reconcile(
        &self,
        invocation_id: &str,
        by: &str,
    ) -> (HttpOutcome, Option<ReconcileReport>) {
        let rec = match Recorder::resume(self.journal(), invocation_id) {
            Ok(r) => r,
            Err(e) => return (unrecorded(invocation_id, &e), None),
        };
        let p = match rec.projection() {
            Ok(p) => p,
            Err(e) => return (unrecorded(invocation_id, &e), None),
        };
        if p.channel != Some(events::Channel::Peer) || p.outcome != Settled::Unknown || !p.terminal
        {
            return (self.recorded_outcome(&rec), None);
        }
        let received = match self.ask_again(&p).await {
            Ok(r) => r,
            Err(message) => {
                let mut outcome = self.outcome_of(&rec);
                if let Some(env) = outcome.error.as_mut() {
                    env.error.message = message;
                }
                return (outcome, None);
            }
        };
        let Some(op) = p.operation.as_ref().and_then(|o| o.peer.as_deref()) else {
            return (self.outcome_of(&rec), None);
        };
        let config = self.config().current();
        let Some(pinned) = config.peer(&op.peer).map(|c| c.key.key) else {
            return (self.outcome_of(&rec), None);
        };
        // The settlement is about the peer's record, whatever its policy says now.
        let asked = Asked {
            peer: op.key_name.clone(),
            capability: op.capability.clone(),
            fingerprint: p.fingerprint.clone().unwrap_or_default(),
            policy_version: None,
            in_flight: None,
            call: None,
        };
        let classified = classify_answer(received, &pinned, &asked);
        let mut record = classified.record.clone();
        record.n = p.peer.as_ref().map_or(0, |s| s.answers) + 1;
        if let Err(e) = rec.peer_answer(record.clone()) {
            return (self.journal_failed(&rec, &e), None);
        }
        let settlement = match (
            &classified.verdict,
            classified.outcome.as_ref().map(|o| o.outcome),
        ) {
            (Verdict::Outcome, Some(Settled::Committed)) => Some(Settlement::Committed),
            (Verdict::Outcome, Some(Settled::Rejected | Settled::NotAttempted)) => {
                Some(Settlement::NotApplied)
            }
            _ => None,
        };
        let report = ReconcileReport {
            verdict: record.verdict,
            signature: record.signature,
            settled: settlement,
        };
        if let (Some(settlement), Some(outcome)) = (settlement, classified.outcome.as_ref()) {
            let note = format!(
                "peer {} settled its invocation {} as {} (attestation {}, signature verified)",
                op.peer,
                outcome.invocation_id,
                outcome.outcome.as_str(),
                record
                    .attestation
                    .as_ref()
                    .map_or("", |a| a.digest.as_str()),
            );
            let status = classified.response.as_ref().map(|r| r.status);
            if let Err(e) =
                rec.reconcile(ConfidenceSource::RemoteQuery, settlement, by, &note, status)
            {
                return (self.journal_failed(&rec, &e), Some(report));
            }
        }
        (self.outcome_of(&rec), Some(report))
    }

    /// One question to the peer about `p`'s call: `peer_reconcile` when its invocation
    /// there is known, else the same `peer_call` again.
    async fn ask_again(&self, p: &Projection) -> Result<Received, String> {
        let op = p
            .operation
            .as_ref()
            .and_then(|o| o.peer.as_deref())
            .ok_or("the record binds no peer")?;
        let config = self.config().current();
        let peer = config
            .peer(&op.peer)
            .ok_or("the peer is no longer configured")?;
        let url = peer.url.clone().ok_or("the peer has no URL to call")?;
        let per_try = Duration::from_millis(op.timeout_ms.max(1));
        let fingerprint = p.fingerprint.clone().unwrap_or_default();
        let journal = self.journal();
        let known = p
            .peer
            .as_ref()
            .and_then(|s| s.last_verified.as_ref())
            .and_then(|a| a.peer_invocation.clone());
        let (tool, args, call) = match known {
            Some(peer_invocation) => {
                let auth = journal.sign_peer_auth(
                    TOOL_RECONCILE,
                    &wire::reconcile_subject(&peer_invocation, &op.capability, &fingerprint),
                    journal.now_ms(),
                    nonce(),
                );
                let call = CallBinding::of(&auth, None, None);
                (
                    TOOL_RECONCILE,
                    serde_json::to_value(ReconcileArgs {
                        auth,
                        capability: op.capability.clone(),
                        invocation_id: peer_invocation,
                        request_fingerprint: fingerprint,
                    }),
                    call,
                )
            }
            None => {
                let stored = journal
                    .load_request(&p.invocation_id)
                    .map_err(|e| e.to_string())?
                    .ok_or("the request was not kept")?;
                let request = stored_request(stored);
                let v = self
                    .channel()
                    .validate(&request, &config)
                    .map_err(|i| i.message)?;
                let generation = p.attempt.generation;
                let auth = journal.sign_peer_auth(
                    TOOL_CALL,
                    &wire::call_subject(
                        &fingerprint,
                        &p.invocation_id,
                        generation,
                        op.policy_version.as_deref(),
                    ),
                    journal.now_ms(),
                    nonce(),
                );
                let call = CallBinding::of(&auth, Some(&p.invocation_id), Some(generation));
                (
                    TOOL_CALL,
                    serde_json::to_value(CallArgs {
                        auth,
                        request: v.plan.request,
                        caller_invocation: p.invocation_id.clone(),
                        caller_attempt: generation,
                        policy_version: op.policy_version.clone(),
                    }),
                    call,
                )
            }
        };
        let args = args.map_err(|e| e.to_string())?;
        let sent_at_ms = journal.now_ms();
        let me = journal.peer_name();
        let answered = match Session::open_as(&url, per_try, &me).await {
            Err(fault) => Err(fault),
            Ok(session) => {
                let answered = session.call(tool, args, per_try).await;
                session.close().await;
                answered
            }
        };
        Ok(received_call(
            answered,
            PeerStage::Reconcile,
            sent_at_ms,
            journal,
            call,
        ))
    }
}
