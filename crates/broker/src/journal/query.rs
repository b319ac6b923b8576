//! Read-only queries over the journal for operators: the activity log and counts.
//!
//! Plain functions over a [`Connection`], so the CLI can run them on a read-only
//! connection while a broker is writing (WAL lets both proceed). The identity columns
//! (`invocations`) are filtered in SQL; the status (phase, outcome, retry, code) is a
//! projection of each invocation's events, folded here exactly as the broker folds it,
//! so the log never shows a status the broker itself would not report.

use std::collections::BTreeMap;

use rusqlite::Connection;
use serde::Serialize;

use super::projection::Projection;
use super::rows::load_events;
use super::store::JournalError;
use crate::contract::{Code, Outcome, Phase, Retry};

/// One invocation as the activity log shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InvocationRow {
    pub id: String,
    /// The journal sequence of ACTION_ACCEPTED: the keyset for the next page.
    pub accepted_seq: i64,
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
    /// Only invocations accepted before this time (unix ms).
    pub until_ms: Option<i64>,
    /// Only invocations whose target or summary (method and URL, or host and command)
    /// contains this text, ASCII case-insensitively.
    pub text: Option<String>,
    /// At most this many rows, after every other filter.
    pub limit: Option<usize>,
    /// Keyset paging: only invocations accepted before this journal sequence (the
    /// `accepted_seq` of the last row of the previous page).
    pub before_seq: Option<i64>,
}

impl Filter {
    fn matches(&self, row: &InvocationRow) -> bool {
        let text = self.text.as_deref().map(str::to_ascii_lowercase);
        text.is_none_or(|t| {
            row.target.to_ascii_lowercase().contains(&t)
                || row.summary.to_ascii_lowercase().contains(&t)
        }) && self.phase.is_none_or(|p| p == row.phase)
            && self.outcome.is_none_or(|o| o == row.outcome)
            && self.code.is_none_or(|c| Some(c) == row.code)
    }
}

/// Counts over every invocation in the journal. Phase and outcome are counted
/// separately: a phase
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
    accepted_seq: i64,
    accepted_at_ms: i64,
    session: Option<String>,
    target: String,
}

impl Identity {
    /// The columns [`Identity::from_row`] reads, in order.
    const COLUMNS: &'static str = "id, accepted_seq, accepted_at_ms, session_id, target";

    fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Identity> {
        Ok(Identity {
            id: r.get(0)?,
            accepted_seq: r.get(1)?,
            accepted_at_ms: r.get(2)?,
            session: r.get(3)?,
            target: r.get(4)?,
        })
    }
}

/// The SQL-side filters. Status filters use the writer-maintained status columns and
/// let rows with no status yet (written before they existed) through to the fold.
#[derive(Default)]
struct SqlFilter<'a> {
    session: Option<&'a str>,
    target: Option<&'a str>,
    since_ms: Option<i64>,
    until_ms: Option<i64>,
    /// Text searched in target and summary.
    text: Option<&'a str>,
    phase: Option<&'static str>,
    outcome: Option<&'static str>,
    code: Option<&'static str>,
    before_seq: Option<i64>,
}

fn row(conn: &Connection, identity: Identity, now_ms: i64) -> Result<InvocationRow, JournalError> {
    row_and_projection(conn, identity, now_ms).map(|(row, _)| row)
}

/// The row of one invocation with the projection it was folded from.
fn row_and_projection(
    conn: &Connection,
    identity: Identity,
    now_ms: i64,
) -> Result<(InvocationRow, Projection), JournalError> {
    let events = load_events(conn, &identity.id)?;
    let p = Projection::fold(&identity.id, &events)?;
    let row = InvocationRow {
        summary: p.summary.clone().unwrap_or_default(),
        phase: p.phase,
        outcome: p.outcome,
        retry: p.retry(now_ms),
        code: p.effective_code(),
        id: identity.id,
        accepted_seq: identity.accepted_seq,
        accepted_at_ms: identity.accepted_at_ms,
        session: identity.session,
        target: identity.target,
    };
    Ok((row, p))
}

/// Calls `each` for the invocations matching the SQL-side filters, newest first, until
/// it returns `false`. Indexed: a page costs its rows, not the journal's size.
fn scan(
    conn: &Connection,
    f: &SqlFilter<'_>,
    mut each: impl FnMut(Identity) -> Result<bool, JournalError>,
) -> Result<(), JournalError> {
    // Only the filters in use go into the query, as plain equalities, so SQLite walks
    // the matching (column, accepted_seq) index backwards and stops after a page.
    let legacy: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM invocations WHERE phase IS NULL)",
        [],
        |r| r.get(0),
    )?;
    let mut clauses: Vec<&str> = Vec::new();
    let mut values: Vec<rusqlite::types::Value> = Vec::new();
    let mut add = |clause: &'static str, value: Option<rusqlite::types::Value>| {
        if let Some(v) = value {
            clauses.push(clause);
            values.push(v);
        }
    };
    use rusqlite::types::Value as V;
    add("session_id = ?", f.session.map(|s| V::Text(s.to_string())));
    add("target = ?", f.target.map(|s| V::Text(s.to_string())));
    add("accepted_at_ms >= ?", f.since_ms.map(V::Integer));
    add("accepted_at_ms < ?", f.until_ms.map(V::Integer));
    add("accepted_seq < ?", f.before_seq.map(V::Integer));
    // Rows written before the status columns existed have none; if any exist, they
    // pass the status filters here and are decided by folding.
    let (phase, outcome, code) = if legacy {
        (
            "(phase = ? OR phase IS NULL)",
            "(outcome = ? OR outcome IS NULL)",
            "(code = ? OR phase IS NULL)",
        )
    } else {
        ("phase = ?", "outcome = ?", "code = ?")
    };
    add(phase, f.phase.map(|s| V::Text(s.to_string())));
    add(outcome, f.outcome.map(|s| V::Text(s.to_string())));
    add(code, f.code.map(|s| V::Text(s.to_string())));
    // A search of three characters or more walks the trigram index newest first; a
    // shorter one (too short for trigrams) scans with LIKE.
    let indexed_search = f.text.as_ref().filter(|t| t.chars().count() >= 3);
    let mut search_values = Vec::new();
    if let Some(text) = indexed_search {
        search_values.push(V::Text(format!("\"{}\"", text.replace('"', "\"\""))));
    } else if let Some(text) = &f.text {
        clauses.push("(target LIKE ? ESCAPE '\\' OR summary LIKE ? ESCAPE '\\')");
        values.push(V::Text(like_pattern(text)));
        values.push(V::Text(like_pattern(text)));
    }
    // Without ANALYZE statistics SQLite may walk the accepted_seq index and filter;
    // name the (column, accepted_seq) index of the most selective filter instead.
    let index = if f.session.is_some() {
        "invocations_by_session"
    } else if f.target.is_some() {
        "invocations_by_target"
    } else if f.code.is_some() && !legacy {
        "invocations_by_code"
    } else if f.outcome.is_some() && !legacy {
        "invocations_by_outcome"
    } else if f.phase.is_some() && !legacy {
        "invocations_by_phase"
    } else {
        "invocations_by_seq"
    };
    let plain = format!(
        "SELECT {} FROM invocations INDEXED BY {index}",
        Identity::COLUMNS
    );
    let Some(search) = search_values.pop() else {
        query(conn, &plain, &clauses, values, "accepted_seq", &mut each)?;
        return Ok(());
    };
    // The writer feeds the search index in batches (see `journal::SEARCH_BATCH`): the
    // invocations after the last one indexed, the newest, are matched with LIKE on the
    // same text, then the index takes over below them.
    let indexed: i64 = conn.query_row(
        "SELECT coalesce(max(id), 0) FROM invocation_search_docsize",
        [],
        |r| r.get(0),
    )?;
    let text = f.text.unwrap_or_default();
    let mut tail = clauses.clone();
    tail.push("accepted_seq > ?");
    tail.push("(target || ' ' || coalesce(summary, '')) LIKE ? ESCAPE '\\'");
    let mut tail_values = values.clone();
    tail_values.push(V::Integer(indexed));
    tail_values.push(V::Text(like_pattern(text)));
    if !query(conn, &plain, &tail, tail_values, "accepted_seq", &mut each)? {
        return Ok(());
    }
    // The search drives: matches newest first, each joined to its row by seq.
    clauses.insert(0, "invocation_search MATCH ?");
    clauses.push("invocation_search.rowid <= ?");
    values.insert(0, search);
    values.push(V::Integer(indexed));
    let sql = format!(
        "SELECT {} FROM invocation_search \
         JOIN invocations INDEXED BY invocations_by_seq \
         ON invocations.accepted_seq = invocation_search.rowid",
        Identity::COLUMNS
    );
    query(
        conn,
        &sql,
        &clauses,
        values,
        "invocation_search.rowid",
        &mut each,
    )?;
    Ok(())
}

/// Runs `base` with `clauses` joined by AND, newest `order` first, calling `each` per row
/// until it returns `false`. Returns whether `each` wants more.
fn query(
    conn: &Connection,
    base: &str,
    clauses: &[&str],
    values: Vec<rusqlite::types::Value>,
    order: &str,
    each: &mut impl FnMut(Identity) -> Result<bool, JournalError>,
) -> Result<bool, JournalError> {
    let mut sql = base.to_string();
    if !clauses.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&clauses.join(" AND "));
    }
    sql.push_str(" ORDER BY ");
    sql.push_str(order);
    sql.push_str(" DESC");
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(rusqlite::params_from_iter(values))?;
    while let Some(r) = rows.next()? {
        if !each(Identity::from_row(r)?)? {
            return Ok(false);
        }
    }
    Ok(true)
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
        until_ms: filter.until_ms,
        text: filter.text.as_deref(),
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

/// One invocation as [`list`] shows it, or `None` when the journal has no such id.
///
/// # Errors
///
/// As [`list`].
pub fn row_by_id(
    conn: &Connection,
    invocation_id: &str,
    now_ms: i64,
) -> Result<Option<InvocationRow>, JournalError> {
    use rusqlite::OptionalExtension;
    let identity = conn
        .prepare_cached(&format!(
            "SELECT {} FROM invocations WHERE id = ?1",
            Identity::COLUMNS
        ))?
        .query_row([invocation_id], Identity::from_row)
        .optional()?;
    identity.map(|i| row(conn, i, now_ms)).transpose()
}

/// The unknown outcomes that nothing has settled ([`Projection::is_unsettled`]):
/// of the newest `limit` invocations whose outcome is unknown, those whose attempt is
/// closed and that no reconciliation settled, newest first.
///
/// # Errors
///
/// As [`list`].
pub fn unsettled(
    conn: &Connection,
    limit: usize,
    now_ms: i64,
) -> Result<Vec<InvocationRow>, JournalError> {
    let mut out = Vec::new();
    if limit == 0 {
        return Ok(out);
    }
    let sql = SqlFilter {
        outcome: Some(Outcome::Unknown.as_str()),
        ..SqlFilter::default()
    };
    let mut unknown = 0usize;
    scan(conn, &sql, |identity| {
        let (row, p) = row_and_projection(conn, identity, now_ms)?;
        if row.outcome == Outcome::Unknown {
            unknown += 1;
            if p.is_unsettled() {
                out.push(row);
            }
        }
        Ok(unknown < limit)
    })?;
    Ok(out)
}

/// The newest journal sequence, 0 for an empty journal.
///
/// # Errors
///
/// [`JournalError::Storage`] if the database cannot be read.
pub fn last_seq(conn: &Connection) -> Result<u64, JournalError> {
    let seq: Option<i64> = conn.query_row("SELECT max(seq) FROM events", [], |r| r.get(0))?;
    Ok(u64::try_from(seq.unwrap_or(0)).unwrap_or(0))
}

/// `%text%` for LIKE, with the wildcards of `text` itself escaped.
fn like_pattern(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('%');
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// One agent session as the journal knows it (sessions of earlier broker runs too).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionRow {
    pub session: String,
    pub invocations: u64,
    pub first_at_ms: i64,
    pub last_at_ms: i64,
}

/// Agent sessions with at least one invocation, the most recently active first.
///
/// # Errors
///
/// [`JournalError::Storage`] if the database cannot be read.
pub fn sessions(conn: &Connection, limit: usize) -> Result<Vec<SessionRow>, JournalError> {
    let mut stmt = conn.prepare_cached(
        "SELECT session_id, count(*), min(accepted_at_ms), max(accepted_at_ms), max(accepted_seq)
         FROM invocations INDEXED BY invocations_by_session
         WHERE session_id IS NOT NULL
         GROUP BY session_id ORDER BY 5 DESC LIMIT ?1",
    )?;
    let rows = stmt
        .query_map([i64::try_from(limit).unwrap_or(i64::MAX)], |r| {
            Ok(SessionRow {
                session: r.get(0)?,
                invocations: u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
                first_at_ms: r.get(2)?,
                last_at_ms: r.get(3)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
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
    let mut unindexed = conn.prepare_cached(&format!(
        "SELECT {} FROM invocations WHERE phase IS NULL",
        Identity::COLUMNS
    ))?;
    let legacy: Vec<Identity> = unindexed
        .query_map([], Identity::from_row)?
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
