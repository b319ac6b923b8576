//! What a channel writes, and what the pipeline hands it: the [`Channel`] trait (the
//! hooks: what is accepted, validation, the operation facts bound, the approval card,
//! arming the secret, one attempt, the stored result read back) and the values that
//! pass between the pipeline and those hooks ([`CallContext`], [`Accepted`],
//! [`Invalid`], [`Validated`], [`Bound`]). Everything else about an invocation is the
//! [`pipeline`](super::pipeline)'s.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::attempt::Attempt;
use super::outcome::Outcome;
use crate::action::{ConfigSnapshot, Fingerprint, NormalizedAction};
use crate::approvals::{ApprovalDetail, Approver};
use crate::config::{ApprovalMode, Config};
use crate::contract::{Code, Failure, Phase, Retry};
use crate::journal::StoredResult;
use crate::journal::events::{Channel as ChannelKind, OperationFacts};
use crate::record::job::ParentLink;
use crate::record::session::Confinement;
use crate::vault::Secret;

/// Who a call runs for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CallerKind {
    /// An agent on this broker's socket (or the operator's own run).
    #[default]
    Local,
    /// A federated peer broker, by the key name it is pinned as: its approval card says
    /// which broker asks.
    Peer { key_name: String },
}

/// Who is calling and how to stop.
#[derive(Clone, Default)]
pub struct CallContext {
    pub session: Option<String>,
    /// Whether the caller is local or a federated peer.
    pub caller: CallerKind,
    pub approver: Option<Arc<dyn Approver>>,
    /// Cancelled when the caller loses interest; after dispatch the outcome stays
    /// unknown (the remote may still be running).
    pub cancel: CancellationToken,
    /// Set when the broker starts this call for another invocation (a followed
    /// redirect, a job poll); recorded in the new invocation's ACTION_ACCEPTED.
    pub parent: Option<ParentLink>,
    /// How the calling session's agent is confined, as the agent socket established it
    /// (never the agent's word): what a `require_confined` target checks.
    pub confinement: Confinement,
}

impl CallContext {
    /// This context for a session whose agent is confined as `confinement`.
    pub fn with_confinement(self, confinement: Confinement) -> Self {
        CallContext {
            confinement,
            ..self
        }
    }
}

/// What ACTION_ACCEPTED records before anything is validated.
#[derive(Debug, Clone, Default)]
pub struct Accepted {
    /// The target the request names, if it names one.
    pub target: Option<String>,
    /// A secret-free description for people.
    pub summary: String,
    pub idempotency_key: Option<String>,
}

/// Why a request is refused before anything is touched: recorded as a validation
/// failure, retry after correction, naming the field to fix.
#[derive(Debug, Clone)]
pub struct Invalid {
    pub code: Code,
    pub field: String,
    pub message: String,
}

impl Invalid {
    pub fn new(code: Code, field: impl Into<String>, message: impl Into<String>) -> Self {
        Invalid {
            code,
            field: field.into(),
            message: message.into(),
        }
    }

    /// PAYLOAD_LIMIT on `field`: the request is larger than a limit allows.
    pub fn too_large(field: impl Into<String>, message: impl Into<String>) -> Self {
        Invalid::new(Code::PayloadLimit, field, message)
    }
}

/// A request as the channel validated it.
#[derive(Debug, Clone)]
pub struct Validated<P> {
    /// The target's name.
    pub target: String,
    pub action: NormalizedAction,
    /// The key the request carries (the caller's, or one the broker made).
    pub idempotency_key: Option<String>,
    /// How long the attempt may take.
    pub timeout: Duration,
    /// The request as stored for a retry: metadata and body bytes.
    pub stored: (serde_json::Value, Vec<u8>),
    /// What only the channel reads.
    pub plan: P,
}

/// A validated request bound to its configuration snapshot and fingerprint.
#[derive(Debug, Clone)]
pub struct Bound<P> {
    pub target: String,
    pub action: NormalizedAction,
    pub snapshot: ConfigSnapshot,
    pub fingerprint: String,
    pub idempotency_key: Option<String>,
    pub timeout: Duration,
    pub plan: P,
}

/// What a channel adds to the pipeline: validation and one attempt.
pub trait Channel: Send + Sync + Sized + 'static {
    /// What an agent asks for.
    type Request: Send + Sync;
    /// What validation found that only this channel reads.
    type Plan: Clone + Send + Sync;
    /// What the credential was turned into for one attempt: the injected request, a
    /// decoded key, and the redactor for what comes back.
    type Armed: Send;
    /// A settled remote result, secrets scrubbed.
    type Result: Clone + Send + Sync;

    const KIND: ChannelKind;
    /// The request field that names the target.
    const TARGET_FIELD: &'static str;

    /// The target and summary ACTION_ACCEPTED records, before validation.
    fn accepted(&self, request: &Self::Request, config: &Config) -> Accepted;

    /// Everything that can be checked before a secret is touched or a socket opened.
    fn validate(
        &self,
        request: &Self::Request,
        config: &Config,
    ) -> Result<Validated<Self::Plan>, Invalid>;

    /// The operation facts bound with the fingerprint: what a retry decision may rely on.
    fn operation(&self, config: &Config, bound: &Bound<Self::Plan>, now_ms: i64) -> OperationFacts;

    /// [`Channel::operation`] for the invocation `invocation_id` (a channel whose facts
    /// name the invocation: a peer de-duplicates by it).
    fn operation_for(
        &self,
        config: &Config,
        bound: &Bound<Self::Plan>,
        now_ms: i64,
        _invocation_id: &str,
    ) -> OperationFacts {
        self.operation(config, bound, now_ms)
    }

    /// The summary and action a person approves (async: the card shows the addresses
    /// the host resolves to).
    fn approval(
        &self,
        bound: &Bound<Self::Plan>,
    ) -> impl Future<Output = (String, ApprovalDetail)> + Send;

    /// Prepares one attempt with the secret, before the lease is taken: nothing is sent
    /// yet, so a failure here proves not_attempted.
    fn arm(
        &self,
        config: &Config,
        bound: &Bound<Self::Plan>,
        secret: Secret,
    ) -> Result<Self::Armed, Failure>;

    /// Connection setup, dispatch through [`Attempt::gate`], the exchange, and the
    /// settled result through [`Attempt::commit`] (or a recorded failure).
    fn attempt(
        &self,
        attempt: Attempt<'_, Self>,
        armed: Self::Armed,
        ctx: &CallContext,
    ) -> impl Future<Output = Outcome<Self::Result>> + Send;

    /// A stored result read back (a fetch, a retry that is not allowed to run).
    fn stored_result(stored: &StoredResult) -> Option<Self::Result>;

    /// Whether the credential is first used in the request the dispatch gate releases,
    /// so its authorization and the attempt's lease can wait for that gate and be
    /// recorded in DISPATCH_STARTED's own transaction (one commit instead of two, with
    /// the connection set up in between; see [`Recorder::defer_authorization`](super::Recorder::defer_authorization)). A
    /// channel that uses it earlier (SSH authenticates with it in the handshake)
    /// records them before connecting.
    const DEFER_AUTHORIZATION: bool = false;

    /// Whether an attempt reads a credential from the keychain. A channel that has none
    /// (the peer holds it) binds with [`Channel::bind_bare`], is armed with
    /// [`Channel::arm_bare`], and never touches the keychain.
    const NEEDS_CREDENTIAL: bool = true;

    /// For a channel without a credential: the configuration snapshot a validated
    /// request binds.
    fn bind_bare(
        &self,
        _config: &Config,
        _validated: &Validated<Self::Plan>,
    ) -> Result<ConfigSnapshot, Invalid> {
        Err(Invalid::new(
            Code::InvalidTarget,
            Self::TARGET_FIELD,
            "This channel binds a keychain credential.",
        ))
    }

    /// For a channel without a credential: prepares one attempt. Nothing is sent yet,
    /// so a failure here proves not_attempted.
    fn arm_bare(
        &self,
        _config: &Config,
        _bound: &Bound<Self::Plan>,
    ) -> Result<Self::Armed, Failure> {
        Err(Failure {
            phase: Phase::CredentialInjection,
            code: Code::CredentialMissing,
            retry: Retry::AfterCorrection,
            message: "This channel needs a keychain credential.".into(),
        })
    }

    /// The approval mode for a call to `target`: the configured target's, by default.
    fn approval_mode(&self, config: &Config, target: &str) -> ApprovalMode {
        config
            .target(target)
            .map_or(ApprovalMode::None, |t| t.approval())
    }

    /// The invocation fingerprint of `action` under `snapshot`, bound at preflight.
    fn fingerprint(action: &NormalizedAction, snapshot: &ConfigSnapshot) -> String {
        Fingerprint::compute(action, snapshot).to_string()
    }

    /// The fingerprint of what is about to be sent under the live configuration,
    /// recomputed at the dispatch gate: a reload that changed the target changes it, and
    /// nothing is sent.
    fn fingerprint_now(
        config: &Config,
        target: &str,
        action: &NormalizedAction,
        bound: &ConfigSnapshot,
    ) -> String {
        match config.target(target) {
            Some(t) => {
                let snapshot = ConfigSnapshot::of(
                    t,
                    bound.credential_version.clone(),
                    bound.idempotency_key.clone(),
                );
                Fingerprint::compute(action, &snapshot).to_string()
            }
            None => String::from("target-removed"),
        }
    }
}
