//! Incidents of calls through peer brokers (seed 002), each with the invocation's
//! envelope and the last attestation received.

use postern_broker::display::escape_text;
use postern_broker::evidence;
use postern_broker::journal::projection::Projection;

use super::{Console, journal_error};
use crate::dto::{CommandError, PeerIncidentRow};

/// How many peer incidents the console lists.
pub const INCIDENT_LIST: usize = 200;

impl Console {
    /// The newest [`INCIDENT_LIST`] incidents of calls through peer brokers, newest
    /// first, each with the invocation's envelope and the last attestation received.
    pub fn peer_incidents(&self) -> Result<Vec<PeerIncidentRow>, CommandError> {
        use postern_broker::journal::events::EventBody;
        let recorded = self
            .engine
            .journal()
            .peer_incidents(INCIDENT_LIST)
            .map_err(|e| journal_error(&e))?;
        let now = self.now();
        let mut rows = Vec::with_capacity(recorded.len());
        for event in recorded {
            let EventBody::PeerIncident(incident) = event.body else {
                continue;
            };
            let events = self
                .engine
                .journal()
                .events(&event.invocation_id)
                .map_err(|e| journal_error(&e))?;
            let p = Projection::fold(&event.invocation_id, &events)
                .map_err(|e| journal_error(&e.into()))?;
            // The answer the incident names, else the last one before it.
            let attestation = events
                .iter()
                .rev()
                .filter(|e| e.seq < event.seq)
                .find_map(|e| match &e.body {
                    EventBody::PeerAnswer(a) => Some(a.attestation.clone()),
                    _ => None,
                })
                .flatten()
                .and_then(|a| serde_json::to_value(a).ok());
            rows.push(PeerIncidentRow {
                invocation_id: event.invocation_id.clone(),
                seq: event.seq,
                at_ms: event.recorded_at_ms,
                kind: incident.incident.as_str().to_string(),
                owner: incident.owner.as_str().to_string(),
                peer: escape_text(&incident.peer),
                capability: escape_text(&incident.capability),
                code: incident.code,
                signature: incident.signature.as_str().to_string(),
                attestation_digest: incident.attestation_digest.clone(),
                attestation,
                answers: incident.answers,
                transient_used: incident.transient_used,
                unknown_used: incident.unknown_used,
                // Seed 000's envelope (error and evidence), or the status when the
                // record carries no code any more (a reconciliation settled it).
                envelope: p
                    .envelope(now)
                    .and_then(|e| serde_json::to_value(e).ok())
                    .unwrap_or_else(|| evidence::invocation_status(&p, now)),
            });
        }
        Ok(rows)
    }
}
