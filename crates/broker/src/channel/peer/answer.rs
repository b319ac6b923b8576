//! What a peer answered, as it came back ([`Received`]) and once classified and checked
//! ([`Classified`]): seed 002's decision boundary applied to this call, then the outcome
//! an attestation binds checked against its digest and decoded.

use crate::channel::http::HttpResponse;
use crate::contract::{Outcome as Settled, Retry};
use crate::federation::record::{
    MAX_RECORDED_ATTESTATION, PeerAnswer, PeerStage, SignatureCheck, VerdictKind,
};
use crate::federation::wire::{CallAnswer, PeerOutcome};
use crate::federation::{
    self, Answer, Attestation, CallBinding, InFlight, Request as Asked, Verdict,
};
use crate::journal::Journal;

/// An answer as it came back, before it is classified.
pub(super) struct Received {
    pub(super) answer: Answer,
    /// The peer's record, when the answer carried one.
    pub(super) outcome: Option<PeerOutcome>,
    pub(super) stage: PeerStage,
    /// When the call was sent and its answer arrived (absent when no call left).
    pub(super) in_flight: Option<InFlight>,
    /// The call sent (absent when no call left): its answer must name exactly it.
    pub(super) call: Option<CallBinding>,
}

/// An answer classified and checked: the verdict, and what is recorded of it.
pub(super) struct Classified {
    pub(super) verdict: Verdict,
    pub(super) record: PeerAnswer,
    pub(super) outcome: Option<PeerOutcome>,
    pub(super) response: Option<HttpResponse>,
}

/// What a `peer_call` (or `peer_reconcile`) sent at `sent_at_ms` came back with, and
/// when (both by `journal`'s clock).
pub(super) fn received_call(
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
pub(super) fn classify_answer(
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
pub(super) fn retry_here(outcome: Settled, peer_retry: Option<Retry>) -> Retry {
    match (outcome, peer_retry) {
        (_, Some(Retry::Never) | Some(Retry::FetchResult)) => Retry::Never,
        (Settled::Committed, None) => Retry::Never,
        (_, Some(Retry::Reconcile)) => Retry::Reconcile,
        (_, _) => Retry::AfterCorrection,
    }
}
