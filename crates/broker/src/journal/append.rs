//! What a job sees inside the writer's transaction ([`WriteCtx`]): the chained append
//! of one event (chain value, tree hashes, status row) after the projection accepted
//! it, and the projections the writer keeps of what it touched.
//!
//! Must never: append an invocation event the projection refuses, or write an event
//! row without its chain value and tree hashes.

use rusqlite::{Connection, params};

use super::chain::ChainHasher;
use super::chain::ChainedRow;
use super::events::EventBody;
use super::merkle::{self, Frontier};
use super::projection::Projection;
use super::rows::load_events;
use super::store::{Appended, JournalError};
use crate::contract::Code;

/// What a job sees inside the writer's transaction.
pub struct WriteCtx<'a> {
    pub(super) conn: &'a Connection,
    /// Projections of invocations the writer touched recently. The writer is the only
    /// writer of events, so a cached fold is exact; entries a rolled-back job touched
    /// are dropped.
    pub(super) cache: &'a mut ProjectionCache,
    /// Invocations this job changed, to forget if the job rolls back.
    pub(super) touched: Vec<String>,
    pub(super) pos: ChainPos,
    pub(super) hasher: &'a mut ChainHasher,
    /// Scratch for the tree hashes one append stores.
    pub(super) stored: &'a mut Vec<[u8; 32]>,
    pub(super) now_ms: i64,
    /// The disk is full: new invocations are refused, those in flight go on.
    pub(super) low_space: bool,
    /// Invocations this job accepted: the text search index gains them later (see
    /// [`SEARCH_BATCH`]).
    pub(super) accepted: usize,
}

impl WriteCtx<'_> {
    /// The connection, inside the batch transaction.
    pub fn conn(&self) -> &Connection {
        self.conn
    }

    pub fn now_ms(&self) -> i64 {
        self.now_ms
    }

    /// Appends one event with the next sequence number and chain hash. Callers that
    /// write invocation events go through [`WriteCtx::append_checked`].
    fn append_raw(&mut self, invocation_id: &str, body: &EventBody) -> Result<u64, JournalError> {
        let seq = self.pos.last_seq + 1;
        let text = serde_json::to_string(body)
            .map_err(|e| JournalError::Storage(format!("event encoding: {e}")))?;
        let kind = body.kind();
        let hash = self.hasher.link(
            &self.pos.head,
            &ChainedRow {
                seq,
                invocation_id,
                kind,
                body: &text,
                recorded_at_ms: self.now_ms,
            },
        );
        self.conn
            .prepare_cached(
                "INSERT INTO events (seq, invocation_id, kind, body, recorded_at_ms, hash)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                seq as i64,
                invocation_id,
                kind,
                text,
                self.now_ms,
                &hash[..]
            ])?;
        self.pos
            .frontier
            .push(merkle::leaf_hash(seq, &hash), self.stored);
        merkle::store_hashes(self.conn, seq, self.stored)?;
        self.pos.last_seq = seq;
        self.pos.head = hash;
        Ok(seq)
    }

    /// Appends a record that belongs to no invocation: a session's identity (under its
    /// `session:` key) or a journal-level record. Invocation events are refused here;
    /// they go through [`WriteCtx::append_checked`].
    pub fn append_record(&mut self, scope: &str, body: &EventBody) -> Result<u64, JournalError> {
        if !matches!(
            body,
            EventBody::SessionOpened(_)
                | EventBody::SigningResumed { .. }
                | EventBody::AgentPause { .. }
        ) {
            return Err(JournalError::Storage(format!(
                "{} is an invocation event; it cannot be appended as a record",
                body.kind()
            )));
        }
        self.append_raw(scope, body)
    }

    /// Appends without the projection check. Only for building large benchmark
    /// journals; the broker itself always goes through [`WriteCtx::append_checked`].
    #[doc(hidden)]
    pub fn append_unchecked_for_bench(
        &mut self,
        invocation_id: &str,
        body: &EventBody,
    ) -> Result<u64, JournalError> {
        self.append_raw(invocation_id, body)
    }

    /// The invocation's current projection (cached, or folded from its events).
    pub fn projection(&mut self, invocation_id: &str) -> Result<Projection, JournalError> {
        if let Some(p) = self.cache.map.get(invocation_id) {
            return Ok(p.clone());
        }
        let p = self.fold(invocation_id)?;
        self.cache.insert(invocation_id, p.clone());
        Ok(p)
    }

    pub(super) fn fold(&self, invocation_id: &str) -> Result<Projection, JournalError> {
        let events = load_events(self.conn, invocation_id)?;
        Ok(Projection::fold(invocation_id, &events)?)
    }

    /// The fingerprints bound by other invocations of the same target under
    /// idempotency key `key` (the target is `invocation_id`'s).
    pub fn other_fingerprints_for_key(
        &mut self,
        invocation_id: &str,
        key: &str,
    ) -> Result<Vec<String>, JournalError> {
        let others: Vec<String> = self
            .conn
            .prepare_cached(
                "SELECT o.id FROM invocations o JOIN invocations me ON me.id = ?1
                 WHERE o.target = me.target AND o.idempotency_key = ?2 AND o.id != ?1",
            )?
            .query_map([invocation_id, key], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let mut out = Vec::new();
        for other in others {
            if let Some(fp) = self.projection(&other)?.fingerprint {
                out.push(fp);
            }
        }
        Ok(out)
    }

    /// Appends an invocation event after checking it against the current projection.
    pub fn append_checked(
        &mut self,
        invocation_id: &str,
        body: &EventBody,
    ) -> Result<Appended, JournalError> {
        // Taken out of the cache rather than copied: it goes back, updated, once the
        // event is appended (until then a failure simply leaves it to be folded again).
        let mut projection = match self.cache.map.remove(invocation_id) {
            Some(p) => p,
            None => self.fold(invocation_id)?,
        };
        let accepting = matches!(body, EventBody::ActionAccepted { .. });
        if !projection.exists() && !accepting {
            return Err(JournalError::UnknownInvocation(invocation_id.to_string()));
        }
        let status = |p: &Projection| (p.phase, p.outcome, p.effective_code());
        let before = status(&projection);
        projection.apply(self.pos.last_seq + 1, body)?;
        let seq = self.append_raw(invocation_id, body)?;
        // The status index moves with the events, in the same transaction. An event that
        // leaves the status as it was (most do) does not touch the row or its indexes;
        // an acceptance has no row yet (it is inserted with its status).
        let after = status(&projection);
        if !accepting && after != before {
            self.conn
                .prepare_cached(
                    "UPDATE invocations SET phase = ?1, outcome = ?2, code = ?3 WHERE id = ?4",
                )?
                .execute(params![
                    after.0.as_str(),
                    after.1.as_str(),
                    after.2.map(Code::as_str),
                    invocation_id
                ])?;
        }
        self.touched.push(invocation_id.to_string());
        self.cache.insert(invocation_id, projection.clone());
        Ok(Appended { seq, projection })
    }
}

/// The chain position and the tree's right edge, saved and restored around each job.
#[derive(Clone)]
pub(super) struct ChainPos {
    pub(super) last_seq: u64,
    pub(super) head: [u8; 32],
    pub(super) frontier: Frontier,
}

/// A bounded map of recent projections; cleared wholesale when full (a miss only costs
/// a fold).
#[derive(Default)]
pub(super) struct ProjectionCache {
    pub(super) map: std::collections::HashMap<String, Projection>,
}

impl ProjectionCache {
    const MAX: usize = 4096;

    pub(super) fn insert(&mut self, id: &str, p: Projection) {
        if self.map.len() >= Self::MAX && !self.map.contains_key(id) {
            self.map.clear();
        }
        self.map.insert(id.to_string(), p);
    }
}
