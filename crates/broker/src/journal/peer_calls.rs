//! The `peer_calls` table (`0010_peer_calls.sql`): which invocation on this broker runs
//! a federated peer's call, keyed by (asking broker, its invocation id); and the
//! `peer_nonces` table (`0013_peer_nonces.sql`): the nonces of authenticated peer
//! requests still inside their time window ([`remember_nonce`]).
//!
//! A row is written in the same transaction as the invocation's ACTION_ACCEPTED
//! ([`accept`]), so the two exist together or not at all. Both commit before the
//! invocation can reach DISPATCH_STARTED, whose fsync makes them durable too (the WAL
//! is ordered): a call that may have been sent always has its row after a crash, and a
//! repeat of it finds the row and never sends it again.

use rusqlite::{OptionalExtension, params};

use super::append::WriteCtx;
use super::invocations::accept_in;
use super::store::{JournalError, NewInvocation};
use super::writer::Journal;

/// One peer call as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCall {
    /// The asking broker's key name.
    pub asker: String,
    /// The asking broker's invocation id.
    pub caller_invocation: String,
    /// The invocation here that runs it.
    pub invocation_id: String,
    pub capability: String,
    /// The peer request's fingerprint, computed here from what arrived.
    pub request_fingerprint: String,
    /// This broker's export policy version for the asker when it accepted the call:
    /// what it decided under, and so what every answer about the call attests.
    pub policy_version: String,
    pub accepted_at_ms: i64,
}

/// What [`accept`] did.
#[derive(Debug, Clone)]
pub enum PeerAccept {
    /// The invocation was accepted (ACTION_ACCEPTED at `seq`) and the call recorded
    /// against it.
    Accepted { seq: u64 },
    /// The call already has an invocation (not the one `replacing` named): nothing was
    /// written.
    Existing(PeerCall),
}

const COLUMNS: &str = "asker, caller_invocation, invocation_id, capability, request_fingerprint, \
                       policy_version, accepted_at_ms";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<PeerCall> {
    Ok(PeerCall {
        asker: r.get(0)?,
        caller_invocation: r.get(1)?,
        invocation_id: r.get(2)?,
        capability: r.get(3)?,
        request_fingerprint: r.get(4)?,
        policy_version: r.get(5)?,
        accepted_at_ms: r.get(6)?,
    })
}

/// The call `caller_invocation` of `asker`, if it was recorded.
pub fn find(
    conn: &rusqlite::Connection,
    asker: &str,
    caller_invocation: &str,
) -> Result<Option<PeerCall>, JournalError> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM peer_calls WHERE asker = ?1 AND caller_invocation = ?2"
        ))?
        .query_row([asker, caller_invocation], row)
        .optional()?)
}

/// The peer call `invocation_id` runs, if it runs one.
pub fn of_invocation(
    conn: &rusqlite::Connection,
    invocation_id: &str,
) -> Result<Option<PeerCall>, JournalError> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM peer_calls WHERE invocation_id = ?1"
        ))?
        .query_row([invocation_id], row)
        .optional()?)
}

/// Accepts `new` as the invocation that runs `call` (whose `invocation_id` must be
/// `new`'s), in one transaction: when the call has no row yet, or when its row still
/// names `replacing` (an invocation the caller found ended without sending anything,
/// which may therefore be run anew). Otherwise writes nothing and returns the row.
pub(super) fn accept(
    ctx: &mut WriteCtx<'_>,
    call: PeerCall,
    replacing: Option<String>,
    new: NewInvocation,
) -> Result<PeerAccept, JournalError> {
    if let Some(existing) = find(ctx.conn(), &call.asker, &call.caller_invocation)?
        && replacing.as_deref() != Some(existing.invocation_id.as_str())
    {
        return Ok(PeerAccept::Existing(existing));
    }
    if new.invocation_id != call.invocation_id {
        return Err(JournalError::Storage(format!(
            "peer call {} names invocation {}, not the one accepted ({})",
            call.caller_invocation, call.invocation_id, new.invocation_id
        )));
    }
    let appended = accept_in(ctx, new)?;
    ctx.conn()
        .prepare_cached(&format!(
            "INSERT INTO peer_calls ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (asker, caller_invocation) DO UPDATE SET
               invocation_id = excluded.invocation_id,
               capability = excluded.capability,
               request_fingerprint = excluded.request_fingerprint,
               policy_version = excluded.policy_version,
               accepted_at_ms = excluded.accepted_at_ms"
        ))?
        .execute(params![
            call.asker,
            call.caller_invocation,
            call.invocation_id,
            call.capability,
            call.request_fingerprint,
            call.policy_version,
            ctx.now_ms(),
        ])?;
    Ok(PeerAccept::Accepted { seq: appended.seq })
}

/// Records `nonce` of `asker` (issued at `issued_at_ms`), first forgetting every nonce
/// issued before `forget_before_ms`. Whether it was new: `false` when it was already
/// recorded (a replay).
fn remember_nonce(
    ctx: &mut WriteCtx<'_>,
    asker: &str,
    nonce: &str,
    issued_at_ms: i64,
    forget_before_ms: i64,
) -> Result<bool, JournalError> {
    ctx.conn()
        .prepare_cached("DELETE FROM peer_nonces WHERE issued_at_ms < ?1")?
        .execute(params![forget_before_ms])?;
    let inserted = ctx
        .conn()
        .prepare_cached(
            "INSERT INTO peer_nonces (asker, nonce, issued_at_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT (asker, nonce) DO NOTHING",
        )?
        .execute(params![asker, nonce, issued_at_ms])?;
    Ok(inserted == 1)
}

impl Journal {
    /// Accepts `new` as the invocation that runs the peer call `call`, recording both in
    /// one transaction, unless the call already has an invocation other than
    /// `replacing` (see [`accept`]). Refused like [`Journal::accept`] in
    /// low-space mode.
    pub fn accept_peer_call(
        &self,
        call: PeerCall,
        replacing: Option<String>,
        new: NewInvocation,
    ) -> Result<PeerAccept, JournalError> {
        self.write(false, move |ctx| accept(ctx, call, replacing, new))
    }

    /// Records a federated peer's request nonce, durably (fsynced), forgetting those
    /// issued before `forget_before_ms`; `false` when it was already recorded: the
    /// request is a replay, also across a restart of this broker.
    pub fn remember_peer_nonce(
        &self,
        asker: &str,
        nonce: &str,
        issued_at_ms: i64,
        forget_before_ms: i64,
    ) -> Result<bool, JournalError> {
        let (asker, nonce) = (asker.to_string(), nonce.to_string());
        self.write(true, move |ctx| {
            remember_nonce(ctx, &asker, &nonce, issued_at_ms, forget_before_ms)
        })
    }

    /// The recorded peer call `caller_invocation` of `asker`.
    pub fn peer_call(
        &self,
        asker: &str,
        caller_invocation: &str,
    ) -> Result<Option<PeerCall>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        find(&conn, asker, caller_invocation)
    }

    /// The peer call `invocation_id` runs, if any.
    pub fn peer_call_of(&self, invocation_id: &str) -> Result<Option<PeerCall>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        of_invocation(&conn, invocation_id)
    }
}
