//! What the asking broker records about its calls through a peer: one
//! [`PeerAnswer`] per answer (or transport failure), the budgets they spent, the
//! [`PeerIncident`] raised when a call stops, and the [`PeerEvidence`] the envelope
//! shows. These are journal payloads: their JSON is what the audit chain hashes, so
//! optional fields are skipped when absent and old records keep their bytes.

use serde::{Deserialize, Serialize};

use super::{Attestation, AttestationKind, Incident, Owner, TransportFault, Verdict};
use crate::contract::{Code, ErrorBody, Outcome};

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

    pub fn as_str(self) -> &'static str {
        match self {
            VerdictKind::Outcome => "outcome",
            VerdictKind::Denial => "denial",
            VerdictKind::Unavailable => "unavailable",
            VerdictKind::Transport => "transport",
            VerdictKind::Unknown => "unknown",
            VerdictKind::PolicyChanged => "policy_changed",
        }
    }
}

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

impl SignatureCheck {
    pub fn as_str(self) -> &'static str {
        match self {
            SignatureCheck::Verified => "verified",
            SignatureCheck::Absent => "absent",
            SignatureCheck::Failed => "failed",
            SignatureCheck::NotApplicable => "not_applicable",
        }
    }
}

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
    pub attempts: super::Attempts,
    /// How long one call may take, ms.
    pub timeout_ms: u64,
}
