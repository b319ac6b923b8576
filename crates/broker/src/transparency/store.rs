//! The witness's SQLite database (`witness.db` in its data dir): numbered migrations
//! embedded in the binary, WAL with `synchronous = FULL` (tlog-witness: the new
//! checkpoint "MUST persist ... before responding"), one function per query.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::note::{KeyAlg, VerifierKey};
use crate::migrations::{Failed, Identified};

/// `PRAGMA application_id` of a witness database ("PSWT").
pub const APPLICATION_ID: i64 = 0x5053_5754;

const MIGRATIONS: &[&str] = &[include_str!("migrations/0001_witness.sql")];

/// The newest schema this build understands.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the witness database {path}: {detail}")]
    Open { path: PathBuf, detail: String },
    #[error("{path} is not a witness database")]
    Foreign { path: PathBuf },
    #[error("{path} has schema {found}, newer than this build's {supported}")]
    NewerSchema {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error("the witness database failed: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the witness database holds an invalid {what} for origin `{origin}`")]
    Invalid { origin: String, what: &'static str },
    #[error("the log `{origin}` is already configured with another key")]
    LogExists { origin: String },
    #[error("`{key}` is not a log key: a log signs checkpoints with an Ed25519 (0x01) key")]
    NotALogKey { key: String },
    #[error("the witness state lock was poisoned by a failed request")]
    Poisoned,
}

/// Opens (creating if needed) the witness database and brings its schema up to date.
pub fn open(path: &Path) -> Result<Connection, StoreError> {
    let open_err = |e: rusqlite::Error| StoreError::Open {
        path: path.to_path_buf(),
        detail: e.to_string(),
    };
    let conn = Connection::open(path).map_err(open_err)?;
    // Identify before any write: switching to WAL rewrites the header.
    let version = match crate::migrations::identify(&conn, APPLICATION_ID, SCHEMA_VERSION)
        .map_err(open_err)?
    {
        Identified::Ours(version) => version,
        Identified::Foreign => {
            return Err(StoreError::Foreign {
                path: path.to_path_buf(),
            });
        }
        Identified::Newer(found) => {
            return Err(StoreError::NewerSchema {
                path: path.to_path_buf(),
                found,
                supported: SCHEMA_VERSION,
            });
        }
    };
    // FULL: a cosignature goes out only after the state it promises is on disk, even
    // across a power cut (NORMAL in WAL mode may lose the last commit).
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;",
    )
    .map_err(open_err)?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(open_err)?;
    crate::migrations::apply(&conn, APPLICATION_ID, MIGRATIONS, version).map_err(|failed| {
        match failed {
            Failed::Transaction(e) => open_err(e),
            Failed::Migration { number, error } => StoreError::Open {
                path: path.to_path_buf(),
                detail: format!("migration {number} failed: {error}"),
            },
        }
    })?;
    Ok(conn)
}

/// The witness's key name, set once by `init`.
pub fn name(conn: &Connection) -> Result<Option<String>, StoreError> {
    Ok(conn
        .query_row("SELECT value FROM meta WHERE key = 'name'", [], |r| {
            r.get(0)
        })
        .optional()?)
}

pub fn set_name(conn: &Connection, name: &str) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO meta (key, value) VALUES ('name', ?1)",
        params![name],
    )?;
    Ok(())
}

/// Adds a log. Adding the same origin with the same key again is a no-op; with another
/// key it is refused (replacing a log's key is not something to do by accident).
pub fn add_log(
    conn: &Connection,
    origin: &str,
    key: &VerifierKey,
    now: u64,
) -> Result<(), StoreError> {
    if key.alg != KeyAlg::Ed25519 {
        return Err(StoreError::NotALogKey { key: key.encode() });
    }
    match log_key(conn, origin)? {
        Some(existing) if existing == *key => Ok(()),
        Some(_) => Err(StoreError::LogExists {
            origin: origin.to_string(),
        }),
        None => {
            conn.execute(
                "INSERT INTO logs (origin, vkey, added_at) VALUES (?1, ?2, ?3)",
                params![origin, key.encode(), to_sql(now)],
            )?;
            Ok(())
        }
    }
}

/// The verifier key configured for `origin`.
pub fn log_key(conn: &Connection, origin: &str) -> Result<Option<VerifierKey>, StoreError> {
    let vkey: Option<String> = conn
        .query_row(
            "SELECT vkey FROM logs WHERE origin = ?1",
            params![origin],
            |r| r.get(0),
        )
        .optional()?;
    vkey.map(|v| {
        VerifierKey::parse(&v).map_err(|_| StoreError::Invalid {
            origin: origin.to_string(),
            what: "verifier key",
        })
    })
    .transpose()
}

/// Every configured log, by origin.
pub fn logs(conn: &Connection) -> Result<Vec<(String, VerifierKey)>, StoreError> {
    let mut stmt = conn.prepare("SELECT origin FROM logs ORDER BY origin")?;
    let origins = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = Vec::with_capacity(origins.len());
    for origin in origins {
        if let Some(key) = log_key(conn, &origin)? {
            out.push((origin, key));
        }
    }
    Ok(out)
}

/// The latest checkpoint cosigned for one origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Latest {
    pub origin: String,
    pub size: u64,
    pub root: [u8; 32],
    /// The checkpoint text, a blank line and the log's verified signature lines.
    pub note: Vec<u8>,
    /// Our cosignature line on it, newline-terminated.
    pub cosignature: Vec<u8>,
    /// The cosignature's timestamp, POSIX seconds.
    pub cosigned_at: u64,
}

impl Latest {
    /// The note with our cosignature appended: a signed note carrying both the log's
    /// signature and ours, verifiable offline by whoever holds both keys.
    pub fn cosigned_note(&self) -> Vec<u8> {
        let mut out = self.note.clone();
        out.extend_from_slice(&self.cosignature);
        out
    }
}

pub fn latest(conn: &Connection, origin: &str) -> Result<Option<Latest>, StoreError> {
    let row = conn
        .query_row(
            "SELECT size, root, note, cosignature, cosigned_at FROM latest WHERE origin = ?1",
            params![origin],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, Vec<u8>>(1)?,
                    r.get::<_, Vec<u8>>(2)?,
                    r.get::<_, Vec<u8>>(3)?,
                    r.get::<_, i64>(4)?,
                ))
            },
        )
        .optional()?;
    let Some((size, root, note, cosignature, cosigned_at)) = row else {
        return Ok(None);
    };
    let invalid = |what| StoreError::Invalid {
        origin: origin.to_string(),
        what,
    };
    Ok(Some(Latest {
        origin: origin.to_string(),
        size: u64::try_from(size).map_err(|_| invalid("size"))?,
        root: root.try_into().map_err(|_| invalid("root"))?,
        note,
        cosignature,
        cosigned_at: u64::try_from(cosigned_at).map_err(|_| invalid("timestamp"))?,
    }))
}

/// Replaces the latest checkpoint for `latest.origin`. Call inside the transaction that
/// read the previous one.
pub fn put_latest(conn: &Connection, latest: &Latest) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO latest (origin, size, root, note, cosignature, cosigned_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (origin) DO UPDATE SET size = excluded.size, root = excluded.root,
             note = excluded.note, cosignature = excluded.cosignature,
             cosigned_at = excluded.cosigned_at",
        params![
            latest.origin,
            to_sql(latest.size),
            latest.root.as_slice(),
            latest.note,
            latest.cosignature,
            to_sql(latest.cosigned_at),
        ],
    )?;
    Ok(())
}

/// Why a correctly signed submission was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// `old` was larger than the checkpoint's size.
    OldExceedsSize,
    /// The consistency proof did not verify: the log rewrote history it had shown.
    Inconsistent,
    /// Same size as the cosigned checkpoint, another root: a fork.
    Equivocation,
}

impl RefusalReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::OldExceedsSize => "old_exceeds_size",
            RefusalReason::Inconsistent => "inconsistent",
            RefusalReason::Equivocation => "equivocation",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "old_exceeds_size" => Some(RefusalReason::OldExceedsSize),
            "inconsistent" => Some(RefusalReason::Inconsistent),
            "equivocation" => Some(RefusalReason::Equivocation),
            _ => None,
        }
    }
}

/// One refused submission, kept as evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub origin: String,
    pub at: u64,
    pub status: u16,
    pub reason: RefusalReason,
    pub old_size: u64,
    pub size: u64,
    pub root: [u8; 32],
    /// The request body as received.
    pub request: Vec<u8>,
}

pub fn record_refusal(conn: &Connection, refusal: &Refusal) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO refusals (origin, at, status, reason, old_size, size, root, request)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            refusal.origin,
            to_sql(refusal.at),
            refusal.status,
            refusal.reason.as_str(),
            to_sql(refusal.old_size),
            to_sql(refusal.size),
            refusal.root.as_slice(),
            refusal.request,
        ],
    )?;
    Ok(())
}

/// The refusals recorded for `origin`, oldest first.
pub fn refusals(conn: &Connection, origin: &str) -> Result<Vec<Refusal>, StoreError> {
    let mut stmt = conn.prepare(
        "SELECT at, status, reason, old_size, size, root, request FROM refusals
         WHERE origin = ?1 ORDER BY id",
    )?;
    let rows = stmt
        .query_map(params![origin], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, u16>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, Vec<u8>>(5)?,
                r.get::<_, Vec<u8>>(6)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let invalid = |what| StoreError::Invalid {
        origin: origin.to_string(),
        what,
    };
    rows.into_iter()
        .map(|(at, status, reason, old_size, size, root, request)| {
            Ok(Refusal {
                origin: origin.to_string(),
                at: u64::try_from(at).map_err(|_| invalid("refusal time"))?,
                status,
                reason: RefusalReason::parse(&reason).ok_or(invalid("refusal reason"))?,
                old_size: u64::try_from(old_size).map_err(|_| invalid("refusal size"))?,
                size: u64::try_from(size).map_err(|_| invalid("refusal size"))?,
                root: root.try_into().map_err(|_| invalid("refusal root"))?,
                request,
            })
        })
        .collect()
}

/// SQLite integers are i64; sizes and times above `i64::MAX` are refused before they
/// get here (see `witness::MAX_TREE_SIZE`), so saturating never changes a stored value.
fn to_sql(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;

    fn log_vkey(seed: u8) -> VerifierKey {
        VerifierKey::new(
            "example.test/log",
            KeyAlg::Ed25519,
            SigningKey::from_bytes(&[seed; 32]).verifying_key(),
        )
        .unwrap()
    }

    #[test]
    fn add_log_is_idempotent_and_refuses_a_second_key() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open(&dir.path().join("w.db")).unwrap();
        add_log(&conn, "example.test/log", &log_vkey(1), 1).unwrap();
        add_log(&conn, "example.test/log", &log_vkey(1), 2).unwrap();
        assert!(matches!(
            add_log(&conn, "example.test/log", &log_vkey(2), 3),
            Err(StoreError::LogExists { .. })
        ));
        assert_eq!(
            log_key(&conn, "example.test/log").unwrap(),
            Some(log_vkey(1))
        );
        assert_eq!(logs(&conn).unwrap().len(), 1);
        let cosigner = VerifierKey::new(
            "w",
            KeyAlg::CosignatureV1,
            SigningKey::from_bytes(&[3; 32]).verifying_key(),
        )
        .unwrap();
        assert!(matches!(
            add_log(&conn, "other", &cosigner, 4),
            Err(StoreError::NotALogKey { .. })
        ));
    }

    #[test]
    fn latest_round_trips_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        let conn = open(&path).unwrap();
        add_log(&conn, "example.test/log", &log_vkey(1), 1).unwrap();
        let l = Latest {
            origin: "example.test/log".into(),
            size: 9,
            root: [7; 32],
            note: b"note\n".to_vec(),
            cosignature: b"line\n".to_vec(),
            cosigned_at: 100,
        };
        put_latest(&conn, &l).unwrap();
        drop(conn);
        let conn = open(&path).unwrap();
        assert_eq!(latest(&conn, "example.test/log").unwrap(), Some(l.clone()));
        assert_eq!(l.cosigned_note(), b"note\nline\n");
        assert_eq!(latest(&conn, "nope").unwrap(), None);
    }

    #[test]
    fn a_foreign_database_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.db");
        let other = Connection::open(&path).unwrap();
        other.execute_batch("CREATE TABLE t (x)").unwrap();
        drop(other);
        assert!(matches!(open(&path), Err(StoreError::Foreign { .. })));
        let not_sqlite = dir.path().join("garbage.db");
        std::fs::write(&not_sqlite, vec![0x42; 4096]).unwrap();
        assert!(open(&not_sqlite).is_err());
    }
}
