//! Reading an invocation's event rows back, in sequence order: shared by the writer's
//! fold (inside its transaction) and the read side (on the reader connection).
//!
//! Must never: write, or return an event whose stored body does not parse.

use rusqlite::Connection;

use super::events::{Event, EventBody};
use super::store::JournalError;

pub(crate) fn load_events(
    conn: &Connection,
    invocation_id: &str,
) -> Result<Vec<Event>, JournalError> {
    let mut stmt = conn.prepare_cached(
        "SELECT seq, body, recorded_at_ms FROM events WHERE invocation_id = ?1 ORDER BY seq",
    )?;
    let rows = stmt.query_map([invocation_id], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (seq, body, recorded_at_ms) = row?;
        let seq = u64::try_from(seq).unwrap_or(0);
        let body: EventBody = serde_json::from_str(&body).map_err(|e| JournalError::BadEvent {
            seq,
            detail: e.to_string(),
        })?;
        out.push(Event {
            seq,
            invocation_id: invocation_id.to_string(),
            recorded_at_ms,
            body,
        });
    }
    Ok(out)
}
