//! The steps of an invocation outside its attempt's lease: acceptance (ACTION_ACCEPTED
//! and the invocation's row), the request it was accepted with, the settled result
//! with RESULT_COMMITTED, and delivery.
//!
//! Must never: accept a new invocation in low-space mode; store a result apart from
//! the event that commits it.

use rusqlite::{OptionalExtension, params};

use super::append::WriteCtx;
use super::events::{Channel, EventBody};
use super::results::{self, ResultToStore, Settle};
use super::store::{Appended, JournalError, NewInvocation};
use super::writer::Journal;

impl Journal {
    /// Records a new invocation (ACTION_ACCEPTED) and its identity row.
    pub fn accept(&self, new: NewInvocation) -> Result<Appended, JournalError> {
        self.write(false, move |ctx| accept_in(ctx, new))
    }

    /// Keeps the request an invocation was accepted with (see `0003_requests.sql`).
    /// Pipelined: only a later retry reads it, after waited appends that follow it.
    pub fn store_request(
        &self,
        invocation_id: &str,
        meta: serde_json::Value,
        body: Vec<u8>,
    ) -> Result<(), JournalError> {
        let id = invocation_id.to_string();
        let meta = encode_request(&meta)?;
        self.pipeline(move |ctx| insert_request(ctx, &id, &meta, &body))
    }

    /// Stores a settled result and appends RESULT_COMMITTED in one fsynced transaction,
    /// after `preceding` events (the exchange's markers) in the same transaction.
    pub fn commit_result(
        &self,
        invocation_id: &str,
        preceding: Vec<EventBody>,
        result: ResultToStore,
        settle: Settle,
    ) -> Result<Appended, JournalError> {
        self.write(true, commit_job(invocation_id, preceding, result, settle))
    }

    /// [`Journal::commit_result`], awaited without blocking a runtime thread.
    pub async fn commit_result_async(
        &self,
        invocation_id: &str,
        preceding: Vec<EventBody>,
        result: ResultToStore,
        settle: Settle,
    ) -> Result<Appended, JournalError> {
        self.write_async(true, commit_job(invocation_id, preceding, result, settle))
            .await
    }

    /// RESULT_DELIVERED for `invocation_id`, if it has ended and is not yet recorded as
    /// delivered; waits for the commit.
    pub fn delivered(&self, invocation_id: &str) -> Result<(), JournalError> {
        self.write(false, delivered_job(invocation_id))
    }

    /// [`Journal::delivered`] queued without waiting: the writer applies it in order,
    /// before anything appended after this call (a later DELIVERY_FAILED of the same
    /// invocation is then refused by its projection). RESULT_DELIVERED proves a handoff
    /// already made; it gates nothing, so no caller waits for it.
    pub fn delivered_pipelined(&self, invocation_id: &str) -> Result<(), JournalError> {
        self.pipeline(delivered_job(invocation_id))
    }
}

pub(super) fn accept_in(
    ctx: &mut WriteCtx<'_>,
    new: NewInvocation,
) -> Result<Appended, JournalError> {
    if ctx.low_space {
        // The space left belongs to invocations already in flight.
        return Err(JournalError::DiskFull {
            detail: "the journal is keeping its last space for requests already sent".into(),
        });
    }
    let exists: Option<i64> = ctx
        .conn()
        .prepare_cached("SELECT 1 FROM invocations WHERE id = ?1")?
        .query_row([&new.invocation_id], |r| r.get(0))
        .optional()?;
    if exists.is_some() {
        return Err(JournalError::DuplicateInvocation(new.invocation_id));
    }
    let body = EventBody::ActionAccepted {
        channel: new.channel,
        target: new.target.clone(),
        summary: new.summary.clone(),
        session: new.session.clone(),
        parent: new.parent.clone(),
    };
    let appended = ctx.append_checked(&new.invocation_id, &body)?;
    let channel = match new.channel {
        Channel::Http => "http",
        Channel::Ssh => "ssh",
        Channel::Peer => "peer",
    };
    ctx.conn()
        .prepare_cached(
            "INSERT INTO invocations
             (id, accepted_seq, accepted_at_ms, channel, target, session_id, idempotency_key,
              phase, outcome, code, summary, parent_id, relation)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, NULL, ?10, ?11, ?12)",
        )?
        .execute(params![
            new.invocation_id,
            appended.seq as i64,
            ctx.now_ms(),
            channel,
            new.target,
            new.session,
            new.idempotency_key,
            appended.projection.phase.as_str(),
            appended.projection.outcome.as_str(),
            new.summary,
            new.parent.as_ref().map(|l| l.invocation_id.as_str()),
            new.parent.as_ref().map(|l| l.relation.as_str()),
        ])?;
    // Indexed for search later, many at once: the full-text index writes a segment
    // for every transaction it sees data in.
    ctx.accepted += 1;
    Ok(appended)
}

/// A stored request's metadata as the `requests` table keeps it.
pub(crate) fn encode_request(meta: &serde_json::Value) -> Result<String, JournalError> {
    serde_json::to_string(meta).map_err(|e| JournalError::Storage(format!("request encoding: {e}")))
}

/// Keeps the request `invocation_id` was accepted with (see `0003_requests.sql`).
pub(crate) fn insert_request(
    ctx: &mut WriteCtx<'_>,
    invocation_id: &str,
    meta: &str,
    body: &[u8],
) -> Result<(), JournalError> {
    ctx.conn()
        .prepare_cached(
            "INSERT OR REPLACE INTO requests (invocation_id, meta, body) VALUES (?1, ?2, ?3)",
        )?
        .execute(params![invocation_id, meta, body])?;
    Ok(())
}

/// The job of [`Journal::commit_result`].
fn commit_job(
    invocation_id: &str,
    preceding: Vec<EventBody>,
    result: ResultToStore,
    settle: Settle,
) -> impl FnOnce(&mut WriteCtx<'_>) -> Result<Appended, JournalError> + Send + 'static {
    let id = invocation_id.to_string();
    move |ctx| {
        for body in &preceding {
            ctx.append_checked(&id, body)?;
        }
        results::commit(ctx, &id, &result, &settle)
    }
}

/// The job of [`Journal::delivered`]: recorded once, and only for an ended invocation.
fn delivered_job(
    invocation_id: &str,
) -> impl FnOnce(&mut WriteCtx<'_>) -> Result<(), JournalError> + Send + 'static {
    let id = invocation_id.to_string();
    move |ctx| {
        let p = ctx.projection(&id)?;
        if p.terminal && !p.delivered {
            ctx.append_checked(&id, &EventBody::ResultDelivered)?;
        }
        Ok(())
    }
}

impl WriteCtx<'_> {
    /// Records a new invocation (ACTION_ACCEPTED) and its identity row, inside another
    /// step's transaction (see [`Journal::accept`]).
    pub fn accept(&mut self, new: NewInvocation) -> Result<Appended, JournalError> {
        accept_in(self, new)
    }
}
