//! The settled-result store: a result is kept so that delivering it again never means
//! executing again.
//!
//! A result is stored in the same transaction as its RESULT_COMMITTED event, split into
//! sequenced chunks per stream (`body`, or `stdout`/`stderr`), with a digest over all of
//! them and a completeness marker. Reading checks both, so a damaged result is reported
//! as such and never handed out as complete.

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use super::events::{EventBody, ResultFacts};
use super::{Appended, JournalError, WriteCtx};
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
    // The completeness marker goes in last, in the same transaction as the chunks.
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
