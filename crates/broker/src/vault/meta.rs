//! The credentials' metadata in the journal database: plain queries over the
//! `credentials` table. They never see secret bytes.

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{CredentialId, CredentialMeta, VersionTag};

/// The columns [`from_row`] reads, in its order (a macro, so a query can be one
/// literal and be cached).
macro_rules! columns {
    () => {
        "id, kind, version, created_at_ms, rotated_at_ms, last_used_at_ms"
    };
}
const COLUMNS: &str = columns!();

fn from_row(row: &Row<'_>) -> rusqlite::Result<CredentialMeta> {
    Ok(CredentialMeta {
        id: row.get(0)?,
        kind: row.get(1)?,
        version: row.get(2)?,
        created_at_ms: row.get(3)?,
        rotated_at_ms: row.get(4)?,
        last_used_at_ms: row.get(5)?,
    })
}

/// Inserts a new credential. Fails with a constraint error if the id exists.
pub fn insert(conn: &Connection, meta: &CredentialMeta) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO credentials (id, kind, version, created_at_ms, rotated_at_ms, \
         last_used_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            meta.id,
            meta.kind,
            meta.version,
            meta.created_at_ms,
            meta.rotated_at_ms,
            meta.last_used_at_ms
        ],
    )?;
    Ok(())
}

/// The credential named `id`, if any.
pub fn get(conn: &Connection, id: &CredentialId) -> rusqlite::Result<Option<CredentialMeta>> {
    // Read on every invocation (binding and injection): a cached statement.
    conn.prepare_cached(concat!(
        "SELECT ",
        columns!(),
        " FROM credentials WHERE id = ?1"
    ))?
    .query_row([id], from_row)
    .optional()
}

/// Every credential, ordered by id.
pub fn list(conn: &Connection) -> rusqlite::Result<Vec<CredentialMeta>> {
    let mut stmt = conn.prepare(&format!("SELECT {COLUMNS} FROM credentials ORDER BY id"))?;
    let rows = stmt.query_map([], from_row)?;
    rows.collect()
}

/// Rotation: moves `id` from version `from` to version `to`.
///
/// Compare-and-set on the current version, so two concurrent rotations cannot both
/// believe they replaced the same version. Returns whether the row was updated
/// (`false` if the credential is gone or its version is no longer `from`).
pub fn set_version(
    conn: &Connection,
    id: &CredentialId,
    from: &VersionTag,
    to: &VersionTag,
    now_ms: i64,
) -> rusqlite::Result<bool> {
    let changed = conn.execute(
        "UPDATE credentials SET version = ?3, rotated_at_ms = ?4 \
         WHERE id = ?1 AND version = ?2",
        params![id, from, to, now_ms],
    )?;
    Ok(changed == 1)
}

/// Records a use of `id` at `now_ms`; never moves the timestamp backwards. Returns
/// whether the credential exists.
pub fn touch_last_used(
    conn: &Connection,
    id: &CredentialId,
    now_ms: i64,
) -> rusqlite::Result<bool> {
    touch_last_used_raw(conn, id.as_ref(), now_ms)
}

/// [`touch_last_used`] by the id's text, for a caller inside the journal's own
/// transaction.
pub fn touch_last_used_raw(conn: &Connection, id: &str, now_ms: i64) -> rusqlite::Result<bool> {
    let changed = conn
        .prepare_cached(
            "UPDATE credentials \
             SET last_used_at_ms = max(coalesce(last_used_at_ms, ?2), ?2) WHERE id = ?1",
        )?
        .execute(params![id, now_ms])?;
    Ok(changed == 1)
}

/// Deletes `id`'s metadata. Returns whether it existed.
pub fn remove(conn: &Connection, id: &CredentialId) -> rusqlite::Result<bool> {
    let changed = conn.execute("DELETE FROM credentials WHERE id = ?1", [id])?;
    Ok(changed == 1)
}
