//! The vault, Postern's one credential store: secret bytes in the OS keychain (a
//! [`Keychain`]: Secret Service or kernel keyutils on Linux, the login keychain on macOS,
//! the Credential Manager on Windows), non-secret metadata in the journal database.
//! [`Vault`] is what the broker holds; [`CredentialRead`] is the injection step's read of
//! the version an invocation bound.
//!
//! The broker must never let a secret reach logs, the journal, errors, panics, `Debug`
//! output or JSON. This module enforces that by construction:
//!
//! * [`Secret`] owns the bytes, zeroizes them on drop, prints as `<redacted>`, and has no
//!   `Serialize`, `Display` or `Clone`. The only way to see the bytes is
//!   [`Secret::expose`], which only the injection step calls.
//! * [`VaultError`] carries credential ids, backend names and platform messages, never
//!   secret bytes; keychain errors that carry payload bytes are scrubbed before mapping.
//! * The SQLite table ([`SCHEMA_SQL`], applied by the journal's migration runner as
//!   `0002`) holds only the id, kind, a random version tag and timestamps.
//!
//! # Keychain layout
//!
//! Every credential version is one keychain entry with keyring *service* = the
//! [`Keychain`]'s service name (`postern` in the product, a random name in tests) and
//! keyring *user* = `<credential_id>@<version_tag>`, e.g. `github-token@v3-9f1c02ab`.
//! Credential ids cannot contain `@`, so the pair is unambiguous. A fresh random version
//! tag is generated on every set or rotation, so a rotation writes a *new* entry and the
//! previous one is deleted only after the metadata points at the new one: a crash in
//! between never leaves the metadata naming an entry that does not exist.

use std::fmt;
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

/// The `0002` journal migration that creates the credential metadata table.
///
/// The journal's migration runner applies it inside its own transaction; it contains no
/// transaction statements of its own.
pub const SCHEMA_SQL: &str = include_str!("../journal/migrations/0002_credentials.sql");

/// The keychain service name the product uses.
pub const DEFAULT_SERVICE: &str = "postern";

/// The longest accepted credential id, in bytes.
pub const MAX_ID_LEN: usize = 128;

// ---------------------------------------------------------------------------------------
// Secret
// ---------------------------------------------------------------------------------------

pub use crate::secret::Secret;

mod error;
mod ids;
mod keychain;
pub mod meta;

pub use error::*;
pub use ids::*;
pub use keychain::*;

// ---------------------------------------------------------------------------------------
// Vault facade
// ---------------------------------------------------------------------------------------

/// The credential store: secret bytes in a [`Keychain`], their non-secret metadata in
/// the journal database. The one place secrets are written, listed, removed and read for
/// injection. Calls block (D-Bus, SQLite); async callers run them on the blocking pool.
pub struct Vault {
    keychain: Keychain,
    conn: Mutex<Connection>,
}

impl fmt::Debug for Vault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vault")
            .field("keychain", &self.keychain)
            .finish_non_exhaustive()
    }
}

impl Vault {
    /// The store over a connection whose schema the caller applied ([`SCHEMA_SQL`]).
    pub fn over(keychain: Keychain, conn: Connection) -> Vault {
        Vault {
            keychain,
            conn: Mutex::new(conn),
        }
    }

    /// The keychain holding the secrets.
    pub fn keychain(&self) -> &Keychain {
        &self.keychain
    }

    fn with_conn<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, VaultError>,
    ) -> Result<T, VaultError> {
        let conn = self.conn.lock().map_err(|_| VaultError::Locked {
            backend: self.keychain.backend(),
            reason: "credential metadata connection poisoned".into(),
        })?;
        f(&conn)
    }

    /// The non-secret metadata (current version tag) of credential `id`.
    ///
    /// # Errors
    ///
    /// [`VaultError::Missing`] if there is no such credential, [`VaultError::Storage`].
    pub fn meta(&self, id: impl AsRef<str>) -> Result<CredentialMeta, VaultError> {
        let id = CredentialId::new(id.as_ref())?;
        self.with_conn(|conn| {
            meta::get(conn, &id)?.ok_or_else(|| VaultError::Missing {
                credential: id.as_str().to_string(),
            })
        })
    }

    /// Creates credential `id`, or rotates it to `secret` if it exists.
    ///
    /// The new version is written to the keychain first and the metadata moved to it
    /// second, so the metadata never names an entry that was not written. On rotation
    /// the previous entry is deleted only after the metadata has moved; if that delete
    /// fails the old entry is left behind unreferenced (nothing will read it) rather than
    /// reporting a rotation that did happen as a failure.
    ///
    /// # Errors
    ///
    /// [`VaultError::InvalidSecret`] for an empty secret, [`VaultError::KindMismatch`] if
    /// the credential exists with another kind, [`VaultError::Conflict`] if a concurrent
    /// set or remove won, [`VaultError::Locked`] and [`VaultError::Storage`] from the
    /// keychain and database.
    pub fn set(
        &self,
        id: impl AsRef<str>,
        kind: CredentialKind,
        secret: &Secret,
        now_ms: i64,
    ) -> Result<CredentialMeta, VaultError> {
        let id = CredentialId::new(id.as_ref())?;
        self.with_conn(|conn| self.set_in(conn, &id, kind, secret, now_ms))
    }

    fn set_in(
        &self,
        conn: &Connection,
        id: &CredentialId,
        kind: CredentialKind,
        secret: &Secret,
        now_ms: i64,
    ) -> Result<CredentialMeta, VaultError> {
        if secret.is_empty() {
            return Err(VaultError::InvalidSecret {
                reason: "it is empty",
            });
        }
        let existing = meta::get(conn, id)?;
        if let Some(old) = &existing
            && old.kind != kind
        {
            return Err(VaultError::KindMismatch {
                credential: id.to_string(),
                stored: old.kind,
                requested: kind,
            });
        }

        let version = VersionTag::generate(existing.as_ref().map(|m| &m.version))?;
        self.keychain.put(id, &version, secret)?;

        let recorded = match &existing {
            Some(old) => meta::set_version(conn, id, &old.version, &version, now_ms).map(|moved| {
                moved.then(|| CredentialMeta {
                    version: version.clone(),
                    rotated_at_ms: now_ms,
                    ..old.clone()
                })
            }),
            None => {
                let new = CredentialMeta {
                    id: id.clone(),
                    kind,
                    version: version.clone(),
                    created_at_ms: now_ms,
                    rotated_at_ms: now_ms,
                    last_used_at_ms: None,
                };
                match meta::insert(conn, &new) {
                    Ok(()) => Ok(Some(new)),
                    // Someone else created the credential since our read.
                    Err(rusqlite::Error::SqliteFailure(e, _))
                        if e.code == rusqlite::ErrorCode::ConstraintViolation =>
                    {
                        Ok(None)
                    }
                    Err(e) => Err(e),
                }
            }
        };

        let recorded = match recorded {
            Ok(Some(meta)) => meta,
            failed => {
                // The new entry is not referenced by any metadata: remove it so a failed
                // set does not leave a secret behind. Best effort; the original error is
                // the one worth reporting.
                let _ = self.keychain.delete(id, &version);
                return match failed {
                    Err(e) => Err(e.into()),
                    _ => Err(VaultError::Conflict {
                        credential: id.to_string(),
                    }),
                };
            }
        };

        if let Some(old) = existing {
            // Best effort by design (see the method docs).
            let _ = self.keychain.delete(id, &old.version);
        }
        Ok(recorded)
    }

    /// Reads credential `id`'s current secret for injection and records the use.
    ///
    /// # Errors
    ///
    /// [`VaultError::Missing`] if the credential or its keychain entry does not exist,
    /// [`VaultError::Locked`] if the keychain is unavailable, [`VaultError::Storage`].
    pub fn read_for_injection(
        &self,
        id: impl AsRef<str>,
        now_ms: i64,
    ) -> Result<(CredentialMeta, Secret), VaultError> {
        let id = CredentialId::new(id.as_ref())?;
        self.with_conn(|conn| self.read_in(conn, &id, now_ms))
    }

    /// The metadata and secret of credential `id` for one injection, without recording
    /// the use: the caller records it in the transaction that authorizes the attempt
    /// ([`crate::journal::Journal::authorize_and_start`]), which refuses a credential
    /// removed in between. The metadata connection is not held while the keychain
    /// answers, so concurrent injections read the keychain side by side. The Secret
    /// Service's one-round-trip read is awaited on the caller's runtime
    /// ([`Keychain::get_fast`]); whatever it does not answer, and every other keychain,
    /// is read on the blocking pool.
    ///
    /// # Errors
    ///
    /// [`VaultError::Missing`], [`VaultError::Locked`] (also when the blocking read did
    /// not finish), [`VaultError::Storage`].
    pub async fn read_secret_async(
        self: Arc<Self>,
        id: String,
    ) -> Result<(CredentialMeta, Secret), VaultError> {
        let id = CredentialId::new(&id)?;
        // An indexed read of non-secret metadata: microseconds, fine inline.
        let meta = self.meta(&id)?;
        if let Some(secret) = self.keychain.get_fast(&id, &meta.version).await {
            return Ok((meta, secret));
        }
        let backend = self.keychain.backend();
        tokio::task::spawn_blocking(move || {
            let secret = self.keychain.get(&id, &meta.version)?;
            Ok((meta, secret))
        })
        .await
        .unwrap_or_else(|_| {
            Err(VaultError::Locked {
                backend,
                reason: "the keychain read did not finish".to_owned(),
            })
        })
    }

    fn read_in(
        &self,
        conn: &Connection,
        id: &CredentialId,
        now_ms: i64,
    ) -> Result<(CredentialMeta, Secret), VaultError> {
        let missing = || VaultError::Missing {
            credential: id.to_string(),
        };
        let mut meta = meta::get(conn, id)?.ok_or_else(missing)?;
        let secret = self.keychain.get(id, &meta.version)?;
        if !meta::touch_last_used(conn, id, now_ms)? {
            // Removed between the read and now; do not hand out a secret for a
            // credential that no longer exists.
            return Err(missing());
        }
        meta.last_used_at_ms = Some(meta.last_used_at_ms.map_or(now_ms, |t| t.max(now_ms)));
        Ok((meta, secret))
    }

    /// Every credential's metadata, ordered by id.
    ///
    /// # Errors
    ///
    /// [`VaultError::Storage`].
    pub fn list(&self) -> Result<Vec<CredentialMeta>, VaultError> {
        self.with_conn(|conn| Ok(meta::list(conn)?))
    }

    /// Deletes credential `id`: its keychain entry, then its metadata.
    ///
    /// The keychain goes first so that a failure (say, a locked keychain) leaves the
    /// metadata in place to retry from, instead of an unreferenced secret. A keychain
    /// entry that is already gone is not an error.
    ///
    /// # Errors
    ///
    /// [`VaultError::Missing`] if there is no such credential, [`VaultError::Locked`],
    /// [`VaultError::Storage`].
    pub fn remove(&self, id: impl AsRef<str>) -> Result<(), VaultError> {
        let id = CredentialId::new(id.as_ref())?;
        self.with_conn(|conn| self.remove_in(conn, &id))
    }

    fn remove_in(&self, conn: &Connection, id: &CredentialId) -> Result<(), VaultError> {
        let missing = || VaultError::Missing {
            credential: id.to_string(),
        };
        let meta = meta::get(conn, id)?.ok_or_else(missing)?;
        match self.keychain.delete(id, &meta.version) {
            Ok(()) | Err(VaultError::Missing { .. }) => {}
            Err(e) => return Err(e),
        }
        if meta::remove(conn, id)? {
            Ok(())
        } else {
            Err(missing())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Code;

    // Regression: issue 26 (item 4): out of descriptors, the keychain read was reported
    // as a locked keychain (retry after_correction) to every other user.
    #[test]
    fn a_broker_out_of_descriptors_is_unavailable_not_a_locked_keychain() {
        let exhausted = VaultError::Locked {
            backend: KeychainBackend::SecretService,
            reason: "I/O error: Too many open files (os error 24)".into(),
        };
        assert_eq!(exhausted.code(), Code::BrokerUnavailable);
        assert_eq!(
            exhausted.code().spec().retry,
            crate::contract::Retry::Backoff
        );
        assert!(exhausted.agent_message().contains("out of resources"));
        let locked = VaultError::Locked {
            backend: KeychainBackend::SecretService,
            reason: "the collection is locked".into(),
        };
        assert_eq!(locked.code(), Code::VaultLocked);
    }

    #[test]
    fn ids_follow_the_alphabet() {
        for ok in ["a", "github-token", "A.b_c-9", &"x".repeat(128)] {
            assert!(CredentialId::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a@b", "a b", "é", "a/b", &"x".repeat(129)] {
            assert!(matches!(
                CredentialId::new(bad),
                Err(VaultError::InvalidId { .. })
            ));
        }
    }

    #[test]
    fn version_tags_parse_what_they_generate() {
        let first = VersionTag::generate(None).unwrap();
        assert_eq!(first.generation(), 1);
        assert_eq!(VersionTag::parse(first.as_str()), Some(first.clone()));
        let second = VersionTag::generate(Some(&first)).unwrap();
        assert_eq!(second.generation(), 2);
        for bad in [
            "",
            "v",
            "v1",
            "v0-00000000",
            "v01-00000000",
            "v1-0000000",
            "v1-ABCDEF01",
        ] {
            assert_eq!(VersionTag::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn kinds_round_trip() {
        for kind in CredentialKind::ALL {
            assert_eq!(kind.as_str().parse::<CredentialKind>(), Ok(*kind));
            assert_eq!(serde_json::to_string(kind).unwrap(), format!("\"{kind}\""));
        }
    }

    #[test]
    fn schema_checks_match_the_types() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA_SQL).unwrap();
        let insert = |id: &str, version: &str| {
            conn.execute(
                "INSERT INTO credentials VALUES (?1, 'token', ?2, 0, 0, NULL)",
                [id, version],
            )
        };
        assert!(insert("ok.id_-9", "v12-0123abcd").is_ok());
        assert!(insert("bad@id", "v1-0123abcd").is_err());
        assert!(insert("bad id", "v1-0123abcd").is_err());
        assert!(insert("", "v1-0123abcd").is_err());
        assert!(insert("fine", "v1-0123ABCD").is_err());
        assert!(insert("fine", "1-0123abcd").is_err());
    }
}
