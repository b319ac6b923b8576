//! The audit signing key: loading it from the keychain (creating it there on first use)
//! and reading which key signed the journal's newest checkpoint.
//!
//! The seed exists only in the keychain and in the key returned. Nothing here writes the
//! journal; [`last_checkpoint_key`] only reads it.

use std::path::Path;

use ed25519_dalek::SigningKey;
use rusqlite::{Connection, OpenFlags};

/// The keychain entry holding the audit signing key.
pub const AUDIT_KEY_ID: &str = "postern-audit-signing";

/// Why the audit key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum AuditKeyError {
    #[error(transparent)]
    Vault(#[from] crate::vault::VaultError),
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    #[error("the audit signing key in the keychain is not a 32-byte ed25519 seed")]
    Malformed,
}

/// Loads the audit signing key from the vault, creating and storing one on first use.
/// The seed itself exists only in the keychain and in the returned key.
pub fn signing_key_from_vault(
    vault: &crate::vault::Vault,
    now_ms: i64,
) -> Result<SigningKey, AuditKeyError> {
    use crate::vault::{CredentialId, CredentialKind, Secret, VaultError};
    let id = CredentialId::new(AUDIT_KEY_ID)?;
    let secret = match vault.read_for_injection(&id, now_ms) {
        Ok((_, secret)) => secret,
        Err(VaultError::Missing { .. }) => {
            let mut seed = vec![0u8; 32];
            getrandom::fill(&mut seed).map_err(|e| {
                AuditKeyError::Journal(crate::journal::JournalError::Storage(format!(
                    "no randomness for the audit key: {e}"
                )))
            })?;
            let secret = Secret::new(seed);
            vault.set(&id, CredentialKind::SigningKey, &secret, now_ms)?;
            secret
        }
        Err(e) => return Err(e.into()),
    };
    signing_key_from_secret(&secret)
}

/// The audit key from the keychain entry's bytes (a 32-byte ed25519 seed).
pub fn signing_key_from_secret(secret: &crate::vault::Secret) -> Result<SigningKey, AuditKeyError> {
    let seed: [u8; 32] = secret
        .expose()
        .try_into()
        .map_err(|_| AuditKeyError::Malformed)?;
    Ok(SigningKey::from_bytes(&seed))
}

/// The public key of the newest signed checkpoint in the journal at `db`, if any: lets
/// a broker notice that the audit key it loaded is not the one that signed the past.
pub fn last_checkpoint_key(db: &Path) -> Option<[u8; 32]> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).ok()?;
    let key: Vec<u8> = conn
        .query_row(
            "SELECT public_key FROM checkpoints ORDER BY seq DESC LIMIT 1",
            [],
            |r| r.get(0),
        )
        .ok()?;
    key.try_into().ok()
}
