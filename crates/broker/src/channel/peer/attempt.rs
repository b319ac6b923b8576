//! One attempt through a peer: ask (DISPATCH_STARTED durable before the `peer_call`
//! leaves), classify each answer, record it as a PEER_ANSWER, and settle, back off and ask
//! again, or stop with an incident, as [`Attempts::next`] says (see the module docs of
//! [`crate::channel::peer`]).

use std::time::Duration;

use super::Peer;
use super::answer::{Classified, Received, classify_answer, received_call, retry_here};
use super::listing::Listings;
use crate::channel::http::HttpOutcome;
use crate::channel::random_16;
use crate::contract::{Code, ConfidenceSource, Outcome as Settled, Phase, Retry};
use crate::federation::client::Session;
use crate::federation::record::{Budget, PeerAnswer, PeerIncident, PeerOperation, PeerStage};
use crate::federation::wire::{self, CallArgs, TOOL_CALL};
use crate::federation::{Answer, Attempts, CallBinding, Incident, Next, Request as Asked, Verdict};
use crate::invocation::outcome::unrecorded;
use crate::invocation::{Attempt, CallContext, Exchange, GateShut};
use crate::journal::events::ResultFacts;
use crate::journal::{ResultToStore, Settle};

/// One attempt's loop: what it asks, of whom, with which budgets.
pub(super) struct Run<'a, 'b> {
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

impl<'a, 'b> Run<'a, 'b> {
    pub(super) fn new(
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
    pub(super) async fn go(mut self, ctx: &CallContext) -> HttpOutcome {
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
            random_16(),
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
