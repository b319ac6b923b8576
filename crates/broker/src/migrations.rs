//! Numbered migrations of the broker's SQLite files (the journal, a witness's state):
//! what a file is, read before anything writes to it ([`identify`]), then each migration
//! it lacks in its own IMMEDIATE transaction, which also stamps the file's
//! `application_id` and `user_version`, so a failure leaves the previous version intact,
//! never a half-migrated file ([`apply`]). Never: import a module that uses it; each file
//! keeps its own migrations and says what a refusal or a failure means for it.

use rusqlite::Connection;

/// What a file is, by its `application_id` and `user_version`.
pub(crate) enum Identified {
    /// Ours at this version (0: new and empty), which this build can bring up to date.
    Ours(i64),
    /// Another program's database: another application id, or tables without ours.
    Foreign,
    /// Ours, at this version, newer than this build knows.
    Newer(i64),
}

/// Reads (never writes) what the file behind `conn` is.
pub(crate) fn identify(
    conn: &Connection,
    application_id: i64,
    schema_version: i64,
) -> rusqlite::Result<Identified> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let app_id: i64 = conn.query_row("PRAGMA application_id", [], |r| r.get(0))?;
    let tables: i64 = conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?;
    Ok(if app_id != application_id && (app_id != 0 || tables > 0) {
        Identified::Foreign
    } else if version > schema_version {
        Identified::Newer(version)
    } else {
        Identified::Ours(version)
    })
}

/// Why [`apply`] stopped.
pub(crate) enum Failed {
    /// Starting or committing a migration's transaction failed.
    Transaction(rusqlite::Error),
    /// Migration `number` (counted from 1) failed and was rolled back.
    Migration { number: i64, error: rusqlite::Error },
}

/// Applies `migrations` after the first `version` (the file's `user_version`), in order.
pub(crate) fn apply(
    conn: &Connection,
    application_id: i64,
    migrations: &[&str],
    version: i64,
) -> Result<(), Failed> {
    for (index, sql) in migrations
        .iter()
        .enumerate()
        .skip(usize::try_from(version).unwrap_or(0))
    {
        let number = index as i64 + 1;
        conn.execute_batch("BEGIN IMMEDIATE")
            .map_err(Failed::Transaction)?;
        let applied = conn.execute_batch(sql).and_then(|_| {
            conn.execute_batch(&format!(
                "PRAGMA application_id = {application_id}; PRAGMA user_version = {number};"
            ))
        });
        match applied {
            Ok(()) => conn.execute_batch("COMMIT").map_err(Failed::Transaction)?,
            Err(error) => {
                let _ = conn.execute_batch("ROLLBACK");
                return Err(Failed::Migration { number, error });
            }
        }
    }
    Ok(())
}
