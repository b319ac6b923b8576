//! Agent sessions: the journal's, the recorded SESSION_OPENED ones and the live ones
//! merged into one list, and one session's timeline.

use postern_broker::display::escape_text;
use postern_broker::journal::query::{self, Filter};
use postern_broker::provenance;
use postern_mcp::caller::ProcessInfo;
use postern_mcp::server::SessionRecord;

use super::Console;
use crate::dto::{
    AgentCard, CommandError, InvocationDetail, ProcessCard, RecordedAgent, SessionSummary,
};

/// How many invocations of one session the timeline shows (the newest).
const TIMELINE_LIMIT: usize = 500;

impl Console {
    pub fn sessions(&self) -> Result<Vec<SessionSummary>, CommandError> {
        let live = self.sessions.list();
        let summary =
            |session: &str, invocations, first_at_ms, last_at_ms, recorded| SessionSummary {
                session: session.to_string(),
                invocations,
                first_at_ms,
                last_at_ms,
                agent: live
                    .iter()
                    .find(|l| l.identity.session == session)
                    .map(agent_card),
                recorded,
            };
        let rows = self.read(|conn| query::sessions(conn, 200))?;
        let mut out: Vec<SessionSummary> = rows
            .iter()
            .map(|r| {
                let recorded = self.recorded_agent(Some(&r.session));
                summary(
                    &r.session,
                    r.invocations,
                    r.first_at_ms,
                    r.last_at_ms,
                    recorded,
                )
            })
            .collect();
        // Sessions the journal recorded that never invoked anything (earlier runs too).
        let recorded = self.read(|conn| provenance::recorded_sessions(conn, 200))?;
        for r in &recorded {
            if !out.iter().any(|s| s.session == r.opened.session) {
                let agent = Some(RecordedAgent::from(r));
                out.push(summary(&r.opened.session, 0, r.at_ms, r.at_ms, agent));
            }
        }
        // Live sessions that have not invoked anything yet still show.
        for record in &live {
            let session = &record.identity.session;
            if !out.iter().any(|s| s.session == *session) {
                let agent = self.recorded_agent(Some(session));
                let seen = record.first_seen_ms;
                out.push(summary(session, 0, seen, seen, agent));
            }
        }
        out.sort_by_key(|s| std::cmp::Reverse(s.last_at_ms));
        Ok(out)
    }

    /// The agent of `session` as the journal recorded it (absent without a record, or
    /// when it cannot be read: the listing still shows the session).
    pub(super) fn recorded_agent(&self, session: Option<&str>) -> Option<RecordedAgent> {
        let session = session?;
        let recorded = self.read(|conn| provenance::recorded_session(conn, session));
        recorded.ok().flatten().as_ref().map(RecordedAgent::from)
    }

    /// Every invocation of one session (the newest [`TIMELINE_LIMIT`]), oldest first,
    /// each with its transitions.
    pub fn timeline(&self, session: &str) -> Result<Vec<InvocationDetail>, CommandError> {
        let rows = self.read(|conn| {
            query::list(
                conn,
                &Filter {
                    session: Some(session.to_string()),
                    limit: Some(TIMELINE_LIMIT),
                    ..Filter::default()
                },
                self.now(),
            )
        })?;
        rows.into_iter()
            .rev()
            .map(|row| self.detail_of(row))
            .collect()
    }
}

fn process_card(p: &ProcessInfo) -> ProcessCard {
    ProcessCard {
        pid: p.pid,
        executable: p.executable.as_deref().map(escape_text),
        claimed_command: escape_text(&p.command),
        cwd: p.cwd.as_deref().map(escape_text),
    }
}

pub(super) fn agent_card(r: &SessionRecord) -> AgentCard {
    AgentCard {
        session: r.identity.session.clone(),
        agent: process_card(&r.identity.agent),
        parent_chain: r.identity.parent_chain.iter().map(process_card).collect(),
        first_seen_ms: r.first_seen_ms,
        ended_at_ms: r.ended_at_ms,
        connections: r.connections,
        confinement: r.identity.confinement.describe(),
    }
}
