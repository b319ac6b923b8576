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
//! The store is [`Journal`]; its methods live beside what they do, as `impl Journal`
//! blocks of one file each:
//! - [`writer`]: the writer thread and group commit; the write API ([`Journal::write_async`],
//!   and [`Journal::write`], its blocking adapter).
//! - [`append`]: what a job sees in the writer's transaction ([`WriteCtx`]): the checked,
//!   chained append.
//! - [`invocations`]: acceptance, stored requests, committed results, delivery.
//! - [`leases`]: attempts, their leases, the credential's authorization and the dispatch
//!   gate.
//! - [`checkpoints`]: signing and cosigning, and the checks of the chain at open.
//! - [`retention`]: the retention policy of stored results.
//! - [`space`]: the disk-space reserve and the low-space mode of a full disk.
//! - [`failures`]: what could not be recorded or stored, for the operator's alert.
//! - [`pause`]: the recorded pause of agent calls.
//! - [`read`] and [`query`]: the read side (one invocation; searches and listings).
//! - [`chain`] and [`merkle`]: the audit chain, checkpoint and tree format the writer
//!   writes (`crate::audit` verifies it).
//! - [`events`]: the event vocabulary.
//! - [`projection`]: folding events into the current status; refuses impossible ones.
//! - [`schema`]: numbered migrations embedded in the binary.
//! - [`results`]: the settled-result store (chunked, with a completeness marker).
//! - [`peer_calls`]: which invocation runs a federated peer's call (at most once per
//!   asking broker and caller invocation).
//!
//! Crash recovery (closing what a crash interrupted) is invocation policy: it lives in
//! `crate::invocation::recovery`.

pub mod append;
pub mod chain;
pub mod checkpoints;
pub mod events;
pub mod failures;
pub mod invocations;
pub mod leases;
pub mod merkle;
pub mod pause;
pub mod peer_calls;
pub mod projection;
pub mod query;
pub mod read;
pub mod results;
pub mod retention;
pub mod schema;
pub mod space;
pub mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use rusqlite::Connection;

use crate::clock::Clock;
use chain::{ChainHasher, Checkpoint, witness_path};
use checkpoints::{
    Retention, chain_tail, load_or_rebuild_tree, newest_checkpoint, verify_unsigned_tail,
};
use events::{Channel, EventBody, JOURNAL_SCOPE};
use projection::{Projection, ProjectionError};
use writer::{ChainPos, Job, ProjectionCache, SearchLag, WriterState, index_for_search};

pub use append::WriteCtx;
pub use failures::{StoreFailure, Unrecorded};
pub(crate) use invocations::{encode_request, insert_request};
pub(crate) use read::load_events;
pub use results::{ResultLayout, ResultToStore, Settle, StoredResult};
pub use retention::{PRUNE_INTERVAL, RetentionSource};
pub use writer::{SEARCH_BATCH, SEARCH_DELAY};

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
