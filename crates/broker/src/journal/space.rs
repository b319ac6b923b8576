//! Disk space for the journal: a reserve file that a full disk gives back, and the
//! low-space mode the writer enters meanwhile.
//!
//! An agent running as the same user can fill the disk, on purpose or not. When that
//! happens mid-invocation, a request already dispatched still needs room for its
//! RESULT_COMMITTED, or its record ends at "unknown" although the remote answered. So
//! the journal keeps [`RESERVE_BYTES`] of zeros in a file beside the database. On the
//! first "disk full" the writer deletes that file (the space becomes free), checkpoints
//! the WAL into the database and stops accepting new invocations; invocations in flight
//! go on and settle. Once the filesystem has room for the reserve twice over again, the
//! writer recreates the reserve and accepts new work.
//!
//! This is best effort against a process that keeps writing: the freed space is free
//! for everyone. What it guarantees is the honest report: a refused invocation says
//! "nothing was sent" and why, and never claims an unknown outcome.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Space kept aside for invocations in flight when the disk fills up.
pub const RESERVE_BYTES: u64 = 4 * 1024 * 1024;

/// Below this much free space the writer gives the reserve back and refuses new
/// invocations before a commit of one already in flight can fail: the first full-disk
/// error must not land on a request that was already sent.
pub const LOW_WATER_BYTES: u64 = 1024 * 1024;

/// A WAL larger than this is checkpointed and truncated by the writer, even while
/// readers keep a passive checkpoint from resetting it.
pub const WAL_CHECKPOINT_AT: u64 = 16 * 1024 * 1024;

/// Bytes available to this user on the filesystem holding `path`, when the platform
/// can tell.
pub fn free_bytes(path: &Path) -> Option<u64> {
    crate::platform::free_bytes(path)
}

/// The reserve file beside the journal at `db` (`journal.db.reserve`).
pub fn reserve_path(db: &Path) -> PathBuf {
    let mut name = db.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".reserve");
    db.with_file_name(name)
}

/// Makes sure the reserve file holds [`RESERVE_BYTES`]; returns whether it does. A
/// partial file left by a failed write is removed, so a full disk never keeps half a
/// reserve.
pub fn ensure_reserve(path: &Path) -> bool {
    if std::fs::metadata(path).is_ok_and(|m| m.len() >= RESERVE_BYTES) {
        return true;
    }
    let written = std::fs::File::create(path).and_then(|mut f| {
        let zeros = vec![0u8; 64 * 1024];
        let mut left = RESERVE_BYTES;
        while left > 0 {
            let n = usize::try_from(left.min(zeros.len() as u64)).unwrap_or(zeros.len());
            f.write_all(&zeros[..n])?;
            left -= n as u64;
        }
        // Written blocks, not a sparse promise: the space is really taken.
        f.sync_all()
    });
    if written.is_err() {
        let _ = std::fs::remove_file(path);
        return false;
    }
    true
}

/// Gives the reserve's space back to the filesystem.
pub fn release_reserve(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// A short description of the space situation for error messages.
pub fn describe(db: &Path) -> String {
    let dir = db
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match free_bytes(db) {
        Some(free) => format!(
            "{free} bytes free on the filesystem of {}; the journal needs {} to resume",
            dir.display(),
            2 * RESERVE_BYTES
        ),
        None => format!("on the filesystem of {}", dir.display()),
    }
}
