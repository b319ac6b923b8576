//! The read side: an invocation's events and status, its children, lookups by key,
//! what a crash left without a terminal record, stored requests and results, and peer
//! incidents, all through the reader connection (never the writer's).
//!
//! Must never: write.

use rusqlite::OptionalExtension;

use super::events::{Event, EventBody};
use super::projection::Projection;
use std::sync::atomic::Ordering;

use super::results::{self, ResultLayout, StoredResult};
use super::rows::load_events;
use super::store::JournalError;
use super::writer::Journal;

impl Journal {
    /// All events of one invocation, in sequence order.
    pub fn events(&self, invocation_id: &str) -> Result<Vec<Event>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        load_events(&conn, invocation_id)
    }

    /// The current status of one invocation.
    pub fn projection(&self, invocation_id: &str) -> Result<Projection, JournalError> {
        let events = self.events(invocation_id)?;
        if events.is_empty() {
            return Err(JournalError::UnknownInvocation(invocation_id.to_string()));
        }
        Ok(Projection::fold(invocation_id, &events)?)
    }

    /// The invocations the broker started for `invocation_id` (followed redirects, its
    /// job, job polls, reconcile queries), oldest first.
    pub fn children(
        &self,
        invocation_id: &str,
    ) -> Result<Vec<crate::record::job::ParentLink>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        let mut stmt = conn.prepare_cached(
            "SELECT id, relation FROM invocations WHERE parent_id = ?1 ORDER BY accepted_seq",
        )?;
        let rows = stmt.query_map([invocation_id], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?))
        })?;
        let mut children = Vec::new();
        for row in rows {
            let (id, relation) = row?;
            let Some(relation) = relation
                .as_deref()
                .and_then(crate::record::job::Relation::parse)
            else {
                return Err(JournalError::Storage(format!(
                    "invocation {id} names {invocation_id} as its parent without a known relation"
                )));
            };
            children.push(crate::record::job::ParentLink {
                invocation_id: id,
                relation,
            });
        }
        Ok(children)
    }

    /// The most recently accepted invocation, if any.
    pub fn newest_invocation(&self) -> Result<Option<String>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        Ok(conn
            .query_row(
                "SELECT id FROM invocations ORDER BY accepted_seq DESC LIMIT 1",
                [],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Finds an invocation by target and idempotency key.
    pub fn find_by_idempotency_key(
        &self,
        target: &str,
        key: &str,
    ) -> Result<Option<String>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        Ok(conn
            .query_row(
                "SELECT id FROM invocations WHERE target = ?1 AND idempotency_key = ?2
                 ORDER BY accepted_seq LIMIT 1",
                [target, key],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Invocations whose last attempt never reached a terminal record: what a crash
    /// interrupted.
    pub fn interrupted(&self) -> Result<Vec<Projection>, JournalError> {
        let ids: Vec<String> = {
            let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
            let mut stmt = conn.prepare(
                "SELECT invocation_id FROM events WHERE seq IN
                   (SELECT max(seq) FROM events
                    WHERE invocation_id IN (SELECT id FROM invocations)
                    GROUP BY invocation_id)
                 AND kind NOT IN ('RESULT_COMMITTED', 'RESULT_DELIVERED', 'DELIVERY_FAILED',
                                  'RESULT_EXPIRED',
                                  'FAILED', 'RECONCILED', 'RETRY_MANIFEST', 'JOB_TRACKED',
                                  'JOB_STATUS', 'MEMBER_RECONCILED')
                 ORDER BY seq",
            )?;
            stmt.query_map([], |r| r.get(0))?
                .collect::<Result<_, _>>()?
        };
        let mut out = Vec::new();
        for id in ids {
            let p = self.projection(&id)?;
            if !p.terminal {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// The request an invocation was accepted with.
    pub fn load_request(
        &self,
        invocation_id: &str,
    ) -> Result<Option<(serde_json::Value, Vec<u8>)>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        let row: Option<(String, Vec<u8>)> = conn
            .query_row(
                "SELECT meta, body FROM requests WHERE invocation_id = ?1",
                [invocation_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        row.map(|(meta, body)| {
            serde_json::from_str(&meta)
                .map(|m| (m, body))
                .map_err(|e| JournalError::Storage(format!("stored request: {e}")))
        })
        .transpose()
    }

    /// The key `fetch_result` cursors are authenticated with.
    pub fn cursor_key(&self) -> &[u8; 32] {
        &self.inner.cursor_key
    }

    /// A stored result's streams and digest without its bytes (see
    /// [`results::layout`]).
    pub fn result_layout(&self, result_id: &str) -> Result<ResultLayout, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        results::layout(&conn, result_id)
    }

    /// `len` bytes of one stream of a stored result, from `offset`.
    pub fn read_result_range(
        &self,
        result_id: &str,
        stream: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        results::read_range(&conn, result_id, stream, offset, len)
    }

    /// Reads a stored result back, checking its completeness marker and digest.
    pub fn read_result(&self, result_id: &str) -> Result<StoredResult, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        results::read(&conn, result_id)
    }

    /// The newest `limit` incidents of calls through peer brokers (PEER_INCIDENT),
    /// newest first.
    pub fn peer_incidents(&self, limit: usize) -> Result<Vec<Event>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        let mut stmt = conn.prepare_cached(
            "SELECT seq, invocation_id, recorded_at_ms, body FROM events
             WHERE kind = 'PEER_INCIDENT' ORDER BY seq DESC LIMIT ?1",
        )?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = stmt.query_map([limit], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, invocation_id, recorded_at_ms, body) = row?;
            let seq = u64::try_from(seq).unwrap_or(0);
            let body: EventBody =
                serde_json::from_str(&body).map_err(|e| JournalError::BadEvent {
                    seq,
                    detail: e.to_string(),
                })?;
            out.push(Event {
                seq,
                invocation_id,
                recorded_at_ms,
                body,
            });
        }
        Ok(out)
    }
}

impl Journal {
    /// Whether the disk is full and new invocations are refused (see [`super::space`]).
    pub fn low_space(&self) -> bool {
        self.inner.low_space.load(Ordering::Relaxed)
    }
}
