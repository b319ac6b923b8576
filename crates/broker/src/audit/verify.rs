//! The verifier: [`verify_file`] and its variants check a whole journal file (chain,
//! tree, checkpoints, signing policy, outside records, page integrity); [`verify_since`]
//! goes on from a [`VerifiedPrefix`]. The passes over the rows are in `scan`. It opens
//! the journal read-only and never writes it.

use std::path::Path;

use ed25519_dalek::VerifyingKey;
use rusqlite::{Connection, OpenFlags};

use super::merkle::Frontier;
use super::outside::{Outside, TreeHead, read_checkpoint_file};
use super::scan::{
    Linked, RowBatch, RowFeed, Scanned, VerifiedPrefix, VerifyFailure, check_links, scan,
};
use super::{
    AuditError, Checkpoint, GENESIS, Tamper, VerifyReport, broken, log_origin, witness_path,
};
use crate::journal::chain::{CHECKPOINT_COLUMNS, checkpoint_row};

/// Verifies the journal at `db` read-only against the audit public key: the chain, the
/// Merkle tree, its signed checkpoints and the signing policy, then the integrity of the
/// whole file (every page of every table and index, and its length against its header),
/// since a damaged page outside the events would otherwise pass.
pub fn verify_file(db: &Path, key: &VerifyingKey) -> Result<VerifyReport, AuditError> {
    verify_file_with(db, key, &Outside::default())
}

/// [`verify_file`], also against records kept outside the journal.
pub fn verify_file_with(
    db: &Path,
    key: &VerifyingKey,
    outside: &Outside,
) -> Result<VerifyReport, AuditError> {
    verify_file_prefix(db, key, outside).map(|(report, _)| report)
}

/// [`verify_file_with`], also returning where it ended, for [`verify_since`] to go on
/// from.
pub fn verify_file_prefix(
    db: &Path,
    key: &VerifyingKey,
    outside: &Outside,
) -> Result<(VerifyReport, VerifiedPrefix), AuditError> {
    let unreadable = |e: &dyn std::fmt::Display| AuditError::Unreadable {
        path: db.display().to_string(),
        detail: e.to_string(),
    };
    let damaged = |detail: String| AuditError::Damaged {
        path: db.display().to_string(),
        detail,
    };
    let conn = open_for_scan(db).map_err(|e| unreadable(&e))?;
    let mut signed_outside = Vec::new();
    if let Some(w) = read_checkpoint_file(&witness_path(db)).map_err(|e| unreadable(&e))? {
        signed_outside.push(w);
    }
    if let Some(anchor) = &outside.anchor
        && let Some(a) = read_checkpoint_file(anchor).map_err(|e| unreadable(&e))?
    {
        signed_outside.push(a);
    }
    let outside_checked = (signed_outside.len() + outside.heads.len()) as u64;
    // A file shorter than its header says reads its missing pages as zeros: say what
    // it is before the chain trips over them.
    if let Err(crate::journal::JournalError::Damaged { detail, .. }) =
        crate::journal::schema::check_length(db)
    {
        return Err(damaged(detail));
    }
    // The page check reads the whole file on its own connection while the chain and
    // the tree are checked on this one: two cores, one pass's time.
    let (chain, pages) = std::thread::scope(|scope| {
        let pages = scope.spawn(|| quick_check(db));
        let chain = in_snapshot(&conn, |conn| {
            verify(conn, key, &signed_outside, &outside.heads, None)
        });
        (chain, pages.join())
    });
    let (report, prefix) = chain.map_err(|e| match e {
        VerifyFailure::Audit(a) => a,
        VerifyFailure::Sql(s)
            if s.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseCorrupt) =>
        {
            damaged(s.to_string())
        }
        VerifyFailure::Sql(s) => unreadable(&s),
    })?;
    match pages {
        Ok(Ok(())) => Ok((
            VerifyReport {
                outside_checked,
                ..report
            },
            prefix,
        )),
        Ok(Err(problems)) => Err(damaged(problems)),
        Err(_) => Err(damaged("the page check stopped unexpectedly".into())),
    }
}

/// A read-only connection for a pass over the whole file: pages are read through a
/// memory map rather than copied into SQLite's cache one `read` at a time.
fn open_for_scan(db: &Path) -> Result<Connection, rusqlite::Error> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    conn.execute_batch("PRAGMA mmap_size = 4294967296")?;
    Ok(conn)
}

/// `PRAGMA quick_check` over the whole file: it reads every page of every table and
/// index (it skips only integrity_check's index-to-table cross-check, which costs a sort
/// per index). `Err` carries what it found.
fn quick_check(db: &Path) -> Result<(), String> {
    let conn = open_for_scan(db).map_err(|e| e.to_string())?;
    let mut problems: Vec<String> = Vec::new();
    conn.prepare("PRAGMA quick_check(20)")
        .and_then(|mut stmt| {
            let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
            for row in rows {
                problems.push(row?);
            }
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    if problems.len() == 1 && problems[0] == "ok" {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// Verifies the events after `from` (all of them when `None`), for a status display
/// that checks often: the row `from` ended at must still carry the head it had, and
/// every later row and checkpoint is checked as [`verify_file`] would. Rows before it
/// are not read again, so a change to them shows only in a full verification.
pub fn verify_since(
    conn: &Connection,
    key: &VerifyingKey,
    from: Option<&VerifiedPrefix>,
) -> Result<(VerifyReport, VerifiedPrefix), AuditError> {
    in_snapshot(conn, |conn| verify(conn, key, &[], &[], from)).map_err(|e| match e {
        VerifyFailure::Audit(a) => a,
        VerifyFailure::Sql(s) => AuditError::Unreadable {
            path: conn.path().unwrap_or("journal").to_string(),
            detail: s.to_string(),
        },
    })
}

/// Runs `f` in one read transaction, so the events and the checkpoints it reads are
/// the same commit's (the writer commits both together).
fn in_snapshot<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, VerifyFailure>,
) -> Result<T, VerifyFailure> {
    conn.execute_batch("BEGIN")?;
    let result = f(conn);
    let _ = conn.execute_batch("COMMIT");
    result
}

fn verify(
    conn: &Connection,
    key: &VerifyingKey,
    signed_outside: &[Checkpoint],
    heads: &[TreeHead],
    from: Option<&VerifiedPrefix>,
) -> Result<(VerifyReport, VerifiedPrefix), VerifyFailure> {
    let start = from.map_or(0, |p| p.seq);
    let mut checkpoints = load_checkpoints(conn, start)?;
    for w in signed_outside {
        // Signed outside copies count like any checkpoint; a copy of a row adds its note
        // (published copies carry one, rows do not), which is then checked too.
        match checkpoints
            .iter_mut()
            .find(|c| c.seq == w.seq && c.signature == w.signature)
        {
            Some(c) if c.note.is_none() => c.note = w.note.clone(),
            Some(c) if c.note == w.note => {}
            _ => checkpoints.push(w.clone()),
        }
    }
    checkpoints.sort_by_key(|c| c.seq);
    let origin = log_origin(key);
    for c in &checkpoints {
        if !c.signature_valid(key) || c.count != c.seq {
            return Err(broken(
                c.seq,
                Tamper::BadSignature,
                "checkpoint is not signed by the audit key",
            )
            .into());
        }
        // The note a witness sees must say the same as the row.
        if let Some(note) = &c.note {
            let body =
                crate::transparency::note::open_checkpoint(note.as_bytes(), &origin, &origin, key);
            if !body.is_ok_and(|b| Some(b.root) == c.root && b.size == c.seq) {
                return Err(broken(
                    c.seq,
                    Tamper::BadSignature,
                    "checkpoint note is not the audit key's signature over this tree",
                )
                .into());
            }
        }
    }
    // Checkpoints from before the Merkle tree (and per-batch signing) sign the chain
    // head only; the policy holds from the last of them on.
    let policy_from = checkpoints
        .iter()
        .filter(|c| c.root.is_none())
        .map(|c| c.seq)
        .max()
        .unwrap_or(0);
    let mut heads: Vec<&TreeHead> = heads.iter().collect();
    heads.sort_by_key(|h| h.size);

    let (head, frontier) = match from {
        None => (GENESIS, Frontier::default()),
        Some(p) => {
            let stored: Option<Vec<u8>> = conn
                .query_row(
                    "SELECT hash FROM events WHERE seq = ?1",
                    [p.seq as i64],
                    |r| r.get(0),
                )
                .ok();
            if p.seq > 0 && stored.as_deref() != Some(&p.head[..]) {
                return Err(broken(
                    p.seq,
                    Tamper::HashMismatch,
                    "the event verified last time has changed or is gone",
                )
                .into());
            }
            (p.head, p.frontier.clone())
        }
    };
    // The sizes whose root something outside the chain vouches for.
    let mut wanted: Vec<u64> = checkpoints
        .iter()
        .filter(|c| c.seq > start && c.root.is_some())
        .map(|c| c.seq)
        .chain(heads.iter().map(|h| h.size).filter(|&s| s > start))
        .collect();
    wanted.sort_unstable();
    wanted.dedup();

    // Each link is checked on a second thread against the stored value before it (all
    // links verifying is the chain verifying, and the first that does not is the first
    // bad sequence), and the tree is built there over the same values; this thread
    // reads the rows and applies the checkpoints and the signing policy.
    let (scanned, worker) = std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<RowBatch>(4);
        let worker = scope.spawn(move || check_links(rx, head, frontier, &wanted));
        let mut feed = RowFeed {
            tx,
            batch: RowBatch::default(),
        };
        let scanned = scan(conn, &checkpoints, &heads, from, policy_from, &mut feed);
        feed.flush();
        drop(feed);
        (scanned, worker.join())
    });
    let Linked {
        frontier,
        roots,
        first_bad_link,
    } = worker.map_err(|_| {
        VerifyFailure::Audit(AuditError::Unreadable {
            path: conn.path().unwrap_or("journal").to_string(),
            detail: "the chain and tree thread stopped unexpectedly".into(),
        })
    })?;
    // A broken link is at or before anything the row pass found from it.
    let scanned = match (scanned, first_bad_link) {
        (Err(VerifyFailure::Sql(e)), _) => return Err(VerifyFailure::Sql(e)),
        (result, Some(seq))
            if result
                .as_ref()
                .err()
                .and_then(|e| match e {
                    VerifyFailure::Audit(a) => a.first_bad_seq(),
                    VerifyFailure::Sql(_) => None,
                })
                .is_none_or(|s| seq <= s) =>
        {
            return Err(broken(
                seq,
                Tamper::HashMismatch,
                "row contents do not match the chain",
            )
            .into());
        }
        (result, _) => result,
    };
    // `roots` comes in size order (the wanted sizes, sorted).
    let root_at = |size: u64| {
        roots
            .binary_search_by_key(&size, |(s, _)| *s)
            .ok()
            .map(|i| roots[i].1)
    };
    let mut root_failure: Option<AuditError> = None;
    for c in checkpoints.iter().filter(|c| c.seq > start) {
        if let (Some(signed), Some(built)) = (c.root, root_at(c.seq))
            && signed != built
        {
            root_failure = Some(broken(
                c.seq,
                Tamper::CheckpointMismatch,
                "signed checkpoint root differs from the Merkle tree",
            ));
            break;
        }
    }
    for h in &heads {
        if let Some(built) = root_at(h.size)
            && built != h.root
            && root_failure
                .as_ref()
                .and_then(AuditError::first_bad_seq)
                .is_none_or(|s| h.size < s)
        {
            root_failure = Some(broken(
                h.size,
                Tamper::CheckpointMismatch,
                format!(
                    "{} holds a different tree at size {}: the journal was rewritten",
                    h.source, h.size
                ),
            ));
        }
    }
    let scanned = match (scanned, root_failure) {
        (Err(VerifyFailure::Audit(e)), Some(r))
            if r.first_bad_seq() < e.first_bad_seq() || e.first_bad_seq().is_none() =>
        {
            return Err(r.into());
        }
        (Err(e), _) => return Err(e),
        (Ok(_), Some(r)) => return Err(r.into()),
        (Ok(s), None) => s,
    };
    let Scanned {
        last,
        head,
        next_checkpoint,
        next_head,
        last_checkpoint_seq,
        checkpoint_count,
        signed_late,
    } = scanned;
    if let Some(seq) = next_checkpoint {
        return Err(broken(
            last + 1,
            Tamper::Truncated,
            format!("checkpoint at sequence {seq} but the journal ends at {last}"),
        )
        .into());
    }
    if let Some(h) = next_head {
        return Err(broken(
            last + 1,
            Tamper::Truncated,
            format!(
                "{} saw {} events but the journal ends at {last}",
                heads[h].source, heads[h].size
            ),
        )
        .into());
    }
    let signed_through = last_checkpoint_seq.unwrap_or(0);
    if last > signed_through {
        let n = last - signed_through;
        return Err(AuditError::Broken {
            first_bad_seq: signed_through + 1,
            kind: Tamper::Unsigned,
            detail: format!(
                "{n} events after sequence {signed_through} are not signed: every commit \
                 carries a checkpoint, so checkpoints were removed (or the broker that wrote \
                 them predates per-batch signing and has not opened the journal since)"
            ),
            unsigned_events: Some(n),
        }
        .into());
    }
    let root = frontier.root();
    let prefix = VerifiedPrefix {
        seq: last,
        head,
        frontier,
        checkpoints: checkpoint_count,
        last_checkpoint_seq,
    };
    Ok((
        VerifyReport {
            events: last,
            verified_through: last,
            head_hex: hex::encode(head),
            root_hex: hex::encode(root),
            checkpoints: checkpoint_count,
            last_checkpoint_seq,
            signed_late,
            outside_checked: 0,
        },
        prefix,
    ))
}

fn load_checkpoints(conn: &Connection, after: u64) -> Result<Vec<Checkpoint>, VerifyFailure> {
    // A journal no broker of this version has opened yet has no tree columns.
    let has_tree: bool = conn.query_row(
        "SELECT count(*) FROM pragma_table_info('checkpoints') WHERE name = 'root'",
        [],
        |r| r.get::<_, i64>(0).map(|n| n > 0),
    )?;
    let columns = if has_tree {
        CHECKPOINT_COLUMNS
    } else {
        "seq, head, count, public_key, signature, made_at_ms, NULL, NULL"
    };
    let mut stmt = conn.prepare(&format!(
        "SELECT {columns} FROM checkpoints WHERE seq > ?1 ORDER BY seq"
    ))?;
    let mut out = Vec::new();
    let mut rows = stmt.query([after as i64])?;
    while let Some(row) = rows.next()? {
        match checkpoint_row(row)? {
            Ok(c) => out.push(c),
            Err((seq, what)) => {
                return Err(broken(
                    seq,
                    Tamper::BadSignature,
                    format!("malformed checkpoint {what}"),
                )
                .into());
            }
        }
    }
    Ok(out)
}
