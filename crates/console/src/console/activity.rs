//! The activity log: filtered pages of invocations (keyset paging, newest first) and
//! their export to JSON lines or CSV.

use std::path::Path;
use std::time::Instant;

use postern_broker::contract::Outcome;
use postern_broker::display::escape_text;
use postern_broker::journal::query::{self, Filter, InvocationRow};

use super::Console;
use crate::dto::{
    ActivityFilter, ActivityPage, ActivityRow, CommandError, ErrorCode, ExportFormat, ExportResult,
};

/// The most rows one activity page returns.
pub const MAX_PAGE: usize = 500;

impl Console {
    pub fn activity(
        &self,
        filter: &ActivityFilter,
        before_seq: Option<i64>,
        limit: usize,
    ) -> Result<ActivityPage, CommandError> {
        let started = Instant::now();
        let limit = limit.clamp(1, MAX_PAGE);
        let mut filter = to_filter(filter)?;
        filter.before_seq = before_seq;
        filter.limit = Some(limit);
        let rows = self.read(|conn| query::list(conn, &filter, self.now()))?;
        let next_before_seq = if rows.len() == limit {
            rows.last().map(|r| r.accepted_seq)
        } else {
            None
        };
        Ok(ActivityPage {
            rows: rows.into_iter().map(activity_row).collect(),
            next_before_seq,
            took_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        })
    }

    /// Writes every invocation matching `filter` to a new file in `dir`, page by page.
    pub fn export(
        &self,
        filter: &ActivityFilter,
        format: ExportFormat,
        dir: &Path,
    ) -> Result<ExportResult, CommandError> {
        use std::io::Write;
        let io = |e: std::io::Error| {
            CommandError::new(ErrorCode::ExportFailed, format!("{}: {e}", dir.display()))
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let extension = match format {
            ExportFormat::Jsonl => "jsonl",
            ExportFormat::Csv => "csv",
        };
        let path = dir.join(format!("postern-activity-{}.{extension}", self.now()));
        let tmp = path.with_extension(format!("{extension}.partial"));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io)?;
        let mut out = std::io::BufWriter::new(file);
        let result = (|| {
            if format == ExportFormat::Csv {
                writeln!(
                    out,
                    "id,accepted_seq,accepted_at_ms,session,target,summary,phase,outcome,retry,code"
                )
                .map_err(io)?;
            }
            let mut before = None;
            let mut rows = 0u64;
            loop {
                let page = self.activity(filter, before, MAX_PAGE)?;
                for row in &page.rows {
                    match format {
                        ExportFormat::Jsonl => {
                            let line = serde_json::to_string(row).map_err(|e| {
                                CommandError::new(ErrorCode::ExportFailed, e.to_string())
                            })?;
                            writeln!(out, "{line}").map_err(io)?;
                        }
                        ExportFormat::Csv => writeln!(out, "{}", csv_line(row)).map_err(io)?,
                    }
                    rows += 1;
                }
                match page.next_before_seq {
                    Some(next) => before = Some(next),
                    None => break,
                }
            }
            out.flush().map_err(io)?;
            out.get_ref().sync_all().map_err(io)?;
            Ok(rows)
        })();
        match result {
            Ok(rows) => {
                std::fs::rename(&tmp, &path).map_err(io)?;
                Ok(ExportResult {
                    path: path.display().to_string(),
                    rows,
                })
            }
            Err(e) => {
                // A failed export leaves no half-written file behind.
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }
}

fn to_filter(f: &ActivityFilter) -> Result<Filter, CommandError> {
    fn parse<T: Copy>(
        field: &str,
        value: &Option<String>,
        all: &[T],
        name: impl Fn(T) -> &'static str,
    ) -> Result<Option<T>, CommandError> {
        match value.as_deref().filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => all
                .iter()
                .copied()
                .find(|x| name(*x) == v)
                .map(Some)
                .ok_or_else(|| {
                    CommandError::field(
                        ErrorCode::InvalidInput,
                        field,
                        format!("Unknown {field} `{v}`."),
                    )
                }),
        }
    }
    use postern_broker::contract::{Code, Phase};
    let nonempty = |s: &Option<String>| {
        s.as_ref()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    Ok(Filter {
        session: nonempty(&f.session),
        target: nonempty(&f.target),
        phase: parse("phase", &f.phase, Phase::ALL, Phase::as_str)?,
        outcome: parse("outcome", &f.outcome, Outcome::ALL, Outcome::as_str)?,
        code: parse("code", &f.code, Code::ALL, Code::as_str)?,
        since_ms: f.since_ms,
        until_ms: f.until_ms,
        text: nonempty(&f.text),
        ..Filter::default()
    })
}

pub(super) fn activity_row(r: InvocationRow) -> ActivityRow {
    ActivityRow {
        id: r.id,
        accepted_seq: r.accepted_seq,
        accepted_at_ms: r.accepted_at_ms,
        session: r.session,
        target: r.target,
        summary: escape_text(&r.summary),
        phase: r.phase.as_str().to_string(),
        outcome: r.outcome.as_str().to_string(),
        retry: r.retry.as_str().to_string(),
        code: r.code.map(|c| c.as_str().to_string()),
    }
}

fn csv_field(s: &str) -> String {
    // Quote every field that needs it, and defuse spreadsheet formulas.
    let s = if s.starts_with(['=', '+', '-', '@']) {
        format!("'{s}")
    } else {
        s.to_string()
    };
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

fn csv_line(r: &ActivityRow) -> String {
    [
        csv_field(&r.id),
        r.accepted_seq.to_string(),
        r.accepted_at_ms.to_string(),
        csv_field(r.session.as_deref().unwrap_or("")),
        csv_field(&r.target),
        csv_field(&r.summary),
        r.phase.clone(),
        r.outcome.clone(),
        r.retry.clone(),
        r.code.clone().unwrap_or_default(),
    ]
    .join(",")
}
