//! Reconciling an unknown outcome on the peer: `peer_reconcile` with the peer's
//! invocation when a verified answer named it, otherwise `peer_call` again with the same
//! caller invocation; a signed, verified settlement is recorded as RECONCILED.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Peer;
use super::answer::{Received, classify_answer, received_call};
use crate::channel::http::HttpOutcome;
use crate::channel::http::stored_request;
use crate::channel::random_16;
use crate::contract::{ConfidenceSource, Outcome as Settled};
use crate::federation::client::Session;
use crate::federation::record::{PeerStage, SignatureCheck, VerdictKind};
use crate::federation::wire::{self, CallArgs, ReconcileArgs, TOOL_CALL, TOOL_RECONCILE};
use crate::federation::{CallBinding, Request as Asked, Verdict};
use crate::invocation::outcome::unrecorded;
use crate::invocation::{Channel, Pipeline, Recorder};
use crate::journal::events::{self, Settlement};
use crate::journal::projection::Projection;

/// What one reconciliation asked and found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileReport {
    pub verdict: VerdictKind,
    pub signature: SignatureCheck,
    pub settled: Option<Settlement>,
}

impl Pipeline<Peer> {
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
                    random_16(),
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
                    random_16(),
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
