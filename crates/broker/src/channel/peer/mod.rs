//! The peer channel: an agent's `http_request` to `peer://<peer>/<capability>/<path>`,
//! run by another broker (seed 002). The peer holds the credential and its approver
//! decides; this broker holds no credential for it, so the channel declares none
//! ([`Channel::NEEDS_CREDENTIAL`]) and the keychain is never read.
//!
//! One attempt: PREFLIGHT_VALIDATED binds the peer request's fingerprint
//! ([`PeerRequest::fingerprint`]), the peer's policy version last seen and the retry
//! budgets ([`PeerOperation`]); DISPATCH_STARTED is durable before the `peer_call`
//! leaves; each answer is classified by [`federation::classify`](crate::federation::classify), recorded as a
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
//!
//! Where each part is: this file holds the channel's hooks (validation in
//! `validate`, binding, the approval card, the attempt's entry) and the peer's
//! configured facts; `attempt` is one attempt's loop (ask, classify, settle or stop, each
//! recorded); `answer` checks and classifies what a peer answered; `reconcile` settles
//! an unknown outcome by asking the peer again.

mod answer;
mod attempt;
pub mod listing;
mod reconcile;
mod validate;

pub use reconcile::ReconcileReport;

use std::time::Duration;

use crate::action::ConfigSnapshot;
use crate::approvals::ApprovalDetail;
use crate::channel::http::{HttpOutcome, HttpRequest, HttpResponse, stored_response};
use crate::config::{ApprovalMode, Config, ConfigHandle, TargetVersion};
use crate::contract::{Code, IdempotencyEvidence, Phase, RemoteContract, Retry};
use crate::federation::Attempts;
use crate::federation::record::PeerOperation;
use crate::federation::wire::PeerRequest;
use crate::invocation::{
    Accepted, Attempt, Bound, CallContext, Channel, Failure, Invalid, Pipeline, Validated,
};
use crate::journal::events::{self, OperationFacts};
use crate::journal::{Journal, StoredResult};
use crate::vault::{Secret, Vault};
use attempt::Run;
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
            summary: crate::channel::http::validate::summary(request),
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
}
