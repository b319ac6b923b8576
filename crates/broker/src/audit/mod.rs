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
//! re-exported here); this module holds the verifier, which only reads. A hash chain
//! proves recorded events were not altered; it cannot prove every event was recorded.
//!
//! The files, each re-exported here so every item is `audit::X`:
//! - `verify.rs`: [`verify_file`], [`verify_file_with`], [`verify_file_prefix`] and
//!   [`verify_since`]: the checks in order and how their failures combine.
//! - `scan.rs`: the verifier's passes over the rows (sequence, checkpoint heads and
//!   signing policy on one thread; chain links and the Merkle tree on another).
//! - `outside.rs`: what the journal is checked against outside its tables: the witness
//!   file, the anchor ([`default_anchor`]), witnesses' tree heads ([`Outside`]).
//! - `key.rs`: the audit signing key ([`signing_key_from_vault`], [`AuditKeyError`]) and
//!   [`last_checkpoint_key`].
//! - [`witnessing`]: sending checkpoints to witnesses and checking their cosignatures.
//!
//! This file keeps what they share: the outcome types ([`VerifyReport`], [`AuditError`],
//! [`Tamper`]) and the signing slack.

use serde::{Deserialize, Serialize};

pub mod assurance;
mod key;
mod outside;
mod scan;
mod verify;
pub mod witnessing;

pub use assurance::{Assurance, Signer};
pub use key::{
    AUDIT_KEY_ID, AuditKeyError, last_checkpoint_key, signing_key_from_secret,
    signing_key_from_vault,
};
pub use outside::{Outside, TreeHead, default_anchor};
pub use scan::VerifiedPrefix;
pub use verify::{verify_file, verify_file_prefix, verify_file_with, verify_since};

/// The chain and checkpoint format, which the journal writes (see [`crate::journal::chain`]).
pub use crate::journal::chain::{
    ChainHasher, ChainedRow, Checkpoint, GENESIS, SIGN_INTERVAL_MS, SIGNING_RESUMED, log_origin,
    witness_path, write_checkpoint_file,
};
/// The Merkle tree over the events: the journal writes it, so it lives there.
pub use crate::journal::merkle;

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

/// A broken chain at `first_bad_seq`, with no unsigned count.
fn broken(first_bad_seq: u64, kind: Tamper, detail: impl Into<String>) -> AuditError {
    AuditError::Broken {
        first_bad_seq,
        kind,
        detail: detail.into(),
        unsigned_events: None,
    }
}
