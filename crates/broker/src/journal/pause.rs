//! The operator's pause of agent calls, as the journal records it (AGENT_PAUSE, a
//! journal-level record): [`crate::pause`] holds the live state; a restart opens in the
//! state last recorded here.
//!
//! Must never: record a pause under an invocation's id.

use rusqlite::OptionalExtension;

use super::events::{self, EventBody, JOURNAL_SCOPE};
use super::store::JournalError;
use super::writer::Journal;

impl Journal {
    /// Records that `operator` paused (or resumed) agent calls; returns once it is on
    /// disk.
    pub fn record_agent_pause(&self, paused: bool, operator: &str) -> Result<(), JournalError> {
        let body = EventBody::AgentPause {
            paused,
            operator: operator.to_string(),
        };
        self.write(true, move |ctx| ctx.append_record(JOURNAL_SCOPE, &body))
            .map(|_| ())
    }

    /// Whether the newest recorded pause holds agent calls paused (`false` if the
    /// operator never paused them).
    pub fn agent_pause(&self) -> Result<bool, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        let row: Option<(i64, String)> = conn
            .prepare_cached(
                "SELECT seq, body FROM events WHERE invocation_id = ?1 AND kind = ?2
                 ORDER BY seq DESC LIMIT 1",
            )?
            .query_row([JOURNAL_SCOPE, events::AGENT_PAUSE], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        let Some((seq, body)) = row else {
            return Ok(false);
        };
        match serde_json::from_str::<EventBody>(&body) {
            Ok(EventBody::AgentPause { paused, .. }) => Ok(paused),
            _ => Err(JournalError::BadEvent {
                seq: seq as u64,
                detail: format!(
                    "an {} record that does not read as one",
                    events::AGENT_PAUSE
                ),
            }),
        }
    }
}
