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
//! blocks of one file each. This file only opens it and names the public paths; no
//! file of the journal imports it.
//! - [`store`]: what the store trades in (errors, options, the facts of a step).
//! - [`writer`]: the [`Journal`] handle, the writer thread and group commit; the write
//!   API ([`Journal::write_async`], and [`Journal::write`], its blocking adapter).
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
//! - [`rows`]: an invocation's event rows read back.
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
pub mod rows;
pub mod schema;
pub mod space;
pub mod store;
pub mod writer;

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use append::{ChainPos, ProjectionCache};
use chain::{ChainHasher, witness_path};
use checkpoints::{chain_tail, load_or_rebuild_tree, newest_checkpoint, verify_unsigned_tail};
use events::{EventBody, JOURNAL_SCOPE};
use writer::{Inner, Job, Retention, SearchLag, WriterState, index_for_search};

pub use append::WriteCtx;
pub(crate) use invocations::{encode_request, insert_request};
pub use results::{ResultLayout, ResultToStore, Settle, StoredResult};
pub use retention::PRUNE_INTERVAL;
pub(crate) use rows::load_events;
pub use store::{
    Appended, Authorization, Dispatch, JournalError, JournalOptions, NewInvocation,
    RetentionSource, SEARCH_BATCH, SEARCH_DELAY, StoreFailure, Unrecorded,
};
pub use writer::Journal;

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
}
