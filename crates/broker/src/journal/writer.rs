//! The writer thread and its group commit: jobs arrive over a channel, each runs in a
//! SAVEPOINT of one IMMEDIATE transaction, the batch commits once (fsynced when a job
//! asked for durability) and only then is every job answered. Also the one write API:
//! [`Journal::write_async`] awaits a job's commit, and [`Journal::write`] is its
//! blocking adapter (same job, same batch, the answer waited for on a thread).
//!
//! Must never: answer a job before its batch committed (and, for a durable one, was
//! fsynced); commit a batch without the checkpoint over the events it adds; let a
//! rolled-back job move the chain position.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use rusqlite::Connection;

use super::append::{ChainPos, ProjectionCache, WriteCtx};
use super::chain::{ChainHasher, Checkpoint};
use super::events::EventBody;
use super::space;
use super::store::{
    Appended, JournalError, RetentionSource, SEARCH_BATCH, StoreFailure, Unrecorded,
};
use crate::clock::Clock;

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

/// Accepted invocations the search index does not hold yet.
pub(super) struct SearchLag {
    pub(super) unindexed: usize,
    pub(super) since: Option<Instant>,
    delay: Duration,
}

impl SearchLag {
    pub(super) fn new(delay: Duration) -> Self {
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

    pub(super) fn lag(&mut self, accepted: usize) {
        if accepted > 0 {
            self.unindexed += accepted;
            self.since.get_or_insert_with(Instant::now);
        }
    }

    /// Whether the waiting invocations should be indexed now.
    pub(super) fn due(&self) -> bool {
        self.unindexed >= SEARCH_BATCH || self.due_in().is_some_and(|d| d.is_zero())
    }

    /// How long until the waiting invocations are due, if any wait.
    fn due_in(&self) -> Option<Duration> {
        self.since
            .map(|since| self.delay.saturating_sub(since.elapsed()))
    }
}

type Finish = Box<dyn FnOnce(Result<(), JournalError>) + Send>;

/// A waited job: `f` runs in the writer's transaction, and `reply` gets its result once
/// the batch committed (and was fsynced, for a durable batch), or the commit's error.
pub(super) fn job<T, F, R>(f: F, reply: R) -> JobFn
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

pub(super) struct JobOutcome {
    pub(super) ok: bool,
    /// The job failed because the disk is full.
    disk_full: bool,
    finish: Finish,
}

/// A job runs inside the batch transaction, or with `None` when the transaction could
/// not begin (it then only reports the failure).
pub(super) type JobFn = Box<dyn FnOnce(Option<&mut WriteCtx<'_>>) -> JobOutcome + Send>;

pub(super) struct Job {
    pub(super) durable: bool,
    pub(super) run: JobFn,
}

pub(super) struct WriterState {
    pub(super) conn: Connection,
    pub(super) cache: ProjectionCache,
    pub(super) pos: ChainPos,
    pub(super) hasher: ChainHasher,
    pub(super) stored: Vec<[u8; 32]>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) signing_key: SigningKey,
    pub(super) retention: Retention,
    /// The witness file beside the database, and the anchor outside the data directory.
    pub(super) witness: PathBuf,
    pub(super) anchor: Option<PathBuf>,
    /// The synchronous mode currently set, to avoid re-issuing the pragma.
    pub(super) sync_full: Option<bool>,
    /// The newest checkpoint, committed but not yet fsynced.
    pub(super) unsynced: Option<Checkpoint>,
    /// The newest fsynced checkpoint not yet written to the witness file and anchor
    /// (written at most every [`SIGN_INTERVAL_MS`]: each write costs an fsync).
    pub(super) outside_pending: Option<Checkpoint>,
    pub(super) outside_written_at: Option<Instant>,
    pub(super) latest_durable: Arc<Mutex<Option<Checkpoint>>>,
    pub(super) db: PathBuf,
    /// The disk-space reserve (see [`space`]).
    pub(super) reserve: PathBuf,
    pub(super) low_space: Arc<AtomicBool>,
    /// When free space was last measured in low-space mode.
    pub(super) last_space_check: Option<Instant>,
    /// Committed batches, to look at the WAL's size now and then.
    pub(super) batches: u64,
    /// The retention policy of stored results, once the broker has set one.
    pub(super) result_retention: Arc<Mutex<Option<RetentionSource>>>,
    /// When the retention policy is next applied.
    pub(super) next_prune: Instant,
    /// What the text search index has yet to take in.
    pub(super) search: SearchLag,
}

impl WriterState {
    pub(super) fn run(mut self, receiver: Receiver<Job>) {
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

    pub(super) fn set_sync(&mut self, full: bool) -> Result<(), rusqlite::Error> {
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

    pub(super) fn run_batch(&mut self, batch: Vec<Job>) {
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
}

/// Runs a statement the writer issues for every batch or job (transaction control)
/// from the connection's statement cache: parsed once, not once per job.
fn run_cached(conn: &Connection, sql: &str) -> Result<(), rusqlite::Error> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Adds every accepted invocation the text search index does not hold yet
/// (`0006_search_index.sql`), in accepted order, read back from `invocations`: the
/// index never has a gap below its newest row, which is what a search relies on to
/// match the invocations above it without the index (`query::scan`).
pub(super) fn index_for_search(conn: &Connection) -> Result<(), rusqlite::Error> {
    run_cached(
        conn,
        "INSERT INTO invocation_search (rowid, text)
         SELECT accepted_seq, target || ' ' || coalesce(summary, '') FROM invocations
         WHERE accepted_seq > (SELECT coalesce(max(id), 0) FROM invocation_search_docsize)
         ORDER BY accepted_seq",
    )
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

impl Journal {
    /// Runs `f` inside the writer's transaction, awaited: the write API. Returns after
    /// commit, and after fsync when `durable`. If `f` fails its writes are rolled back
    /// and nothing else is. The writer's answer wakes this task directly; no runtime
    /// thread waits for the commit (or its fsync), so every invocation in flight can
    /// join one batch.
    ///
    /// Dropping the future does not withdraw the job: it commits (or not) all the same,
    /// exactly as when a [`Journal::write`] caller goes away.
    pub async fn write_async<T, F>(&self, durable: bool, f: F) -> Result<T, JournalError>
    where
        T: Send + 'static,
        F: FnOnce(&mut WriteCtx<'_>) -> Result<T, JournalError> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.enqueue(durable, f, move |result| {
            let _ = tx.send(result);
        })?;
        self.answered(rx.await.map_err(|_| JournalError::Closed)?)
    }

    /// [`Journal::write_async`]'s blocking adapter, for callers on a thread of their
    /// own: the same job in the same group commit, its answer waited for on this
    /// thread. Async code awaits [`Journal::write_async`] instead, which parks no
    /// runtime thread.
    pub fn write<T, F>(&self, durable: bool, f: F) -> Result<T, JournalError>
    where
        T: Send + 'static,
        F: FnOnce(&mut WriteCtx<'_>) -> Result<T, JournalError> + Send + 'static,
    {
        let (tx, rx) = mpsc::sync_channel(1);
        self.enqueue(durable, f, move |result| {
            let _ = tx.send(result);
        })?;
        self.answered(rx.recv().map_err(|_| JournalError::Closed)?)
    }

    /// The writer's answer to a waited job, with a full disk described.
    pub(super) fn answered<T>(&self, result: Result<T, JournalError>) -> Result<T, JournalError> {
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

    /// Hands `f` to the writer; `reply` gets its result once the batch committed, or
    /// the commit's error (see [`job`]). Every write goes through here.
    fn enqueue<T, F, R>(&self, durable: bool, f: F, reply: R) -> Result<(), JournalError>
    where
        T: Send + 'static,
        F: FnOnce(&mut WriteCtx<'_>) -> Result<T, JournalError> + Send + 'static,
        R: FnOnce(Result<T, JournalError>) + Send + 'static,
    {
        let sender = self
            .inner
            .sender
            .lock()
            .map_err(|_| JournalError::Closed)?
            .clone()
            .ok_or(JournalError::Closed)?;
        let job = Job {
            durable,
            run: job(f, reply),
        };
        sender.send(job).map_err(|_| JournalError::Closed)
    }

    /// Appends one event to an existing invocation, checked against its projection;
    /// durable events return only after fsync.
    pub fn append(&self, invocation_id: &str, body: EventBody) -> Result<Appended, JournalError> {
        let id = invocation_id.to_string();
        self.write(body.must_be_durable(), move |ctx| {
            ctx.append_checked(&id, &body)
        })
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
    pub(super) fn pipeline<F>(&self, f: F) -> Result<(), JournalError>
    where
        F: FnOnce(&mut WriteCtx<'_>) -> Result<(), JournalError> + Send + 'static,
    {
        // Nobody waits for the answer: a refusal surfaces at the next waited append.
        self.enqueue(false, f, |_| {})
    }
}

/// A handle to the journal; cheap to clone, shared by every channel and interface.
#[derive(Clone)]
pub struct Journal {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) path: PathBuf,
    pub(super) sender: Mutex<Option<SyncSender<Job>>>,
    pub(super) writer: Mutex<Option<JoinHandle<()>>>,
    pub(super) reader: Mutex<Connection>,
    pub(super) clock: Arc<dyn Clock>,
    /// The public half of the checkpoint signing key, to verify this journal's file.
    pub(super) verifying_key: ed25519_dalek::VerifyingKey,
    /// The same key, for signing retry manifests (never leaves this struct).
    pub(super) manifest_key: SigningKey,
    /// Set by the writer while the disk is full (see [`space`]).
    pub(super) low_space: Arc<AtomicBool>,
    /// Complete responses whose results could not be stored, since this process
    /// started: the operator console's alert (recorded ones are also in the journal).
    pub(super) store_failures: Mutex<Vec<StoreFailure>>,
    /// Invocations refused before their acceptance could be recorded, so `get_invocation`
    /// can still say what happened to them (in memory: nothing else could be written).
    pub(super) unrecorded: Mutex<std::collections::VecDeque<Unrecorded>>,
    /// Set by the writer after each fsynced commit that carried a checkpoint.
    pub(super) latest_durable: Arc<Mutex<Option<Checkpoint>>>,
    /// The retention policy of stored results, read by the writer's periodic pass.
    pub(super) result_retention: Arc<Mutex<Option<RetentionSource>>>,
    /// Authenticates `fetch_result` cursors; derived from the checkpoint signing key so
    /// cursors stay valid across restarts of the same broker.
    pub(super) cursor_key: [u8; 32],
}

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

impl Journal {
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    pub fn now_ms(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    /// Stops the writer after it has drained, with its last checkpoint on disk and
    /// written to the witness file and the anchor.
    pub fn close(self) -> Result<(), JournalError> {
        self.inner.shutdown()
    }
}

/// Which checkpoints are kept: the newest is provisional and is replaced by the next one
/// made within [`SIGN_INTERVAL_MS`] of the last kept one, so the table holds about one
/// checkpoint per interval of activity while every event is still covered within it.
#[derive(Clone, Copy, Default)]
pub(super) struct Retention {
    /// The last kept checkpoint: (seq, made_at_ms).
    pub(super) retained: Option<(u64, i64)>,
    /// The newest checkpoint, kept only if the next one falls in a new window.
    pub(super) provisional: Option<(u64, i64)>,
}

impl WriterState {
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
