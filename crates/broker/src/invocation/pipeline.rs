//! The invocation pipeline, written once for every channel.
//!
//! One call goes: accept (ACTION_ACCEPTED) → [`Channel::validate`] (nothing touched yet)
//! → bind the configuration snapshot and fingerprint (PREFLIGHT_VALIDATED, plus the
//! request kept for a retry) → approval, when the target asks for it → read the bound
//! credential and [`Channel::arm`] with it → CREDENTIAL_AUTHORIZED and the attempt's
//! lease → [`Channel::attempt`]: connection setup, DISPATCH_STARTED through the
//! [`Gate`](super::Gate), the exchange, and the settled result through
//! [`Attempt::commit`] → one [`Outcome`] → RESULT_DELIVERED once the caller's side
//! confirms the handoff ([`confirm_delivery`]).
//!
//! A channel that holds no credential of its own (a call through a peer broker: the
//! peer holds it) says so with [`Channel::NEEDS_CREDENTIAL`]: it binds its own
//! snapshot ([`Channel::bind_bare`]), is armed without a secret ([`Channel::arm_bare`])
//! and its attempt starts without CREDENTIAL_AUTHORIZED; the keychain is never read.
//!
//! A channel writes validation and the attempt and nothing else: every record, every
//! failure envelope and every retry decision is made here and in the
//! [`Recorder`]. What a failure proves is classified by the last
//! boundary the record proves, not by where the error was caught: [`Recorder::fail`]
//! turns any failure after a recorded dispatch into `unknown`.
//!
//! The hooks a channel implements, and the values passed to them, are in
//! [`hooks`](super::hooks); they are re-exported here.

use std::sync::Arc;

use super::attempt::Attempt;
use super::credential::CredentialRead;
use super::outcome::{Outcome, journal_failure, unrecorded};
use super::recorder::{Recorder, StepError, new_invocation_id};
use crate::action::ConfigSnapshot;
use crate::approvals::{ApprovalAnswer, ApprovalRequest};
use crate::config::{ApprovalMode, Config, ConfigHandle};
use crate::contract::{Code, Phase, Retry};
use crate::journal::events::EventBody;
use crate::journal::projection::Projection;
use crate::journal::{Authorization, Journal, JournalError, NewInvocation};
use crate::record::job::Relation;
use crate::retry::{Decision, RetryRequest};
use crate::vault::Vault;

/// The refusal of a call from a session that is not confined to a target that says
/// `require_confined = true`, made at validation (before a credential is read). A
/// reconcile query is the broker's own read on the operator's behalf and is not refused;
/// a federated peer's call is (this broker cannot know how the peer's agent runs).
fn unconfined_refusal<P>(config: &Config, v: &Validated<P>, ctx: &CallContext) -> Option<Invalid> {
    let required = config
        .target(&v.target)
        .is_some_and(|t| t.require_confined());
    let broker_own = ctx
        .parent
        .as_ref()
        .is_some_and(|p| p.relation == Relation::ReconcileQuery);
    (required && !ctx.confinement.is_confined() && !broker_own).then(|| Invalid {
        code: Code::ConfinementRequired,
        field: "target".into(),
        message: format!(
            "target {:?} takes calls only from confined sessions; start the agent with \
             `postern shield -- AGENT` so its session is confined",
            v.target
        ),
    })
}

pub use super::hooks::{Accepted, Bound, CallContext, CallerKind, Channel, Invalid, Validated};

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

    pub(super) fn now(&self) -> i64 {
        self.inner.journal.now_ms()
    }

    /// Runs one request as a new invocation, end to end.
    pub async fn run(&self, request: &T::Request, ctx: &CallContext) -> Outcome<T::Result> {
        let rec = match self.accept(request, ctx) {
            Ok(rec) => rec,
            Err(outcome) => return *outcome,
        };
        self.run_accepted(rec, request, ctx).await
    }

    /// Runs a request whose ACTION_ACCEPTED the caller recorded itself (a peer broker's
    /// call, accepted together with its dedup record), from validation to the end.
    pub async fn run_accepted(
        &self,
        rec: Recorder,
        request: &T::Request,
        ctx: &CallContext,
    ) -> Outcome<T::Result> {
        // One snapshot for validation and the policy checked with it.
        let config = self.inner.config.current();
        let validated = match self.inner.channel.validate(request, &config) {
            Ok(v) => v,
            Err(invalid) => return self.reject(&rec, &invalid),
        };
        if let Some(invalid) = unconfined_refusal(&config, &validated, ctx) {
            return self.reject(&rec, &invalid);
        }
        // A target that asks nobody gets its secret read while the binding is recorded
        // (the two wait on different things: the keychain, the journal's commit). One
        // that asks a person is read only after the grant.
        let early =
            self.inner.channel.approval_mode(&config, &validated.target) == ApprovalMode::None;
        let (bound, read) = match self.bind_reading(&rec, validated, early).await {
            Ok(b) => b,
            Err(outcome) => return *outcome,
        };
        let asked = match self.approve(&rec, &bound, ctx).await {
            Ok(asked) => asked,
            Err(outcome) => return *outcome,
        };
        // Approval turned out to be needed after all (a reload): read after the grant.
        let read = if asked { None } else { read };
        let mut rec = rec;
        self.attempt_with(&mut rec, &bound, ctx, read).await
    }

    /// ACTION_ACCEPTED under a fresh invocation id, recorded with the invocation's
    /// first step ([`Recorder::accept_deferred`]): one commit fewer per invocation.
    pub fn accept(
        &self,
        request: &T::Request,
        ctx: &CallContext,
    ) -> Result<Recorder, Box<Outcome<T::Result>>> {
        let id = new_invocation_id().map_err(|e| Box::new(unrecorded("inv_unassigned", &e)))?;
        let accepted = self
            .inner
            .channel
            .accepted(request, &self.inner.config.current());
        Ok(Recorder::accept_deferred(
            &self.inner.journal,
            NewInvocation {
                invocation_id: id,
                channel: T::KIND,
                target: accepted.target.unwrap_or_default(),
                summary: accepted.summary,
                session: ctx.session.clone(),
                idempotency_key: accepted.idempotency_key,
                parent: ctx.parent.clone(),
            },
        ))
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
    pub async fn bind(
        &self,
        rec: &Recorder,
        v: Validated<T::Plan>,
    ) -> Result<Bound<T::Plan>, Box<Outcome<T::Result>>> {
        self.bind_reading(rec, v, false)
            .await
            .map(|(bound, _)| bound)
    }

    /// [`Pipeline::bind`]; with `read_early`, the bound credential's keychain read starts
    /// before the binding is recorded and comes back in flight, for
    /// [`Pipeline::attempt_with`]. If the binding fails, the read is dropped unused.
    async fn bind_reading(
        &self,
        rec: &Recorder,
        v: Validated<T::Plan>,
        read_early: bool,
    ) -> Result<(Bound<T::Plan>, Option<CredentialRead>), Box<Outcome<T::Result>>> {
        let config = self.inner.config.current();
        let snapshot = if T::NEEDS_CREDENTIAL {
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
                Err(e) => return Err(Box::new(self.vault_failed(rec, &e))),
            };
            ConfigSnapshot::of(target, meta.version.as_str(), v.idempotency_key.clone())
        } else {
            match self.inner.channel.bind_bare(&config, &v) {
                Ok(snapshot) => snapshot,
                Err(invalid) => return Err(Box::new(self.reject(rec, &invalid))),
            }
        };
        let fingerprint = T::fingerprint(&v.action, &snapshot);
        let bound = Bound {
            target: v.target,
            action: v.action,
            snapshot,
            fingerprint,
            idempotency_key: v.idempotency_key,
            timeout: v.timeout,
            plan: v.plan,
        };
        let operation = self
            .inner
            .channel
            .operation_for(&config, &bound, self.now(), rec.id());
        let read = (read_early && T::NEEDS_CREDENTIAL)
            .then(|| CredentialRead::start(&self.inner.vault, &bound.snapshot));
        // The request is kept for a retry in the binding's own transaction.
        if let Err(e) = rec
            .preflight_async(
                &bound.fingerprint,
                bound.snapshot.clone(),
                operation,
                Some(v.stored),
            )
            .await
        {
            return Err(Box::new(self.stopped(rec, e)));
        }
        Ok((bound, read))
    }

    /// Asks a person when the target's approval mode says so: no console attached fails
    /// fast (NO_APPROVER), the card carries the bound fingerprint, and only a grant of
    /// exactly that fingerprint lets the invocation go on.
    ///
    /// Returns whether a person was asked (and granted it).
    pub async fn approve(
        &self,
        rec: &Recorder,
        bound: &Bound<T::Plan>,
        ctx: &CallContext,
    ) -> Result<bool, Box<Outcome<T::Result>>> {
        let mode = self
            .inner
            .channel
            .approval_mode(&self.inner.config.current(), &bound.target);
        if mode == ApprovalMode::None {
            return Ok(false);
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
        let (summary, detail) = self.inner.channel.approval(bound).await;
        // A federated peer's call: the card (and its digest) says which broker asks.
        let summary = match &ctx.caller {
            CallerKind::Peer { key_name } => {
                let config = self.inner.config.current();
                let name = config
                    .peer_by_key_name(key_name)
                    .map_or("unknown", |p| p.name.as_str());
                format!("for peer broker {name} ({key_name}): {summary}")
            }
            CallerKind::Local => summary,
        };
        let retry_budget = self
            .inner
            .channel
            .operation(&self.inner.config.current(), bound, self.now())
            .retry_budget;
        let request = ApprovalRequest {
            mode: mode.as_str(),
            covers: crate::approvals::covers(mode.as_str(), &bound.target, retry_budget),
            agent: crate::provenance::card_agent_of(&self.inner.journal, ctx.session.as_deref()),
            ..ApprovalRequest::bound(
                rec.id(),
                ctx.session.clone(),
                summary,
                bound.fingerprint.clone(),
                &bound.snapshot,
                detail,
            )
        };
        if let Err(e) = rec.approval_requested(&bound.fingerprint, request.mode, request.card()) {
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
            ApprovalAnswer::Approved {
                fingerprint,
                by,
                card_digest,
            } => rec
                .approval_granted(&fingerprint, &by, card_digest)
                .map(|_| true)
                .map_err(|e| Box::new(self.stopped(rec, e))),
            ApprovalAnswer::Denied { by, card_digest } => Err(Box::new(
                match rec.approval_denied(&bound.fingerprint, &by, card_digest) {
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
        self.attempt_with(rec, bound, ctx, None).await
    }

    /// [`Pipeline::attempt`] with the credential's keychain read already in flight
    /// (`read`, from binding), or started here.
    async fn attempt_with(
        &self,
        rec: &mut Recorder,
        bound: &Bound<T::Plan>,
        ctx: &CallContext,
        read: Option<CredentialRead>,
    ) -> Outcome<T::Result> {
        // The lease outlives the attempt's own timeout by a margin for recording.
        let ttl = i64::try_from(bound.timeout.as_millis())
            .unwrap_or(i64::MAX)
            .saturating_add(30_000);
        let armed = if T::NEEDS_CREDENTIAL {
            // The credential: the only place secret bytes leave the keychain.
            let read =
                read.unwrap_or_else(|| CredentialRead::start(&self.inner.vault, &bound.snapshot));
            let (meta, secret) = match read.finish().await {
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
            let authorization = Authorization {
                credential_id: bound.snapshot.credential_id.clone(),
                version: meta.version.as_str().to_string(),
                holder: self.inner.holder.clone(),
                ttl_ms: ttl,
            };
            if T::DEFER_AUTHORIZATION {
                rec.defer_authorization(authorization);
            } else if let Err(e) = rec.authorize_and_start_async(authorization).await {
                // A credential removed since it was read is recorded as missing, and
                // the secret is dropped unused.
                return self.stopped(rec, e);
            }
            armed
        } else {
            // No credential of this broker's: nothing is read from the keychain and no
            // CREDENTIAL_AUTHORIZED is recorded.
            let armed = match self
                .inner
                .channel
                .arm_bare(&self.inner.config.current(), bound)
            {
                Ok(armed) => armed,
                Err(f) => return self.fail(rec, f.phase, f.code, f.retry, &f.message, None),
            };
            if let Err(e) = rec.start_attempt(&self.inner.holder, ttl) {
                return self.journal_failed(rec, &e);
            }
            armed
        };
        let attempt = Attempt::new(self, rec, bound);
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
        let snapshot = if T::NEEDS_CREDENTIAL {
            ConfigSnapshot {
                target_version: config.target(&v.target)?.version(),
                ..bound_snapshot
            }
        } else {
            ConfigSnapshot {
                target_version: self
                    .inner
                    .channel
                    .bind_bare(&config, &v)
                    .ok()?
                    .target_version,
                ..bound_snapshot
            }
        };
        let fingerprint = T::fingerprint(&v.action, &snapshot);
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

    /// The record plus its stored result, if any (a read, never a re-run). A stored
    /// result that cannot be read back leaves the answer without it.
    pub fn recorded_outcome(&self, rec: &Recorder) -> Outcome<T::Result> {
        match rec.projection() {
            Ok(p) => self
                .recorded_projection(&p)
                .unwrap_or_else(|_| Outcome::of_projection(&p, self.now())),
            Err(e) => unrecorded(rec.id(), &e),
        }
    }

    /// What the record `p` says, with its stored result when one was committed.
    ///
    /// # Errors
    ///
    /// The stored result could not be read back (damaged or incomplete).
    pub fn recorded_projection(&self, p: &Projection) -> Result<Outcome<T::Result>, JournalError> {
        let mut outcome = Outcome::of_projection(p, self.now());
        if let Some(result_id) = &p.result_id {
            let stored = self.inner.journal.read_result(result_id)?;
            outcome.result = T::stored_result(&stored);
        }
        Ok(outcome)
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

    /// Records a keychain failure before anything was sent (credential injection), with
    /// the agent-safe message and the code's own retry.
    fn vault_failed(&self, rec: &Recorder, e: &crate::vault::VaultError) -> Outcome<T::Result> {
        let code = e.code();
        self.fail(
            rec,
            Phase::CredentialInjection,
            code,
            code.spec().retry,
            &e.agent_message(),
            None,
        )
    }
}
