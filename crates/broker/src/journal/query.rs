//! Read-only queries over the journal for operators: the activity log and counts.
//!
//! Plain functions over a [`Connection`], so the CLI can run them on a read-only
//! connection while a broker is writing (WAL lets both proceed). The identity columns
//! (`invocations`) are filtered in SQL; the status (phase, outcome, retry, code) is a
//! projection of each invocation's events, folded here exactly as the broker folds it,
//! so the log never shows a status the broker itself would not report.

use std::collections::BTreeMap;

use rusqlite::{Connection, params};
use serde::Serialize;

use super::projection::Projection;
use super::{JournalError, load_events};
use crate::contract::{Code, Outcome, Phase, Retry};

/// One invocation as the activity log shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InvocationRow {
    pub id: String,
    pub accepted_at_ms: i64,
    pub session: Option<String>,
    pub target: String,
    /// The secret-free description recorded at ACTION_ACCEPTED.
    pub summary: String,
    pub phase: Phase,
    pub outcome: Outcome,
    /// The retry disposition now (derived from evidence for an unknown outcome).
    pub retry: Retry,
    /// The code describing the current state, if any (none for a success or an
    /// invocation still in flight before dispatch).
    pub code: Option<Code>,
}

/// Which invocations [`list`] returns. Every field left `None` matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub session: Option<String>,
    pub target: Option<String>,
    pub phase: Option<Phase>,
    pub outcome: Option<Outcome>,
    pub code: Option<Code>,
    /// Only invocations accepted at or after this time (unix ms).
    pub since_ms: Option<i64>,
    /// At most this many rows, after every other filter.
    pub limit: Option<usize>,
    /// Keyset paging: only invocations accepted before this journal sequence (the
    /// `accepted_seq` of the last row of the previous page).
    pub before_seq: Option<i64>,
}

impl Filter {
    fn matches(&self, row: &InvocationRow) -> bool {
        self.phase.is_none_or(|p| p == row.phase)
            && self.outcome.is_none_or(|o| o == row.outcome)
            && self.code.is_none_or(|c| Some(c) == row.code)
    }
}

/// Counts over every invocation in the journal. Phase and outcome are counted
/// separately (seed 000: "Metrics should count phase and outcome separately"): a phase
/// says where the broker stopped, an outcome what is known about the remote side, and
/// neither can be derived from the other.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Every phase, including those with a count of zero.
    pub by_phase: BTreeMap<String, u64>,
    /// Every outcome, including those with a count of zero.
    pub by_outcome: BTreeMap<String, u64>,
    /// Only the codes that occur; invocations without a code are not counted here.
    pub by_code: BTreeMap<String, u64>,
    pub invocations: u64,
}

/// The identity columns of one `invocations` row.
struct Identity {
    id: String,
    accepted_at_ms: i64,
    session: Option<String>,
    target: String,
}

/// The SQL-side filters. Status filters use the writer-maintained status columns and
/// let rows with no status yet (written before they existed) through to the fold.
#[derive(Default)]
struct SqlFilter<'a> {
    session: Option<&'a str>,
    target: Option<&'a str>,
    since_ms: Option<i64>,
    phase: Option<&'static str>,
    outcome: Option<&'static str>,
    code: Option<&'static str>,
    before_seq: Option<i64>,
}

fn row(conn: &Connection, identity: Identity, now_ms: i64) -> Result<InvocationRow, JournalError> {
    let events = load_events(conn, &identity.id)?;
    let p = Projection::fold(&identity.id, &events)?;
    Ok(InvocationRow {
        summary: p.summary.clone().unwrap_or_default(),
        phase: p.phase,
        outcome: p.outcome,
        retry: p.retry(now_ms),
        code: p.effective_code(),
        id: identity.id,
        accepted_at_ms: identity.accepted_at_ms,
        session: identity.session,
        target: identity.target,
    })
}

/// Calls `each` for the invocations matching the SQL-side filters, newest first, until
/// it returns `false`. Indexed: a page costs its rows, not the journal's size.
fn scan(
    conn: &Connection,
    f: &SqlFilter<'_>,
    mut each: impl FnMut(Identity) -> Result<bool, JournalError>,
) -> Result<(), JournalError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, accepted_at_ms, session_id, target FROM invocations
         WHERE (?1 IS NULL OR session_id = ?1)
           AND (?2 IS NULL OR target = ?2)
           AND (?3 IS NULL OR accepted_at_ms >= ?3)
           AND (?4 IS NULL OR phase = ?4 OR phase IS NULL)
           AND (?5 IS NULL OR outcome = ?5 OR outcome IS NULL)
           AND (?6 IS NULL OR code = ?6 OR phase IS NULL)
           AND (?7 IS NULL OR accepted_seq < ?7)
         ORDER BY accepted_seq DESC",
    )?;
    let mut rows = stmt.query(params![
        f.session,
        f.target,
        f.since_ms,
        f.phase,
        f.outcome,
        f.code,
        f.before_seq
    ])?;
    while let Some(r) = rows.next()? {
        let identity = Identity {
            id: r.get(0)?,
            accepted_at_ms: r.get(1)?,
            session: r.get(2)?,
            target: r.get(3)?,
        };
        if !each(identity)? {
            break;
        }
    }
    Ok(())
}

/// The invocations matching `filter`, newest (latest accepted) first. `now_ms` is the
/// time retry dispositions are computed at (an idempotency key's retention may have
/// lapsed).
///
/// # Errors
///
/// [`JournalError::Storage`] if the database cannot be read, [`JournalError::BadEvent`]
/// or [`JournalError::Impossible`] if an invocation's events do not fold (a corrupt or
/// tampered record is reported, never shown as a plausible status).
pub fn list(
    conn: &Connection,
    filter: &Filter,
    now_ms: i64,
) -> Result<Vec<InvocationRow>, JournalError> {
    let mut out = Vec::new();
    if filter.limit == Some(0) {
        return Ok(out);
    }
    let sql = SqlFilter {
        session: filter.session.as_deref(),
        target: filter.target.as_deref(),
        since_ms: filter.since_ms,
        phase: filter.phase.map(Phase::as_str),
        outcome: filter.outcome.map(Outcome::as_str),
        code: filter.code.map(Code::as_str),
        before_seq: filter.before_seq,
    };
    scan(conn, &sql, |identity| {
        let row = row(conn, identity, now_ms)?;
        if filter.matches(&row) {
            out.push(row);
        }
        Ok(filter.limit.is_none_or(|limit| out.len() < limit))
    })?;
    Ok(out)
}

/// Counts every invocation by phase, by outcome and by code.
///
/// # Errors
///
/// As [`list`].
pub fn stats(conn: &Connection, now_ms: i64) -> Result<Stats, JournalError> {
    let mut stats = Stats {
        by_phase: Phase::ALL
            .iter()
            .map(|p| (p.as_str().to_string(), 0))
            .collect(),
        by_outcome: Outcome::ALL
            .iter()
            .map(|o| (o.as_str().to_string(), 0))
            .collect(),
        ..Stats::default()
    };
    // Rows with a status are counted by index; older rows without one are folded.
    let mut grouped = conn.prepare_cached(
        "SELECT phase, outcome, code, count(*) FROM invocations
         WHERE phase IS NOT NULL GROUP BY phase, outcome, code",
    )?;
    let mut rows = grouped.query([])?;
    while let Some(r) = rows.next()? {
        let (phase, outcome, code, n): (String, String, Option<String>, i64) =
            (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?);
        let n = u64::try_from(n).unwrap_or(0);
        stats.invocations += n;
        *stats.by_phase.entry(phase).or_default() += n;
        *stats.by_outcome.entry(outcome).or_default() += n;
        if let Some(code) = code {
            *stats.by_code.entry(code).or_default() += n;
        }
    }
    let mut unindexed = conn.prepare_cached(
        "SELECT id, accepted_at_ms, session_id, target FROM invocations WHERE phase IS NULL",
    )?;
    let legacy: Vec<Identity> = unindexed
        .query_map([], |r| {
            Ok(Identity {
                id: r.get(0)?,
                accepted_at_ms: r.get(1)?,
                session: r.get(2)?,
                target: r.get(3)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    for identity in legacy {
        let row = row(conn, identity, now_ms)?;
        stats.invocations += 1;
        *stats
            .by_phase
            .entry(row.phase.as_str().to_string())
            .or_default() += 1;
        *stats
            .by_outcome
            .entry(row.outcome.as_str().to_string())
            .or_default() += 1;
        if let Some(code) = row.code {
            *stats.by_code.entry(code.as_str().to_string()).or_default() += 1;
        }
    }
    Ok(stats)
}
