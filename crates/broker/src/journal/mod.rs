//! The evidence journal: invocations, append-only events, results and attempt leases in
//! SQLite, behind a single writer thread that group-commits.
//!
//! # Durability promise
//! The database runs in WAL mode. Every append returns only after its transaction has
//! committed. An append of an event whose [`EventBody::must_be_durable`] is true (notably
//! DISPATCH_STARTED and RESULT_COMMITTED) returns only after the WAL has been fsynced:
//! the writer switches the connection to `synchronous=FULL` for any batch that holds
//! such an event. Other batches commit with `synchronous=NORMAL` (no fsync); because the
//! WAL is append-only and ordered, the next fsync makes them durable too, and a process
//! crash (as opposed to a power loss) never loses a committed transaction.
//!
//! # Group commit
//! Appenders hand closures to the writer thread over a channel. The writer drains every
//! job waiting, runs each inside its own SAVEPOINT of one IMMEDIATE transaction (a
//! failing job rolls back alone), commits once, and only then answers all of them. With
//! 64 concurrent invocations, 64 durable appends share one fsync.
//!
//! # Layout
//! - [`events`]: the event vocabulary.
//! - [`projection`]: folding events into the current status; refuses impossible ones.
//! - [`schema`]: numbered migrations embedded in the binary.
//! - [`results`]: the settled-result store (chunked, with a completeness marker).
//! - [`space`]: the disk-space reserve and the low-space mode of a full disk.
//! - [`peer_calls`]: which invocation runs a federated peer's call (at most once per
//!   asking broker and caller invocation).

pub mod chain;
pub mod events;
pub mod merkle;
pub mod peer_calls;
pub mod projection;
pub mod query;
pub mod results;
pub mod schema;
pub mod space;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use rusqlite::{Connection, OptionalExtension, params};

use crate::clock::Clock;
use crate::config::RetentionPolicy;
use chain::{
    CHECKPOINT_COLUMNS, ChainHasher, ChainedRow, Checkpoint, GENESIS, SIGN_INTERVAL_MS,
    checkpoint_row, witness_path, write_checkpoint_file,
};
use events::{Channel, Event, EventBody, JOURNAL_SCOPE};
use merkle::Frontier;
use projection::{Projection, ProjectionError};
pub use results::{ResultLayout, ResultToStore, Settle, StoredResult};

/// How often the writer applies the result retention policy (also once at open).
pub const PRUNE_INTERVAL: Duration = Duration::from_secs(60);

/// Where the writer reads the live retention policy of stored results.
pub type RetentionSource = Arc<dyn Fn() -> RetentionPolicy + Send + Sync>;

/// Jobs drained into one transaction at most; bounds the latency of the first job.
const MAX_BATCH: usize = 512;

/// Under load (at least this many jobs already waiting when a batch starts), the
/// writer waits up to [`GROUP_WAIT`] for more before it commits, as PostgreSQL's
/// `commit_delay` does past `commit_siblings`: a commit's WAL frames, checkpoint
/// signature and fsync are paid once for more steps. A job that arrives alone (one call
/// at a time) is committed at once. Measured at 32 and 64 sessions: about 10 % fewer
/// WAL writes per action and a few percent less daemon CPU at 300 µs; longer waits
/// write less still but cost the closed loop's throughput (docs/benchmarks.md).
const GROUP_MIN: usize = 4;
const GROUP_WAIT: Duration = Duration::from_micros(300);

/// The writer feeds the text search index once this many accepted invocations wait,
/// or once the oldest has waited [`SEARCH_DELAY`] ([`JournalOptions::search_delay`]),
/// or when it is idle: each transaction
/// that adds to the index writes a new segment of it, which cost a commit several
/// pages when every commit did. A search matches the invocations not indexed yet
/// without the index, so nothing is missed meanwhile.
pub const SEARCH_BATCH: usize = 256;

/// See [`SEARCH_BATCH`].
pub const SEARCH_DELAY: Duration = Duration::from_secs(1);

/// Accepted invocations the search index does not hold yet.
struct SearchLag {
    unindexed: usize,
    since: Option<Instant>,
    delay: Duration,
}

impl SearchLag {
    fn new(delay: Duration) -> Self {
        SearchLag {
            unindexed: 0,
            since: None,
            delay,
        }
    }

    /// The index holds everything accepted.
    fn caught_up(&mut self) {
        *self = SearchLag::new(self.delay);
    }

    fn lag(&mut self, accepted: usize) {
        if accepted > 0 {
            self.unindexed += accepted;
            self.since.get_or_insert_with(Instant::now);
        }
    }

    /// Whether the waiting invocations should be indexed now.
    fn due(&self) -> bool {
        self.unindexed >= SEARCH_BATCH || self.due_in().is_some_and(|d| d.is_zero())
    }

    /// How long until the waiting invocations are due, if any wait.
    fn due_in(&self) -> Option<Duration> {
        self.since
            .map(|since| self.delay.saturating_sub(since.elapsed()))
    }
}

/// Errors of the journal. Messages name the file and never contain secret bytes (the
/// journal never holds any).
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("cannot open journal {path}: {detail}")]
    Open { path: PathBuf, detail: String },
    #[error("journal {path} is not a readable Postern database ({detail}); it was left untouched")]
    Corrupt { path: PathBuf, detail: String },
    #[error(
        "journal {path} has schema version {found}, newer than this build supports ({supported}); upgrade Postern — the file was left untouched"
    )]
    NewerSchema {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error("{path} is a SQLite database of another application; it was left untouched")]
    Foreign { path: PathBuf },
    #[error(
        "journal {path} is damaged ({detail}); Postern will not add to it. Run `postern audit verify` for the details, and move the file aside (keep it as evidence) to start a new journal"
    )]
    Damaged { path: PathBuf, detail: String },
    #[error("the journal's disk is full ({detail}); nothing new is accepted until space is freed")]
    DiskFull { detail: String },
    #[error("journal storage failed: {0}")]
    Storage(String),
    #[error("the journal writer has stopped")]
    Closed,
    #[error(transparent)]
    Impossible(#[from] ProjectionError),
    #[error("invocation {0} does not exist")]
    UnknownInvocation(String),
    #[error("invocation {0} already exists")]
    DuplicateInvocation(String),
    #[error("invocation {invocation_id}: lease generation {generation} is no longer current")]
    LeaseLost {
        invocation_id: String,
        generation: u32,
    },
    #[error("invocation {invocation_id}: another attempt holds the lease until {until_ms}")]
    LeaseHeld {
        invocation_id: String,
        until_ms: i64,
    },
    #[error("invocation {invocation_id}: retry budget of {budget} dispatches is spent")]
    BudgetExhausted { invocation_id: String, budget: u32 },
    /// A step found it could not go ahead and recorded the failure that ends the
    /// invocation instead (a changed fingerprint at dispatch, a credential removed since
    /// it was read): the appended failure.
    #[error("invocation {}: a failure was recorded instead; nothing was sent", .0.projection.invocation_id)]
    RecordedInstead(Box<Appended>),
    #[error("invocation {0}: the stored result is missing or incomplete")]
    ResultIncomplete(String),
    #[error("event body in the journal does not parse at sequence {seq}: {detail}")]
    BadEvent { seq: u64, detail: String },
}

impl From<rusqlite::Error> for JournalError {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DiskFull) => JournalError::DiskFull {
                detail: e.to_string(),
            },
            _ => JournalError::Storage(e.to_string()),
        }
    }
}

impl JournalError {
    /// Whether this is the disk running out of space (as opposed to damage or a bug).
    pub fn is_disk_full(&self) -> bool {
        matches!(self, JournalError::DiskFull { .. })
    }
}

/// Settings of an open journal.
pub struct JournalOptions {
    pub clock: Arc<dyn Clock>,
    /// Signs audit checkpoints. Kept in the OS keychain by the broker.
    pub signing_key: SigningKey,
    /// Where to keep a copy of the latest durable checkpoint outside the data directory,
    /// so a journal cut together with its checkpoint rows and witness file still fails
    /// verification against it.
    pub anchor: Option<PathBuf>,
    /// How long accepted invocations may wait for the text search index
    /// ([`SEARCH_DELAY`]; see [`SEARCH_BATCH`]).
    pub search_delay: Duration,
}

impl JournalOptions {
    pub fn new(clock: Arc<dyn Clock>, signing_key: SigningKey) -> Self {
        JournalOptions {
            clock,
            signing_key,
            anchor: None,
            search_delay: SEARCH_DELAY,
        }
    }
}

/// A handle to the journal; cheap to clone, shared by every channel and interface.
#[derive(Clone)]
pub struct Journal {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    sender: Mutex<Option<SyncSender<Job>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    reader: Mutex<Connection>,
    clock: Arc<dyn Clock>,
    /// The public half of the checkpoint signing key, to verify this journal's file.
    verifying_key: ed25519_dalek::VerifyingKey,
    /// The same key, for signing retry manifests (never leaves this struct).
    manifest_key: SigningKey,
    /// Set by the writer while the disk is full (see [`space`]).
    low_space: Arc<AtomicBool>,
    /// Complete responses whose results could not be stored, since this process
    /// started: the operator console's alert (recorded ones are also in the journal).
    store_failures: Mutex<Vec<StoreFailure>>,
    /// Invocations refused before their acceptance could be recorded, so `get_invocation`
    /// can still say what happened to them (in memory: nothing else could be written).
    unrecorded: Mutex<std::collections::VecDeque<Unrecorded>>,
    /// Set by the writer after each fsynced commit that carried a checkpoint.
    latest_durable: Arc<Mutex<Option<Checkpoint>>>,
    /// The retention policy of stored results, read by the writer's periodic pass.
    result_retention: Arc<Mutex<Option<RetentionSource>>>,
    /// Authenticates `fetch_result` cursors; derived from the checkpoint signing key so
    /// cursors stay valid across restarts of the same broker.
    cursor_key: [u8; 32],
}

/// An invocation whose acceptance never reached the journal.
#[derive(Debug, Clone)]
pub struct Unrecorded {
    pub invocation_id: String,
    pub session: Option<String>,
    pub envelope: crate::contract::Envelope,
}

/// A complete response whose result could not be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreFailure {
    pub invocation_id: String,
    pub at_ms: i64,
    /// The journal recorded the failure (RESULT_STORE_FAILED with the settled outcome);
    /// false when even that record failed and the outcome is left unknown.
    pub recorded: bool,
    pub detail: String,
}

/// How many unrecorded invocations are remembered.
const MAX_UNRECORDED: usize = 4096;

/// The result of an append: where it landed and the invocation's new status.
#[derive(Debug, Clone)]
pub struct Appended {
    pub seq: u64,
    pub projection: Projection,
}

/// Facts recorded when an invocation is accepted.
#[derive(Debug, Clone)]
pub struct NewInvocation {
    pub invocation_id: String,
    pub channel: Channel,
    pub target: String,
    pub summary: String,
    pub session: Option<String>,
    pub idempotency_key: Option<String>,
    /// The invocation the broker started this one for, if it did.
    pub parent: Option<crate::record::job::ParentLink>,
}

/// What CREDENTIAL_AUTHORIZED and the attempt's lease record: the credential's id and
/// non-secret version tag, and who takes the lease for how long.
#[derive(Debug, Clone)]
pub struct Authorization {
    pub credential_id: String,
    pub version: String,
    pub holder: String,
    pub ttl_ms: i64,
}

/// What DISPATCH_STARTED records of one connection: the fingerprint of what is about to
/// be sent, the connection's id and the verified peer.
#[derive(Debug, Clone)]
pub struct Dispatch {
    pub fingerprint: String,
    pub connection_id: Option<String>,
    pub peer_identity: Option<String>,
}

type Finish = Box<dyn FnOnce(Result<(), JournalError>) + Send>;

/// A waited job: `f` runs in the writer's transaction, and `reply` gets its result once
/// the batch committed (and was fsynced, for a durable batch), or the commit's error.
fn job<T, F, R>(f: F, reply: R) -> JobFn
where
    T: Send + 'static,
    F: FnOnce(&mut WriteCtx<'_>) -> Result<T, JournalError> + Send + 'static,
    R: FnOnce(Result<T, JournalError>) + Send + 'static,
{
    Box::new(move |ctx| {
        let result = match ctx {
            Some(ctx) => f(ctx),
            None => Err(JournalError::Storage(
                "the write transaction could not begin".into(),
            )),
        };
        JobOutcome {
            ok: result.is_ok(),
            disk_full: result.as_ref().is_err_and(JournalError::is_disk_full),
            // The caller may have gone away; the commit stands either way.
            finish: Box::new(move |commit: Result<(), JournalError>| reply(commit.and(result))),
        }
    })
}
struct JobOutcome {
    ok: bool,
    /// The job failed because the disk is full.
    disk_full: bool,
    finish: Finish,
}
/// A job runs inside the batch transaction, or with `None` when the transaction could
/// not begin (it then only reports the failure).
type JobFn = Box<dyn FnOnce(Option<&mut WriteCtx<'_>>) -> JobOutcome + Send>;
struct Job {
    durable: bool,
    run: JobFn,
}

/// The chain position and the tree's right edge, saved and restored around each job.
#[derive(Clone)]
struct ChainPos {
    last_seq: u64,
    head: [u8; 32],
    frontier: Frontier,
}

/// What a job sees inside the writer's transaction.
pub struct WriteCtx<'a> {
    conn: &'a Connection,
    /// Projections of invocations the writer touched recently. The writer is the only
    /// writer of events, so a cached fold is exact; entries a rolled-back job touched
    /// are dropped.
    cache: &'a mut ProjectionCache,
    /// Invocations this job changed, to forget if the job rolls back.
    touched: Vec<String>,
    pos: ChainPos,
    hasher: &'a mut ChainHasher,
    /// Scratch for the tree hashes one append stores.
    stored: &'a mut Vec<[u8; 32]>,
    now_ms: i64,
    /// The disk is full: new invocations are refused, those in flight go on.
    low_space: bool,
    /// Invocations this job accepted: the text search index gains them later (see
    /// [`SEARCH_BATCH`]).
    accepted: usize,
}

impl WriteCtx<'_> {
    /// The connection, inside the batch transaction.
    pub fn conn(&self) -> &Connection {
        self.conn
    }

    pub fn now_ms(&self) -> i64 {
        self.now_ms
    }

    /// Appends one event with the next sequence number and chain hash. Callers that
    /// write invocation events go through [`WriteCtx::append_checked`].
    fn append_raw(&mut self, invocation_id: &str, body: &EventBody) -> Result<u64, JournalError> {
        let seq = self.pos.last_seq + 1;
        let text = serde_json::to_string(body)
            .map_err(|e| JournalError::Storage(format!("event encoding: {e}")))?;
        let kind = body.kind();
        let hash = self.hasher.link(
            &self.pos.head,
            &ChainedRow {
                seq,
                invocation_id,
                kind,
                body: &text,
                recorded_at_ms: self.now_ms,
            },
        );
        self.conn
            .prepare_cached(
                "INSERT INTO events (seq, invocation_id, kind, body, recorded_at_ms, hash)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                seq as i64,
                invocation_id,
                kind,
                text,
                self.now_ms,
                &hash[..]
            ])?;
        self.pos
            .frontier
            .push(merkle::leaf_hash(seq, &hash), self.stored);
        merkle::store_hashes(self.conn, seq, self.stored)?;
        self.pos.last_seq = seq;
        self.pos.head = hash;
        Ok(seq)
    }

    /// Appends a record that belongs to no invocation: a session's identity (under its
    /// `session:` key) or a journal-level record. Invocation events are refused here;
    /// they go through [`WriteCtx::append_checked`].
    pub fn append_record(&mut self, scope: &str, body: &EventBody) -> Result<u64, JournalError> {
        if !matches!(
            body,
            EventBody::SessionOpened(_)
                | EventBody::SigningResumed { .. }
                | EventBody::AgentPause { .. }
        ) {
            return Err(JournalError::Storage(format!(
                "{} is an invocation event; it cannot be appended as a record",
                body.kind()
            )));
        }
        self.append_raw(scope, body)
    }

    /// Appends without the projection check. Only for building large benchmark
    /// journals; the broker itself always goes through [`WriteCtx::append_checked`].
    #[doc(hidden)]
    pub fn append_unchecked_for_bench(
        &mut self,
        invocation_id: &str,
        body: &EventBody,
    ) -> Result<u64, JournalError> {
        self.append_raw(invocation_id, body)
    }

    /// Records a new invocation (ACTION_ACCEPTED) and its identity row, inside another
    /// step's transaction (see [`Journal::accept`]).
    pub fn accept(&mut self, new: NewInvocation) -> Result<Appended, JournalError> {
        accept_in(self, new)
    }

    /// The invocation's current projection (cached, or folded from its events).
    pub fn projection(&mut self, invocation_id: &str) -> Result<Projection, JournalError> {
        if let Some(p) = self.cache.map.get(invocation_id) {
            return Ok(p.clone());
        }
        let p = self.fold(invocation_id)?;
        self.cache.insert(invocation_id, p.clone());
        Ok(p)
    }

    fn fold(&self, invocation_id: &str) -> Result<Projection, JournalError> {
        let events = load_events(self.conn, invocation_id)?;
        Ok(Projection::fold(invocation_id, &events)?)
    }

    /// The fingerprints bound by other invocations of the same target under
    /// idempotency key `key` (the target is `invocation_id`'s).
    pub fn other_fingerprints_for_key(
        &mut self,
        invocation_id: &str,
        key: &str,
    ) -> Result<Vec<String>, JournalError> {
        let others: Vec<String> = self
            .conn
            .prepare_cached(
                "SELECT o.id FROM invocations o JOIN invocations me ON me.id = ?1
                 WHERE o.target = me.target AND o.idempotency_key = ?2 AND o.id != ?1",
            )?
            .query_map([invocation_id, key], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let mut out = Vec::new();
        for other in others {
            if let Some(fp) = self.projection(&other)?.fingerprint {
                out.push(fp);
            }
        }
        Ok(out)
    }

    /// Appends an invocation event after checking it against the current projection.
    pub fn append_checked(
        &mut self,
        invocation_id: &str,
        body: &EventBody,
    ) -> Result<Appended, JournalError> {
        // Taken out of the cache rather than copied: it goes back, updated, once the
        // event is appended (until then a failure simply leaves it to be folded again).
        let mut projection = match self.cache.map.remove(invocation_id) {
            Some(p) => p,
            None => self.fold(invocation_id)?,
        };
        let accepting = matches!(body, EventBody::ActionAccepted { .. });
        if !projection.exists() && !accepting {
            return Err(JournalError::UnknownInvocation(invocation_id.to_string()));
        }
        let status = |p: &Projection| (p.phase, p.outcome, p.effective_code());
        let before = status(&projection);
        projection.apply(self.pos.last_seq + 1, body)?;
        let seq = self.append_raw(invocation_id, body)?;
        // The status index moves with the events, in the same transaction. An event that
        // leaves the status as it was (most do) does not touch the row or its indexes;
        // an acceptance has no row yet (it is inserted with its status).
        let after = status(&projection);
        if !accepting && after != before {
            self.conn
                .prepare_cached(
                    "UPDATE invocations SET phase = ?1, outcome = ?2, code = ?3 WHERE id = ?4",
                )?
                .execute(params![
                    after.0.as_str(),
                    after.1.as_str(),
                    after.2.map(Code::as_str),
                    invocation_id
                ])?;
        }
        self.touched.push(invocation_id.to_string());
        self.cache.insert(invocation_id, projection.clone());
        Ok(Appended { seq, projection })
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
fn newest_checkpoint(conn: &Connection) -> Result<Option<Checkpoint>, rusqlite::Error> {
    conn.query_row(
        &format!("SELECT {CHECKPOINT_COLUMNS} FROM checkpoints ORDER BY seq DESC LIMIT 1"),
        [],
        checkpoint_row,
    )
    .optional()
    .map(|row| row.and_then(Result::ok))
}

/// The tree's right edge for the `last_seq` events: read from the stored hashes when
/// they are complete and agree with the newest checkpoint, otherwise rebuilt from the
/// events' chain values (a journal from before the tree, or a damaged table; the table
/// is derived data, and verification never trusts it).
fn load_or_rebuild_tree(
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

pub(crate) fn load_events(
    conn: &Connection,
    invocation_id: &str,
) -> Result<Vec<Event>, JournalError> {
    let mut stmt = conn.prepare_cached(
        "SELECT seq, body, recorded_at_ms FROM events WHERE invocation_id = ?1 ORDER BY seq",
    )?;
    let rows = stmt.query_map([invocation_id], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (seq, body, recorded_at_ms) = row?;
        let seq = u64::try_from(seq).unwrap_or(0);
        let body: EventBody = serde_json::from_str(&body).map_err(|e| JournalError::BadEvent {
            seq,
            detail: e.to_string(),
        })?;
        out.push(Event {
            seq,
            invocation_id: invocation_id.to_string(),
            recorded_at_ms,
            body,
        });
    }
    Ok(out)
}

impl Journal {
    /// Opens (creating or migrating) the journal at `path` and starts its writer.
    pub fn open(path: &Path, options: JournalOptions) -> Result<Journal, JournalError> {
        let conn = schema::open_and_migrate(path)?;
        let (last_seq, head) = chain_tail(&conn).map_err(|e| JournalError::Damaged {
            path: path.to_path_buf(),
            detail: format!("reading the end of the audit chain failed: {e}"),
        })?;
        verify_unsigned_tail(&conn, path, last_seq, &head)?;
        let newest = newest_checkpoint(&conn).map_err(|e| JournalError::Damaged {
            path: path.to_path_buf(),
            detail: format!("reading the newest checkpoint failed: {e}"),
        })?;
        let frontier = load_or_rebuild_tree(&conn, path, last_seq, newest.as_ref())?;
        let signed_through = newest.as_ref().map_or(0, |c| c.seq);
        // Invocations accepted before a crash that the search index had not taken in:
        // searches match them without the index, so a failure here (a full disk) only
        // leaves it to the writer.
        let mut search = SearchLag::new(options.search_delay);
        if index_for_search(&conn).is_err() {
            search.lag(1);
        }
        let reader = schema::open_reader(path)?;
        let (sender, receiver) = mpsc::sync_channel::<Job>(4096);
        let verifying_key = options.signing_key.verifying_key();
        let manifest_key = options.signing_key.clone();
        let reserve = space::reserve_path(path);
        let low_space = Arc::new(AtomicBool::new(!space::ensure_reserve(&reserve)));
        let latest_durable = Arc::new(Mutex::new(
            newest.clone().map(|c| c.with_note(&options.signing_key)),
        ));
        let cursor_key = blake3::derive_key(
            "postern 2026 result-cursor v1",
            &options.signing_key.to_bytes(),
        );
        let result_retention: Arc<Mutex<Option<RetentionSource>>> = Arc::new(Mutex::new(None));
        let state = WriterState {
            conn,
            cache: ProjectionCache::default(),
            pos: ChainPos {
                last_seq,
                head,
                frontier,
            },
            hasher: ChainHasher::new(),
            stored: Vec::new(),
            clock: options.clock.clone(),
            signing_key: options.signing_key,
            retention: Retention {
                retained: newest.as_ref().map(|c| (c.seq, c.made_at_ms)),
                provisional: None,
            },
            witness: witness_path(path),
            anchor: options.anchor,
            sync_full: None,
            unsynced: None,
            outside_pending: None,
            outside_written_at: None,
            latest_durable: latest_durable.clone(),
            db: path.to_path_buf(),
            reserve,
            low_space: low_space.clone(),
            last_space_check: None,
            batches: 0,
            result_retention: result_retention.clone(),
            next_prune: Instant::now(),
            search,
        };
        let writer = std::thread::Builder::new()
            .name("postern-journal-writer".into())
            .spawn(move || state.run(receiver))
            .map_err(|e| JournalError::Open {
                path: path.to_path_buf(),
                detail: e.to_string(),
            })?;
        let journal = Journal {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                sender: Mutex::new(Some(sender)),
                writer: Mutex::new(Some(writer)),
                reader: Mutex::new(reader),
                clock: options.clock,
                verifying_key,
                manifest_key,
                low_space,
                unrecorded: Mutex::new(std::collections::VecDeque::new()),
                store_failures: Mutex::new(Vec::new()),
                latest_durable,
                result_retention,
                cursor_key,
            }),
        };
        if last_seq > signed_through {
            // A previous run ended without signing these (or predates per-batch
            // signing): sign them now, and say so in the chain.
            let body = EventBody::SigningResumed {
                first_unsigned: signed_through + 1,
                last_unsigned: last_seq,
                last_checkpoint: signed_through,
            };
            journal.write(true, move |ctx| {
                ctx.append_record(JOURNAL_SCOPE, &body).map(|_| ())
            })?;
        }
        Ok(journal)
    }

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

    /// Whether the disk is full and new invocations are refused (see [`space`]).
    pub fn low_space(&self) -> bool {
        self.inner.low_space.load(Ordering::Relaxed)
    }

    /// Remembers an invocation refused before anything of it was recorded.
    pub fn note_unrecorded(&self, unrecorded: Unrecorded) {
        if let Ok(mut list) = self.inner.unrecorded.lock() {
            if list.len() >= MAX_UNRECORDED {
                list.pop_front();
            }
            list.push_back(unrecorded);
        }
    }

    /// Remembers a complete response whose result could not be stored, for the
    /// operator's alert.
    pub fn note_store_failure(&self, invocation_id: &str, recorded: bool, error: &JournalError) {
        if let Ok(mut list) = self.inner.store_failures.lock() {
            if list.len() >= MAX_UNRECORDED {
                list.remove(0);
            }
            list.push(StoreFailure {
                invocation_id: invocation_id.to_string(),
                at_ms: self.now_ms(),
                recorded,
                detail: error.to_string(),
            });
        }
    }

    /// Every complete response whose result could not be stored: those the journal
    /// recorded (RESULT_STORE_FAILED), oldest first, then those only this process saw.
    pub fn store_failures(&self) -> Result<Vec<StoreFailure>, JournalError> {
        let mut out: Vec<StoreFailure> = {
            let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
            let mut stmt = conn.prepare_cached(
                "SELECT e.invocation_id, e.recorded_at_ms, e.body FROM events e
                 JOIN invocations i ON i.id = e.invocation_id
                 WHERE i.code = 'RESULT_STORE_FAILED' AND e.kind = 'FAILED'
                 ORDER BY e.seq",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (invocation_id, at_ms, body) = row?;
                if let Ok(EventBody::Failed {
                    code: Code::ResultStoreFailed,
                    message,
                    ..
                }) = serde_json::from_str::<EventBody>(&body)
                {
                    out.push(StoreFailure {
                        invocation_id,
                        at_ms,
                        recorded: true,
                        detail: message,
                    });
                }
            }
            out
        };
        if let Ok(list) = self.inner.store_failures.lock() {
            out.extend(list.iter().filter(|f| !f.recorded).cloned());
        }
        Ok(out)
    }

    /// Records that `operator` paused (or resumed) agent calls; returns once it is on
    /// disk.
    pub fn record_agent_pause(&self, paused: bool, operator: &str) -> Result<(), JournalError> {
        let body = EventBody::AgentPause {
            paused,
            operator: operator.to_string(),
        };
        self.write(true, move |ctx| ctx.append_record(JOURNAL_SCOPE, &body))
            .map(|_| ())
    }

    /// Whether the newest recorded pause holds agent calls paused (`false` if the
    /// operator never paused them).
    pub fn agent_pause(&self) -> Result<bool, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        let row: Option<(i64, String)> = conn
            .prepare_cached(
                "SELECT seq, body FROM events WHERE invocation_id = ?1 AND kind = ?2
                 ORDER BY seq DESC LIMIT 1",
            )?
            .query_row([JOURNAL_SCOPE, events::AGENT_PAUSE], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        let Some((seq, body)) = row else {
            return Ok(false);
        };
        match serde_json::from_str::<EventBody>(&body) {
            Ok(EventBody::AgentPause { paused, .. }) => Ok(paused),
            _ => Err(JournalError::BadEvent {
                seq: seq as u64,
                detail: format!(
                    "an {} record that does not read as one",
                    events::AGENT_PAUSE
                ),
            }),
        }
    }

    /// The newest `limit` incidents of calls through peer brokers (PEER_INCIDENT),
    /// newest first.
    pub fn peer_incidents(&self, limit: usize) -> Result<Vec<Event>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        let mut stmt = conn.prepare_cached(
            "SELECT seq, invocation_id, recorded_at_ms, body FROM events
             WHERE kind = 'PEER_INCIDENT' ORDER BY seq DESC LIMIT ?1",
        )?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = stmt.query_map([limit], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, invocation_id, recorded_at_ms, body) = row?;
            let seq = u64::try_from(seq).unwrap_or(0);
            let body: EventBody =
                serde_json::from_str(&body).map_err(|e| JournalError::BadEvent {
                    seq,
                    detail: e.to_string(),
                })?;
            out.push(Event {
                seq,
                invocation_id,
                recorded_at_ms,
                body,
            });
        }
        Ok(out)
    }

    /// What was answered for an invocation that was never recorded, if this process
    /// refused it.
    pub fn unrecorded(&self, invocation_id: &str) -> Option<Unrecorded> {
        let list = self.inner.unrecorded.lock().ok()?;
        list.iter()
            .rev()
            .find(|u| u.invocation_id == invocation_id)
            .cloned()
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
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
    ) -> crate::federation::Attestation {
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

    pub fn now_ms(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    /// Runs `f` inside the writer's transaction. Returns after commit, and after fsync
    /// when `durable`. If `f` fails its writes are rolled back and nothing else is.
    ///
    /// This blocks the calling thread until then: async code awaits
    /// [`Journal::write_async`] instead, which parks no runtime thread.
    pub fn write<T, F>(&self, durable: bool, f: F) -> Result<T, JournalError>
    where
        T: Send + 'static,
        F: FnOnce(&mut WriteCtx<'_>) -> Result<T, JournalError> + Send + 'static,
    {
        let (tx, rx) = mpsc::sync_channel(1);
        self.submit(Job {
            durable,
            run: job(f, move |result| {
                let _ = tx.send(result);
            }),
        })?;
        self.answered(rx.recv().map_err(|_| JournalError::Closed)?)
    }

    /// [`Journal::write`] for async callers: the same job in the same group commit,
    /// awaited. The writer's answer wakes this task directly; no runtime thread waits
    /// for the commit (or its fsync), so every invocation in flight can join one batch.
    ///
    /// Dropping the future does not withdraw the job: it commits (or not) all the same,
    /// exactly as when a [`Journal::write`] caller goes away.
    pub async fn write_async<T, F>(&self, durable: bool, f: F) -> Result<T, JournalError>
    where
        T: Send + 'static,
        F: FnOnce(&mut WriteCtx<'_>) -> Result<T, JournalError> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(Job {
            durable,
            run: job(f, move |result| {
                let _ = tx.send(result);
            }),
        })?;
        self.answered(rx.await.map_err(|_| JournalError::Closed)?)
    }

    /// The writer's answer to a waited job, with a full disk described.
    fn answered<T>(&self, result: Result<T, JournalError>) -> Result<T, JournalError> {
        match result {
            Err(JournalError::DiskFull { detail }) => Err(JournalError::DiskFull {
                detail: format!("{detail}; {}", space::describe(&self.inner.path)),
            }),
            other => other,
        }
    }

    /// Waits until every append queued before this call has been applied.
    pub fn flush(&self) -> Result<(), JournalError> {
        self.write(false, |_| Ok(()))
    }

    fn submit(&self, job: Job) -> Result<(), JournalError> {
        let sender = self
            .inner
            .sender
            .lock()
            .map_err(|_| JournalError::Closed)?
            .clone()
            .ok_or(JournalError::Closed)?;
        sender.send(job).map_err(|_| JournalError::Closed)
    }

    /// Queues an append without waiting for its commit. The single writer applies jobs
    /// in order, so a later waited append sees it; if it is refused, every later event
    /// that depends on it is refused too and the error surfaces there. Only for markers
    /// whose loss in a crash the contract tolerates (markers help diagnosis and prove
    /// nothing); a durable transition always waits.
    pub fn append_pipelined(
        &self,
        invocation_id: &str,
        body: EventBody,
    ) -> Result<(), JournalError> {
        if body.must_be_durable() {
            return self.append(invocation_id, body).map(|_| ());
        }
        let id = invocation_id.to_string();
        self.pipeline(move |ctx| ctx.append_checked(&id, &body).map(|_| ()))
    }

    /// Queues `f` for the writer without waiting for it (see `append_pipelined`).
    fn pipeline<F>(&self, f: F) -> Result<(), JournalError>
    where
        F: FnOnce(&mut WriteCtx<'_>) -> Result<(), JournalError> + Send + 'static,
    {
        let run: JobFn = Box::new(move |ctx| {
            let result = match ctx {
                Some(ctx) => f(ctx),
                None => Err(JournalError::Closed),
            };
            JobOutcome {
                ok: result.is_ok(),
                disk_full: result.as_ref().is_err_and(JournalError::is_disk_full),
                finish: Box::new(|_| {}),
            }
        });
        self.submit(Job {
            durable: false,
            run,
        })
    }

    /// RESULT_DELIVERED for `invocation_id`, if it has ended and is not yet recorded as
    /// delivered; waits for the commit.
    pub fn delivered(&self, invocation_id: &str) -> Result<(), JournalError> {
        self.write(false, delivered_job(invocation_id))
    }

    /// [`Journal::delivered`] queued without waiting: the writer applies it in order,
    /// before anything appended after this call (a later DELIVERY_FAILED of the same
    /// invocation is then refused by its projection). RESULT_DELIVERED proves a handoff
    /// already made; it gates nothing, so no caller waits for it.
    pub fn delivered_pipelined(&self, invocation_id: &str) -> Result<(), JournalError> {
        self.pipeline(delivered_job(invocation_id))
    }

    /// Records a new invocation (ACTION_ACCEPTED) and its identity row.
    pub fn accept(&self, new: NewInvocation) -> Result<Appended, JournalError> {
        self.write(false, move |ctx| accept_in(ctx, new))
    }

    /// Accepts `new` as the invocation that runs the peer call `call`, recording both in
    /// one transaction, unless the call already has an invocation other than
    /// `replacing` (see [`peer_calls::accept`]). Refused like [`Journal::accept`] in
    /// low-space mode.
    pub fn accept_peer_call(
        &self,
        call: peer_calls::PeerCall,
        replacing: Option<String>,
        new: NewInvocation,
    ) -> Result<peer_calls::PeerAccept, JournalError> {
        self.write(false, move |ctx| {
            peer_calls::accept(ctx, call, replacing, new)
        })
    }

    /// Records a federated peer's request nonce, durably (fsynced), forgetting those
    /// issued before `forget_before_ms`; `false` when it was already recorded: the
    /// request is a replay, also across a restart of this broker.
    pub fn remember_peer_nonce(
        &self,
        asker: &str,
        nonce: &str,
        issued_at_ms: i64,
        forget_before_ms: i64,
    ) -> Result<bool, JournalError> {
        let (asker, nonce) = (asker.to_string(), nonce.to_string());
        self.write(true, move |ctx| {
            peer_calls::remember_nonce(ctx, &asker, &nonce, issued_at_ms, forget_before_ms)
        })
    }

    /// The recorded peer call `caller_invocation` of `asker`.
    pub fn peer_call(
        &self,
        asker: &str,
        caller_invocation: &str,
    ) -> Result<Option<peer_calls::PeerCall>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        peer_calls::find(&conn, asker, caller_invocation)
    }

    /// The peer call `invocation_id` runs, if any.
    pub fn peer_call_of(
        &self,
        invocation_id: &str,
    ) -> Result<Option<peer_calls::PeerCall>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        peer_calls::of_invocation(&conn, invocation_id)
    }

    /// Appends one event to an existing invocation, checked against its projection;
    /// durable events return only after fsync.
    pub fn append(&self, invocation_id: &str, body: EventBody) -> Result<Appended, JournalError> {
        let id = invocation_id.to_string();
        self.write(body.must_be_durable(), move |ctx| {
            ctx.append_checked(&id, &body)
        })
    }

    /// Takes the lease for the next attempt. Fails with `LeaseHeld` while another holder's
    /// lease is live.
    pub fn start_attempt(
        &self,
        invocation_id: &str,
        holder: &str,
        ttl_ms: i64,
    ) -> Result<Appended, JournalError> {
        self.write(
            false,
            start_attempt_job(invocation_id, Vec::new(), holder, ttl_ms),
        )
    }

    /// CREDENTIAL_AUTHORIZED and the next attempt's lease, in one transaction that also
    /// records the credential's use (its last-used time, in the same database: no second
    /// writer contends for it). When the credential was removed since it was read, no
    /// secret is handed out for a credential that no longer exists: the invocation ends
    /// with CREDENTIAL_MISSING, recorded in this transaction
    /// (`Err(JournalError::RecordedInstead)`). Awaited without blocking a runtime thread.
    pub async fn authorize_and_start(
        &self,
        invocation_id: &str,
        authorization: Authorization,
    ) -> Result<Appended, JournalError> {
        let job = authorize_job(invocation_id, authorization, None);
        recorded_instead(self.write_async(false, job).await?)
    }

    /// A start deferred to the dispatch gate ([`Journal::authorize_and_dispatch`]) that
    /// is recorded on its own instead, because the attempt ends before the gate: what
    /// [`Journal::authorize_and_start`] records. The attempt must start as generation
    /// `expected`, the one its connections were named after; if another holder started
    /// one first, nothing is recorded (`LeaseLost`).
    pub fn authorize_deferred(
        &self,
        invocation_id: &str,
        authorization: Authorization,
        expected: u32,
    ) -> Result<Appended, JournalError> {
        let job = authorize_job(invocation_id, authorization, Some(expected));
        recorded_instead(self.write(false, job)?)
    }

    /// CREDENTIAL_AUTHORIZED, the attempt's lease and DISPATCH_STARTED in one fsynced
    /// transaction, for a channel whose credential is first used in the request the gate
    /// releases (HTTP): one commit where [`Journal::authorize_and_start`] and
    /// [`Journal::dispatch_started_async`] take two, with the connection set up in
    /// between. Every check of both is made, in the same order; a credential removed
    /// since it was read ends the invocation with CREDENTIAL_MISSING instead, and a
    /// changed fingerprint with FINGERPRINT_MISMATCH, both recorded in this transaction
    /// (`Err(JournalError::RecordedInstead)`). The attempt must start as generation
    /// `expected` (see [`Journal::authorize_deferred`]).
    pub async fn authorize_and_dispatch(
        &self,
        invocation_id: &str,
        authorization: Authorization,
        expected: u32,
        dispatch: Dispatch,
    ) -> Result<Appended, JournalError> {
        let start = authorize_job(invocation_id, authorization, Some(expected));
        let dispatch = dispatch_job(invocation_id, expected, dispatch);
        let dispatched = self
            .write_async(true, move |ctx| match start(ctx)? {
                Ok(_) => dispatch(ctx),
                Err(failed) => Ok(Err(failed)),
            })
            .await?;
        recorded_instead(dispatched)
    }

    /// Closes the current attempt if its lease expired before it ended, recording what
    /// it proves (unknown if it dispatched, not_attempted otherwise). Returns whether it
    /// closed one.
    pub fn reap_expired(&self, invocation_id: &str) -> Result<bool, JournalError> {
        let id = invocation_id.to_string();
        self.write(true, move |ctx| reap_expired(ctx, &id))
    }

    /// Appends DISPATCH_STARTED (fsynced) if and only if `generation` still holds a live
    /// lease, the fingerprint is the bound one and the retry budget allows another
    /// dispatch. The checks and the append are one transaction, so a holder whose lease
    /// expired is stopped here, before any byte is sent.
    pub fn dispatch_started(
        &self,
        invocation_id: &str,
        generation: u32,
        dispatch: Dispatch,
    ) -> Result<Appended, JournalError> {
        recorded_instead(self.write(true, dispatch_job(invocation_id, generation, dispatch))?)
    }

    /// [`Journal::dispatch_started`], awaited without blocking a runtime thread.
    pub async fn dispatch_started_async(
        &self,
        invocation_id: &str,
        generation: u32,
        dispatch: Dispatch,
    ) -> Result<Appended, JournalError> {
        let job = dispatch_job(invocation_id, generation, dispatch);
        recorded_instead(self.write_async(true, job).await?)
    }

    /// Stores a settled result and appends RESULT_COMMITTED in one fsynced transaction,
    /// after `preceding` events (the exchange's markers) in the same transaction.
    pub fn commit_result(
        &self,
        invocation_id: &str,
        preceding: Vec<EventBody>,
        result: ResultToStore,
        settle: Settle,
    ) -> Result<Appended, JournalError> {
        self.write(true, commit_job(invocation_id, preceding, result, settle))
    }

    /// [`Journal::commit_result`], awaited without blocking a runtime thread.
    pub async fn commit_result_async(
        &self,
        invocation_id: &str,
        preceding: Vec<EventBody>,
        result: ResultToStore,
        settle: Settle,
    ) -> Result<Appended, JournalError> {
        self.write_async(true, commit_job(invocation_id, preceding, result, settle))
            .await
    }

    /// Keeps the request an invocation was accepted with (see `0003_requests.sql`).
    /// Pipelined: only a later retry reads it, after waited appends that follow it.
    pub fn store_request(
        &self,
        invocation_id: &str,
        meta: serde_json::Value,
        body: Vec<u8>,
    ) -> Result<(), JournalError> {
        let id = invocation_id.to_string();
        let meta = encode_request(&meta)?;
        self.pipeline(move |ctx| insert_request(ctx, &id, &meta, &body))
    }

    /// The request an invocation was accepted with.
    pub fn load_request(
        &self,
        invocation_id: &str,
    ) -> Result<Option<(serde_json::Value, Vec<u8>)>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        let row: Option<(String, Vec<u8>)> = conn
            .query_row(
                "SELECT meta, body FROM requests WHERE invocation_id = ?1",
                [invocation_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        row.map(|(meta, body)| {
            serde_json::from_str(&meta)
                .map(|m| (m, body))
                .map_err(|e| JournalError::Storage(format!("stored request: {e}")))
        })
        .transpose()
    }

    /// All events of one invocation, in sequence order.
    pub fn events(&self, invocation_id: &str) -> Result<Vec<Event>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        load_events(&conn, invocation_id)
    }

    /// The invocations the broker started for `invocation_id` (followed redirects, its
    /// job, job polls, reconcile queries), oldest first.
    pub fn children(
        &self,
        invocation_id: &str,
    ) -> Result<Vec<crate::record::job::ParentLink>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        let mut stmt = conn.prepare_cached(
            "SELECT id, relation FROM invocations WHERE parent_id = ?1 ORDER BY accepted_seq",
        )?;
        let rows = stmt.query_map([invocation_id], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?))
        })?;
        let mut children = Vec::new();
        for row in rows {
            let (id, relation) = row?;
            let Some(relation) = relation
                .as_deref()
                .and_then(crate::record::job::Relation::parse)
            else {
                return Err(JournalError::Storage(format!(
                    "invocation {id} names {invocation_id} as its parent without a known relation"
                )));
            };
            children.push(crate::record::job::ParentLink {
                invocation_id: id,
                relation,
            });
        }
        Ok(children)
    }

    /// The current status of one invocation.
    pub fn projection(&self, invocation_id: &str) -> Result<Projection, JournalError> {
        let events = self.events(invocation_id)?;
        if events.is_empty() {
            return Err(JournalError::UnknownInvocation(invocation_id.to_string()));
        }
        Ok(Projection::fold(invocation_id, &events)?)
    }

    /// Sets where the writer reads the retention policy of stored results, and applies
    /// it once now. Returns how many results expired in this first pass.
    pub fn set_result_retention(&self, source: RetentionSource) -> Result<usize, JournalError> {
        let policy = source();
        if let Ok(mut slot) = self.inner.result_retention.lock() {
            *slot = Some(source);
        }
        self.prune_results(policy)
    }

    /// Applies `policy` to the stored results now: RESULT_EXPIRED for each result
    /// removed, oldest first. Only result rows are deleted; events never are.
    pub fn prune_results(&self, policy: RetentionPolicy) -> Result<usize, JournalError> {
        let mut total = 0;
        loop {
            let n = self.write(false, move |ctx| results::prune_step(ctx, policy))?;
            total += n;
            if n < results::PRUNE_BATCH {
                return Ok(total);
            }
        }
    }

    /// The key `fetch_result` cursors are authenticated with.
    pub fn cursor_key(&self) -> &[u8; 32] {
        &self.inner.cursor_key
    }

    /// A stored result's streams and digest without its bytes (see
    /// [`results::layout`]).
    pub fn result_layout(&self, result_id: &str) -> Result<ResultLayout, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        results::layout(&conn, result_id)
    }

    /// `len` bytes of one stream of a stored result, from `offset`.
    pub fn read_result_range(
        &self,
        result_id: &str,
        stream: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        results::read_range(&conn, result_id, stream, offset, len)
    }

    /// Reads a stored result back, checking its completeness marker and digest.
    pub fn read_result(&self, result_id: &str) -> Result<StoredResult, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        results::read(&conn, result_id)
    }

    /// The most recently accepted invocation, if any.
    pub fn newest_invocation(&self) -> Result<Option<String>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        Ok(conn
            .query_row(
                "SELECT id FROM invocations ORDER BY accepted_seq DESC LIMIT 1",
                [],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Finds an invocation by target and idempotency key.
    pub fn find_by_idempotency_key(
        &self,
        target: &str,
        key: &str,
    ) -> Result<Option<String>, JournalError> {
        let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
        Ok(conn
            .query_row(
                "SELECT id FROM invocations WHERE target = ?1 AND idempotency_key = ?2
                 ORDER BY accepted_seq LIMIT 1",
                [target, key],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Invocations whose last attempt never reached a terminal record: what a crash
    /// interrupted.
    pub fn interrupted(&self) -> Result<Vec<Projection>, JournalError> {
        let ids: Vec<String> = {
            let conn = self.inner.reader.lock().map_err(|_| JournalError::Closed)?;
            let mut stmt = conn.prepare(
                "SELECT invocation_id FROM events WHERE seq IN
                   (SELECT max(seq) FROM events
                    WHERE invocation_id IN (SELECT id FROM invocations)
                    GROUP BY invocation_id)
                 AND kind NOT IN ('RESULT_COMMITTED', 'RESULT_DELIVERED', 'DELIVERY_FAILED',
                                  'RESULT_EXPIRED',
                                  'FAILED', 'RECONCILED', 'RETRY_MANIFEST', 'JOB_TRACKED',
                                  'JOB_STATUS', 'MEMBER_RECONCILED')
                 ORDER BY seq",
            )?;
            stmt.query_map([], |r| r.get(0))?
                .collect::<Result<_, _>>()?
        };
        let mut out = Vec::new();
        for id in ids {
            let p = self.projection(&id)?;
            if !p.terminal {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// Closes every interrupted invocation with a FAILED record that says what the
    /// evidence proves: unknown after dispatch, not_attempted before. Run at startup.
    pub fn recover_interrupted(&self) -> Result<Vec<String>, JournalError> {
        let now = self.now_ms();
        let mut closed = Vec::new();
        for p in self.interrupted()? {
            let (code, retry, message) = if p.attempt.dispatched {
                (
                    Code::RemoteOutcomeUnknown,
                    p.retry(now),
                    "The broker stopped after dispatch and before a complete response; the remote may have acted.",
                )
            } else {
                (
                    Code::BrokerInterrupted,
                    Retry::Backoff,
                    "The broker stopped before dispatch; nothing was sent.",
                )
            };
            let outcome = if p.attempt.dispatched {
                Outcome::Unknown
            } else {
                Outcome::NotAttempted
            };
            let body = EventBody::Failed {
                phase: p.phase,
                outcome,
                retry,
                code,
                message: message.to_string(),
                field: None,
            };
            self.append(&p.invocation_id, body)?;
            closed.push(p.invocation_id);
        }
        Ok(closed)
    }

    /// Stops the writer after it has drained, with its last checkpoint on disk and
    /// written to the witness file and the anchor.
    pub fn close(self) -> Result<(), JournalError> {
        self.inner.shutdown()
    }
}

use crate::contract::{Code, Outcome, Phase, Retry};

impl Inner {
    fn shutdown(&self) -> Result<(), JournalError> {
        if let Ok(mut sender) = self.sender.lock() {
            sender.take();
        }
        let handle = self.writer.lock().map_err(|_| JournalError::Closed)?.take();
        if let Some(handle) = handle {
            handle
                .join()
                .map_err(|_| JournalError::Storage("journal writer panicked".into()))?;
        }
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // A clean shutdown makes the last checkpoint durable; errors have nowhere to go.
        let _ = self.shutdown();
    }
}

/// The job of [`Journal::start_attempt`], after `preceding` events (a credential's
/// authorization) in the same transaction.
fn start_attempt_job(
    invocation_id: &str,
    preceding: Vec<EventBody>,
    holder: &str,
    ttl_ms: i64,
) -> impl FnOnce(&mut WriteCtx<'_>) -> Result<Appended, JournalError> + Send + use<> {
    let id = invocation_id.to_string();
    let holder = holder.to_string();
    move |ctx| {
        for body in &preceding {
            ctx.append_checked(&id, body)?;
        }
        let now = ctx.now_ms();
        let lease: Option<(i64, String, i64)> = ctx
            .conn()
            .prepare_cached(
                "SELECT generation, holder, expires_at_ms FROM leases WHERE invocation_id = ?1",
            )?
            .query_row([&id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()?;
        if let Some((_, current, until)) = &lease
            && *until > now
            && *current != holder
        {
            return Err(JournalError::LeaseHeld {
                invocation_id: id,
                until_ms: *until,
            });
        }
        reap_expired(ctx, &id)?;
        let projection = ctx.projection(&id)?;
        let generation = projection.attempt.generation + 1;
        let expires = now.saturating_add(ttl_ms);
        let appended = ctx.append_checked(
            &id,
            &EventBody::AttemptStarted {
                generation,
                holder: holder.clone(),
                lease_expires_at_ms: expires,
            },
        )?;
        ctx.conn()
            .prepare_cached(
                "INSERT INTO leases (invocation_id, generation, holder, expires_at_ms)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (invocation_id) DO UPDATE SET
                   generation = excluded.generation, holder = excluded.holder,
                   expires_at_ms = excluded.expires_at_ms",
            )?
            .execute(params![id, generation, holder, expires])?;
        Ok(appended)
    }
}

/// What a step whose job may record a failure instead returns to its caller: the
/// appended step, or that failure as [`JournalError::RecordedInstead`].
fn recorded_instead(step: Result<Appended, Appended>) -> Result<Appended, JournalError> {
    step.map_err(|failed| JournalError::RecordedInstead(Box::new(failed)))
}

/// The job that authorizes the credential and starts the next attempt
/// ([`Journal::authorize_and_start`]): the appended ATTEMPT_STARTED, or, when the
/// credential was removed since it was read, the CREDENTIAL_MISSING failure it recorded
/// instead. With `expected`, an attempt that would start under another generation is
/// refused with nothing recorded.
fn authorize_job(
    invocation_id: &str,
    authorization: Authorization,
    expected: Option<u32>,
) -> impl FnOnce(&mut WriteCtx<'_>) -> Result<Result<Appended, Appended>, JournalError> + Send + 'static
{
    let id = invocation_id.to_string();
    let Authorization {
        credential_id,
        version,
        holder,
        ttl_ms,
    } = authorization;
    let authorized = EventBody::CredentialAuthorized {
        credential_id: credential_id.clone(),
        credential_version: version,
    };
    let start = start_attempt_job(invocation_id, vec![authorized], &holder, ttl_ms);
    move |ctx| {
        let now = ctx.now_ms();
        if !crate::vault::meta::touch_last_used_raw(ctx.conn(), &credential_id, now)? {
            let removed = crate::vault::VaultError::Missing {
                credential: credential_id,
            };
            let code = removed.code();
            let failed = ctx.append_checked(
                &id,
                &EventBody::failed_before_dispatch(
                    Phase::CredentialInjection,
                    code,
                    code.spec().retry,
                    &removed.agent_message(),
                ),
            )?;
            return Ok(Err(failed));
        }
        let started = start(ctx)?;
        let generation = started.projection.attempt.generation;
        if let Some(expected) = expected
            && generation != expected
        {
            return Err(JournalError::LeaseLost {
                invocation_id: id,
                generation: expected,
            });
        }
        Ok(Ok(started))
    }
}

/// The job of [`Journal::dispatch_started`]: the appended DISPATCH_STARTED, or the
/// FINGERPRINT_MISMATCH failure it recorded instead.
fn dispatch_job(
    invocation_id: &str,
    generation: u32,
    dispatch: Dispatch,
) -> impl FnOnce(&mut WriteCtx<'_>) -> Result<Result<Appended, Appended>, JournalError> + Send + 'static
{
    let id = invocation_id.to_string();
    let bound = dispatch.fingerprint.clone();
    let body = EventBody::DispatchStarted {
        generation,
        fingerprint: dispatch.fingerprint,
        connection_id: dispatch.connection_id,
        peer_identity: dispatch.peer_identity,
    };
    move |ctx| {
        let now = ctx.now_ms();
        let lease: Option<(u32, i64)> = ctx
            .conn()
            .prepare_cached(
                "SELECT generation, expires_at_ms FROM leases WHERE invocation_id = ?1",
            )?
            .query_row([&id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        match lease {
            Some((current, until)) if current == generation && until > now => {}
            _ => {
                return Err(JournalError::LeaseLost {
                    invocation_id: id,
                    generation,
                });
            }
        }
        let projection = ctx.projection(&id)?;
        if projection.fingerprint.as_deref() != Some(bound.as_str()) {
            // The request or its bound configuration changed: nothing is sent, and
            // the invocation ends saying so, in this same transaction.
            let failed = ctx.append_checked(
                &id,
                &EventBody::failed_before_dispatch(
                    Phase::Validation,
                    Code::FingerprintMismatch,
                    Retry::AfterCorrection,
                    "The request or its configuration changed after it was bound; nothing was sent.",
                ),
            )?;
            return Ok(Err(failed));
        }
        let budget = projection.operation.as_ref().map_or(1, |o| o.retry_budget);
        if projection.dispatches >= budget {
            return Err(JournalError::BudgetExhausted {
                invocation_id: id,
                budget,
            });
        }
        Ok(Ok(ctx.append_checked(&id, &body)?))
    }
}

/// The job of [`Journal::commit_result`].
fn commit_job(
    invocation_id: &str,
    preceding: Vec<EventBody>,
    result: ResultToStore,
    settle: Settle,
) -> impl FnOnce(&mut WriteCtx<'_>) -> Result<Appended, JournalError> + Send + 'static {
    let id = invocation_id.to_string();
    move |ctx| {
        for body in &preceding {
            ctx.append_checked(&id, body)?;
        }
        results::commit(ctx, &id, &result, &settle)
    }
}

/// The job of [`Journal::delivered`]: recorded once, and only for an ended invocation.
fn delivered_job(
    invocation_id: &str,
) -> impl FnOnce(&mut WriteCtx<'_>) -> Result<(), JournalError> + Send + 'static {
    let id = invocation_id.to_string();
    move |ctx| {
        let p = ctx.projection(&id)?;
        if p.terminal && !p.delivered {
            ctx.append_checked(&id, &EventBody::ResultDelivered)?;
        }
        Ok(())
    }
}

/// Runs a statement the writer issues for every batch or job (transaction control)
/// from the connection's statement cache: parsed once, not once per job.
fn run_cached(conn: &Connection, sql: &str) -> Result<(), rusqlite::Error> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// A stored request's metadata as the `requests` table keeps it.
pub(crate) fn encode_request(meta: &serde_json::Value) -> Result<String, JournalError> {
    serde_json::to_string(meta).map_err(|e| JournalError::Storage(format!("request encoding: {e}")))
}

/// Keeps the request `invocation_id` was accepted with (see `0003_requests.sql`).
pub(crate) fn insert_request(
    ctx: &mut WriteCtx<'_>,
    invocation_id: &str,
    meta: &str,
    body: &[u8],
) -> Result<(), JournalError> {
    ctx.conn()
        .prepare_cached(
            "INSERT OR REPLACE INTO requests (invocation_id, meta, body) VALUES (?1, ?2, ?3)",
        )?
        .execute(params![invocation_id, meta, body])?;
    Ok(())
}

/// Adds every accepted invocation the text search index does not hold yet
/// (`0006_search_index.sql`), in accepted order, read back from `invocations`: the
/// index never has a gap below its newest row, which is what a search relies on to
/// match the invocations above it without the index (`query::scan`).
fn index_for_search(conn: &Connection) -> Result<(), rusqlite::Error> {
    run_cached(
        conn,
        "INSERT INTO invocation_search (rowid, text)
         SELECT accepted_seq, target || ' ' || coalesce(summary, '') FROM invocations
         WHERE accepted_seq > (SELECT coalesce(max(id), 0) FROM invocation_search_docsize)
         ORDER BY accepted_seq",
    )
}

fn accept_in(ctx: &mut WriteCtx<'_>, new: NewInvocation) -> Result<Appended, JournalError> {
    if ctx.low_space {
        // The space left belongs to invocations already in flight.
        return Err(JournalError::DiskFull {
            detail: "the journal is keeping its last space for requests already sent".into(),
        });
    }
    let exists: Option<i64> = ctx
        .conn()
        .prepare_cached("SELECT 1 FROM invocations WHERE id = ?1")?
        .query_row([&new.invocation_id], |r| r.get(0))
        .optional()?;
    if exists.is_some() {
        return Err(JournalError::DuplicateInvocation(new.invocation_id));
    }
    let body = EventBody::ActionAccepted {
        channel: new.channel,
        target: new.target.clone(),
        summary: new.summary.clone(),
        session: new.session.clone(),
        parent: new.parent.clone(),
    };
    let appended = ctx.append_checked(&new.invocation_id, &body)?;
    let channel = match new.channel {
        Channel::Http => "http",
        Channel::Ssh => "ssh",
        Channel::Peer => "peer",
    };
    ctx.conn()
        .prepare_cached(
            "INSERT INTO invocations
             (id, accepted_seq, accepted_at_ms, channel, target, session_id, idempotency_key,
              phase, outcome, code, summary, parent_id, relation)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, NULL, ?10, ?11, ?12)",
        )?
        .execute(params![
            new.invocation_id,
            appended.seq as i64,
            ctx.now_ms(),
            channel,
            new.target,
            new.session,
            new.idempotency_key,
            appended.projection.phase.as_str(),
            appended.projection.outcome.as_str(),
            new.summary,
            new.parent.as_ref().map(|l| l.invocation_id.as_str()),
            new.parent.as_ref().map(|l| l.relation.as_str()),
        ])?;
    // Indexed for search later, many at once: the full-text index writes a segment
    // for every transaction it sees data in.
    ctx.accepted += 1;
    Ok(appended)
}

fn reap_expired(ctx: &mut WriteCtx<'_>, id: &str) -> Result<bool, JournalError> {
    let p = ctx.projection(id)?;
    if p.attempt.generation == 0 || p.attempt.closed {
        return Ok(false);
    }
    let until: Option<i64> = ctx
        .conn()
        .prepare_cached("SELECT expires_at_ms FROM leases WHERE invocation_id = ?1")?
        .query_row([id], |r| r.get(0))
        .optional()?;
    if until.is_some_and(|u| u > ctx.now_ms()) {
        return Ok(false);
    }
    let body = if p.attempt.dispatched {
        EventBody::Failed {
            phase: Phase::RemoteExecution,
            outcome: Outcome::Unknown,
            retry: p.retry(ctx.now_ms()),
            code: Code::RemoteOutcomeUnknown,
            message: "The attempt's lease expired after dispatch and before a complete response; the remote may have acted.".into(), field: None }
    } else {
        EventBody::Failed {
            phase: p.phase,
            outcome: Outcome::NotAttempted,
            retry: Retry::Backoff,
            code: Code::BrokerInterrupted,
            message: "The attempt's lease expired before dispatch; nothing was sent.".into(),
            field: None,
        }
    };
    ctx.append_checked(id, &body)?;
    Ok(true)
}

/// A copy of a SQLite error good enough for reporting it to several callers.
fn clone_sqlite_error(e: &rusqlite::Error) -> rusqlite::Error {
    match e {
        rusqlite::Error::SqliteFailure(code, msg) => {
            rusqlite::Error::SqliteFailure(*code, msg.clone())
        }
        other => rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(other.to_string()),
        ),
    }
}

/// Checks the events after the last signed checkpoint before the journal is extended
/// (or signed at shutdown): the checkpointed event must still have the signed head,
/// sequence numbers must be gap-free, and every row must link to the one before. A
/// damaged tail is refused rather than extended (the audit key's signature is not
/// checked here; `postern audit verify` does that).
fn verify_unsigned_tail(
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

fn chain_tail(conn: &Connection) -> Result<(u64, [u8; 32]), JournalError> {
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

/// A bounded map of recent projections; cleared wholesale when full (a miss only costs
/// a fold).
#[derive(Default)]
struct ProjectionCache {
    map: std::collections::HashMap<String, Projection>,
}

impl ProjectionCache {
    const MAX: usize = 4096;

    fn insert(&mut self, id: &str, p: Projection) {
        if self.map.len() >= Self::MAX && !self.map.contains_key(id) {
            self.map.clear();
        }
        self.map.insert(id.to_string(), p);
    }
}

/// Which checkpoints are kept: the newest is provisional and is replaced by the next one
/// made within [`SIGN_INTERVAL_MS`] of the last kept one, so the table holds about one
/// checkpoint per interval of activity while every event is still covered within it.
#[derive(Clone, Copy, Default)]
struct Retention {
    /// The last kept checkpoint: (seq, made_at_ms).
    retained: Option<(u64, i64)>,
    /// The newest checkpoint, kept only if the next one falls in a new window.
    provisional: Option<(u64, i64)>,
}

struct WriterState {
    conn: Connection,
    cache: ProjectionCache,
    pos: ChainPos,
    hasher: ChainHasher,
    stored: Vec<[u8; 32]>,
    clock: Arc<dyn Clock>,
    signing_key: SigningKey,
    retention: Retention,
    /// The witness file beside the database, and the anchor outside the data directory.
    witness: PathBuf,
    anchor: Option<PathBuf>,
    /// The synchronous mode currently set, to avoid re-issuing the pragma.
    sync_full: Option<bool>,
    /// The newest checkpoint, committed but not yet fsynced.
    unsynced: Option<Checkpoint>,
    /// The newest fsynced checkpoint not yet written to the witness file and anchor
    /// (written at most every [`SIGN_INTERVAL_MS`]: each write costs an fsync).
    outside_pending: Option<Checkpoint>,
    outside_written_at: Option<Instant>,
    latest_durable: Arc<Mutex<Option<Checkpoint>>>,
    db: PathBuf,
    /// The disk-space reserve (see [`space`]).
    reserve: PathBuf,
    low_space: Arc<AtomicBool>,
    /// When free space was last measured in low-space mode.
    last_space_check: Option<Instant>,
    /// Committed batches, to look at the WAL's size now and then.
    batches: u64,
    /// The retention policy of stored results, once the broker has set one.
    result_retention: Arc<Mutex<Option<RetentionSource>>>,
    /// When the retention policy is next applied.
    next_prune: Instant,
    /// What the text search index has yet to take in.
    search: SearchLag,
}

impl WriterState {
    fn run(mut self, receiver: Receiver<Job>) {
        loop {
            self.prune_when_due();
            let wait = if self.outside_pending.is_some() || self.unsynced.is_some() {
                Some(self.outside_due_in().min(self.prune_due_in()))
            } else if self.retention_source().is_some() {
                Some(self.prune_due_in())
            } else {
                None
            };
            let wait = match (wait, self.search.due_in()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let first = if let Some(wait) = wait {
                match receiver.recv_timeout(wait) {
                    Ok(job) => job,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        self.index_search_when_due();
                        self.sync_idle();
                        self.write_outside();
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match receiver.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match receiver.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            if batch.len() >= GROUP_MIN {
                let until = Instant::now() + GROUP_WAIT;
                while batch.len() < MAX_BATCH {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    match receiver.recv_timeout(left) {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
            }
            self.run_batch(batch);
        }
        // Clean shutdown: the search index, the last checkpoint on disk, then outside.
        if self.search.since.is_some() {
            self.index_search();
        }
        if let Some(cp) = self.unsynced.take()
            && self.set_sync(true).is_ok()
            && self
                .conn
                .execute_batch("PRAGMA wal_checkpoint(FULL)")
                .is_ok()
        {
            self.published(cp);
        }
        self.write_outside();
    }

    /// Idle: feeds the search index if what waits for it is due.
    fn index_search_when_due(&mut self) {
        if self.search.due() {
            self.index_search();
        }
    }

    /// Feeds the search index in a transaction of its own (no events: no checkpoint).
    fn index_search(&mut self) {
        let indexed = self.set_sync(false).is_ok()
            && run_cached(&self.conn, "BEGIN IMMEDIATE").is_ok()
            && index_for_search(&self.conn).is_ok()
            && run_cached(&self.conn, "COMMIT").is_ok();
        if indexed {
            self.search.caught_up();
        } else {
            let _ = self.conn.execute_batch("ROLLBACK");
            // Tried again after another delay.
            self.search.since = Some(Instant::now());
        }
    }

    fn retention_source(&self) -> Option<RetentionSource> {
        self.result_retention.lock().ok()?.clone()
    }

    fn prune_due_in(&self) -> Duration {
        self.next_prune.saturating_duration_since(Instant::now())
    }

    /// Applies the result retention policy when its interval has passed: batches of
    /// expiries, each its own transaction, until nothing more is due.
    fn prune_when_due(&mut self) {
        if Instant::now() < self.next_prune {
            return;
        }
        self.next_prune = Instant::now() + PRUNE_INTERVAL;
        let Some(source) = self.retention_source() else {
            return;
        };
        let policy = source();
        loop {
            let (tx, rx) = mpsc::sync_channel(1);
            let run: JobFn = Box::new(move |ctx| {
                let result = match ctx {
                    Some(ctx) => results::prune_step(ctx, policy),
                    None => Err(JournalError::Closed),
                };
                JobOutcome {
                    ok: result.is_ok(),
                    disk_full: result.as_ref().is_err_and(JournalError::is_disk_full),
                    finish: Box::new(move |commit: Result<(), JournalError>| {
                        let _ = tx.send(commit.and(result));
                    }),
                }
            });
            self.run_batch(vec![Job {
                durable: false,
                run,
            }]);
            // A failed pass is tried again at the next interval.
            match rx.try_recv() {
                Ok(Ok(n)) if n == results::PRUNE_BATCH => continue,
                _ => break,
            }
        }
    }

    fn set_sync(&mut self, full: bool) -> Result<(), rusqlite::Error> {
        if self.sync_full != Some(full) {
            let pragma = if full {
                "PRAGMA synchronous = FULL"
            } else {
                "PRAGMA synchronous = NORMAL"
            };
            run_cached(&self.conn, pragma)?;
            self.sync_full = Some(full);
        }
        Ok(())
    }

    /// Signs the tree the batch leaves, inside its transaction, and applies the
    /// retention rule. Returns the checkpoint and the retention to adopt on commit.
    fn seal(&self, now_ms: i64) -> Result<(Checkpoint, Retention), rusqlite::Error> {
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
    fn sync_idle(&mut self) {
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
    fn published(&mut self, cp: Checkpoint) {
        self.outside_pending = Some(cp);
    }

    fn outside_due_in(&self) -> Duration {
        let interval = Duration::from_millis(SIGN_INTERVAL_MS as u64);
        self.outside_written_at
            .map_or(Duration::ZERO, |t| interval.saturating_sub(t.elapsed()))
    }

    /// Writes the pending checkpoint to the witness file and the anchor. Best effort:
    /// the signed rows in the database remain the primary record.
    fn write_outside(&mut self) {
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

    fn run_batch(&mut self, batch: Vec<Job>) {
        if self.low_space.load(Ordering::Relaxed) {
            self.try_leave_low_space();
        } else if space::free_bytes(&self.db).is_some_and(|free| free < space::LOW_WATER_BYTES) {
            // Every commit now carries a checkpoint and tree hashes, so the disk can fill
            // on any commit: stop taking new work while the reserve is still there.
            self.enter_low_space();
        }
        let low_space = self.low_space.load(Ordering::Relaxed);
        let mut disk_full = false;
        let durable = batch.iter().any(|j| j.durable);
        let start = self.pos.clone();
        let now_ms = self.clock.now_ms();
        let mut finishes: Vec<Finish> = Vec::with_capacity(batch.len());

        let begun = self
            .set_sync(durable)
            .and_then(|_| run_cached(&self.conn, "BEGIN IMMEDIATE"));
        if let Err(e) = begun {
            for job in batch {
                // The job never ran; tell its caller why.
                let outcome = (job.run)(None);
                (outcome.finish)(Err(JournalError::from(clone_sqlite_error(&e))));
            }
            if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
                self.enter_low_space();
            }
            return;
        }

        let mut jobs = batch.into_iter();
        let mut rolled_back = false;
        let mut accepted = 0;
        for job in jobs.by_ref() {
            let savepoint = run_cached(&self.conn, "SAVEPOINT job");
            // The job works on a copy of the position; `self.pos` stays as it was until
            // the job is kept.
            let mut ctx = WriteCtx {
                conn: &self.conn,
                cache: &mut self.cache,
                touched: Vec::new(),
                pos: self.pos.clone(),
                hasher: &mut self.hasher,
                stored: &mut self.stored,
                now_ms,
                low_space,
                accepted: 0,
            };
            let outcome = (job.run)(Some(&mut ctx));
            disk_full |= outcome.disk_full;
            let (pos, touched, job_accepted) = (ctx.pos, ctx.touched, ctx.accepted);
            let kept =
                savepoint.is_ok() && outcome.ok && run_cached(&self.conn, "RELEASE job").is_ok();
            if kept {
                self.pos = pos;
                accepted += job_accepted;
            } else {
                // Undo only this job's writes; the chain position stays where it was.
                let _ = self.conn.execute_batch("ROLLBACK TO job; RELEASE job");
                for id in touched {
                    self.cache.map.remove(&id);
                }
            }
            finishes.push(outcome.finish);
            // On SQLITE_FULL mid-statement (a large result spilling to a full disk) SQLite
            // may roll back the whole transaction: nothing of the batch is kept, and a
            // later job must not run outside it, where RELEASE would commit it unsealed.
            if self.conn.is_autocommit() {
                rolled_back = true;
                break;
            }
        }
        if rolled_back {
            let lost = || {
                let detail = "the transaction was rolled back; nothing of it was kept";
                if disk_full {
                    JournalError::DiskFull {
                        detail: detail.into(),
                    }
                } else {
                    JournalError::Storage(detail.into())
                }
            };
            for job in jobs {
                let outcome = (job.run)(None);
                (outcome.finish)(Err(lost()));
            }
            self.pos = start;
            self.cache.map.clear();
            for finish in finishes {
                finish(Err(lost()));
            }
            if disk_full {
                self.enter_low_space();
            }
            return;
        }

        // The search index when enough is waiting, then a checkpoint over every event
        // the commit adds.
        // (Counted before the commit: if it fails, the count only brings the next feed
        // forward; the feed reads what `invocations` holds.)
        self.search.lag(accepted);
        let index_now = self.search.due();
        let indexed = if index_now {
            index_for_search(&self.conn)
        } else {
            Ok(())
        };
        let sealed = indexed.and_then(|()| {
            if self.pos.last_seq > start.last_seq {
                self.seal(now_ms).map(Some)
            } else {
                Ok(None)
            }
        });
        match sealed.and_then(|s| run_cached(&self.conn, "COMMIT").map(|_| s)) {
            Ok(sealed) => {
                if index_now {
                    self.search.caught_up();
                }
                if let Some((cp, retention)) = sealed {
                    self.retention = retention;
                    self.unsynced = Some(cp);
                }
                // Outside copies must never be ahead of what is on disk, or a power loss
                // would look like truncation: only after an fsynced commit.
                if durable && let Some(cp) = self.unsynced.take() {
                    self.published(cp);
                    if self.outside_due_in().is_zero() {
                        self.write_outside();
                    }
                }
                for finish in finishes {
                    finish(Ok(()));
                }
                self.batches = self.batches.wrapping_add(1);
                if self.batches.is_multiple_of(32) {
                    self.trim_wal();
                }
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                self.pos = start;
                self.cache.map.clear();
                let full = e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull);
                disk_full |= full;
                for finish in finishes {
                    finish(Err(if full {
                        JournalError::DiskFull {
                            detail: format!("commit failed: {e}"),
                        }
                    } else {
                        JournalError::Storage(format!("commit failed: {e}"))
                    }));
                }
            }
        }
        if disk_full {
            self.enter_low_space();
        }
    }

    /// The disk is full: give the reserve back so invocations in flight can settle,
    /// fold the WAL into the database, and refuse new invocations (see [`space`]).
    fn enter_low_space(&mut self) {
        if !self.low_space.swap(true, Ordering::Relaxed) {
            space::release_reserve(&self.reserve);
        }
        self.last_space_check = Some(Instant::now());
        let _ = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)");
    }

    /// Leaves low-space mode once the filesystem has room for the reserve twice over
    /// and the reserve could be written again. Measured at most every 200 ms.
    fn try_leave_low_space(&mut self) {
        if self
            .last_space_check
            .is_some_and(|t| t.elapsed() < Duration::from_millis(200))
        {
            return;
        }
        self.last_space_check = Some(Instant::now());
        let enough =
            space::free_bytes(&self.db).is_none_or(|free| free >= 2 * space::RESERVE_BYTES);
        if !enough {
            return;
        }
        // Fold the WAL into the database first: it may hold most of the used space.
        let _ = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)");
        if space::ensure_reserve(&self.reserve) {
            self.low_space.store(false, Ordering::Relaxed);
        }
    }

    /// Checkpoints and truncates a WAL that grew past [`space::WAL_CHECKPOINT_AT`]
    /// (passive checkpoints cannot reset it while readers keep coming).
    fn trim_wal(&mut self) {
        let mut wal = self.db.as_os_str().to_os_string();
        wal.push("-wal");
        if std::fs::metadata(&wal).is_ok_and(|m| m.len() > space::WAL_CHECKPOINT_AT) {
            let _ = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)");
        }
    }
}
