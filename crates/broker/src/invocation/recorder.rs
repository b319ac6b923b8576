//! One invocation's record: one method per durable transition, in the order an action
//! goes through them (accepted, validated, approved, authorized, attempt started,
//! dispatched, settled, delivered). The [`pipeline`](super::pipeline) calls them; a
//! channel never appends an event itself.
//!
//! Why this file is long: it is one type, [`Recorder`], with one short method per
//! durable transition (and its async twin where the runtime waits on a commit), read top
//! to bottom in the order an invocation goes through them. Every method leans on the
//! same few private steps (`append`, `stopped`, `step_recorded`, the deferred
//! authorization) and on the one rule that a failure is classified by the last boundary
//! the record proves; splitting the transitions across files would put that rule's
//! callers out of sight of each other without making any of them shorter.
//!
//! The recorder, not the channel, decides what a failure proves: [`Recorder::fail`]
//! reads the projection and records `unknown` once the current attempt has dispatched,
//! whatever the caller's error looked like. That keeps "classify by the last proved
//! boundary, not by the function whose stack frame caught it" in one place.

use crate::action::ConfigSnapshot;
use crate::contract::{Code, ConfidenceSource, Envelope, Outcome, Phase, Retry, Stage};
use crate::journal::events::{EventBody, OperationFacts, Settlement};
use crate::journal::projection::Projection;
use crate::journal::{
    Appended, Authorization, Dispatch, Journal, JournalError, NewInvocation, ResultToStore, Settle,
};
use crate::record::approval::ApprovalCard;
use crate::retry::{self, Decision, RetryManifest, RetryRequest};

/// Why a step did not go ahead.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The journal could not record the step; nothing after it may happen.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The invocation ended with a recorded failure; here is what the record proves.
    #[error("{}: {}", .0.error.code, .0.error.message)]
    Stopped(Box<Envelope>),
}

/// A fresh invocation id: `inv_`, then 32 hex digits: the time of issue in milliseconds
/// since the Unix epoch (48 bits), then 80 random bits.
///
/// The time comes first so that ids issued together sort together: every journal table
/// and index keyed by the id (invocations, leases, requests, results, the events of an
/// invocation) then gains its new rows on its last pages, and a commit rewrites a few
/// pages instead of one page per invocation in flight. Nothing relies on that order for
/// correctness; the 80 random bits keep ids unguessable and unique.
pub fn new_invocation_id() -> Result<String, JournalError> {
    let mut random = [0u8; 10];
    getrandom::fill(&mut random)
        .map_err(|e| JournalError::Storage(format!("no randomness for an invocation id: {e}")))?;
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    Ok(invocation_id_at(ms, random))
}

/// The id issued at `ms` with `random`: the 48 low bits of `ms`, then `random`.
fn invocation_id_at(ms: u128, random: [u8; 10]) -> String {
    let time = (ms & 0xffff_ffff_ffff) as u64;
    format!("inv_{time:012x}{}", hex::encode(random))
}

/// Drives one invocation through the journal.
#[derive(Clone)]
pub struct Recorder {
    journal: Journal,
    id: String,
    generation: u32,
    /// The agent session the invocation belongs to (for what is remembered of it when
    /// nothing could be recorded).
    session: Option<String>,
    /// Whether bytes of this invocation may have reached a transport: set when this
    /// process tried to record DISPATCH_STARTED, or found one in the record on resume.
    /// When the journal fails so badly that the record cannot be read back, this is what
    /// tells "nothing was sent" from "the remote may have acted".
    may_have_dispatched: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The credential authorization and lease of the next attempt, not recorded yet: they
    /// go with its DISPATCH_STARTED, or on their own before anything else of the attempt
    /// is recorded ([`Recorder::defer_authorization`]). Shared with the attempt's gates.
    deferred_authorization: Deferred<Authorization>,
    /// ACTION_ACCEPTED, not recorded yet: it goes with the invocation's first step
    /// ([`Recorder::accept_deferred`]).
    deferred_accept: Deferred<NewInvocation>,
}

/// A record left for a later step to take into its own transaction, shared by a
/// recorder's clones: whichever takes it first records it, once.
struct Deferred<T>(std::sync::Arc<std::sync::Mutex<Option<T>>>);

impl<T> Deferred<T> {
    /// Leaves `value` to be taken; false (and nothing left) if the slot is unusable.
    fn put(&self, value: T) -> bool {
        self.0.lock().map(|mut slot| *slot = Some(value)).is_ok()
    }

    fn take(&self) -> Option<T> {
        self.0.lock().ok().and_then(|mut slot| slot.take())
    }
}

impl<T> Default for Deferred<T> {
    fn default() -> Self {
        Deferred(std::sync::Arc::default())
    }
}

impl<T> Clone for Deferred<T> {
    fn clone(&self) -> Self {
        Deferred(self.0.clone())
    }
}

/// What the journal's markers record of a complete exchange, committed with its result:
/// how far the request got onto the wire and how the remote began answering. Each
/// channel says it in its own words through a constructor.
#[derive(Debug, Clone, Default)]
pub struct Exchange {
    request_started: bool,
    request_complete: bool,
    status: Option<u16>,
    remote_request_id: Option<String>,
    /// Digest of the complete response as received (before redaction).
    digest: String,
}

impl Exchange {
    /// HTTP: whether the headers and the whole body were written, and the status line
    /// and request id the remote answered with.
    pub fn http(
        headers_sent: bool,
        body_complete: bool,
        status: u16,
        remote_request_id: Option<String>,
        digest: String,
    ) -> Self {
        Exchange {
            request_started: headers_sent,
            request_complete: body_complete,
            status: Some(status),
            remote_request_id,
            digest,
        }
    }

    /// A peer broker's signed outcome: the whole `peer_call` went out, the peer answered
    /// with the HTTP status it received (if any) under its invocation `peer_invocation`;
    /// `digest` is the attestation's.
    pub fn peer(status: Option<u16>, peer_invocation: String, digest: String) -> Self {
        Exchange {
            request_started: true,
            request_complete: true,
            status,
            remote_request_id: Some(peer_invocation),
            digest,
        }
    }

    /// SSH: the exec request went out; `stdin_complete` when all of stdin and its EOF
    /// were written. An exec answer has no status line or request id.
    pub fn exec(stdin_complete: bool, digest: String) -> Self {
        Exchange {
            request_started: true,
            request_complete: stdin_complete,
            status: None,
            remote_request_id: None,
            digest,
        }
    }
}

/// What a retry decision produced.
#[derive(Debug, Clone)]
pub struct RetryPlan {
    pub decision: Decision,
    pub manifest: RetryManifest,
    /// The generation the next attempt will carry, when the decision allows one.
    pub next_generation: u32,
}

impl Recorder {
    /// ACTION_ACCEPTED.
    pub fn accept(journal: &Journal, new: NewInvocation) -> Result<Recorder, JournalError> {
        let id = new.invocation_id.clone();
        let session = new.session.clone();
        journal.accept(new)?;
        Ok(Recorder::new(journal, id, 0, session, false))
    }

    /// [`Recorder::accept`], recorded in the transaction of the invocation's first
    /// step instead of one of its own: the binding (PREFLIGHT_VALIDATED), or the failure
    /// that ends the invocation before it (a validation error). Until then nothing of
    /// the invocation is in the journal, and nothing of it has happened but the
    /// request's validation.
    pub fn accept_deferred(journal: &Journal, new: NewInvocation) -> Recorder {
        let id = new.invocation_id.clone();
        let session = new.session.clone();
        let rec = Recorder::new(journal, id, 0, session, false);
        rec.deferred_accept.put(new);
        rec
    }

    /// Picks up an existing invocation (a retry, a reconciliation, a restart).
    pub fn resume(journal: &Journal, invocation_id: &str) -> Result<Recorder, JournalError> {
        let p = journal.projection(invocation_id)?;
        Ok(Recorder::new(
            journal,
            invocation_id.to_string(),
            p.attempt.generation,
            p.session.clone(),
            p.ever_dispatched,
        ))
    }

    fn new(
        journal: &Journal,
        id: String,
        generation: u32,
        session: Option<String>,
        dispatched: bool,
    ) -> Recorder {
        Recorder {
            journal: journal.clone(),
            id,
            generation,
            session,
            may_have_dispatched: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(
                dispatched,
            )),
            deferred_authorization: Deferred::default(),
            deferred_accept: Deferred::default(),
        }
    }

    /// Whether this invocation may have crossed the dispatch boundary, by the record
    /// or by what this process did (see the field).
    pub fn may_have_dispatched(&self) -> bool {
        self.may_have_dispatched
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The agent session, as accepted.
    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn generation(&self) -> u32 {
        self.generation
    }

    pub fn projection(&self) -> Result<Projection, JournalError> {
        self.journal.projection(&self.id)
    }

    /// The envelope for the current state.
    pub fn envelope(&self) -> Result<Option<Envelope>, JournalError> {
        Ok(self.projection()?.envelope(self.journal.now_ms()))
    }

    fn append(&self, body: EventBody) -> Result<Appended, JournalError> {
        self.journal.append(&self.id, body)
    }

    fn stopped(&self, appended: &Appended) -> StepError {
        match appended.projection.envelope(self.journal.now_ms()) {
            Some(env) => StepError::Stopped(Box::new(env)),
            None => StepError::Journal(JournalError::Storage(
                "a failure was recorded without a code".into(),
            )),
        }
    }

    /// PREFLIGHT_VALIDATED: binds the fingerprint, configuration snapshot and operation
    /// facts. An idempotency key already bound to a different fingerprint on the same
    /// target ends this invocation with IDEMPOTENCY_MISMATCH; nothing is sent.
    pub fn preflight(
        &self,
        fingerprint: &str,
        snapshot: ConfigSnapshot,
        operation: OperationFacts,
    ) -> Result<Appended, StepError> {
        let appended = self.journal.write(
            false,
            self.preflight_job(fingerprint, snapshot, operation, None),
        )?;
        appended.map_err(|failed| self.stopped(&failed))
    }

    /// [`Recorder::preflight`], awaited without blocking a runtime thread, keeping the
    /// request for a retry (`stored`: its metadata and body) in the same transaction.
    pub async fn preflight_async(
        &self,
        fingerprint: &str,
        snapshot: ConfigSnapshot,
        operation: OperationFacts,
        stored: Option<(serde_json::Value, Vec<u8>)>,
    ) -> Result<Appended, StepError> {
        let stored = match stored {
            Some((meta, body)) => Some((crate::journal::encode_request(&meta)?, body)),
            None => None,
        };
        let appended = self
            .journal
            .write_async(
                false,
                self.preflight_job(fingerprint, snapshot, operation, stored),
            )
            .await?;
        appended.map_err(|failed| self.stopped(&failed))
    }

    /// The transaction of [`Recorder::preflight`]: the binding, or the
    /// IDEMPOTENCY_MISMATCH failure it recorded instead.
    fn preflight_job(
        &self,
        fingerprint: &str,
        snapshot: ConfigSnapshot,
        operation: OperationFacts,
        stored: Option<(String, Vec<u8>)>,
    ) -> impl FnOnce(
        &mut crate::journal::WriteCtx<'_>,
    ) -> Result<Result<Appended, Appended>, JournalError>
    + Send
    + 'static {
        let id = self.id.clone();
        let key = operation.idempotency.as_ref().map(|i| i.key.clone());
        let body = EventBody::PreflightValidated {
            fingerprint: fingerprint.to_string(),
            snapshot,
            operation,
        };
        let fingerprint = fingerprint.to_string();
        let accept = self.deferred_accept.take();
        // The key check and the binding are one transaction, so two concurrent
        // invocations cannot both bind one key to different requests.
        move |ctx| {
            if let Some(new) = accept {
                ctx.accept(new)?;
            }
            if let Some(key) = key {
                let reused = ctx.other_fingerprints_for_key(&id, &key)?;
                if reused.iter().any(|bound| *bound != fingerprint) {
                    let failed = ctx.append_checked(
                        &id,
                        &EventBody::failed_before_dispatch(
                            Phase::Validation,
                            Code::IdempotencyMismatch,
                            Retry::AfterCorrection,
                            "This idempotency key was already used with a different request; nothing was sent.",
                        ),
                    )?;
                    return Ok(Err(failed));
                }
            }
            let appended = ctx.append_checked(&id, &body)?;
            if let Some((meta, body)) = stored {
                crate::journal::insert_request(ctx, &id, &meta, &body)?;
            }
            Ok(Ok(appended))
        }
    }

    /// Records that a person is asked, with the card they are shown and its digest.
    pub fn approval_requested(
        &self,
        fingerprint: &str,
        mode: &str,
        card: ApprovalCard,
    ) -> Result<Appended, JournalError> {
        let card_digest = card.digest();
        self.append(EventBody::ApprovalRequested {
            fingerprint: fingerprint.to_string(),
            mode: mode.to_string(),
            card: Some(Box::new(card)),
            card_digest: Some(card_digest),
        })
    }

    /// Records an approval of exactly `fingerprint`. A stale fingerprint is refused with
    /// FINGERPRINT_MISMATCH and the invocation ends; nothing is sent.
    pub fn approval_granted(
        &self,
        fingerprint: &str,
        approver: &str,
        card_digest: Option<String>,
    ) -> Result<Appended, StepError> {
        let bound = self.projection()?.fingerprint;
        if bound.as_deref() != Some(fingerprint) {
            return Err(self.fingerprint_mismatch()?);
        }
        Ok(self.append(EventBody::ApprovalGranted {
            fingerprint: fingerprint.to_string(),
            approver: approver.to_string(),
            card_digest,
        })?)
    }

    /// Records a person's denial, and nothing else.
    pub fn denial(
        &self,
        fingerprint: &str,
        approver: &str,
        card_digest: Option<String>,
    ) -> Result<Appended, JournalError> {
        self.append(EventBody::ApprovalDenied {
            fingerprint: fingerprint.to_string(),
            approver: approver.to_string(),
            card_digest,
        })
    }

    /// A person denied the invocation: APPROVAL_DENIED, retry never.
    pub fn approval_denied(
        &self,
        fingerprint: &str,
        approver: &str,
        card_digest: Option<String>,
    ) -> Result<StepError, JournalError> {
        self.denial(fingerprint, approver, card_digest)?;
        let failed = self.fail(
            Phase::CredentialInjection,
            Code::ApprovalDenied,
            Retry::Never,
            "A person denied this request; do not repeat it.",
        )?;
        Ok(self.stopped(&failed))
    }

    fn fingerprint_mismatch(&self) -> Result<StepError, JournalError> {
        let failed = self.fail(
            Phase::Validation,
            Code::FingerprintMismatch,
            Retry::AfterCorrection,
            "The request or its configuration changed after it was bound; nothing was sent.",
        )?;
        Ok(self.stopped(&failed))
    }

    /// CREDENTIAL_AUTHORIZED: id and non-secret version tag only.
    pub fn credential_authorized(
        &self,
        credential_id: &str,
        version: &str,
    ) -> Result<(), JournalError> {
        // Pipelined: the lease taken next waits for it and is refused without it.
        self.journal.append_pipelined(
            &self.id,
            EventBody::CredentialAuthorized {
                credential_id: credential_id.to_string(),
                credential_version: version.to_string(),
            },
        )
    }

    /// Takes the lease for the next attempt; the generation guards dispatch.
    pub fn start_attempt(&mut self, holder: &str, ttl_ms: i64) -> Result<Appended, JournalError> {
        let appended = self.journal.start_attempt(&self.id, holder, ttl_ms)?;
        self.generation = appended.projection.attempt.generation;
        Ok(appended)
    }

    /// CREDENTIAL_AUTHORIZED and the next attempt's lease in one transaction, which also
    /// records the credential's use, awaited without blocking a runtime thread. A
    /// credential removed since it was read ends the invocation with CREDENTIAL_MISSING
    /// instead (`StepError::Stopped`; [`Journal::authorize_and_start`]).
    pub async fn authorize_and_start_async(
        &mut self,
        authorization: Authorization,
    ) -> Result<Appended, StepError> {
        let started = self
            .journal
            .authorize_and_start(&self.id, authorization)
            .await;
        let appended = self.step_recorded(started)?;
        self.generation = appended.projection.attempt.generation;
        Ok(appended)
    }

    /// Defers the credential's authorization and the next attempt's lease to the
    /// attempt's first record: DISPATCH_STARTED takes them into its own transaction
    /// ([`Journal::authorize_and_dispatch`]), and anything recorded of the attempt
    /// before that settles them first ([`Recorder::settle_deferred`]), so the record
    /// reads as if they had been recorded now. For a channel whose credential is first
    /// used in the request the gate releases: until then nothing of it leaves the
    /// process. The attempt is named as the next generation from here on.
    pub fn defer_authorization(&mut self, authorization: Authorization) {
        if self.deferred_authorization.put(authorization) {
            self.generation += 1;
        }
    }

    /// Records a deferred authorization and lease on their own (see
    /// [`Recorder::defer_authorization`]); nothing to do when none is pending. A
    /// credential removed since it was read ends the invocation with CREDENTIAL_MISSING
    /// instead (`StepError::Stopped`).
    pub fn settle_deferred(&self) -> Result<(), StepError> {
        let Some(authorization) = self.deferred_authorization.take() else {
            return Ok(());
        };
        // LeaseLost here: another holder started the generation this attempt was named
        // after.
        let started = self
            .journal
            .authorize_deferred(&self.id, authorization, self.generation);
        self.step_recorded(started).map(|_| ())
    }

    /// A connection-setup stage failed; it proves not_attempted for this attempt.
    pub fn connection_attempt(
        &self,
        n: u32,
        stage: Stage,
        code: Code,
    ) -> Result<Appended, JournalError> {
        self.connection_attempt_via(n, stage, code, None)
    }

    /// [`Recorder::connection_attempt`] of a connection through the proxy `via`
    /// (`host:port`).
    pub fn connection_attempt_via(
        &self,
        n: u32,
        stage: Stage,
        code: Code,
        via: Option<String>,
    ) -> Result<Appended, JournalError> {
        self.append(EventBody::ConnectionAttempt {
            n,
            stage,
            outcome: Outcome::NotAttempted,
            code,
            via,
        })
    }

    /// DISPATCH_STARTED, fsynced, immediately before the first byte goes to the
    /// transport. `fingerprint_now` is recomputed by the channel from what it is about to
    /// send; if it differs from the bound fingerprint, nothing is sent.
    pub fn dispatch_started(
        &self,
        fingerprint_now: &str,
        connection_id: Option<String>,
        peer_identity: Option<String>,
    ) -> Result<Appended, StepError> {
        self.settle_deferred()?;
        // Set before the append, not after: an append that fails may still have reached
        // the file, and a record that may say DISPATCH_STARTED must never be answered
        // with not_attempted.
        self.may_have_dispatched
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let dispatch = Dispatch {
            fingerprint: fingerprint_now.to_string(),
            connection_id,
            peer_identity,
        };
        let recorded = self
            .journal
            .dispatch_started(&self.id, self.generation, dispatch);
        self.step_recorded(recorded)
    }

    /// [`Recorder::dispatch_started`], awaited without blocking a runtime thread.
    pub async fn dispatch_started_async(
        &self,
        fingerprint_now: &str,
        connection_id: Option<String>,
        peer_identity: Option<String>,
    ) -> Result<Appended, StepError> {
        // Set before the append, as above.
        self.may_have_dispatched
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let dispatch = Dispatch {
            fingerprint: fingerprint_now.to_string(),
            connection_id,
            peer_identity,
        };
        let recorded = match self.deferred_authorization.take() {
            Some(authorization) => {
                self.journal
                    .authorize_and_dispatch(&self.id, authorization, self.generation, dispatch)
                    .await
            }
            None => {
                self.journal
                    .dispatch_started_async(&self.id, self.generation, dispatch)
                    .await
            }
        };
        self.step_recorded(recorded)
    }

    /// A step that may be refused as the journal records it (the attempt's start, its
    /// DISPATCH_STARTED), as the caller sees it: a failure the job recorded instead, or
    /// a lease another holder took, stops the invocation with its envelope.
    fn step_recorded(
        &self,
        recorded: Result<Appended, JournalError>,
    ) -> Result<Appended, StepError> {
        match recorded {
            Ok(a) => Ok(a),
            Err(JournalError::RecordedInstead(failed)) => Err(self.stopped(&failed)),
            Err(JournalError::LeaseLost { .. }) => {
                // Another holder owns the invocation now. Record nothing on its record
                // beyond what the generation check already refused.
                Err(StepError::Stopped(Box::new(self.lease_lost_envelope()?)))
            }
            Err(e) => Err(e.into()),
        }
    }

    fn lease_lost_envelope(&self) -> Result<Envelope, JournalError> {
        let p = self.projection()?;
        let mut evidence = p.evidence();
        evidence.attempt_generation = self.generation;
        Ok(Envelope {
            invocation_id: self.id.clone(),
            error: crate::contract::ErrorBody {
                code: Code::LeaseLost,
                phase: Phase::Validation,
                // This attempt never dispatched; the invocation's own outcome is
                // whatever the current holder's record says.
                outcome: if p.ever_dispatched {
                    p.outcome
                } else {
                    Outcome::NotAttempted
                },
                retry: Retry::Never,
                message: Code::LeaseLost.spec().meaning.to_string(),
            },
            evidence,
        })
    }

    /// Pipelined: a marker, not a durable transition.
    pub fn request_sent(
        &self,
        headers_sent: bool,
        body_complete: bool,
    ) -> Result<(), JournalError> {
        self.journal.append_pipelined(
            &self.id,
            EventBody::RequestSent {
                headers_sent,
                body_complete,
            },
        )
    }

    /// Pipelined: a marker; the settling append that follows waits for it.
    pub fn response_started(
        &self,
        http_status: Option<u16>,
        remote_request_id: Option<String>,
    ) -> Result<(), JournalError> {
        self.journal.append_pipelined(
            &self.id,
            EventBody::RemoteResponseStarted {
                http_status,
                remote_request_id,
            },
        )
    }

    /// Pipelined: RESULT_COMMITTED, which waits, is refused unless this landed.
    pub fn response_complete(&self, digest: &str) -> Result<(), JournalError> {
        self.journal.append_pipelined(
            &self.id,
            EventBody::RemoteResponseComplete {
                digest: digest.to_string(),
            },
        )
    }

    /// RESULT_COMMITTED with the stored result, fsynced, before anything is returned.
    pub fn commit_result(
        &self,
        result: ResultToStore,
        settle: Settle,
    ) -> Result<Appended, JournalError> {
        self.journal
            .commit_result(&self.id, Vec::new(), result, settle)
    }

    /// The whole tail of a complete exchange in one fsynced transaction: the request
    /// markers, the final response's start and completion, and RESULT_COMMITTED with
    /// the stored result. One commit instead of four on the hot path.
    pub fn commit_exchange(
        &self,
        exchange: Exchange,
        result: ResultToStore,
        settle: Settle,
    ) -> Result<Appended, JournalError> {
        let preceding = completion_events(exchange);
        self.journal
            .commit_result(&self.id, preceding, result, settle)
    }

    /// [`Recorder::commit_exchange`], awaited without blocking a runtime thread.
    pub async fn commit_exchange_async(
        &self,
        exchange: Exchange,
        result: ResultToStore,
        settle: Settle,
    ) -> Result<Appended, JournalError> {
        let preceding = completion_events(exchange);
        self.journal
            .commit_result_async(&self.id, preceding, result, settle)
            .await
    }

    /// The exchange completed but its result could not be stored (`error`): records the
    /// completion and a RESULT_STORE_FAILED failure in `result_delivery` with the outcome
    /// the complete response settles (`outcome`, committed or rejected), fsynced, in one
    /// small transaction. The result itself is lost; `retry` is what the response
    /// settled, never `fetch_result` (there is nothing to fetch).
    pub fn result_store_failed(
        &self,
        exchange: Exchange,
        outcome: Outcome,
        retry: Retry,
        error: &JournalError,
    ) -> Result<Appended, JournalError> {
        let status = exchange.status;
        let mut events = completion_events(exchange);
        let answered = status.map_or_else(String::new, |s| format!(" (HTTP {s})"));
        events.push(EventBody::Failed {
            phase: Phase::ResultDelivery,
            outcome,
            retry: if retry == Retry::FetchResult {
                Retry::Never
            } else {
                retry
            },
            code: Code::ResultStoreFailed,
            message: format!(
                "The remote answered completely{answered} but the result could not be stored ({error}); the stored copy is lost and the action is not re-run. The operator has been alerted."
            ),
            field: None,
        });
        let id = self.id.clone();
        self.journal.write(true, move |ctx| {
            let mut last = None;
            for body in &events {
                last = Some(ctx.append_checked(&id, body)?);
            }
            last.ok_or_else(|| JournalError::Storage("nothing to record".into()))
        })
    }

    /// Pipelined markers of how far the request got and, when `response` is given, how
    /// the remote began answering (its status and request id): recorded before a failure
    /// is. Every marker is tried; the first error is returned.
    pub fn mark(
        &self,
        request_started: bool,
        request_complete: bool,
        response: Option<(Option<u16>, Option<String>)>,
    ) -> Result<(), JournalError> {
        let mut first_error = Ok(());
        for body in marker_events(request_started, request_complete, response) {
            if let Err(e) = self.journal.append_pipelined(&self.id, body)
                && first_error.is_ok()
            {
                first_error = Err(e);
            }
        }
        first_error
    }

    /// RESULT_DELIVERED, after the caller-facing protocol confirmed the handoff.
    pub fn delivered(&self) -> Result<Appended, JournalError> {
        self.append(EventBody::ResultDelivered)
    }

    /// The result could not be handed over; it stays retrievable with fetch_result.
    pub fn delivery_failed(&self, message: &str) -> Result<Appended, JournalError> {
        self.append(EventBody::DeliveryFailed {
            code: Code::ResultDeliveryFailed,
            message: message.to_string(),
        })
    }

    /// Ends the current attempt with a failure. The outcome and, after dispatch, the
    /// phase and retry come from the record: once this attempt dispatched, the outcome
    /// is unknown and the retry disposition is derived from the bound operation facts,
    /// whatever `phase` and `retry` the caller suggested.
    pub fn fail(
        &self,
        phase: Phase,
        code: Code,
        retry: Retry,
        message: &str,
    ) -> Result<Appended, JournalError> {
        self.fail_field(phase, code, retry, message, None)
    }

    /// [`Recorder::fail`] naming the request field the failure is about.
    pub fn fail_field(
        &self,
        phase: Phase,
        code: Code,
        retry: Retry,
        message: &str,
        field: Option<&str>,
    ) -> Result<Appended, JournalError> {
        let id = self.id.clone();
        let message = message.to_string();
        let field = field.map(str::to_string);
        let accept = self.deferred_accept.take();
        // Decided inside the writer, against the same state the append is checked on.
        self.journal.write(true, move |ctx| {
            if let Some(new) = accept {
                ctx.accept(new)?;
            }
            let p = ctx.projection(&id)?;
            let body = if p.attempt.dispatched && !p.attempt.closed {
                EventBody::Failed {
                    phase: Phase::RemoteExecution,
                    outcome: Outcome::Unknown,
                    retry: p.retry_once_failed(code, ctx.now_ms()),
                    code,
                    message,
                    field,
                }
            } else {
                EventBody::Failed {
                    phase,
                    outcome: Outcome::NotAttempted,
                    retry,
                    code,
                    message,
                    field,
                }
            };
            ctx.append_checked(&id, &body)
        })
    }

    /// Runs `decide()` on the record and appends the retry manifest (fsynced) before any
    /// retry can happen.
    pub fn plan_retry(&self, request: &RetryRequest) -> Result<RetryPlan, JournalError> {
        // A stalled holder's attempt is closed first, so the decision sees what it proves.
        self.journal.reap_expired(&self.id)?;
        let now = self.journal.now_ms();
        let p = self.projection()?;
        let facts = p.record_facts(now);
        let decision = retry::decide(&facts, request, now);
        let next_generation = p.attempt.generation + 1;
        let manifest = self
            .journal
            .sign_manifest(&facts, decision, next_generation, now);
        self.append(EventBody::RetryManifest {
            for_generation: next_generation,
            verdict: manifest.verdict,
            decision,
            directive: manifest.directive.clone(),
            digest: manifest.digest.clone(),
            source_query_predicate: manifest.source_query_predicate.clone(),
            signature: Some(manifest.signature.clone()),
        })?;
        Ok(RetryPlan {
            decision,
            manifest,
            next_generation,
        })
    }

    /// PEER_ANSWER: one answer from a peer broker, with the budget it spent.
    pub fn peer_answer(
        &self,
        answer: crate::federation::record::PeerAnswer,
    ) -> Result<Appended, JournalError> {
        self.append(EventBody::PeerAnswer(Box::new(answer)))
    }

    /// PEER_NOT_RUN: the peer's verified attestation in the answer just recorded says
    /// it did not run the call; the attempt ends not_attempted.
    pub fn peer_not_run(
        &self,
        code: Code,
        retry: Retry,
        message: &str,
        attestation_digest: &str,
    ) -> Result<Appended, JournalError> {
        self.append(EventBody::PeerNotRun {
            code,
            retry,
            message: message.to_string(),
            attestation_digest: attestation_digest.to_string(),
        })
    }

    /// PEER_INCIDENT: the call stopped with an incident for its owner.
    pub fn peer_incident(
        &self,
        incident: crate::federation::record::PeerIncident,
    ) -> Result<Appended, JournalError> {
        self.append(EventBody::PeerIncident(Box::new(incident)))
    }

    /// Settles one batch member whose outcome was unknown, from a query about it or an
    /// operator's attestation.
    pub fn reconcile_member(
        &self,
        member: &str,
        source: ConfidenceSource,
        settlement: Settlement,
        by: &str,
        note: &str,
        http_status: Option<u16>,
    ) -> Result<Appended, JournalError> {
        self.append(EventBody::MemberReconciled {
            member: member.to_string(),
            source,
            settlement,
            by: by.to_string(),
            note: note.to_string(),
            http_status,
        })
    }

    /// Settles an unknown outcome from a remote query or an operator's attestation. The
    /// original attempt stays as recorded.
    pub fn reconcile(
        &self,
        source: ConfidenceSource,
        settlement: Settlement,
        by: &str,
        note: &str,
        http_status: Option<u16>,
    ) -> Result<Appended, JournalError> {
        self.append(EventBody::Reconciled {
            source,
            settlement,
            by: by.to_string(),
            note: note.to_string(),
            http_status,
        })
    }
}

/// The markers of an exchange: REQUEST_SENT when any of the request was written, then
/// REMOTE_RESPONSE_STARTED when the remote began answering.
/// The markers of a complete exchange followed by REMOTE_RESPONSE_COMPLETE.
fn completion_events(exchange: Exchange) -> Vec<EventBody> {
    let mut events = marker_events(
        exchange.request_started,
        exchange.request_complete,
        Some((exchange.status, exchange.remote_request_id)),
    );
    events.push(EventBody::RemoteResponseComplete {
        digest: exchange.digest,
    });
    events
}

fn marker_events(
    request_started: bool,
    request_complete: bool,
    response: Option<(Option<u16>, Option<String>)>,
) -> Vec<EventBody> {
    let mut events = Vec::with_capacity(3);
    if request_started || request_complete {
        events.push(EventBody::RequestSent {
            headers_sent: request_started,
            body_complete: request_complete,
        });
    }
    if let Some((http_status, remote_request_id)) = response {
        events.push(EventBody::RemoteResponseStarted {
            http_status,
            remote_request_id,
        });
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invocation_ids_keep_their_shape_and_sort_by_time_of_issue() {
        let early = invocation_id_at(1_764_590_000_000, [0xff; 10]);
        let later = invocation_id_at(1_764_590_000_001, [0x00; 10]);
        assert!(early < later, "{early} should sort before {later}");
        for id in [&early, &later] {
            let hex = id.strip_prefix("inv_").unwrap();
            assert_eq!(hex.len(), 32);
            assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()));
        }
        assert_eq!(&early[4..16], "019ad9c29780");

        let a = new_invocation_id().unwrap();
        let b = new_invocation_id().unwrap();
        assert_ne!(a, b, "the random part tells ids of one millisecond apart");
        assert!(a[4..16] <= b[4..16]);
    }
}
