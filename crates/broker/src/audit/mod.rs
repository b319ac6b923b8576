//! The audit record: the journal's own `events` table, hash-chained with blake3, an
//! RFC 6962 Merkle tree over the chain ([`merkle`]), and ed25519-signed checkpoints.
//!
//! We chain the journal itself rather than mirroring it into a second log: every
//! transition is covered by construction, and there is no window in which an event is
//! in the journal but not yet in the audit log. Each row's hash is
//! `H_k(prev_hash ‖ seq ‖ len‖invocation_id ‖ len‖kind ‖ len‖body ‖ recorded_at_ms)` with
//! a key derived from a fixed context string (domain separation), so no other blake3 use
//! in the product can produce a colliding chain value. Known-answer vectors:
//! `tests/vectors/audit_chain_v1.json`. The chain finds the first changed row; the tree
//! lets a witness check that a later checkpoint extends an earlier one.
//!
//! Signing policy: every batch the journal writer commits carries a checkpoint over the
//! tree it leaves, in the same transaction, so no committed event is ever unsigned. To
//! keep the table small, a checkpoint is replaced by the next one while both fall in the
//! same [`SIGN_INTERVAL_MS`] window, so every event is covered by a checkpoint made at
//! most that long after it was recorded. `verify` holds the file to this: events past
//! the last checkpoint, or signed later than the interval allows (a checkpoint between
//! them was removed), fail, unless a `SIGNING_RESUMED` event in the chain says the
//! previous run ended without signing them. The latest checkpoint is also written to a
//! witness file beside the database and, when configured, to an anchor outside the data
//! directory, and sent to witnesses that cosign it; a journal cut behind any of those
//! fails as truncated.
//!
//! Writing lives in the journal writer, and so does the format it writes (the chain
//! hashing, the checkpoints and the tree: `journal::chain` and `journal::merkle`,
//! re-exported here); this module holds the verifier, which only reads. A hash chain proves recorded events were not altered; it cannot
//! prove every event was recorded.

use std::path::Path;

use ed25519_dalek::VerifyingKey;
use rusqlite::{Connection, OpenFlags};
use serde::{Deserialize, Serialize};

mod key;
mod outside;
pub mod witnessing;

pub use key::{
    AUDIT_KEY_ID, AuditKeyError, last_checkpoint_key, signing_key_from_secret,
    signing_key_from_vault,
};
use outside::read_checkpoint_file;
pub use outside::{Outside, TreeHead, default_anchor};

use crate::journal::chain::{CHECKPOINT_COLUMNS, checkpoint_row};
/// The chain and checkpoint format, which the journal writes (see [`crate::journal::chain`]).
pub use crate::journal::chain::{
    ChainHasher, ChainedRow, Checkpoint, GENESIS, SIGN_INTERVAL_MS, SIGNING_RESUMED, log_origin,
    witness_path, write_checkpoint_file,
};
/// The Merkle tree over the events: the journal writes it, so it lives there.
pub use crate::journal::merkle;
use merkle::Frontier;

/// What `verify` allows beyond [`SIGN_INTERVAL_MS`] between an event and the checkpoint
/// that covers it (a slow commit, a clock stepped back).
pub const SIGN_SLACK_MS: i64 = 5_000;

/// What went wrong, at the first sequence number where the record stops verifying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tamper {
    /// A row's contents do not match its chain hash (modified, inserted or reordered).
    HashMismatch,
    /// A sequence number is missing (a row was deleted) or out of place.
    SequenceGap,
    /// A checkpoint, the witness file, the outside anchor or a witness names events that
    /// are no longer there (tail truncated).
    Truncated,
    /// A checkpoint's head or root does not match the recomputed chain and tree at its
    /// sequence, or a witness saw a different tree at that size.
    CheckpointMismatch,
    /// A checkpoint is not signed by the audit key.
    BadSignature,
    /// Events after the last checkpoint. Every batch the writer commits carries one, so
    /// checkpoints were removed (or a run of a version before per-batch signing ended
    /// without signing them, and no broker has opened the journal since).
    Unsigned,
    /// Events first covered by a checkpoint made longer after them than the signing
    /// interval allows: the checkpoints between were removed.
    LateSignature,
}

/// The audit record does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
pub enum AuditError {
    #[error("audit chain broken at sequence {first_bad_seq}: {kind:?}: {detail}")]
    Broken {
        first_bad_seq: u64,
        kind: Tamper,
        detail: String,
        /// With [`Tamper::Unsigned`]: how many events are past the last checkpoint.
        #[serde(skip_serializing_if = "Option::is_none")]
        unsigned_events: Option<u64>,
    },
    #[error("cannot read the audit record in {path}: {detail}")]
    Unreadable { path: String, detail: String },
    /// The chain verifies, but the file around it does not: a damaged page, a cut-off
    /// end. What such a file says cannot be trusted whole.
    #[error("the journal file {path} is damaged: {detail}")]
    Damaged { path: String, detail: String },
    /// A witness refused the journal's newest checkpoint, or cosigned more events than
    /// the journal holds: the history it saw was rewritten or cut.
    #[error("a witness refutes this journal: {detail}")]
    Refuted { detail: String },
}

impl AuditError {
    /// The first sequence number that fails, when the chain itself is broken.
    pub fn first_bad_seq(&self) -> Option<u64> {
        match self {
            AuditError::Broken { first_bad_seq, .. } => Some(*first_bad_seq),
            AuditError::Unreadable { .. }
            | AuditError::Damaged { .. }
            | AuditError::Refuted { .. } => None,
        }
    }

    /// How many events are past the last checkpoint, when that is the failure.
    pub fn unsigned_events(&self) -> Option<u64> {
        match self {
            AuditError::Broken {
                unsigned_events, ..
            } => *unsigned_events,
            _ => None,
        }
    }
}

/// A range of events a previous run left unsigned, signed when the journal was next
/// opened (recorded by a `SIGNING_RESUMED` event).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedLate {
    pub first: u64,
    pub last: u64,
    /// The sequence of the `SIGNING_RESUMED` event that says so.
    pub at: u64,
}

/// A successful verification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    pub events: u64,
    /// Every event up to and including this sequence verifies.
    pub verified_through: u64,
    pub head_hex: String,
    /// The Merkle root over every event.
    pub root_hex: String,
    pub checkpoints: u64,
    /// The last signed checkpoint.
    pub last_checkpoint_seq: Option<u64>,
    /// Ranges a previous run ended without signing, signed at the next start.
    pub signed_late: Vec<SignedLate>,
    /// Records kept outside the journal's tables that it was checked against (witness
    /// file, outside anchor, witnesses' cosigned tree heads).
    pub outside_checked: u64,
}

fn broken(first_bad_seq: u64, kind: Tamper, detail: impl Into<String>) -> AuditError {
    AuditError::Broken {
        first_bad_seq,
        kind,
        detail: detail.into(),
        unsigned_events: None,
    }
}

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

/// Where an incremental verification stopped: enough to go on from there without
/// reading the events before it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedPrefix {
    seq: u64,
    head: [u8; 32],
    frontier: Frontier,
    checkpoints: u64,
    last_checkpoint_seq: Option<u64>,
}

impl VerifiedPrefix {
    pub fn seq(&self) -> u64 {
        self.seq
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

#[derive(Debug)]
enum VerifyFailure {
    Audit(AuditError),
    Sql(rusqlite::Error),
}

impl From<rusqlite::Error> for VerifyFailure {
    fn from(e: rusqlite::Error) -> Self {
        VerifyFailure::Sql(e)
    }
}

impl From<AuditError> for VerifyFailure {
    fn from(e: AuditError) -> Self {
        VerifyFailure::Audit(e)
    }
}

/// The events since the last checkpoint that the signing policy holds to its interval.
#[derive(Clone, Copy)]
struct Segment {
    first_seq: u64,
    earliest_ms: i64,
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

/// Rows handed to the link thread per message.
const ROW_BATCH: usize = 4096;

/// Rows as the chain hashes them, packed into one buffer.
#[derive(Default)]
struct RowBatch {
    bytes: Vec<u8>,
    /// seq, invocation_id end, kind end, body end (offsets into `bytes`), recorded_at,
    /// stored hash.
    rows: Vec<(u64, usize, usize, usize, i64, [u8; 32])>,
}

/// Rows on their way to the link thread.
struct RowFeed {
    tx: std::sync::mpsc::SyncSender<RowBatch>,
    batch: RowBatch,
}

impl RowFeed {
    fn push(&mut self, row: &ChainedRow<'_>, stored: [u8; 32]) {
        let b = &mut self.batch;
        b.bytes.extend_from_slice(row.invocation_id.as_bytes());
        let id_end = b.bytes.len();
        b.bytes.extend_from_slice(row.kind.as_bytes());
        let kind_end = b.bytes.len();
        b.bytes.extend_from_slice(row.body.as_bytes());
        let body_end = b.bytes.len();
        b.rows.push((
            row.seq,
            id_end,
            kind_end,
            body_end,
            row.recorded_at_ms,
            stored,
        ));
        if b.rows.len() == ROW_BATCH {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if !self.batch.rows.is_empty() {
            // A closed channel means the link thread is gone; its join reports that.
            let _ = self.tx.send(std::mem::take(&mut self.batch));
        }
    }
}

/// What the link thread established.
struct Linked {
    frontier: Frontier,
    /// The root at each wanted size reached.
    roots: Vec<(u64, [u8; 32])>,
    /// The first row whose stored hash is not the link from the one before.
    first_bad_link: Option<u64>,
}

/// Checks each row's stored hash against the link from the previous stored hash
/// (starting from `head`), extends `frontier` with the leaves, and records the root at
/// each size in `wanted` (sorted). Stops hashing at the first bad link.
fn check_links(
    rx: std::sync::mpsc::Receiver<RowBatch>,
    mut head: [u8; 32],
    mut frontier: Frontier,
    wanted: &[u64],
) -> Linked {
    let mut hasher = ChainHasher::new();
    let mut roots = Vec::new();
    let mut next = wanted.iter().peekable();
    let mut first_bad_link = None;
    for batch in rx {
        if first_bad_link.is_some() {
            continue;
        }
        let mut start = 0;
        for &(seq, id_end, kind_end, body_end, recorded_at_ms, stored) in &batch.rows {
            let text = |from: usize, to: usize| std::str::from_utf8(&batch.bytes[from..to]);
            let (Ok(invocation_id), Ok(kind), Ok(body)) = (
                text(start, id_end),
                text(id_end, kind_end),
                text(kind_end, body_end),
            ) else {
                first_bad_link = Some(seq);
                break;
            };
            start = body_end;
            let computed = hasher.link(
                &head,
                &ChainedRow {
                    seq,
                    invocation_id,
                    kind,
                    body,
                    recorded_at_ms,
                },
            );
            if computed != stored {
                first_bad_link = Some(seq);
                break;
            }
            head = stored;
            frontier.push_leaf(merkle::leaf_hash(seq, &stored));
            while next.next_if(|&&s| s == frontier.size()).is_some() {
                roots.push((frontier.size(), frontier.root()));
            }
        }
    }
    Linked {
        frontier,
        roots,
        first_bad_link,
    }
}

/// What the pass over the rows established.
struct Scanned {
    last: u64,
    head: [u8; 32],
    /// The first checkpoint past the end (the tail was cut).
    next_checkpoint: Option<u64>,
    /// The index (in the sorted heads) of the first outside head past the end.
    next_head: Option<usize>,
    last_checkpoint_seq: Option<u64>,
    checkpoint_count: u64,
    signed_late: Vec<SignedLate>,
}

/// One pass over the events after the verified prefix: sequence numbers, the heads
/// checkpoints sign (against the stored hashes, which the link thread checks), and the
/// signing policy. Each row goes to `links`.
fn scan(
    conn: &Connection,
    checkpoints: &[Checkpoint],
    heads: &[&TreeHead],
    from: Option<&VerifiedPrefix>,
    policy_from: u64,
    links: &mut RowFeed,
) -> Result<Scanned, VerifyFailure> {
    let start = from.map_or(0, |p| p.seq);
    let mut head = from.map_or(GENESIS, |p| p.head);
    let mut pending = checkpoints.iter().filter(|c| c.seq > start).peekable();
    let mut pending_heads = heads
        .iter()
        .enumerate()
        .filter(|(_, h)| h.size > start)
        .peekable();
    let mut expected_seq = start + 1;
    let mut segment: Option<Segment> = None;
    let mut signed_late = Vec::new();
    let mut last_checkpoint_seq = from.and_then(|p| p.last_checkpoint_seq);
    let mut checkpoint_count = from.map_or(0, |p| p.checkpoints);
    let mut stmt = conn.prepare(
        "SELECT seq, invocation_id, kind, body, recorded_at_ms, hash FROM events
         WHERE seq > ?1 ORDER BY seq",
    )?;
    let mut rows = stmt.query([start as i64])?;
    while let Some(row) = rows.next()? {
        let seq = u64::try_from(row.get::<_, i64>(0)?).unwrap_or(0);
        if seq != expected_seq {
            return Err(broken(
                expected_seq,
                Tamper::SequenceGap,
                format!("expected sequence {expected_seq}, found {seq}"),
            )
            .into());
        }
        let invocation_id = row.get_ref(1)?.as_str().map_err(rusqlite::Error::from)?;
        let kind = row.get_ref(2)?.as_str().map_err(rusqlite::Error::from)?;
        let body = row.get_ref(3)?.as_str().map_err(rusqlite::Error::from)?;
        let recorded_at_ms = row.get::<_, i64>(4)?;
        let Ok(stored) =
            <[u8; 32]>::try_from(row.get_ref(5)?.as_blob().map_err(rusqlite::Error::from)?)
        else {
            return Err(
                broken(seq, Tamper::HashMismatch, "the stored hash is not 32 bytes").into(),
            );
        };
        links.push(
            &ChainedRow {
                seq,
                invocation_id,
                kind,
                body,
                recorded_at_ms,
            },
            stored,
        );
        head = stored;
        if kind == SIGNING_RESUMED
            && let Some(late) = signed_late_range(body, seq)
        {
            // The chain itself says these were signed only at this start.
            if segment.is_some_and(|s| s.first_seq >= late.first) {
                segment = None;
            }
            signed_late.push(late);
        }
        if seq > policy_from {
            segment = Some(match segment {
                None => Segment {
                    first_seq: seq,
                    earliest_ms: recorded_at_ms,
                },
                Some(s) => Segment {
                    earliest_ms: s.earliest_ms.min(recorded_at_ms),
                    ..s
                },
            });
        }
        while let Some(c) = pending.next_if(|c| c.seq == seq) {
            if c.head != head {
                return Err(broken(
                    seq,
                    Tamper::CheckpointMismatch,
                    "signed checkpoint head differs from the chain",
                )
                .into());
            }
            if c.root.is_some()
                && let Some(s) = segment
                && c.made_at_ms > s.earliest_ms + SIGN_INTERVAL_MS + SIGN_SLACK_MS
            {
                return Err(broken(
                    s.first_seq,
                    Tamper::LateSignature,
                    format!(
                        "events {}..={seq} were first signed {} ms after they were recorded \
                         (the policy keeps a checkpoint within {SIGN_INTERVAL_MS} ms): the \
                         checkpoints between them were removed",
                        s.first_seq,
                        c.made_at_ms - s.earliest_ms
                    ),
                )
                .into());
            }
            segment = None;
            last_checkpoint_seq = Some(seq);
            checkpoint_count += 1;
        }
        while pending_heads.next_if(|(_, h)| h.size == seq).is_some() {}
        expected_seq += 1;
    }
    Ok(Scanned {
        last: expected_seq - 1,
        head,
        next_checkpoint: pending.next().map(|c| c.seq),
        next_head: pending_heads.next().map(|(i, _)| i),
        last_checkpoint_seq,
        checkpoint_count,
        signed_late,
    })
}

/// The range a `SIGNING_RESUMED` event at `seq` names, if it is well formed and lies
/// before it.
fn signed_late_range(body: &str, seq: u64) -> Option<SignedLate> {
    #[derive(Deserialize)]
    struct Body {
        first_unsigned: u64,
        last_unsigned: u64,
    }
    let b: Body = serde_json::from_str(body).ok()?;
    (b.first_unsigned <= b.last_unsigned && b.last_unsigned < seq).then_some(SignedLate {
        first: b.first_unsigned,
        last: b.last_unsigned,
        at: seq,
    })
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
