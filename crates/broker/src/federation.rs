//! Federation between brokers (seed 002): what one broker attests to another about a
//! capability it exports, and how the asking broker classifies what came back.
//!
//! Broker B holds the credential and the approver; broker A's agents call B's exported
//! capabilities. Every resolution and call outcome B emits carries an [`Attestation`]
//! signed with B's broker key, with an explicit [`AttestationKind`]: `denial` (B's policy
//! refused; B does not say whether the capability exists), `unavailable` (B cannot serve
//! it for now), or `outcome` (B ran the call; the digest binds B's outcome envelope).
//!
//! B answers its peers through [`serve::PeerService`] (the wire is [`wire`]).
//!
//! A classifies each answer by [`classify`], which follows seed 002's decision boundary
//! exactly, and decides the next step with [`Attempts::next`]:
//!
//! | what arrived | verdict | next |
//! |---|---|---|
//! | signed `denial` | terminal | never retried, no failover; a *policy incident* for the peering owner |
//! | signed `unavailable` | transient | bounded backoff, then *transient exhaustion* for the local operator |
//! | no envelope, bad signature, wrong key, or an envelope about another request or another call (caller, nonce, invocation, attempt) | unknown | limited retries, then a *broker-contract violation* for B's operator |
//! | signed `denial` that B could not place under a policy (it could not authenticate the call: the call was changed on the way) or under a policy version this broker does not know | unknown | as above: a denial is terminal only when it is about this very call and under a policy this broker can place |
//! | transport error (429, timeout, reset) | transient | backoff; never counted toward any denial or contract budget |
//! | signed, but B's policy version changed since the attempt began | abandoned | the attempt stops unclassified |
//!
//! # Attestation encoding, version 1
//!
//! The digest is BLAKE3 in key-derivation mode with context
//! `"postern 2026 federation-attestation v1"` over, in order, the format version byte
//! (2), the kind, peer, capability, request fingerprint, policy version, issue time (i64
//! LE), the outcome digest (a presence byte, then the text), and the call it answers
//! ([`CallBinding`]): the caller's key name, the caller's nonce, the caller's invocation
//! id (a presence byte, then the text) and attempt (a presence byte, then u32 LE); each
//! field preceded by its length as u64 LE. The signature is Ed25519 over
//! [`SIGNING_CONTEXT`] followed by the digest's text (`blake3:` + hex).
//!
//! Format 2 binds every answer to the one call it answers (issue 27): the nonce is fresh
//! for every call the asking broker signs, so an answer captured for one call, however
//! genuine, is never accepted as the answer to another, and a denial or `unavailable`
//! saved from an earlier try cannot stand in for a later one.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use crate::canonical::signed_message;

pub use crate::config::peer::Attempts;
pub use crate::record::peer::{
    Attestation, AttestationKind, CallBinding, Incident, Owner, TransportFault, Verdict,
};

pub mod client;
pub mod record;
pub mod serve;
pub mod wire;

/// The policy version a denial carries when the call is not authenticated (no pinned
/// peer, or a signature that fails). A party on the path can provoke such a denial by
/// breaking the asker's signature; an asker that began with B's version then sees a
/// policy change and abandons the attempt instead of taking the denial as final.
pub const NO_POLICY: &str = "none";

/// What prefixes the session of a peer's invocations (agent sessions are `sess_…`).
pub const PEER_SESSION_PREFIX: &str = "peer:";

/// The session B's invocations for the peer whose key is named `key_name` run under.
pub fn peer_session(key_name: &str) -> String {
    format!("{PEER_SESSION_PREFIX}{key_name}")
}

/// The peer key name of a peer session, if `session` is one.
pub fn session_peer(session: &str) -> Option<&str> {
    session.strip_prefix(PEER_SESSION_PREFIX)
}

const DIGEST_CONTEXT: &str = "postern 2026 federation-attestation v1";
const FORMAT: u8 = 2;
/// What a broker's signature on an attestation covers, before the digest.
pub const SIGNING_CONTEXT: &[u8] = b"postern federation-attestation signature v1\n";

impl CallBinding {
    /// The binding of the call whose auth is `auth`.
    pub fn of(
        auth: &wire::PeerAuth,
        invocation: Option<&str>,
        attempt: Option<u32>,
    ) -> CallBinding {
        CallBinding {
            caller: auth.peer.clone(),
            nonce: auth.nonce.to_ascii_lowercase(),
            invocation: invocation.map(str::to_string),
            attempt,
        }
    }
}

/// The fields an attestation signs, before it is signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    pub kind: AttestationKind,
    pub peer: String,
    pub capability: String,
    pub request_fingerprint: String,
    pub policy_version: String,
    pub issued_at_ms: i64,
    pub outcome_digest: Option<String>,
    pub call: CallBinding,
}

impl Statement {
    /// The digest of these fields (see the module doc).
    pub fn digest(&self) -> String {
        let mut h = blake3::Hasher::new_derive_key(DIGEST_CONTEXT);
        let mut field = |bytes: &[u8]| {
            h.update(&(bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(&[FORMAT]);
        field(self.kind.as_str().as_bytes());
        field(self.peer.as_bytes());
        field(self.capability.as_bytes());
        field(self.request_fingerprint.as_bytes());
        field(self.policy_version.as_bytes());
        field(&self.issued_at_ms.to_le_bytes());
        optional(
            &mut field,
            self.outcome_digest.as_deref().map(str::as_bytes),
        );
        field(self.call.caller.as_bytes());
        field(self.call.nonce.as_bytes());
        optional(
            &mut field,
            self.call.invocation.as_deref().map(str::as_bytes),
        );
        let attempt = self.call.attempt.map(u32::to_le_bytes);
        optional(&mut field, attempt.as_ref().map(|n| &n[..]));
        format!("blake3:{}", h.finalize().to_hex())
    }

    /// Signs the statement with the broker's key.
    pub fn sign(self, key: &SigningKey) -> Attestation {
        let digest = self.digest();
        let signature = key.sign(&signed_message(SIGNING_CONTEXT, &digest));
        Attestation {
            kind: self.kind,
            peer: self.peer,
            capability: self.capability,
            request_fingerprint: self.request_fingerprint,
            policy_version: self.policy_version,
            issued_at_ms: self.issued_at_ms,
            outcome_digest: self.outcome_digest,
            call: self.call,
            digest,
            signature: hex::encode(signature.to_bytes()),
        }
    }
}

/// An optional field of the digest: a presence byte, then the value when there is one.
fn optional(field: &mut impl FnMut(&[u8]), value: Option<&[u8]>) {
    match value {
        None => field(&[0]),
        Some(bytes) => {
            field(&[1]);
            field(bytes);
        }
    }
}

/// Why an attestation is not accepted as the pinned peer's statement about this request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unverified {
    #[error("the attestation's digest does not match its fields: it was changed after signing")]
    DigestMismatch,
    #[error("the signature is not 64 bytes of hex")]
    MalformedSignature,
    #[error("the signature does not verify with the pinned key of peer {peer}")]
    BadSignature { peer: String },
    #[error("the attestation names peer {found}, not {expected}")]
    WrongPeer { expected: String, found: String },
    #[error("the attestation is about capability {found}, not {expected}")]
    WrongCapability { expected: String, found: String },
    #[error("the attestation is about another request (fingerprint {found})")]
    WrongRequest { found: String },
    #[error("an outcome attestation carries no outcome digest")]
    OutcomeWithoutDigest,
    #[error(
        "the attestation answers another call ({found}), not this one ({expected}): a replayed or swapped answer"
    )]
    WrongCall { expected: String, found: String },
    #[error("the call was sent without a binding to check the answer against")]
    Unbound,
    #[error(
        "the attestation was issued at {issued_at_ms} ms, outside the call it answers ({sent_at_ms}..{answered_at_ms} ms, give or take {CLOCK_SKEW_MS} ms): a replayed answer, or the peer's clock is off"
    )]
    Stale {
        issued_at_ms: i64,
        sent_at_ms: i64,
        answered_at_ms: i64,
    },
}

impl Attestation {
    /// The signed fields.
    pub fn statement(&self) -> Statement {
        Statement {
            kind: self.kind,
            peer: self.peer.clone(),
            capability: self.capability.clone(),
            request_fingerprint: self.request_fingerprint.clone(),
            policy_version: self.policy_version.clone(),
            issued_at_ms: self.issued_at_ms,
            outcome_digest: self.outcome_digest.clone(),
            call: self.call.clone(),
        }
    }

    /// Checks the digest and the signature with the peer's pinned key, and that the
    /// attestation is about `request` (peer, capability, fingerprint) and, when `request`
    /// says when it was asked, was issued while it was in flight.
    pub fn verify(&self, pinned: &VerifyingKey, request: &Request) -> Result<(), Unverified> {
        if self.statement().digest() != self.digest {
            return Err(Unverified::DigestMismatch);
        }
        let bytes: [u8; 64] = hex::decode(&self.signature)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or(Unverified::MalformedSignature)?;
        pinned
            .verify_strict(
                &signed_message(SIGNING_CONTEXT, &self.digest),
                &Signature::from_bytes(&bytes),
            )
            .map_err(|_| Unverified::BadSignature {
                peer: request.peer.clone(),
            })?;
        if self.peer != request.peer {
            return Err(Unverified::WrongPeer {
                expected: request.peer.clone(),
                found: self.peer.clone(),
            });
        }
        if self.capability != request.capability {
            return Err(Unverified::WrongCapability {
                expected: request.capability.clone(),
                found: self.capability.clone(),
            });
        }
        if self.request_fingerprint != request.fingerprint {
            return Err(Unverified::WrongRequest {
                found: self.request_fingerprint.clone(),
            });
        }
        if self.kind == AttestationKind::Outcome && self.outcome_digest.is_none() {
            return Err(Unverified::OutcomeWithoutDigest);
        }
        let Some(call) = &request.call else {
            return Err(Unverified::Unbound);
        };
        if self.call != *call {
            return Err(Unverified::WrongCall {
                expected: describe_call(call),
                found: describe_call(&self.call),
            });
        }
        if let Some(asked) = request.in_flight
            && !(asked.sent_at_ms.saturating_sub(CLOCK_SKEW_MS)
                ..=asked.answered_at_ms.saturating_add(CLOCK_SKEW_MS))
                .contains(&self.issued_at_ms)
        {
            return Err(Unverified::Stale {
                issued_at_ms: self.issued_at_ms,
                sent_at_ms: asked.sent_at_ms,
                answered_at_ms: asked.answered_at_ms,
            });
        }
        Ok(())
    }
}

/// A call binding in one line, for a reason recorded in the journal.
fn describe_call(call: &CallBinding) -> String {
    let short = |s: &str| s.chars().take(64).collect::<String>();
    format!(
        "caller {}, nonce {}, invocation {}, attempt {}",
        short(&call.caller),
        short(&call.nonce),
        call.invocation.as_deref().map_or("-".to_string(), short),
        call.attempt.map_or("-".to_string(), |n| n.to_string())
    )
}

/// What the asking broker sent, and what it knew of the peer's policy when it began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The key name of the peer's pinned key (what its attestations call it).
    pub peer: String,
    pub capability: String,
    pub fingerprint: String,
    /// The peer's policy version the attempt began under, when one was known.
    pub policy_version: Option<String>,
    /// When this try was sent and when its answer arrived, by this broker's clock. An
    /// attestation issued outside that interval (widened by [`CLOCK_SKEW_MS`] each way)
    /// is stale: a replay of an older answer, or a peer whose clock is off.
    pub in_flight: Option<InFlight>,
    /// The call this try sent: an answer must name exactly it. `None` only before a
    /// call is signed; an answer checked against no binding is unknown.
    pub call: Option<CallBinding>,
}

/// The interval one try was in flight, Unix ms by the asking broker's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    pub sent_at_ms: i64,
    pub answered_at_ms: i64,
}

/// How far the two brokers' clocks may disagree (the window a peer's signed auth is
/// accepted in, too).
pub const CLOCK_SKEW_MS: i64 = wire::AUTH_WINDOW_MS;

/// What came back from the peer for one attempt. One exists per try, briefly: its size
/// is not worth a box at every construction site.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Transport(TransportFault),
    /// An answer at the attestation layer; `None` when it carried no envelope.
    Attested(Option<Attestation>),
}

/// Classifies one answer. Signature validation comes before anything the envelope
/// says; an unsigned or wrongly signed "denial" is unknown, never terminal.
pub fn classify(answer: &Answer, pinned: &VerifyingKey, request: &Request) -> Verdict {
    let envelope = match answer {
        Answer::Transport(fault) => return Verdict::Transport(*fault),
        Answer::Attested(None) => {
            return Verdict::Unknown {
                reason: "the peer answered without an attestation envelope".into(),
            };
        }
        Answer::Attested(Some(envelope)) => envelope,
    };
    if let Err(e) = envelope.verify(pinned, request) {
        return Verdict::Unknown {
            reason: e.to_string(),
        };
    }
    // A denial is terminal only under a policy this broker can place (seed 002; issue
    // 27). B's refusal to authenticate the call (`NO_POLICY`: its signature did not
    // verify, as when a party on the path changed it) is about this try only and says
    // nothing of earlier tries of the same call, so it is neither a verdict nor a policy
    // change.
    if envelope.kind == AttestationKind::Denial && envelope.policy_version == NO_POLICY {
        return Verdict::Unknown {
            reason: "the peer could not authenticate this call (a denial under no policy): the \
                     call was changed on the way, or the keys pinned on the two sides disagree"
                .into(),
        };
    }
    if let Some(began) = &request.policy_version
        && *began != envelope.policy_version
    {
        return Verdict::PolicyChanged {
            from: began.clone(),
            to: envelope.policy_version.clone(),
        };
    }
    match envelope.kind {
        AttestationKind::Denial if request.policy_version.is_none() => Verdict::Unknown {
            reason: format!(
                "a denial under policy version {}, which this broker cannot place: it knew no \
                 verified listing of the peer when the call began",
                envelope.policy_version.chars().take(80).collect::<String>()
            ),
        },
        AttestationKind::Denial => Verdict::Denial,
        AttestationKind::Unavailable => Verdict::Unavailable,
        AttestationKind::Outcome => Verdict::Outcome,
    }
}

/// What to do after an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// B's outcome stands; use it.
    Done,
    /// Try again after this long.
    RetryAfterMs(u64),
    /// Stop and raise the incident.
    Stop(Incident),
    /// Stop without a verdict: the peer's policy moved during the attempt.
    Abandon,
}

/// How answers spend the budgets a `[[peer]]` configures.
impl Attempts {
    /// The next step after `verdict`, spending the matching budget.
    pub fn next(&mut self, verdict: &Verdict) -> Next {
        match verdict {
            Verdict::Outcome => Next::Done,
            Verdict::Denial => Next::Stop(Incident::Policy),
            Verdict::PolicyChanged { .. } => Next::Abandon,
            Verdict::Unavailable | Verdict::Transport(_) => {
                if self.transient_used >= self.transient_budget {
                    return Next::Stop(Incident::TransientExhaustion);
                }
                let wait = self.backoff(self.transient_used);
                self.transient_used += 1;
                Next::RetryAfterMs(wait)
            }
            Verdict::Unknown { .. } => {
                if self.unknown_used >= self.unknown_budget {
                    return Next::Stop(Incident::ContractViolation);
                }
                let wait = self.backoff(self.unknown_used);
                self.unknown_used += 1;
                Next::RetryAfterMs(wait)
            }
        }
    }
}
