//! Attempts and their leases: who may run the next attempt of an invocation and until
//! when, the credential's authorization that comes with it, and the dispatch gate that
//! checks the lease, the bound fingerprint and the retry budget before anything is sent.
//!
//! Must never: record DISPATCH_STARTED for a holder whose lease expired or whose
//! generation is not current; start an attempt while another holder's lease is live.

use rusqlite::{OptionalExtension, params};

use super::append::WriteCtx;
use super::events::EventBody;
use super::store::{Appended, Authorization, Dispatch, JournalError};
use super::writer::Journal;
use crate::contract::{Code, Outcome, Phase, Retry};

impl Journal {
    /// Takes the lease for the next attempt. Fails with `LeaseHeld` while another holder's
    /// lease is live.
    pub fn start_attempt(
        &self,
        invocation_id: &str,
        holder: &str,
        ttl_ms: i64,
    ) -> Result<Appended, JournalError> {
        self.write(
            false,
            start_attempt_job(invocation_id, Vec::new(), holder, ttl_ms),
        )
    }

    /// CREDENTIAL_AUTHORIZED and the next attempt's lease, in one transaction that also
    /// records the credential's use (its last-used time, in the same database: no second
    /// writer contends for it). When the credential was removed since it was read, no
    /// secret is handed out for a credential that no longer exists: the invocation ends
    /// with CREDENTIAL_MISSING, recorded in this transaction
    /// (`Err(JournalError::RecordedInstead)`). Awaited without blocking a runtime thread.
    pub async fn authorize_and_start(
        &self,
        invocation_id: &str,
        authorization: Authorization,
    ) -> Result<Appended, JournalError> {
        let job = authorize_job(invocation_id, authorization, None);
        recorded_instead(self.write_async(false, job).await?)
    }

    /// A start deferred to the dispatch gate ([`Journal::authorize_and_dispatch`]) that
    /// is recorded on its own instead, because the attempt ends before the gate: what
    /// [`Journal::authorize_and_start`] records. The attempt must start as generation
    /// `expected`, the one its connections were named after; if another holder started
    /// one first, nothing is recorded (`LeaseLost`).
    pub fn authorize_deferred(
        &self,
        invocation_id: &str,
        authorization: Authorization,
        expected: u32,
    ) -> Result<Appended, JournalError> {
        let job = authorize_job(invocation_id, authorization, Some(expected));
        recorded_instead(self.write(false, job)?)
    }

    /// CREDENTIAL_AUTHORIZED, the attempt's lease and DISPATCH_STARTED in one fsynced
    /// transaction, for a channel whose credential is first used in the request the gate
    /// releases (HTTP): one commit where [`Journal::authorize_and_start`] and
    /// [`Journal::dispatch_started_async`] take two, with the connection set up in
    /// between. Every check of both is made, in the same order; a credential removed
    /// since it was read ends the invocation with CREDENTIAL_MISSING instead, and a
    /// changed fingerprint with FINGERPRINT_MISMATCH, both recorded in this transaction
    /// (`Err(JournalError::RecordedInstead)`). The attempt must start as generation
    /// `expected` (see [`Journal::authorize_deferred`]).
    pub async fn authorize_and_dispatch(
        &self,
        invocation_id: &str,
        authorization: Authorization,
        expected: u32,
        dispatch: Dispatch,
    ) -> Result<Appended, JournalError> {
        let start = authorize_job(invocation_id, authorization, Some(expected));
        let dispatch = dispatch_job(invocation_id, expected, dispatch);
        let dispatched = self
            .write_async(true, move |ctx| match start(ctx)? {
                Ok(_) => dispatch(ctx),
                Err(failed) => Ok(Err(failed)),
            })
            .await?;
        recorded_instead(dispatched)
    }

    /// Closes the current attempt if its lease expired before it ended, recording what
    /// it proves (unknown if it dispatched, not_attempted otherwise). Returns whether it
    /// closed one.
    pub fn reap_expired(&self, invocation_id: &str) -> Result<bool, JournalError> {
        let id = invocation_id.to_string();
        self.write(true, move |ctx| reap_expired(ctx, &id))
    }

    /// Appends DISPATCH_STARTED (fsynced) if and only if `generation` still holds a live
    /// lease, the fingerprint is the bound one and the retry budget allows another
    /// dispatch. The checks and the append are one transaction, so a holder whose lease
    /// expired is stopped here, before any byte is sent.
    pub fn dispatch_started(
        &self,
        invocation_id: &str,
        generation: u32,
        dispatch: Dispatch,
    ) -> Result<Appended, JournalError> {
        recorded_instead(self.write(true, dispatch_job(invocation_id, generation, dispatch))?)
    }

    /// [`Journal::dispatch_started`], awaited without blocking a runtime thread.
    pub async fn dispatch_started_async(
        &self,
        invocation_id: &str,
        generation: u32,
        dispatch: Dispatch,
    ) -> Result<Appended, JournalError> {
        let job = dispatch_job(invocation_id, generation, dispatch);
        recorded_instead(self.write_async(true, job).await?)
    }
}

/// The job of [`Journal::start_attempt`], after `preceding` events (a credential's
/// authorization) in the same transaction.
fn start_attempt_job(
    invocation_id: &str,
    preceding: Vec<EventBody>,
    holder: &str,
    ttl_ms: i64,
) -> impl FnOnce(&mut WriteCtx<'_>) -> Result<Appended, JournalError> + Send + use<> {
    let id = invocation_id.to_string();
    let holder = holder.to_string();
    move |ctx| {
        for body in &preceding {
            ctx.append_checked(&id, body)?;
        }
        let now = ctx.now_ms();
        let lease: Option<(i64, String, i64)> = ctx
            .conn()
            .prepare_cached(
                "SELECT generation, holder, expires_at_ms FROM leases WHERE invocation_id = ?1",
            )?
            .query_row([&id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()?;
        if let Some((_, current, until)) = &lease
            && *until > now
            && *current != holder
        {
            return Err(JournalError::LeaseHeld {
                invocation_id: id,
                until_ms: *until,
            });
        }
        reap_expired(ctx, &id)?;
        let projection = ctx.projection(&id)?;
        let generation = projection.attempt.generation + 1;
        let expires = now.saturating_add(ttl_ms);
        let appended = ctx.append_checked(
            &id,
            &EventBody::AttemptStarted {
                generation,
                holder: holder.clone(),
                lease_expires_at_ms: expires,
            },
        )?;
        ctx.conn()
            .prepare_cached(
                "INSERT INTO leases (invocation_id, generation, holder, expires_at_ms)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (invocation_id) DO UPDATE SET
                   generation = excluded.generation, holder = excluded.holder,
                   expires_at_ms = excluded.expires_at_ms",
            )?
            .execute(params![id, generation, holder, expires])?;
        Ok(appended)
    }
}

/// What a step whose job may record a failure instead returns to its caller: the
/// appended step, or that failure as [`JournalError::RecordedInstead`].
fn recorded_instead(step: Result<Appended, Appended>) -> Result<Appended, JournalError> {
    step.map_err(|failed| JournalError::RecordedInstead(Box::new(failed)))
}

/// The job that authorizes the credential and starts the next attempt
/// ([`Journal::authorize_and_start`]): the appended ATTEMPT_STARTED, or, when the
/// credential was removed since it was read, the CREDENTIAL_MISSING failure it recorded
/// instead. With `expected`, an attempt that would start under another generation is
/// refused with nothing recorded.
fn authorize_job(
    invocation_id: &str,
    authorization: Authorization,
    expected: Option<u32>,
) -> impl FnOnce(&mut WriteCtx<'_>) -> Result<Result<Appended, Appended>, JournalError> + Send + 'static
{
    let id = invocation_id.to_string();
    let Authorization {
        credential_id,
        version,
        holder,
        ttl_ms,
    } = authorization;
    let authorized = EventBody::CredentialAuthorized {
        credential_id: credential_id.clone(),
        credential_version: version,
    };
    let start = start_attempt_job(invocation_id, vec![authorized], &holder, ttl_ms);
    move |ctx| {
        let now = ctx.now_ms();
        if !crate::vault::meta::touch_last_used_raw(ctx.conn(), &credential_id, now)? {
            let removed = crate::vault::VaultError::Missing {
                credential: credential_id,
            };
            let code = removed.code();
            let failed = ctx.append_checked(
                &id,
                &EventBody::failed_before_dispatch(
                    Phase::CredentialInjection,
                    code,
                    code.spec().retry,
                    &removed.agent_message(),
                ),
            )?;
            return Ok(Err(failed));
        }
        let started = start(ctx)?;
        let generation = started.projection.attempt.generation;
        if let Some(expected) = expected
            && generation != expected
        {
            return Err(JournalError::LeaseLost {
                invocation_id: id,
                generation: expected,
            });
        }
        Ok(Ok(started))
    }
}

/// The job of [`Journal::dispatch_started`]: the appended DISPATCH_STARTED, or the
/// FINGERPRINT_MISMATCH failure it recorded instead.
fn dispatch_job(
    invocation_id: &str,
    generation: u32,
    dispatch: Dispatch,
) -> impl FnOnce(&mut WriteCtx<'_>) -> Result<Result<Appended, Appended>, JournalError> + Send + 'static
{
    let id = invocation_id.to_string();
    let bound = dispatch.fingerprint.clone();
    let body = EventBody::DispatchStarted {
        generation,
        fingerprint: dispatch.fingerprint,
        connection_id: dispatch.connection_id,
        peer_identity: dispatch.peer_identity,
    };
    move |ctx| {
        let now = ctx.now_ms();
        let lease: Option<(u32, i64)> = ctx
            .conn()
            .prepare_cached(
                "SELECT generation, expires_at_ms FROM leases WHERE invocation_id = ?1",
            )?
            .query_row([&id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        match lease {
            Some((current, until)) if current == generation && until > now => {}
            _ => {
                return Err(JournalError::LeaseLost {
                    invocation_id: id,
                    generation,
                });
            }
        }
        let projection = ctx.projection(&id)?;
        if projection.fingerprint.as_deref() != Some(bound.as_str()) {
            // The request or its bound configuration changed: nothing is sent, and
            // the invocation ends saying so, in this same transaction.
            let failed = ctx.append_checked(
                &id,
                &EventBody::failed_before_dispatch(
                    Phase::Validation,
                    Code::FingerprintMismatch,
                    Retry::AfterCorrection,
                    "The request or its configuration changed after it was bound; nothing was sent.",
                ),
            )?;
            return Ok(Err(failed));
        }
        let budget = projection.operation.as_ref().map_or(1, |o| o.retry_budget);
        if projection.dispatches >= budget {
            return Err(JournalError::BudgetExhausted {
                invocation_id: id,
                budget,
            });
        }
        Ok(Ok(ctx.append_checked(&id, &body)?))
    }
}

fn reap_expired(ctx: &mut WriteCtx<'_>, id: &str) -> Result<bool, JournalError> {
    let p = ctx.projection(id)?;
    if p.attempt.generation == 0 || p.attempt.closed {
        return Ok(false);
    }
    let until: Option<i64> = ctx
        .conn()
        .prepare_cached("SELECT expires_at_ms FROM leases WHERE invocation_id = ?1")?
        .query_row([id], |r| r.get(0))
        .optional()?;
    if until.is_some_and(|u| u > ctx.now_ms()) {
        return Ok(false);
    }
    let body = if p.attempt.dispatched {
        EventBody::Failed {
            phase: Phase::RemoteExecution,
            outcome: Outcome::Unknown,
            retry: p.retry(ctx.now_ms()),
            code: Code::RemoteOutcomeUnknown,
            message: "The attempt's lease expired after dispatch and before a complete response; the remote may have acted.".into(), field: None }
    } else {
        EventBody::Failed {
            phase: p.phase,
            outcome: Outcome::NotAttempted,
            retry: Retry::Backoff,
            code: Code::BrokerInterrupted,
            message: "The attempt's lease expired before dispatch; nothing was sent.".into(),
            field: None,
        }
    };
    ctx.append_checked(id, &body)?;
    Ok(true)
}
