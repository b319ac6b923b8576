//! The registry of agent sessions: who is connected, since when, and when the agent
//! process ended. The console lists it; the daemon updates it per connection.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::caller::AgentIdentity;

/// One agent session as the broker knows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SessionRecord {
    pub identity: AgentIdentity,
    pub first_seen_ms: i64,
    /// Open bridge connections from this agent.
    pub connections: u32,
    /// Set once the agent process (same pid and start time) is gone.
    pub ended_at_ms: Option<i64>,
}

/// Agent sessions, keyed by agent pid and start time. A session ends when that process
/// exits; a recycled pid has a different start time and so a different session. One
/// registry per broker, held beside it by whoever serves the socket (the daemon, the
/// desktop console).
#[derive(Default)]
pub struct Sessions(Mutex<HashMap<String, SessionRecord>>);

impl Sessions {
    pub fn connected(&self, identity: &AgentIdentity, now_ms: i64) {
        if let Ok(mut map) = self.0.lock() {
            let record = map
                .entry(identity.session.clone())
                .or_insert_with(|| SessionRecord {
                    identity: identity.clone(),
                    first_seen_ms: now_ms,
                    connections: 0,
                    ended_at_ms: None,
                });
            record.connections += 1;
            record.ended_at_ms = None;
        }
    }

    /// A bridge went away; the session ends if its agent process is gone too.
    pub fn disconnected(&self, identity: &AgentIdentity, now_ms: i64) {
        if let Ok(mut map) = self.0.lock()
            && let Some(record) = map.get_mut(&identity.session)
        {
            record.connections = record.connections.saturating_sub(1);
            if !crate::caller::session_alive(identity) {
                record.ended_at_ms = Some(now_ms);
            }
        }
    }

    /// Marks sessions whose agent process exited as ended.
    pub fn sweep(&self, now_ms: i64) {
        if let Ok(mut map) = self.0.lock() {
            for record in map.values_mut() {
                if record.ended_at_ms.is_none() && !crate::caller::session_alive(&record.identity) {
                    record.ended_at_ms = Some(now_ms);
                }
            }
        }
    }

    pub fn list(&self) -> Vec<SessionRecord> {
        self.0
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }
}
