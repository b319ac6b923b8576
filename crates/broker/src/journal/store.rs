//! What the store trades in: its errors, its options, and the facts a step records or
//! answers with ([`Appended`], [`NewInvocation`], [`Authorization`], [`Dispatch`]), and
//! what it remembers of what it could not record. The ground floor of the journal: it
//! imports nothing of the journal but the projection's error.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::SigningKey;

use super::events::Channel;
use super::projection::{Projection, ProjectionError};
use crate::clock::Clock;
use crate::config::RetentionPolicy;

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

/// The writer feeds the text search index once this many accepted invocations wait,
/// or once the oldest has waited [`SEARCH_DELAY`] ([`JournalOptions::search_delay`]),
/// or when it is idle: each transaction
/// that adds to the index writes a new segment of it, which cost a commit several
/// pages when every commit did. A search matches the invocations not indexed yet
/// without the index, so nothing is missed meanwhile.
pub const SEARCH_BATCH: usize = 256;

/// See [`SEARCH_BATCH`].
pub const SEARCH_DELAY: Duration = Duration::from_secs(1);

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

/// Where the writer reads the live retention policy of stored results.
pub type RetentionSource = Arc<dyn Fn() -> RetentionPolicy + Send + Sync>;
