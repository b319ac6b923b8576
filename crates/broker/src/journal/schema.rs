//! Numbered migrations embedded in the binary, each applied in its own IMMEDIATE
//! transaction, and the connection settings the durability promise depends on.
//!
//! Opening refuses, without writing anything, a file that is not SQLite, a SQLite file
//! of another application, and a journal from a newer schema.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags};

use super::JournalError;

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
];

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

/// Opens the writer connection and brings the schema up to date.
pub fn open_and_migrate(path: &Path) -> Result<Connection, JournalError> {
    let conn = Connection::open(path).map_err(|e| classify(path, e))?;
    // Identify the file before changing anything about it: switching to WAL rewrites
    // the header, which must never happen to a file that is not ours.
    let version = identify(&conn, path)?;
    configure(&conn).map_err(|e| classify(path, e))?;
    migrate(&conn, path, version)?;
    Ok(conn)
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
    Ok(())
}

/// Reads (never writes) what the file is: ours at some version, empty, or refused.
fn identify(conn: &Connection, path: &Path) -> Result<i64, JournalError> {
    let err = |e: rusqlite::Error| classify(path, e);
    // Reading the header turns "not a database" into an error before any write.
    conn.query_row("PRAGMA schema_version", [], |r| r.get::<_, i64>(0))
        .map_err(err)?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(err)?;
    let app_id: i64 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(err)?;
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .map_err(err)?;
    if app_id != APPLICATION_ID && (app_id != 0 || tables > 0) {
        return Err(JournalError::Foreign {
            path: path.to_path_buf(),
        });
    }
    if version > SCHEMA_VERSION {
        return Err(JournalError::NewerSchema {
            path: path.to_path_buf(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(version)
}

fn migrate(conn: &Connection, path: &Path, version: i64) -> Result<(), JournalError> {
    let err = |e: rusqlite::Error| classify(path, e);
    for (index, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(version).unwrap_or(0))
    {
        let next = index as i64 + 1;
        // One IMMEDIATE transaction per migration: a failure leaves the previous version
        // intact, never a half-migrated file.
        conn.execute_batch("BEGIN IMMEDIATE").map_err(err)?;
        let applied = conn.execute_batch(sql).and_then(|_| {
            conn.execute_batch(&format!(
                "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {next};"
            ))
        });
        match applied {
            Ok(()) => conn.execute_batch("COMMIT").map_err(err)?,
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                return Err(JournalError::Open {
                    path: path.to_path_buf(),
                    detail: format!("migration {next} failed: {e}"),
                });
            }
        }
    }
    Ok(())
}
