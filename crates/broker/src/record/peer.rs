//! What brokers that peer record about each other's answers (seed 002), as plain record
//! types on the ground floor: the signed attestation a peer answers with, how an answer
//! was classified, the incident a stopped call raises and whom it is for, and what the
//! asking broker records per answer ([`PeerAnswer`]), per call ([`PeerOperation`],
//! [`PeerIncident`]) and shows in the envelope ([`PeerEvidence`]). These are journal
//! payloads: their JSON is what the audit chain hashes, so optional fields are skipped
//! when absent and old records keep their bytes. Signing, verifying and classifying are
//! [`crate::federation`]'s.
//!
//! Never: change a field's serialized form.

use serde::{Deserialize, Serialize};

use crate::contract::codes::wire_names;

/// What an attestation says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttestationKind {
    /// B's policy refused. Terminal: never retried. B does not disclose whether the
    /// capability exists.
    Denial,
    /// B cannot serve the capability for now.
    Unavailable,
    /// B ran the call; `outcome_digest` binds B's outcome envelope.
    Outcome,
}

wire_names!(AttestationKind {
    Denial => "denial",
    Unavailable => "unavailable",
    Outcome => "outcome",
});

/// The one call an attestation answers, as the answering broker read it from the call's
/// signed auth: who asked (the asking broker's key name), the auth's nonce (fresh for
/// every call), and for a `peer_call` the asking broker's invocation id and attempt.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallBinding {
    pub caller: String,
    pub nonce: String,
    pub invocation: Option<String>,
    pub attempt: Option<u32>,
}

/// A peer broker's signed statement about one request for one capability.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attestation {
    pub kind: AttestationKind,
    /// The attesting broker's key name (its audit log origin, the name part of the key
    /// pinned for it in `[[peer]]`).
    pub peer: String,
    /// The capability asked for, as the attesting broker exports it.
    pub capability: String,
    /// The fingerprint of the request the asking broker sent.
    pub request_fingerprint: String,
    /// The attesting broker's export policy version when it decided.
    pub policy_version: String,
    /// Unix ms, by the attesting broker's clock.
    pub issued_at_ms: i64,
    /// For `outcome`: the digest of the attesting broker's outcome envelope.
    pub outcome_digest: Option<String>,
    /// The call answered. Empty in records written before format 2, which a fresh
    /// answer never verifies as.
    #[serde(default)]
    pub call: CallBinding,
    /// `blake3:` + hex over the fields above (`Attestation::digest`).
    pub digest: String,
    /// ed25519 signature, hex, over `federation::SIGNING_CONTEXT` followed by `digest`.
    pub signature: String,
}

/// A failure below the attestation layer: never a verdict about policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportFault {
    /// HTTP 429 (a rate limiter, perhaps answering a retry storm).
    RateLimited,
    Timeout,
    /// Connection refused or reset, or the stream broke.
    Reset,
}

/// How one answer is classified (seed 002's decision boundary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Signed denial: terminal, never retried, no failover.
    Denial,
    /// Signed unavailable: transient.
    Unavailable,
    /// Signed outcome: B ran the call and says what happened.
    Outcome,
    /// A transport error: transient, and never counted toward a denial or contract
    /// budget.
    Transport(TransportFault),
    /// No envelope or one that does not verify: not a verdict; a broker-contract
    /// violation once the retries are spent.
    Unknown { reason: String },
    /// The peer's policy version changed since the attempt began: the attempt is
    /// abandoned, not classified.
    PolicyChanged { from: String, to: String },
}

/// Who must act on an incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Owner {
    /// Whoever owns the peering agreement: the peer's policy refuses this capability.
    PeeringOwner,
    /// The operator of the peer broker: it emitted outcomes it did not attest.
    PeerOperator,
    /// This broker's operator: the peer stayed unavailable.
    LocalOperator,
}

/// What the asking broker raises when it stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Incident {
    /// A signed denial.
    Policy,
    /// Unattested or unverifiable answers until the unknown budget was spent.
    ContractViolation,
    /// Signed unavailable or transport errors until the transient budget was spent.
    TransientExhaustion,
}

wire_names!(Owner {
    PeeringOwner => "peering_owner",
    PeerOperator => "peer_operator",
    LocalOperator => "local_operator",
});

impl Incident {
    pub fn owner(self) -> Owner {
        match self {
            Incident::Policy => Owner::PeeringOwner,
            Incident::ContractViolation => Owner::PeerOperator,
            Incident::TransientExhaustion => Owner::LocalOperator,
        }
    }
}

wire_names!(Incident {
    Policy => "policy",
    ContractViolation => "contract_violation",
    TransientExhaustion => "transient_exhaustion",
});

use crate::contract::codes::{Code, ErrorBody, Outcome};

/// The largest attestation kept in a record, as JSON: a peer's fields are its own text,
/// and a hostile peer must not fill the journal through them.
pub const MAX_RECORDED_ATTESTATION: usize = 8 * 1024;

/// Where in the exchange an answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerStage {
    /// Opening the MCP session with the peer: nothing of the call was sent yet.
    Setup,
    /// The `peer_call` itself (after DISPATCH_STARTED).
    Call,
    /// Asking the peer again about an unknown outcome, after the attempt ended.
    Reconcile,
}

/// How one answer was classified (seed 002's decision boundary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    Outcome,
    Denial,
    Unavailable,
    Transport,
    Unknown,
    PolicyChanged,
}

impl VerdictKind {
    pub fn of(verdict: &Verdict) -> VerdictKind {
        match verdict {
            Verdict::Outcome => VerdictKind::Outcome,
            Verdict::Denial => VerdictKind::Denial,
            Verdict::Unavailable => VerdictKind::Unavailable,
            Verdict::Transport(_) => VerdictKind::Transport,
            Verdict::Unknown { .. } => VerdictKind::Unknown,
            Verdict::PolicyChanged { .. } => VerdictKind::PolicyChanged,
        }
    }
}

wire_names!(VerdictKind {
    Outcome => "outcome",
    Denial => "denial",
    Unavailable => "unavailable",
    Transport => "transport",
    Unknown => "unknown",
    PolicyChanged => "policy_changed",
});

/// What checking an answer's attestation against the peer's pinned key found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignatureCheck {
    /// The digest and signature verify with the pinned key, and it is about this request.
    Verified,
    /// The answer carried no attestation.
    Absent,
    /// An attestation came and did not verify (see the answer's reason).
    Failed,
    /// Nothing reached the attestation layer (a transport error).
    NotApplicable,
}

wire_names!(SignatureCheck {
    Verified => "verified",
    Absent => "absent",
    Failed => "failed",
    NotApplicable => "not_applicable",
});

/// Which budget an answer spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Budget {
    /// Signed `unavailable` and transport errors.
    Transient,
    /// Unattested or unverifiable answers.
    Unknown,
}

/// One answer from the peer (or the transport failure instead of one), as recorded.
/// (A journal event's payload: its `kind` tag sits beside these fields, so unknown
/// fields cannot be denied here.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerAnswer {
    /// 1 for the invocation's first answer; counts across attempts and restarts.
    pub n: u32,
    pub stage: PeerStage,
    pub verdict: VerdictKind,
    pub signature: SignatureCheck,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<TransportFault>,
    /// Why an answer is unknown, or how the policy moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The attestation as received (verified or not), unless it exceeded
    /// [`MAX_RECORDED_ATTESTATION`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestation: Option<Attestation>,
    /// For a verified outcome: the invocation on the peer, its outcome there, and its
    /// envelope's error body when its record carries a code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_invocation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_outcome: Option<Outcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_error: Option<ErrorBody>,
    /// The budget this answer spent, if any (the record of the budgets: a restart
    /// counts them again from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent: Option<Budget>,
}

impl PeerAnswer {
    /// Whether this is a verified statement by the peer that it did not run the call:
    /// a signed denial or unavailable, or a signed outcome whose record says
    /// not_attempted.
    pub fn attests_not_run(&self) -> bool {
        if self.signature != SignatureCheck::Verified {
            return false;
        }
        match self.attestation.as_ref().map(|a| a.kind) {
            Some(AttestationKind::Denial | AttestationKind::Unavailable) => true,
            Some(AttestationKind::Outcome) => self.peer_outcome == Some(Outcome::NotAttempted),
            None => false,
        }
    }
}

/// A call through a peer stopped in a way someone must act on. (A journal event's
/// payload, beside its `kind` tag: hence `incident`, not `kind`.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerIncident {
    pub incident: Incident,
    pub owner: Owner,
    /// The peer's name in this broker's `[[peer]]`.
    pub peer: String,
    pub capability: String,
    /// The code the invocation ended with.
    pub code: Code,
    /// The digest of the last attestation received, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestation_digest: Option<String>,
    /// What checking that attestation found.
    pub signature: SignatureCheck,
    /// Answers the call received, and what it spent.
    pub answers: u32,
    pub transient_used: u32,
    pub unknown_used: u32,
}

/// The peer's part of an envelope's evidence: what the peer proved, and how.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerEvidence {
    /// The peer's name in this broker's `[[peer]]`.
    pub peer: String,
    pub capability: String,
    /// Answers received so far (across attempts) and the budgets they spent.
    pub answers: u32,
    pub transient_used: u32,
    pub unknown_used: u32,
    /// The budgets bound at preflight.
    pub transient_budget: u32,
    pub unknown_budget: u32,
    /// The last answer's verdict and signature check.
    pub last_verdict: Option<VerdictKind>,
    pub signature: Option<SignatureCheck>,
    /// The last attestation received (verified or not; `signature` says which).
    pub attestation: Option<Attestation>,
    /// The invocation on the peer, its outcome there and its error body.
    pub peer_invocation_id: Option<String>,
    pub peer_outcome: Option<Outcome>,
    pub peer_error: Option<ErrorBody>,
    /// The incident raised, if the call stopped with one.
    pub incident: Option<Incident>,
}

/// What a call through a peer binds at preflight, beside the fingerprint: whom it
/// asks, under which policy version, and the budgets its answers may spend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerOperation {
    /// The peer's name in this broker's `[[peer]]`.
    pub peer: String,
    /// The name its attestations carry (its pinned key's name).
    pub key_name: String,
    pub capability: String,
    /// The peer's export policy version this broker last saw, if it saw one: an answer
    /// under another version abandons the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<String>,
    /// Budgets and backoff (nothing spent: the answers record what is).
    pub attempts: Attempts,
    /// How long one call may take, ms.
    pub timeout_ms: u64,
}

/// Budgets for one resolution, counted separately: a transport error never spends the
/// unknown budget, and nothing but a signed denial ever stops as a policy incident.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempts {
    /// Retries allowed after signed `unavailable` or transport errors.
    pub transient_budget: u32,
    /// Retries allowed after unattested answers.
    pub unknown_budget: u32,
    pub transient_used: u32,
    pub unknown_used: u32,
    /// Backoff base and cap, ms.
    pub base_backoff_ms: u64,
    pub max_backoff_ms: u64,
}

impl Attempts {
    /// Five transient retries (seed 002's example), three for unattested answers
    /// (fewer: a broker that does not attest is at fault, and waiting rarely fixes it),
    /// backoff from 500 ms doubling to at most 30 s.
    pub fn new() -> Attempts {
        Attempts {
            transient_budget: 5,
            unknown_budget: 3,
            transient_used: 0,
            unknown_used: 0,
            base_backoff_ms: 500,
            max_backoff_ms: 30_000,
        }
    }

    /// The wait before retry `n` (from 0): the base doubled `n` times, at most the cap.
    pub fn backoff(&self, n: u32) -> u64 {
        self.base_backoff_ms
            .saturating_mul(1u64 << n.min(20))
            .min(self.max_backoff_ms)
    }
}

impl Default for Attempts {
    fn default() -> Self {
        Attempts::new()
    }
}
