//! Numbered migrations embedded in the binary, each applied in its own IMMEDIATE
//! transaction, and the connection settings the durability promise depends on.
//!
//! Opening refuses, without writing anything, a file that is not SQLite, a SQLite file
//! of another application, and a journal from a newer schema.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags};

use super::store::JournalError;
use crate::migrations::{Failed, Identified};
use crate::vault::{Keychain, Vault};

/// `PRAGMA application_id` of a Postern journal ("PSTN").
pub const APPLICATION_ID: i64 = 0x5053_544E;

/// The migrations, in order; `user_version` records how many have been applied.
const MIGRATIONS: &[&str] = &[
    include_str!("migrations/0001_journal.sql"),
    include_str!("migrations/0002_credentials.sql"),
    include_str!("migrations/0003_requests.sql"),
    include_str!("migrations/0004_status.sql"),
    include_str!("migrations/0005_search.sql"),
    include_str!("migrations/0006_search_index.sql"),
    include_str!("migrations/0007_merkle.sql"),
    include_str!("migrations/0008_result_retention.sql"),
    include_str!("migrations/0009_links.sql"),
    include_str!("migrations/0010_peer_calls.sql"),
    include_str!("migrations/0011_events_by_kind.sql"),
    include_str!("migrations/0012_peer_incident_index.sql"),
    include_str!("migrations/0013_peer_nonces.sql"),
];

/// Bytes a checkpointed WAL is truncated to (see `configure`).
pub const WAL_SIZE_LIMIT: u64 = 4 * 1024 * 1024;

/// The newest schema this build understands.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

fn classify(path: &Path, e: rusqlite::Error) -> JournalError {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) | Some(ErrorCode::DatabaseCorrupt) => JournalError::Corrupt {
            path: path.to_path_buf(),
            detail: e.to_string(),
        },
        _ => JournalError::Open {
            path: path.to_path_buf(),
            detail: e.to_string(),
        },
    }
}

/// The vault keeps its credential metadata in the journal database, whose schema the
/// journal owns: the journal opens it for the vault.
impl Vault {
    /// Opens the store with its metadata in the journal database at `db` (migrated if
    /// needed).
    pub fn open(keychain: Keychain, db: &Path) -> Result<Vault, JournalError> {
        let conn = open_and_migrate(db)?;
        // Credential metadata writes (last-used times) need no fsync of their own: a
        // lost last-used time after a power cut is harmless, and an fsync here would sit
        // on every injection's hot path. WAL commits are ordered, so the journal's next
        // fsync makes a rotation durable too.
        conn.execute_batch("PRAGMA synchronous = NORMAL")
            .map_err(|e| JournalError::Storage(e.to_string()))?;
        Ok(Vault::over(keychain, conn))
    }
}

/// Opens the writer connection and brings the schema up to date.
pub fn open_and_migrate(path: &Path) -> Result<Connection, JournalError> {
    check_length(path)?;
    let conn = Connection::open(path).map_err(|e| classify(path, e))?;
    // Identify the file before changing anything about it: switching to WAL rewrites
    // the header, which must never happen to a file that is not ours.
    let version = identify(&conn, path)?;
    configure(&conn).map_err(|e| classify(path, e))?;
    migrate(&conn, path, version)?;
    Ok(conn)
}

/// Refuses a file shorter than its own header says: its last pages were cut off (a torn
/// write, a truncated copy). SQLite reads a missing page as zeros, so without this check
/// the damage would surface later, or never, while new events extend a broken chain.
///
/// The header fields (SQLite file format §1.3): page size at offset 16 (big-endian u16,
/// 1 meaning 65536), the file change counter at 24, the database size in pages at 28,
/// valid only when the "version-valid-for" number at 92 equals the change counter. In
/// WAL mode the main file holds at least as many pages as its own header names; newer
/// pages live in the WAL until a checkpoint copies them, header included.
pub fn check_length(path: &Path) -> Result<(), JournalError> {
    // A checkpoint of a live journal writes page 1 (with the new size) before the pages
    // that extend the file: a shortfall seen once may be one in progress. A file that
    // stays short for ~100 ms is cut.
    let mut result = check_length_once(path);
    for _ in 0..5 {
        if result.is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        result = check_length_once(path);
    }
    result
}

fn check_length_once(path: &Path) -> Result<(), JournalError> {
    let Some((len, header)) = read_header(path) else {
        // Missing (a new journal), empty, or too short to be SQLite: identification
        // reports the last; other errors surface when SQLite opens it.
        return Ok(());
    };
    if &header[..16] != b"SQLite format 3\0" {
        return Ok(());
    }
    let be32 = |at: usize| {
        u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    let page_size = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65_536u64,
        n => u64::from(n),
    };
    let pages = u64::from(be32(28));
    if be32(24) != be32(92) || pages == 0 {
        // Written by an old SQLite that did not keep the size field: nothing to compare.
        return Ok(());
    }
    let expected = pages.saturating_mul(page_size);
    if len < expected && !wal_holds(path, page_size, len / page_size + 1..=pages) {
        return Err(JournalError::Damaged {
            path: path.to_path_buf(),
            detail: format!(
                "the file is {len} bytes but its header says {pages} pages of {page_size} bytes \
                 ({expected} bytes): its end was cut off"
            ),
        });
    }
    Ok(())
}

/// Whether the WAL beside the journal at `path` holds a committed frame for every page
/// in `missing`. A checkpoint writes page 1 (with the new size) before the pages that
/// extend the file; killed in between, it leaves the file short, and the WAL, which a
/// checkpoint only resets once it has finished, still holds those pages: SQLite reads
/// them from there and the next checkpoint copies them again. Frames count only as
/// SQLite's recovery counts them: from the WAL's current generation (salts), their
/// checksum chain intact, up to the last commit frame.
fn wal_holds(path: &Path, page_size: u64, missing: std::ops::RangeInclusive<u64>) -> bool {
    let mut wal = path.as_os_str().to_os_string();
    wal.push("-wal");
    let Ok(bytes) = std::fs::read(&wal) else {
        return false;
    };
    let held = wal_pages(&bytes, page_size);
    missing
        .into_iter()
        .all(|page| u32::try_from(page).is_ok_and(|p| held.binary_search(&p).is_ok()))
}

/// The pages a WAL's committed frames hold, sorted (SQLite file format §4.1-4.3).
fn wal_pages(wal: &[u8], page_size: u64) -> Vec<u32> {
    const HEADER: usize = 32;
    const FRAME_HEADER: usize = 24;
    let be32 = |b: &[u8], at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    if wal.len() < HEADER {
        return Vec::new();
    }
    let magic = be32(wal, 0);
    if magic & !1 != 0x377f_0682 || u64::from(be32(wal, 8)) != page_size {
        return Vec::new();
    }
    // The checksum reads 32-bit words big-endian when the magic's low bit is set.
    let big_endian = magic & 1 == 1;
    let checksum = |data: &[u8], (mut s0, mut s1): (u32, u32)| {
        for pair in data.chunks_exact(8) {
            let word = |w: &[u8]| {
                let w = [w[0], w[1], w[2], w[3]];
                if big_endian {
                    u32::from_be_bytes(w)
                } else {
                    u32::from_le_bytes(w)
                }
            };
            s0 = s0.wrapping_add(word(&pair[..4])).wrapping_add(s1);
            s1 = s1.wrapping_add(word(&pair[4..])).wrapping_add(s0);
        }
        (s0, s1)
    };
    let mut sum = checksum(&wal[..24], (0, 0));
    if sum != (be32(wal, 24), be32(wal, 28)) {
        return Vec::new();
    }
    let salts = &wal[16..24];
    let Ok(page) = usize::try_from(page_size) else {
        return Vec::new();
    };
    let (mut pending, mut committed) = (Vec::new(), Vec::new());
    let mut at = HEADER;
    while let Some(frame) = wal.get(at..at + FRAME_HEADER + page) {
        if &frame[8..16] != salts {
            break;
        }
        sum = checksum(&frame[FRAME_HEADER..], checksum(&frame[..8], sum));
        if sum != (be32(frame, 16), be32(frame, 20)) {
            break;
        }
        pending.push(be32(frame, 0));
        if be32(frame, 4) != 0 {
            // A commit frame: everything up to here is in the database.
            committed.append(&mut pending);
        }
        at += FRAME_HEADER + page;
    }
    committed.sort_unstable();
    committed.dedup();
    committed
}

/// The file's length and its first 100 bytes.
///
/// POSIX record locks belong to the process and the file, not to a descriptor: closing
/// any descriptor of the journal releases every lock SQLite holds on it in this process.
/// Another process could then take the lock that means "last connection", checkpoint
/// and reset the WAL under a live writer, and the commits after it are lost. So the
/// descriptor used here is opened once per file and kept open (SQLite does the same
/// for its own); one whose file has been unlinked is closed, since no other process can
/// open that file any more.
#[cfg(unix)]
fn read_header(path: &Path) -> Option<(u64, [u8; 100])> {
    use std::os::unix::fs::{FileExt, MetadataExt};
    use std::sync::Mutex;
    static OPEN: Mutex<Vec<(u64, u64, std::fs::File)>> = Mutex::new(Vec::new());
    let meta = std::fs::metadata(path).ok()?;
    let (dev, ino, len) = (meta.dev(), meta.ino(), meta.len());
    let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
    open.retain(|(_, _, f)| f.metadata().is_ok_and(|m| m.nlink() > 0));
    if !open.iter().any(|(d, i, _)| (*d, *i) == (dev, ino)) {
        open.push((dev, ino, std::fs::File::open(path).ok()?));
    }
    let (_, _, file) = open.iter().find(|(d, i, _)| (*d, *i) == (dev, ino))?;
    let mut header = [0u8; 100];
    (len >= 100 && file.read_exact_at(&mut header, 0).is_ok()).then_some((len, header))
}

/// Windows: SQLite locks with LockFileEx, whose locks belong to the handle that took
/// them, so a handle opened and closed here releases nothing of SQLite's.
#[cfg(not(unix))]
fn read_header(path: &Path) -> Option<(u64, [u8; 100])> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    let mut header = [0u8; 100];
    (len >= 100 && file.read_exact(&mut header).is_ok()).then_some((len, header))
}

/// Opens a read connection (WAL lets it read while the writer commits).
pub fn open_reader(path: &Path) -> Result<Connection, JournalError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| classify(path, e))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(|e| classify(path, e))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

fn configure(conn: &Connection) -> Result<(), rusqlite::Error> {
    conn.busy_timeout(Duration::from_secs(5))?;
    // WAL: readers never block the writer, and commits are sequential appends, which is
    // what makes "a later fsync covers earlier NORMAL commits" true.
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(rusqlite::Error::InvalidQuery);
    }
    // FULL until the writer decides per batch; see the durability promise in mod.rs.
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")?;
    // A WAL that a checkpoint has emptied is cut back to this size instead of keeping
    // its high-water mark: after a burst (or a full disk) the space comes back.
    conn.execute_batch(&format!("PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}"))?;
    // The statement journal each job's savepoint fills (the pages it changes, so it can
    // roll back alone) stays in memory: by default it spills to a temporary file past
    // 64 KiB, and under load that file took as many writes as the WAL itself. It is
    // only ever needed inside one transaction, never after a crash.
    conn.execute_batch("PRAGMA temp_store = MEMORY")?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(())
}

/// Prepared statements each connection keeps. The writer runs a few dozen distinct
/// statements per action; with rusqlite's default of 16 they evicted one another and
/// were parsed again in every job (under load, 4.6 % of the daemon's CPU went to
/// SQLite's parser).
const STATEMENT_CACHE: usize = 256;

/// Reads (never writes) what the file is: ours at some version, empty, or refused.
fn identify(conn: &Connection, path: &Path) -> Result<i64, JournalError> {
    let err = |e: rusqlite::Error| classify(path, e);
    // Reading the header turns "not a database" into an error before any write.
    conn.query_row("PRAGMA schema_version", [], |r| r.get::<_, i64>(0))
        .map_err(err)?;
    match crate::migrations::identify(conn, APPLICATION_ID, SCHEMA_VERSION).map_err(err)? {
        Identified::Ours(version) => Ok(version),
        Identified::Foreign => Err(JournalError::Foreign {
            path: path.to_path_buf(),
        }),
        Identified::Newer(found) => Err(JournalError::NewerSchema {
            path: path.to_path_buf(),
            found,
            supported: SCHEMA_VERSION,
        }),
    }
}

fn migrate(conn: &Connection, path: &Path, version: i64) -> Result<(), JournalError> {
    crate::migrations::apply(conn, APPLICATION_ID, MIGRATIONS, version).map_err(|failed| {
        match failed {
            Failed::Transaction(e) => classify(path, e),
            Failed::Migration { number, error } => JournalError::Open {
                path: path.to_path_buf(),
                detail: format!("migration {number} failed: {error}"),
            },
        }
    })
}
