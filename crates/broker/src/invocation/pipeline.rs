//! The invocation pipeline, written once for every channel.
//!
//! One call goes: accept (ACTION_ACCEPTED) → [`Channel::validate`] (nothing touched yet)
//! → bind the configuration snapshot and fingerprint (PREFLIGHT_VALIDATED, plus the
//! request kept for a retry) → approval, when the target asks for it → read the bound
//! credential and [`Channel::arm`] with it → CREDENTIAL_AUTHORIZED and the attempt's
//! lease → [`Channel::attempt`]: connection setup, DISPATCH_STARTED through the
//! [`Gate`], the exchange, and the settled result through [`Attempt::commit`] → one
//! [`Outcome`].
//!
//! A channel writes validation and the attempt and nothing else: every record, every
//! failure envelope and every retry decision is made here and in the
//! [`Recorder`](super::Recorder). What a failure proves is classified by the last
//! boundary the record proves, not by where the error was caught: [`Recorder::fail`]
//! turns any failure after a recorded dispatch into `unknown`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::recorder::{Exchange, Recorder, StepError, new_invocation_id};
use crate::action::{ConfigSnapshot, Fingerprint, NormalizedAction};
use crate::approvals::{ApprovalAnswer, ApprovalDetail, ApprovalRequest, Approver};
use crate::config::{ApprovalMode, Config, ConfigHandle};
use crate::contract::{self, Code, Envelope, ErrorBody, Evidence, Phase, Retry, Stage};
use crate::journal::events::{Channel as ChannelKind, EventBody, OperationFacts};
use crate::journal::projection::Projection;
use crate::journal::{
    Journal, JournalError, NewInvocation, ResultToStore, Settle, StoredResult, Unrecorded,
};
use crate::retry::{Decision, RetryManifest, RetryRequest};
use crate::vault::{Secret, Vault, read_bound_credential};

/// Who is calling and how to stop.
#[derive(Clone, Default)]
pub struct CallContext {
    pub session: Option<String>,
    pub approver: Option<Arc<dyn Approver>>,
    /// Cancelled when the caller loses interest; after dispatch the outcome stays
    /// unknown (the remote may still be running).
    pub cancel: CancellationToken,
}

/// What one call produced: a settled result (which may still carry an error code, an
/// HTTP 500 or a refused exec for instance), or an envelope saying what the records
/// prove.
#[derive(Debug, Clone)]
pub struct Outcome<R> {
    pub invocation_id: String,
    pub outcome: contract::Outcome,
    pub result: Option<R>,
    /// Present when the record carries a code.
    pub error: Option<Envelope>,
    /// For a retry: the manifest the decision was recorded with.
    pub manifest: Option<RetryManifest>,
}

impl<R> Outcome<R> {
    /// The answer for an envelope alone (nothing settled to return).
    pub fn of_envelope(envelope: Envelope) -> Self {
        Outcome {
            invocation_id: envelope.invocation_id.clone(),
            outcome: envelope.error.outcome,
            result: None,
            error: Some(envelope),
            manifest: None,
        }
    }

    /// What the record `p` says, without a result.
    pub fn of_projection(p: &Projection, now_ms: i64) -> Self {
        Outcome {
            invocation_id: p.invocation_id.clone(),
            outcome: p.outcome,
            result: None,
            error: p.envelope(now_ms),
            manifest: None,
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
}

/// Why a step before dispatch could not go on; nothing was sent.
#[derive(Debug, Clone)]
pub struct Failure {
    pub phase: Phase,
    pub code: Code,
    pub retry: Retry,
    pub message: String,
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

    /// The summary and action a person approves.
    fn approval(&self, bound: &Bound<Self::Plan>) -> (String, ApprovalDetail);

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
}

/// One channel's pipeline over the broker's journal, credentials and configuration.
pub struct Pipeline<T: Channel> {
    inner: Arc<Shared<T>>,
}

impl<T: Channel> Clone for Pipeline<T> {
    fn clone(&self) -> Self {
        Pipeline {
            inner: self.inner.clone(),
        }
    }
}

struct Shared<T> {
    channel: T,
    journal: Journal,
    vault: Arc<Vault>,
    config: ConfigHandle,
    /// Lease holder name of this broker process.
    holder: String,
}

impl<T: Channel> Pipeline<T> {
    pub fn with(channel: T, journal: Journal, vault: Arc<Vault>, config: ConfigHandle) -> Self {
        Pipeline {
            inner: Arc::new(Shared {
                channel,
                journal,
                vault,
                config,
                holder: format!("pid-{}", std::process::id()),
            }),
        }
    }

    pub fn journal(&self) -> &Journal {
        &self.inner.journal
    }

    pub fn config(&self) -> &ConfigHandle {
        &self.inner.config
    }

    pub fn channel(&self) -> &T {
        &self.inner.channel
    }

    fn now(&self) -> i64 {
        self.inner.journal.now_ms()
    }

    /// Runs one request as a new invocation, end to end.
    pub async fn run(&self, request: &T::Request, ctx: &CallContext) -> Outcome<T::Result> {
        let rec = match self.accept(request, ctx.session.clone()) {
            Ok(rec) => rec,
            Err(outcome) => return *outcome,
        };
        let validated = match self
            .inner
            .channel
            .validate(request, &self.inner.config.current())
        {
            Ok(v) => v,
            Err(invalid) => return self.reject(&rec, &invalid),
        };
        let bound = match self.bind(&rec, validated) {
            Ok(b) => b,
            Err(outcome) => return *outcome,
        };
        if let Err(outcome) = self.approve(&rec, &bound, ctx).await {
            return *outcome;
        }
        let mut rec = rec;
        self.attempt(&mut rec, &bound, ctx).await
    }

    /// ACTION_ACCEPTED under a fresh invocation id. Pipelined: the preflight that follows
    /// waits, and fails if the acceptance did.
    pub fn accept(
        &self,
        request: &T::Request,
        session: Option<String>,
    ) -> Result<Recorder, Box<Outcome<T::Result>>> {
        let id = new_invocation_id().map_err(|e| Box::new(unrecorded("inv_unassigned", &e)))?;
        let accepted = self
            .inner
            .channel
            .accepted(request, &self.inner.config.current());
        Recorder::accept_pipelined(
            &self.inner.journal,
            NewInvocation {
                invocation_id: id.clone(),
                channel: T::KIND,
                target: accepted.target.unwrap_or_default(),
                summary: accepted.summary,
                session,
                idempotency_key: accepted.idempotency_key,
            },
        )
        .map_err(|e| Box::new(unrecorded(&id, &e)))
    }

    /// Records a validation failure (nothing touched, nothing sent).
    pub fn reject(&self, rec: &Recorder, invalid: &Invalid) -> Outcome<T::Result> {
        self.fail(
            rec,
            Phase::Validation,
            invalid.code,
            Retry::AfterCorrection,
            &invalid.message,
            Some(&invalid.field),
        )
    }

    /// Binds the configuration snapshot and fingerprint (PREFLIGHT_VALIDATED) and keeps
    /// the request for a retry.
    pub fn bind(
        &self,
        rec: &Recorder,
        v: Validated<T::Plan>,
    ) -> Result<Bound<T::Plan>, Box<Outcome<T::Result>>> {
        let config = self.inner.config.current();
        let Some(target) = config.target(&v.target) else {
            return Err(Box::new(self.fail(
                rec,
                Phase::Validation,
                Code::InvalidTarget,
                Retry::AfterCorrection,
                "The target disappeared from the configuration.",
                Some(T::TARGET_FIELD),
            )));
        };
        // An indexed read of non-secret metadata: microseconds, fine inline.
        let meta = match self.inner.vault.meta(target.credential()) {
            Ok(meta) => meta,
            Err(e) => {
                return Err(Box::new(self.fail(
                    rec,
                    Phase::CredentialInjection,
                    e.code(),
                    e.code().spec().retry,
                    &e.to_string(),
                    None,
                )));
            }
        };
        let snapshot = ConfigSnapshot::of(target, meta.version.as_str(), v.idempotency_key.clone());
        let fingerprint = Fingerprint::compute(&v.action, &snapshot).to_string();
        let bound = Bound {
            target: v.target,
            action: v.action,
            snapshot,
            fingerprint,
            idempotency_key: v.idempotency_key,
            timeout: v.timeout,
            plan: v.plan,
        };
        let operation = self.inner.channel.operation(&config, &bound, self.now());
        if let Err(e) = rec.preflight(&bound.fingerprint, bound.snapshot.clone(), operation) {
            return Err(Box::new(self.stopped(rec, e)));
        }
        let (meta, body) = v.stored;
        if let Err(e) = self.inner.journal.store_request(rec.id(), meta, body) {
            return Err(Box::new(self.journal_failed(rec, &e)));
        }
        Ok(bound)
    }

    /// Asks a person when the target's approval mode says so: no console attached fails
    /// fast (NO_APPROVER), the card carries the bound fingerprint, and only a grant of
    /// exactly that fingerprint lets the invocation go on.
    pub async fn approve(
        &self,
        rec: &Recorder,
        bound: &Bound<T::Plan>,
        ctx: &CallContext,
    ) -> Result<(), Box<Outcome<T::Result>>> {
        let mode = self
            .inner
            .config
            .current()
            .target(&bound.target)
            .map_or(ApprovalMode::None, |t| t.approval());
        if mode == ApprovalMode::None {
            return Ok(());
        }
        let refused = |code: Code, message: &str| {
            Box::new(self.fail(
                rec,
                Phase::CredentialInjection,
                code,
                Retry::AfterCorrection,
                message,
                None,
            ))
        };
        let Some(approver) = ctx.approver.clone() else {
            return Err(refused(
                Code::NoApprover,
                "This target needs approval and no approval console is attached; nothing was sent.",
            ));
        };
        let (summary, detail) = self.inner.channel.approval(bound);
        let request = ApprovalRequest {
            mode: mode.as_str(),
            ..ApprovalRequest::bound(
                rec.id(),
                ctx.session.clone(),
                summary,
                bound.fingerprint.clone(),
                &bound.snapshot,
                detail,
            )
        };
        if let Err(e) = rec.approval_requested(&bound.fingerprint, request.mode) {
            return Err(Box::new(self.journal_failed(rec, &e)));
        }
        let answer = tokio::select! {
            answer = approver.approve(request) => answer,
            () = ctx.cancel.cancelled() => {
                return Err(refused(
                    Code::CallerCancelled,
                    "The caller cancelled while approval was pending; nothing was sent.",
                ));
            }
        };
        match answer {
            ApprovalAnswer::Approved { fingerprint, by } => rec
                .approval_granted(&fingerprint, &by)
                .map(|_| ())
                .map_err(|e| Box::new(self.stopped(rec, e))),
            ApprovalAnswer::Denied { by } => Err(Box::new(
                match rec.approval_denied(&bound.fingerprint, &by) {
                    Ok(stopped) => self.stopped(rec, stopped),
                    Err(e) => self.journal_failed(rec, &e),
                },
            )),
            ApprovalAnswer::TimedOut => Err(refused(
                Code::ApprovalTimeout,
                "Nobody answered the approval request in time; nothing was sent.",
            )),
        }
    }

    /// Reads the bound credential, arms the channel with it, takes the lease and runs
    /// one attempt up to a stored result or a recorded failure.
    pub async fn attempt(
        &self,
        rec: &mut Recorder,
        bound: &Bound<T::Plan>,
        ctx: &CallContext,
    ) -> Outcome<T::Result> {
        // The credential: the only place secret bytes leave the keychain.
        let (meta, secret) =
            match read_bound_credential(&self.inner.vault, &bound.snapshot, self.now()).await {
                Ok(pair) => pair,
                Err(f) => return self.fail(rec, f.phase, f.code, f.retry, &f.message, None),
            };
        let armed = match self
            .inner
            .channel
            .arm(&self.inner.config.current(), bound, secret)
        {
            Ok(armed) => armed,
            Err(f) => return self.fail(rec, f.phase, f.code, f.retry, &f.message, None),
        };
        // The lease outlives the attempt's own timeout by a margin for recording.
        let ttl = i64::try_from(bound.timeout.as_millis())
            .unwrap_or(i64::MAX)
            .saturating_add(30_000);
        if let Err(e) = rec.authorize_and_start(
            &bound.snapshot.credential_id,
            meta.version.as_str(),
            &self.inner.holder,
            ttl,
        ) {
            return self.journal_failed(rec, &e);
        }
        let attempt = Attempt {
            pipeline: self,
            rec,
            bound,
        };
        self.inner.channel.attempt(attempt, armed, ctx).await
    }

    /// `retry_invocation`: applies `decide()` to the record. A new attempt starts only on
    /// a safe basis, for exactly the bound request (`request` is the stored one);
    /// otherwise the recorded evidence and the manifest come back.
    pub async fn retry_request(
        &self,
        invocation_id: &str,
        request: &T::Request,
        ctx: &CallContext,
    ) -> Outcome<T::Result> {
        let mut rec = match Recorder::resume(&self.inner.journal, invocation_id) {
            Ok(r) => r,
            Err(e) => return unrecorded(invocation_id, &e),
        };
        let recorded = match rec.projection() {
            Ok(p) => p,
            Err(e) => return unrecorded(invocation_id, &e),
        };
        // Re-derive the request under the current configuration; any change to a bound
        // value means a new invocation, never a mutation of this one.
        let rebound = self.rebind(invocation_id, request, &recorded);
        let fingerprint_now = rebound
            .as_ref()
            .map(|b| b.fingerprint.clone())
            .unwrap_or_default();
        if recorded.fingerprint.as_deref() != Some(fingerprint_now.as_str()) {
            let mut outcome = self.outcome_of(&rec);
            outcome.error = outcome.error.or_else(|| recorded.envelope(self.now()));
            if let Some(env) = outcome.error.as_mut() {
                env.error.message = format!(
                    "The target's configuration changed since this invocation was bound; submit a new request. {}",
                    env.error.message
                );
            }
            return outcome;
        }
        let plan = match rec.plan_retry(&RetryRequest {
            fingerprint: fingerprint_now,
        }) {
            Ok(plan) => plan,
            Err(e) => return self.journal_failed(&rec, &e),
        };
        let Some(bound) = rebound else {
            return self.outcome_of(&rec);
        };
        let not_before = rec
            .projection()
            .ok()
            .and_then(|p| p.result_facts.and_then(|f| f.not_before_ms));
        let too_early = plan.decision == Decision::RetryWhenAllowed
            && not_before.is_some_and(|t| self.now() < t);
        if !plan.decision.starts_attempt() || too_early {
            let mut outcome = self.recorded_outcome(&rec);
            outcome.manifest = Some(plan.manifest);
            return outcome;
        }
        let mut outcome = self.attempt(&mut rec, &bound, ctx).await;
        outcome.manifest = Some(plan.manifest);
        outcome
    }

    /// The stored request validated again and bound with the recorded snapshot, under
    /// the target's current version.
    fn rebind(
        &self,
        invocation_id: &str,
        request: &T::Request,
        recorded: &Projection,
    ) -> Option<Bound<T::Plan>> {
        recorded.fingerprint.as_ref()?;
        let config = self.inner.config.current();
        let v = self.inner.channel.validate(request, &config).ok()?;
        let bound_snapshot = self
            .inner
            .journal
            .events(invocation_id)
            .ok()?
            .into_iter()
            .find_map(|e| match e.body {
                EventBody::PreflightValidated { snapshot, .. } => Some(snapshot),
                _ => None,
            })?;
        let snapshot = ConfigSnapshot {
            target_version: config.target(&v.target)?.version(),
            ..bound_snapshot
        };
        let fingerprint = Fingerprint::compute(&v.action, &snapshot).to_string();
        Some(Bound {
            target: v.target,
            action: v.action,
            idempotency_key: snapshot.idempotency_key.clone(),
            snapshot,
            fingerprint,
            timeout: v.timeout,
            plan: v.plan,
        })
    }

    /// The record plus its stored result, if any (a read, never a re-run).
    pub fn recorded_outcome(&self, rec: &Recorder) -> Outcome<T::Result> {
        match rec.projection() {
            Ok(p) => self.recorded_projection(&p),
            Err(e) => unrecorded(rec.id(), &e),
        }
    }

    /// What the record `p` says, with its stored result when one was committed.
    pub fn recorded_projection(&self, p: &Projection) -> Outcome<T::Result> {
        let mut outcome = Outcome::of_projection(p, self.now());
        if let Some(result_id) = &p.result_id
            && let Ok(stored) = self.inner.journal.read_result(result_id)
        {
            outcome.result = T::stored_result(&stored);
        }
        outcome
    }

    /// What the record says now, without a result.
    pub fn outcome_of(&self, rec: &Recorder) -> Outcome<T::Result> {
        match rec.projection() {
            Ok(p) => Outcome::of_projection(&p, self.now()),
            Err(e) => unrecorded(rec.id(), &e),
        }
    }

    /// Ends the current attempt with a failure (see [`Recorder::fail`] for what the
    /// record decides).
    pub fn fail(
        &self,
        rec: &Recorder,
        phase: Phase,
        code: Code,
        retry: Retry,
        message: &str,
        field: Option<&str>,
    ) -> Outcome<T::Result> {
        match rec.fail_field(phase, code, retry, message, field) {
            Ok(appended) => Outcome::of_projection(&appended.projection, self.now()),
            Err(e) => self.journal_failed(rec, &e),
        }
    }

    /// A step that did not go ahead.
    pub fn stopped(&self, rec: &Recorder, e: StepError) -> Outcome<T::Result> {
        match e {
            StepError::Stopped(env) => Outcome {
                invocation_id: rec.id().to_string(),
                ..Outcome::of_envelope(*env)
            },
            StepError::Journal(e) => self.journal_failed(rec, &e),
        }
    }

    /// The journal failed mid-invocation: see [`journal_failure`].
    pub fn journal_failed(&self, rec: &Recorder, e: &JournalError) -> Outcome<T::Result> {
        Outcome::of_envelope(journal_failure(rec, e, self.now()))
    }
}

/// One attempt in progress: what a channel's [`Channel::attempt`] records through.
pub struct Attempt<'a, T: Channel> {
    pipeline: &'a Pipeline<T>,
    rec: &'a Recorder,
    bound: &'a Bound<T::Plan>,
}

impl<'a, T: Channel> Attempt<'a, T> {
    pub fn bound(&self) -> &'a Bound<T::Plan> {
        self.bound
    }

    pub fn invocation_id(&self) -> &str {
        self.rec.id()
    }

    /// The live configuration (an SSH first-seen approval pins a host key in it).
    pub fn config(&self) -> &ConfigHandle {
        &self.pipeline.inner.config
    }

    pub fn now_ms(&self) -> i64 {
        self.pipeline.now()
    }

    /// The id of this attempt's `n`th connection: `<invocation>/g<generation>/c<n>`.
    pub fn connection_id(&self, n: u32) -> String {
        format!("{}/g{}/c{n}", self.rec.id(), self.rec.generation())
    }

    /// The gate that records DISPATCH_STARTED for connection `connection_id`.
    pub fn gate(&self, connection_id: String) -> Gate {
        Gate {
            rec: self.rec.clone(),
            config: self.pipeline.inner.config.clone(),
            target: self.bound.target.clone(),
            action: self.bound.action.clone(),
            bound: self.bound.snapshot.clone(),
            connection_id,
        }
    }

    /// A connection-setup stage failed (it proves not_attempted for this attempt).
    pub fn setup_stage_failed(
        &self,
        n: u32,
        stage: Stage,
        code: Code,
    ) -> Result<(), Box<Outcome<T::Result>>> {
        self.rec
            .connection_attempt(n, stage, code)
            .map(|_| ())
            .map_err(|e| Box::new(self.pipeline.journal_failed(self.rec, &e)))
    }

    /// Ends the attempt with a failure; after a recorded dispatch the record makes it
    /// `unknown` whatever is passed here.
    pub fn fail(
        &self,
        phase: Phase,
        code: Code,
        retry: Retry,
        message: &str,
    ) -> Outcome<T::Result> {
        self.pipeline
            .fail(self.rec, phase, code, retry, message, None)
    }

    /// [`Attempt::fail`] naming the request field to correct.
    pub fn fail_field(
        &self,
        phase: Phase,
        code: Code,
        retry: Retry,
        message: &str,
        field: &str,
    ) -> Outcome<T::Result> {
        self.pipeline
            .fail(self.rec, phase, code, retry, message, Some(field))
    }

    /// A step the journal refused or stopped.
    pub fn stopped(&self, e: StepError) -> Outcome<T::Result> {
        self.pipeline.stopped(self.rec, e)
    }

    /// What the record says now.
    pub fn recorded(&self) -> Outcome<T::Result> {
        self.pipeline.outcome_of(self.rec)
    }

    /// Markers of how far the request got and whether the remote began answering,
    /// recorded before a failure is. Markers are diagnosis, not proof: a failure to
    /// record them must not hide the failure being reported.
    pub fn mark(&self, request_started: bool, request_complete: bool, response: Option<Response>) {
        if request_started || request_complete {
            let _ = self.rec.request_sent(request_started, request_complete);
        }
        if let Some(r) = response {
            let _ = self.rec.response_started(r.status, r.remote_request_id);
        }
    }

    /// RESULT_COMMITTED with the stored result, fsynced, in one transaction with the
    /// exchange's markers, before anything is returned. `result` is what the caller
    /// gets back when the commit lands.
    pub fn commit(
        &self,
        exchange: Exchange,
        stored: ResultToStore,
        settle: Settle,
        result: Option<T::Result>,
    ) -> Outcome<T::Result> {
        match self.rec.commit_exchange(exchange, stored, settle) {
            Ok(appended) => Outcome {
                result,
                ..Outcome::of_projection(&appended.projection, self.now_ms())
            },
            Err(e) => self.pipeline.journal_failed(self.rec, &e),
        }
    }
}

/// How the remote began answering, for a marker.
#[derive(Debug, Clone, Default)]
pub struct Response {
    pub status: Option<u16>,
    pub remote_request_id: Option<String>,
}

/// The dispatch boundary of one connection. [`Gate::open`] records DISPATCH_STARTED,
/// fsynced, immediately before the first byte of the request goes to the transport,
/// after re-verifying the fingerprint against the live configuration: a reload that
/// changed the target changes the fingerprint, and nothing is sent.
#[derive(Clone)]
pub struct Gate {
    rec: Recorder,
    config: ConfigHandle,
    target: String,
    action: NormalizedAction,
    bound: ConfigSnapshot,
    connection_id: String,
}

/// Why a gate stayed shut; nothing was sent.
#[derive(Debug)]
pub enum GateShut {
    /// The journal refused or failed the record.
    Refused(StepError),
    /// The record did not finish (its task was lost).
    Interrupted,
}

impl Gate {
    /// The fingerprint of what is about to be sent, under the live configuration.
    fn fingerprint_now(&self) -> String {
        match self.config.current().target(&self.target) {
            Some(t) => {
                let snapshot = ConfigSnapshot::of(
                    t,
                    self.bound.credential_version.clone(),
                    self.bound.idempotency_key.clone(),
                );
                Fingerprint::compute(&self.action, &snapshot).to_string()
            }
            None => String::from("target-removed"),
        }
    }

    /// Records DISPATCH_STARTED naming the verified peer, off the async threads.
    pub async fn open(&self, peer: Option<String>) -> Result<(), GateShut> {
        let fingerprint_now = self.fingerprint_now();
        let rec = self.rec.clone();
        let connection_id = self.connection_id.clone();
        let recorded = tokio::task::spawn_blocking(move || {
            rec.dispatch_started(&fingerprint_now, Some(connection_id), peer)
        })
        .await;
        match recorded {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(GateShut::Refused(e)),
            Err(_) => Err(GateShut::Interrupted),
        }
    }
}

/// The answer for a failure that could not even be recorded (the journal is down).
/// Nothing was sent: every path that reaches the network records DISPATCH_STARTED
/// first, and that record is what failed.
pub fn unrecorded<R>(invocation_id: &str, error: &JournalError) -> Outcome<R> {
    Outcome::of_envelope(unrecorded_failure(invocation_id, error))
}

/// The envelope of [`unrecorded`].
pub fn unrecorded_failure(invocation_id: &str, error: &JournalError) -> Envelope {
    broker_unavailable(
        invocation_id,
        format!("The broker could not record this request; nothing was sent. ({error})"),
    )
}

/// The journal failed and its record cannot even be read back, after this invocation
/// may have been dispatched: nothing can prove the request stayed unsent, so report the
/// conservative outcome (a broker that cannot prove an operation stayed unattempted
/// must not call it a preflight failure).
pub fn unprovable(invocation_id: &str, error: &JournalError) -> Envelope {
    Envelope {
        invocation_id: invocation_id.to_string(),
        error: ErrorBody {
            code: Code::ResultStoreFailed,
            phase: Phase::RemoteExecution,
            outcome: contract::Outcome::Unknown,
            retry: Retry::Reconcile,
            message: format!(
                "The journal failed and the record cannot be read; the request may have been sent. ({error})"
            ),
        },
        evidence: Evidence {
            dispatch_started: true,
            ..Evidence::default()
        },
    }
}

/// What to report when the journal failed part-way through an invocation: after a
/// recorded dispatch the outcome stands as recorded (the remote may have acted) with
/// RESULT_STORE_FAILED. Without one, nothing was sent, whether or not the record can be
/// read back: DISPATCH_STARTED is durable before the first byte goes out, so a request
/// this process never dispatched (and whose record shows no earlier dispatch) stayed
/// here. Only an invocation that may have dispatched and whose record is unreadable is
/// unprovable. What is answered for an invocation that left no record is remembered
/// for `get_invocation`.
pub fn journal_failure(rec: &Recorder, error: &JournalError, now_ms: i64) -> Envelope {
    // A step that failed because an earlier one was refused for space says only that
    // the invocation is missing; name the cause instead.
    let full;
    let error = if !error.is_disk_full() && rec.journal().low_space() {
        full = JournalError::DiskFull {
            detail: crate::journal::space::describe(rec.journal().path()),
        };
        &full
    } else {
        error
    };
    match rec.projection() {
        Ok(p) if p.ever_dispatched => {
            let retry = p.retry(now_ms);
            let mut envelope = p.envelope(now_ms).unwrap_or_else(|| Envelope {
                invocation_id: p.invocation_id.clone(),
                error: ErrorBody {
                    code: Code::ResultStoreFailed,
                    phase: p.phase,
                    outcome: p.outcome,
                    retry,
                    message: String::new(),
                },
                evidence: p.evidence(),
            });
            envelope.error.code = Code::ResultStoreFailed;
            envelope.error.message = format!("The journal failed after dispatch: {error}");
            envelope
        }
        Ok(p) => {
            // Close the record if the journal takes it now (the reserve a full disk gives
            // back is there for this), so it does not stay "in progress" until a restart.
            if !p.terminal {
                let _ = rec.fail(
                    p.phase,
                    Code::BrokerUnavailable,
                    Retry::Backoff,
                    "The journal failed before dispatch; nothing was sent.",
                );
            }
            unrecorded_failure(rec.id(), error)
        }
        Err(_) if rec.may_have_dispatched() => unprovable(rec.id(), error),
        Err(_) => {
            let envelope = unrecorded_failure(rec.id(), error);
            rec.journal().note_unrecorded(Unrecorded {
                invocation_id: rec.id().to_string(),
                session: rec.session().map(str::to_string),
                envelope: envelope.clone(),
            });
            envelope
        }
    }
}

/// BROKER_UNAVAILABLE: nothing was recorded and nothing was sent.
pub fn broker_unavailable(invocation_id: &str, message: String) -> Envelope {
    Envelope {
        invocation_id: invocation_id.to_string(),
        error: ErrorBody {
            code: Code::BrokerUnavailable,
            phase: Phase::Validation,
            outcome: contract::Outcome::NotAttempted,
            retry: Retry::Backoff,
            message,
        },
        evidence: Evidence::default(),
    }
}
