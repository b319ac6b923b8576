//! Signing: the checkpoint each commit carries (and which of them are kept), its
//! publication to the witness file and the anchor once on disk, the witnesses'
//! cosignatures, the checks of the chain's unsigned tail and the tree at open, and the
//! broker's other signatures with the same key (retry manifests, federation
//! attestations and peer calls), which never leaves the journal.
//!
//! Must never: publish a checkpoint outside before it is on disk; extend a journal
//! whose unsigned tail does not link to its last checkpoint.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, params};

use super::chain::{
    self, CHECKPOINT_COLUMNS, ChainHasher, ChainedRow, Checkpoint, GENESIS, SIGN_INTERVAL_MS,
    checkpoint_row, write_checkpoint_file,
};
use super::merkle::{self, Frontier};
use super::store::JournalError;
use super::writer::{Journal, Retention, WriterState};

impl Journal {
    /// The newest checkpoint known to be on disk (fsynced): what may be shown to a
    /// witness without a power loss later making the journal look cut.
    pub fn latest_durable_checkpoint(&self) -> Option<Checkpoint> {
        self.inner.latest_durable.lock().ok()?.clone()
    }

    /// A consistency proof from the tree of `old_size` events to the tree of
    /// `new_size`, from the stored tree hashes.
    pub fn consistency_proof(
        &self,
        new_size: u64,
        old_size: u64,
    ) -> Result<Vec<[u8; 32]>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        merkle::consistency_proof(&conn, new_size, old_size).map_err(|e| {
            JournalError::Storage(format!("consistency proof {old_size}->{new_size}: {e}"))
        })
    }

    /// Keeps a witness's cosignature of the tree of `size` events: the checkpoint note
    /// with the cosignature line appended, and the line itself.
    pub fn record_cosignature(
        &self,
        size: u64,
        witness: &str,
        cosigned_note: String,
        line: String,
    ) -> Result<(), JournalError> {
        let witness = witness.to_string();
        self.write(false, move |ctx| {
            ctx.conn()
                .execute(
                    "INSERT OR REPLACE INTO cosignatures
                       (size, witness, note, signature, received_at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![size as i64, witness, cosigned_note, line, ctx.now_ms()],
                )
                .map(|_| ())
                .map_err(JournalError::from)
        })
    }

    /// The largest tree `witness` has cosigned, from the stored cosignatures.
    pub fn cosigned_size(&self, witness: &str) -> Result<Option<u64>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        let size: Option<i64> = conn.query_row(
            "SELECT max(size) FROM cosignatures WHERE witness = ?1",
            [witness],
            |r| r.get(0),
        )?;
        Ok(size.and_then(|s| u64::try_from(s).ok()))
    }

    /// The key this journal's checkpoints are signed with (public half).
    pub fn verifying_key(&self) -> ed25519_dalek::VerifyingKey {
        self.inner.verifying_key
    }

    /// The retry manifest for `decision` on `facts`, signed with the broker's key.
    pub fn sign_manifest(
        &self,
        facts: &crate::retry::RecordFacts,
        decision: crate::retry::Decision,
        for_generation: u32,
        now_ms: i64,
    ) -> crate::retry::RetryManifest {
        crate::retry::manifest(
            facts,
            decision,
            for_generation,
            now_ms,
            &self.inner.manifest_key,
        )
    }

    /// A federation attestation of `statement`, signed with the broker's key (the key
    /// that signs checkpoints; see [`crate::federation`]). The key never leaves here.
    pub fn sign_attestation(
        &self,
        statement: crate::federation::Statement,
    ) -> crate::record::peer::Attestation {
        statement.sign(&self.inner.manifest_key)
    }

    /// This broker's name to its peers: the audit log origin of its key, the name the
    /// peers' `[[peer]] key` entries pin it by.
    pub fn peer_name(&self) -> String {
        chain::log_origin(&self.inner.verifying_key)
    }

    /// Signs one peering tool call (`tool` about `subject`) as this broker, with a
    /// fresh `nonce`: the signing key never leaves the journal.
    pub fn sign_peer_auth(
        &self,
        tool: &str,
        subject: &str,
        issued_at_ms: i64,
        nonce: [u8; 16],
    ) -> crate::federation::wire::PeerAuth {
        crate::federation::wire::PeerAuth::sign(
            &self.inner.manifest_key,
            tool,
            &self.peer_name(),
            subject,
            issued_at_ms,
            nonce,
        )
    }
}

impl WriterState {
    /// Signs the tree the batch leaves, inside its transaction, and applies the
    /// retention rule. Returns the checkpoint and the retention to adopt on commit.
    pub(super) fn seal(&self, now_ms: i64) -> Result<(Checkpoint, Retention), rusqlite::Error> {
        let cp = Checkpoint::sign(
            &self.signing_key,
            self.pos.last_seq,
            self.pos.head,
            self.pos.frontier.root(),
            now_ms,
        );
        insert_checkpoint(&self.conn, &cp)?;
        let mut retention = self.retention;
        if let Some((seq, made_at)) = retention.provisional {
            let same_window = retention
                .retained
                .is_some_and(|(_, at)| now_ms < at.saturating_add(SIGN_INTERVAL_MS));
            if same_window {
                self.conn
                    .prepare_cached("DELETE FROM checkpoints WHERE seq = ?1")?
                    .execute([seq as i64])?;
            } else {
                retention.retained = Some((seq, made_at));
            }
        }
        retention.provisional = Some((cp.seq, cp.made_at_ms));
        Ok((cp, retention))
    }

    /// Idle with commits not yet on disk: sync them (a passive checkpoint syncs the WAL
    /// first), so their checkpoint can go to the anchor and the witnesses.
    pub(super) fn sync_idle(&mut self) {
        if self.unsynced.is_none() {
            return;
        }
        let synced = self.set_sync(true).is_ok()
            && self
                .conn
                .execute_batch("PRAGMA wal_checkpoint(PASSIVE)")
                .is_ok();
        if synced && let Some(cp) = self.unsynced.take() {
            self.published(cp);
        }
    }

    /// `cp` is on disk: it goes outside (and to witnesses) when due.
    pub(super) fn published(&mut self, cp: Checkpoint) {
        self.outside_pending = Some(cp);
    }

    pub(super) fn outside_due_in(&self) -> Duration {
        let interval = Duration::from_millis(SIGN_INTERVAL_MS as u64);
        self.outside_written_at
            .map_or(Duration::ZERO, |t| interval.saturating_sub(t.elapsed()))
    }

    /// Writes the pending checkpoint to the witness file and the anchor. Best effort:
    /// the signed rows in the database remain the primary record.
    pub(super) fn write_outside(&mut self) {
        if let Some(cp) = self.outside_pending.take() {
            // The C2SP note witnesses read is signed here, once per publication rather
            // than in every commit.
            let cp = cp.with_note(&self.signing_key);
            if let Ok(mut latest) = self.latest_durable.lock() {
                *latest = Some(cp.clone());
            }
            let _ = write_checkpoint_file(&self.witness, &cp);
            if let Some(anchor) = &self.anchor {
                let _ = write_checkpoint_file(anchor, &cp);
            }
            self.outside_written_at = Some(Instant::now());
        }
    }
}

fn insert_checkpoint(conn: &Connection, cp: &Checkpoint) -> Result<(), rusqlite::Error> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO checkpoints
           (seq, head, count, public_key, signature, made_at_ms, root, note)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        cp.seq as i64,
        &cp.head[..],
        cp.count as i64,
        &cp.public_key[..],
        &cp.signature[..],
        cp.made_at_ms,
        cp.root.as_ref().map(|r| &r[..]),
        cp.note.as_deref(),
    ])?;
    Ok(())
}

/// The newest checkpoint row, if any (a malformed one counts as none; verification
/// reports it).
pub(super) fn newest_checkpoint(conn: &Connection) -> Result<Option<Checkpoint>, rusqlite::Error> {
    conn.query_row(
        &format!("SELECT {CHECKPOINT_COLUMNS} FROM checkpoints ORDER BY seq DESC LIMIT 1"),
        [],
        checkpoint_row,
    )
    .optional()
    .map(|row| row.and_then(Result::ok))
}

pub(super) fn chain_tail(conn: &Connection) -> Result<(u64, [u8; 32]), JournalError> {
    let tail: Option<(i64, Vec<u8>)> = conn
        .query_row(
            "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    match tail {
        None => Ok((0, GENESIS)),
        Some((seq, hash)) => {
            let head: [u8; 32] = hash
                .try_into()
                .map_err(|_| JournalError::Storage(format!("malformed chain hash at {seq}")))?;
            Ok((u64::try_from(seq).unwrap_or(0), head))
        }
    }
}

/// Checks the events after the last signed checkpoint before the journal is extended
/// (or signed at shutdown): the checkpointed event must still have the signed head,
/// sequence numbers must be gap-free, and every row must link to the one before. A
/// damaged tail is refused rather than extended (the audit key's signature is not
/// checked here; `postern audit verify` does that).
pub(super) fn verify_unsigned_tail(
    conn: &Connection,
    path: &Path,
    last_seq: u64,
    head: &[u8; 32],
) -> Result<(), JournalError> {
    let damaged = |detail: String| JournalError::Damaged {
        path: path.to_path_buf(),
        detail,
    };
    let sql = |e: rusqlite::Error| damaged(format!("reading the events failed: {e}"));
    let checkpoint: Option<(i64, Vec<u8>)> = conn
        .query_row(
            "SELECT seq, head FROM checkpoints ORDER BY seq DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(sql)?;
    let (from, mut prev) = match checkpoint {
        None => (0u64, GENESIS),
        Some((seq, h)) => {
            let h: [u8; 32] = h
                .try_into()
                .map_err(|_| damaged(format!("checkpoint {seq} has a malformed head")))?;
            (u64::try_from(seq).unwrap_or(0), h)
        }
    };
    if from > last_seq {
        return Err(damaged(format!(
            "a signed checkpoint covers sequence {from} but the events end at {last_seq}: \
             events were cut off"
        )));
    }
    if from > 0 {
        let stored: Option<Vec<u8>> = conn
            .query_row(
                "SELECT hash FROM events WHERE seq = ?1",
                [from as i64],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql)?;
        if stored.as_deref() != Some(&prev[..]) {
            return Err(damaged(format!(
                "the event at signed checkpoint {from} is missing or changed"
            )));
        }
    }
    let mut hasher = ChainHasher::new();
    let mut expected = from + 1;
    let mut stmt = conn
        .prepare(
            "SELECT seq, invocation_id, kind, body, recorded_at_ms, hash FROM events
             WHERE seq > ?1 ORDER BY seq",
        )
        .map_err(sql)?;
    let mut rows = stmt.query([from as i64]).map_err(sql)?;
    while let Some(row) = rows.next().map_err(sql)? {
        let seq = u64::try_from(row.get::<_, i64>(0).map_err(sql)?).unwrap_or(0);
        if seq != expected {
            return Err(damaged(format!(
                "expected event {expected}, found {seq}: events are missing"
            )));
        }
        let text =
            |i: usize| -> Result<String, JournalError> { row.get::<_, String>(i).map_err(sql) };
        let computed = hasher.link(
            &prev,
            &ChainedRow {
                seq,
                invocation_id: &text(1)?,
                kind: &text(2)?,
                body: &text(3)?,
                recorded_at_ms: row.get::<_, i64>(4).map_err(sql)?,
            },
        );
        let stored: Vec<u8> = row.get(5).map_err(sql)?;
        if stored != computed {
            return Err(damaged(format!(
                "event {seq} does not match the audit chain"
            )));
        }
        prev = computed;
        expected += 1;
    }
    if expected - 1 != last_seq || prev != *head {
        return Err(damaged(format!(
            "the chain ends at {} but the journal's tail is {last_seq}",
            expected - 1
        )));
    }
    Ok(())
}

/// The tree's right edge for the `last_seq` events: read from the stored hashes when
/// they are complete and agree with the newest checkpoint, otherwise rebuilt from the
/// events' chain values (a journal from before the tree, or a damaged table; the table
/// is derived data, and verification never trusts it).
pub(super) fn load_or_rebuild_tree(
    conn: &Connection,
    path: &Path,
    last_seq: u64,
    newest: Option<&Checkpoint>,
) -> Result<Frontier, JournalError> {
    let damaged = |e: rusqlite::Error| JournalError::Damaged {
        path: path.to_path_buf(),
        detail: format!("rebuilding the Merkle tree failed: {e}"),
    };
    let expected = tlog_tiles::tlog::stored_hash_count(last_seq);
    let (count, max): (i64, Option<i64>) = conn
        .query_row("SELECT count(*), max(idx) FROM merkle", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .map_err(damaged)?;
    let complete =
        u64::try_from(count).ok() == Some(expected) && max.map_or(0, |m| m + 1) == expected as i64;
    if complete
        && let Ok(frontier) = Frontier::load(last_seq, &merkle::StoredHashes { conn })
        && newest
            .filter(|c| c.seq == last_seq)
            .and_then(|c| c.root)
            .is_none_or(|root| root == frontier.root())
    {
        return Ok(frontier);
    }
    conn.execute_batch("BEGIN IMMEDIATE; DELETE FROM merkle;")
        .map_err(damaged)?;
    let rebuilt = (|| -> Result<Frontier, rusqlite::Error> {
        let mut frontier = Frontier::default();
        let mut stored = Vec::new();
        let mut stmt = conn.prepare("SELECT seq, hash FROM events ORDER BY seq")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let seq = u64::try_from(row.get::<_, i64>(0)?).unwrap_or(0);
            let chain: [u8; 32] = row.get::<_, Vec<u8>>(1)?.try_into().map_err(|_| {
                rusqlite::Error::InvalidColumnType(1, "hash".into(), rusqlite::types::Type::Blob)
            })?;
            frontier.push(merkle::leaf_hash(seq, &chain), &mut stored);
            merkle::store_hashes(conn, seq, &stored)?;
        }
        Ok(frontier)
    })();
    match rebuilt.and_then(|f| conn.execute_batch("COMMIT").map(|_| f)) {
        Ok(frontier) => Ok(frontier),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(damaged(e))
        }
    }
}
