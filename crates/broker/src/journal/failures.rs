//! What could not be recorded or stored, for the operator's alert: invocations refused
//! before their acceptance reached the journal (kept in memory, nothing else could be
//! written), and complete responses whose result could not be stored.
//!
//! Must never: hold secret bytes; forget a recorded RESULT_STORE_FAILED.

use super::events::EventBody;
use super::store::{JournalError, StoreFailure, Unrecorded};
use super::writer::Journal;
use crate::contract::Code;

/// How many unrecorded invocations are remembered.
const MAX_UNRECORDED: usize = 4096;

impl Journal {
    /// Remembers an invocation refused before anything of it was recorded.
    pub fn note_unrecorded(&self, unrecorded: Unrecorded) {
        if let Ok(mut list) = self.inner.unrecorded.lock() {
            if list.len() >= MAX_UNRECORDED {
                list.pop_front();
            }
            list.push_back(unrecorded);
        }
    }

    /// What was answered for an invocation that was never recorded, if this process
    /// refused it.
    pub fn unrecorded(&self, invocation_id: &str) -> Option<Unrecorded> {
        let list = self.inner.unrecorded.lock().ok()?;
        list.iter()
            .rev()
            .find(|u| u.invocation_id == invocation_id)
            .cloned()
    }

    /// Remembers a complete response whose result could not be stored, for the
    /// operator's alert.
    pub fn note_store_failure(&self, invocation_id: &str, recorded: bool, error: &JournalError) {
        if let Ok(mut list) = self.inner.store_failures.lock() {
            if list.len() >= MAX_UNRECORDED {
                list.remove(0);
            }
            list.push(StoreFailure {
                invocation_id: invocation_id.to_string(),
                at_ms: self.now_ms(),
                recorded,
                detail: error.to_string(),
            });
        }
    }

    /// Every complete response whose result could not be stored: those the journal
    /// recorded (RESULT_STORE_FAILED), oldest first, then those only this process saw.
    pub fn store_failures(&self) -> Result<Vec<StoreFailure>, JournalError> {
        let mut out: Vec<StoreFailure> = {
            let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
            let mut stmt = conn.prepare_cached(
                "SELECT e.invocation_id, e.recorded_at_ms, e.body FROM events e
                 JOIN invocations i ON i.id = e.invocation_id
                 WHERE i.code = 'RESULT_STORE_FAILED' AND e.kind = 'FAILED'
                 ORDER BY e.seq",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (invocation_id, at_ms, body) = row?;
                if let Ok(EventBody::Failed {
                    code: Code::ResultStoreFailed,
                    message,
                    ..
                }) = serde_json::from_str::<EventBody>(&body)
                {
                    out.push(StoreFailure {
                        invocation_id,
                        at_ms,
                        recorded: true,
                        detail: message,
                    });
                }
            }
            out
        };
        if let Ok(list) = self.inner.store_failures.lock() {
            out.extend(list.iter().filter(|f| !f.recorded).cloned());
        }
        Ok(out)
    }
}
