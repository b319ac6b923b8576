//! The settled-result store: a result is kept so that delivering it again never means
//! executing again.
//!
//! A result is stored in the same transaction as its RESULT_COMMITTED event, split into
//! sequenced chunks per stream (`body`, or `stdout`/`stderr`), with a digest over all of
//! them and a completeness marker. Reading checks both, so a damaged result is reported
//! as such and never handed out as complete.

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use super::append::WriteCtx;
use super::events::{EventBody, ResultFacts};
use super::store::{Appended, JournalError};
use crate::config::RetentionPolicy;
use crate::contract::{Code, ConfidenceSource, Outcome, Retry};

/// Chunk size for stored streams: large enough to keep row counts low, small enough that
/// a multi-megabyte body never needs one huge allocation on read.
pub const CHUNK_BYTES: usize = 64 * 1024;

const DIGEST_CONTEXT: &str = "postern 2026 result-digest v1";

/// A result to store. Secrets must already be redacted by the channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultToStore {
    /// Non-secret facts a caller needs beside the streams (status, filtered headers,
    /// exit status, which streams completed). Stored as JSON.
    pub meta: serde_json::Value,
    /// Named byte streams, in order.
    pub streams: Vec<(String, Vec<u8>)>,
}

/// How the stored result settles the invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settle {
    pub outcome: Outcome,
    pub code: Option<Code>,
    pub retry: Retry,
    pub facts: ResultFacts,
    pub confidence: ConfidenceSource,
    pub redactions: u32,
}

/// A result read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResult {
    pub result_id: String,
    pub invocation_id: String,
    pub generation: u32,
    pub meta: serde_json::Value,
    pub streams: Vec<(String, Vec<u8>)>,
    pub digest: String,
}

/// Digest over named streams, each framed by lengths so boundaries cannot shift.
pub fn digest(streams: &[(String, Vec<u8>)]) -> String {
    let mut h = blake3::Hasher::new_derive_key(DIGEST_CONTEXT);
    h.update(&(streams.len() as u64).to_le_bytes());
    for (name, data) in streams {
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update(&(data.len() as u64).to_le_bytes());
        h.update(data);
    }
    format!("blake3:{}", h.finalize().to_hex())
}

pub(super) fn commit(
    ctx: &mut WriteCtx<'_>,
    invocation_id: &str,
    result: &ResultToStore,
    settle: &Settle,
) -> Result<Appended, JournalError> {
    let projection = ctx.projection(invocation_id)?;
    let generation = projection.attempt.generation;
    let result_id = format!("{invocation_id}/r{generation}");
    let digest = digest(&result.streams);
    let body = EventBody::ResultCommitted {
        outcome: settle.outcome,
        code: settle.code,
        retry: settle.retry,
        result_id: result_id.clone(),
        digest: digest.clone(),
        facts: settle.facts.clone(),
        confidence: settle.confidence,
        redactions: settle.redactions,
    };
    // Validate against the projection before touching the result tables.
    let appended = ctx.append_checked(invocation_id, &body)?;
    let meta = serde_json::to_string(&result.meta)
        .map_err(|e| JournalError::Storage(format!("result meta encoding: {e}")))?;
    let conn = ctx.conn();
    let mut chunk = conn.prepare_cached(
        "INSERT INTO result_chunks (result_id, stream, n, data) VALUES (?1, ?2, ?3, ?4)",
    )?;
    for (name, data) in &result.streams {
        // An empty stream still gets chunk 0, so reading restores it.
        if data.is_empty() {
            chunk.execute(params![result_id, name, 0i64, &[] as &[u8]])?;
        }
        for (n, part) in data.chunks(CHUNK_BYTES).enumerate() {
            chunk.execute(params![result_id, name, n as i64, part])?;
        }
    }
    let bytes: usize = result.streams.iter().map(|(_, d)| d.len()).sum();
    // The completeness marker goes in last, in the same transaction as the chunks.
    conn.prepare_cached(
        "INSERT INTO result_retention (result_id, committed_at_ms, bytes) VALUES (?1, ?2, ?3)",
    )?
    .execute(params![result_id, ctx.now_ms(), bytes as i64])?;
    conn.prepare_cached(
        "INSERT INTO results (id, invocation_id, generation, meta, digest, complete)
         VALUES (?1, ?2, ?3, ?4, ?5, 1)",
    )?
    .execute(params![result_id, invocation_id, generation, meta, digest])?;
    Ok(appended)
}

pub(super) fn read(conn: &Connection, result_id: &str) -> Result<StoredResult, JournalError> {
    let incomplete = || JournalError::ResultIncomplete(result_id.to_string());
    let row: Option<(String, u32, String, String, i64)> = conn
        .query_row(
            "SELECT invocation_id, generation, meta, digest, complete FROM results WHERE id = ?1",
            [result_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .optional()?;
    let Some((invocation_id, generation, meta, stored_digest, complete)) = row else {
        return Err(incomplete());
    };
    if complete != 1 {
        return Err(incomplete());
    }
    let mut stmt = conn.prepare_cached(
        "SELECT stream, n, data FROM result_chunks WHERE result_id = ?1 ORDER BY rowid",
    )?;
    let mut streams: Vec<(String, Vec<u8>)> = Vec::new();
    let mut rows = stmt.query([result_id])?;
    let mut expected_n = 0i64;
    while let Some(row) = rows.next()? {
        let name: String = row.get(0)?;
        let n: i64 = row.get(1)?;
        let data = row.get_ref(2)?.as_blob().map_err(rusqlite::Error::from)?;
        match streams.last_mut() {
            Some((last, buf)) if *last == name => {
                if n != expected_n {
                    return Err(incomplete());
                }
                buf.extend_from_slice(data);
            }
            _ => {
                if n != 0 {
                    return Err(incomplete());
                }
                streams.push((name, data.to_vec()));
            }
        }
        expected_n = n + 1;
    }
    if digest(&streams) != stored_digest {
        return Err(incomplete());
    }
    let meta = serde_json::from_str(&meta).map_err(|_| incomplete())?;
    Ok(StoredResult {
        result_id: result_id.to_string(),
        invocation_id,
        generation,
        meta,
        streams,
        digest: stored_digest,
    })
}

/// The shape of a stored result without its bytes: what a piecewise reader needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultLayout {
    pub result_id: String,
    pub invocation_id: String,
    pub meta: serde_json::Value,
    pub digest: String,
    /// Each stream's name and length, in stored order.
    pub streams: Vec<(String, u64)>,
}

impl ResultLayout {
    /// Total bytes over every stream.
    pub fn total_bytes(&self) -> u64 {
        self.streams.iter().map(|(_, n)| n).sum()
    }
}

/// Reads a stored result's layout, checking its completeness marker and that every
/// stream's chunks are contiguous (the bytes themselves are checked by [`read`]).
pub(super) fn layout(conn: &Connection, result_id: &str) -> Result<ResultLayout, JournalError> {
    let incomplete = || JournalError::ResultIncomplete(result_id.to_string());
    let row: Option<(String, String, String, i64)> = conn
        .query_row(
            "SELECT invocation_id, meta, digest, complete FROM results WHERE id = ?1",
            [result_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()?;
    let Some((invocation_id, meta, digest, 1)) = row else {
        return Err(incomplete());
    };
    let mut stmt = conn.prepare_cached(
        "SELECT stream, count(*), max(n), sum(length(data)) FROM result_chunks
         WHERE result_id = ?1 GROUP BY stream ORDER BY min(rowid)",
    )?;
    let mut streams = Vec::new();
    let mut rows = stmt.query([result_id])?;
    while let Some(row) = rows.next()? {
        let (name, count, max_n, len): (String, i64, i64, i64) =
            (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?);
        if max_n + 1 != count {
            return Err(incomplete());
        }
        streams.push((name, u64::try_from(len).map_err(|_| incomplete())?));
    }
    let meta = serde_json::from_str(&meta).map_err(|_| incomplete())?;
    Ok(ResultLayout {
        result_id: result_id.to_string(),
        invocation_id,
        meta,
        digest,
        streams,
    })
}

/// `len` bytes of `stream` from `offset`, read from the chunks that hold them only.
/// Every chunk but a stream's last holds exactly [`CHUNK_BYTES`]; a chunk of another
/// size, or a missing one, is reported as an incomplete result.
pub(super) fn read_range(
    conn: &Connection,
    result_id: &str,
    stream: &str,
    offset: u64,
    len: u64,
) -> Result<Vec<u8>, JournalError> {
    let incomplete = || JournalError::ResultIncomplete(result_id.to_string());
    if len == 0 {
        return Ok(Vec::new());
    }
    let chunk = CHUNK_BYTES as u64;
    let (first, last) = (offset / chunk, (offset + len - 1) / chunk);
    let mut stmt = conn.prepare_cached(
        "SELECT n, data FROM result_chunks
         WHERE result_id = ?1 AND stream = ?2 AND n BETWEEN ?3 AND ?4 ORDER BY n",
    )?;
    let mut rows = stmt.query(params![result_id, stream, first as i64, last as i64])?;
    let mut out = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    let mut expected = first;
    while let Some(row) = rows.next()? {
        let n: i64 = row.get(0)?;
        let data = row.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
        if u64::try_from(n).ok() != Some(expected)
            || (n as u64 != last && data.len() != CHUNK_BYTES)
        {
            return Err(incomplete());
        }
        let start = if expected == first {
            usize::try_from(offset % chunk).map_err(|_| incomplete())?
        } else {
            0
        };
        let want = usize::try_from(len).map_err(|_| incomplete())? - out.len();
        let end = data.len().min(start + want);
        if start > end {
            return Err(incomplete());
        }
        out.extend_from_slice(&data[start..end]);
        expected += 1;
    }
    if out.len() as u64 != len {
        return Err(incomplete());
    }
    Ok(out)
}

/// At most this many results are expired per pruning transaction, so a long backlog
/// never holds the writer for long; the pass repeats until nothing is left.
pub const PRUNE_BATCH: usize = 256;

/// One pruning step inside the writer's transaction: expires up to [`PRUNE_BATCH`]
/// results, oldest first, by age and then by total size, appending RESULT_EXPIRED for
/// each before deleting its rows. Returns how many were expired.
pub(super) fn prune_step(
    ctx: &mut WriteCtx<'_>,
    policy: RetentionPolicy,
) -> Result<usize, JournalError> {
    let cutoff = ctx.now_ms().saturating_sub(policy.max_age_ms);
    let mut victims: Vec<(String, String, u64, super::events::ExpiryReason)> = Vec::new();
    {
        let conn = ctx.conn();
        let mut aged = conn.prepare_cached(
            "SELECT r.id, r.invocation_id, t.bytes FROM result_retention t
             JOIN results r ON r.id = t.result_id WHERE t.committed_at_ms < ?1
             ORDER BY t.committed_at_ms, t.rowid LIMIT ?2",
        )?;
        let mut rows = aged.query(params![cutoff, PRUNE_BATCH as i64])?;
        while let Some(row) = rows.next()? {
            let bytes: i64 = row.get(2)?;
            victims.push((
                row.get(0)?,
                row.get(1)?,
                u64::try_from(bytes).unwrap_or(0),
                super::events::ExpiryReason::Age,
            ));
        }
        if victims.is_empty() {
            let total: i64 = conn.query_row(
                "SELECT coalesce(sum(t.bytes), 0) FROM result_retention t
                 JOIN results r ON r.id = t.result_id",
                [],
                |r| r.get(0),
            )?;
            let mut excess = u64::try_from(total)
                .unwrap_or(0)
                .saturating_sub(policy.max_bytes);
            if excess > 0 {
                let mut oldest = conn.prepare_cached(
                    "SELECT r.id, r.invocation_id, t.bytes FROM result_retention t
                     JOIN results r ON r.id = t.result_id
                     ORDER BY t.committed_at_ms, t.rowid LIMIT ?1",
                )?;
                let mut rows = oldest.query([PRUNE_BATCH as i64])?;
                while excess > 0
                    && let Some(row) = rows.next()?
                {
                    let bytes = u64::try_from(row.get::<_, i64>(2)?).unwrap_or(0);
                    victims.push((
                        row.get(0)?,
                        row.get(1)?,
                        bytes,
                        super::events::ExpiryReason::Size,
                    ));
                    excess = excess.saturating_sub(bytes);
                }
            }
        }
    }
    let expired = victims.len();
    for (result_id, invocation_id, bytes, reason) in victims {
        // The record first: a result whose expiry cannot be recorded is kept.
        let body = EventBody::ResultExpired {
            result_id: result_id.clone(),
            reason,
            bytes,
        };
        ctx.append_checked(&invocation_id, &body)?;
        let conn = ctx.conn();
        conn.prepare_cached("DELETE FROM result_chunks WHERE result_id = ?1")?
            .execute([&result_id])?;
        conn.prepare_cached("DELETE FROM results WHERE id = ?1")?
            .execute([&result_id])?;
        conn.prepare_cached("DELETE FROM result_retention WHERE result_id = ?1")?
            .execute([&result_id])?;
    }
    Ok(expired)
}
