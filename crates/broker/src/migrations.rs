//! Numbered migrations of the broker's SQLite files (the journal, a witness's state):
//! each runs in its own IMMEDIATE transaction, which also stamps the file's
//! `application_id` and `user_version`, so a failure leaves the previous version intact,
//! never a half-migrated file. Never: import a module that uses it; each file keeps its
//! own migrations and says what a failure means for it.

use rusqlite::Connection;

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
