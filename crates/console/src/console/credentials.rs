//! Credentials: their metadata, and storing or removing one. A secret value travels
//! only inward, into the keychain; the audit signing key is neither listed nor changed.

use postern_broker::audit;
use postern_broker::ssh_keys::{KeyImportError, import_private_key};
use postern_broker::vault::{CredentialKind, CredentialMeta, Secret};

use super::Console;
use crate::dto::{CommandError, CredentialCard, ErrorCode, SetCredential};

impl Console {
    pub(super) fn credential_metas(&self) -> Result<Vec<CredentialMeta>, CommandError> {
        // The audit signing key lives in the vault too, but it is the broker's own: it is
        // neither listed nor removable here (removing it would orphan the checkpoints).
        Ok(self
            .engine
            .vault()
            .list()
            .map_err(|e| CommandError::new(e.code(), e.to_string()))?
            .into_iter()
            .filter(|m| m.id.as_str() != audit::AUDIT_KEY_ID)
            .collect())
    }

    pub fn credentials(&self) -> Result<Vec<CredentialCard>, CommandError> {
        let config = self.engine.config().current();
        Ok(self
            .credential_metas()?
            .into_iter()
            .map(|m| {
                let id = m.id.as_str().to_string();
                let used_by = config
                    .http
                    .iter()
                    .filter(|t| t.credential.as_str() == id)
                    .map(|t| t.name.clone())
                    .chain(
                        config
                            .ssh
                            .iter()
                            .filter(|t| t.credential.as_str() == id)
                            .map(|t| t.name.clone()),
                    )
                    .collect();
                CredentialCard {
                    kind: m.kind.as_str().to_string(),
                    version: m.version.as_str().to_string(),
                    created_at_ms: m.created_at_ms,
                    rotated_at_ms: (m.rotated_at_ms != m.created_at_ms).then_some(m.rotated_at_ms),
                    last_used_ms: m.last_used_at_ms,
                    used_by,
                    id,
                }
            })
            .collect())
    }

    /// Adds or rotates a credential. The value is moved into a zeroizing buffer at once,
    /// written to the keychain, and never returned or logged.
    pub fn set_credential(&self, input: SetCredential) -> Result<CredentialCard, CommandError> {
        let SetCredential {
            id,
            kind,
            secret,
            passphrase,
        } = input;
        let secret = Secret::from(secret);
        let passphrase = passphrase.map(Secret::from);
        reserved(&id)?;
        let kind: CredentialKind = kind.parse().map_err(|_| {
            CommandError::field(
                ErrorCode::InvalidInput,
                "kind",
                format!(
                    "Unknown credential kind; use one of: {}.",
                    CredentialKind::ALL
                        .iter()
                        .map(|k| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })?;
        if secret.is_empty() {
            return Err(CommandError::field(
                ErrorCode::InvalidInput,
                "secret",
                "The secret is empty; nothing was stored.",
            ));
        }
        let secret = if kind == CredentialKind::SshKey {
            let text = std::str::from_utf8(secret.expose()).map_err(|_| {
                CommandError::field(
                    ErrorCode::InvalidInput,
                    "secret",
                    "The SSH private key is not text.",
                )
            })?;
            let pass = passphrase
                .as_ref()
                .and_then(|p| std::str::from_utf8(p.expose()).ok())
                .filter(|p| !p.is_empty());
            match import_private_key(text, pass) {
                Ok(key) => key.private_openssh,
                Err(KeyImportError::PassphraseRequired) => {
                    return Err(CommandError::field(
                        ErrorCode::InvalidInput,
                        "passphrase",
                        "This SSH key is encrypted: enter its passphrase (used once to decrypt, \
                         never stored).",
                    ));
                }
                Err(e) => {
                    return Err(CommandError::field(
                        ErrorCode::InvalidInput,
                        "secret",
                        format!("{e}; nothing was stored."),
                    ));
                }
            }
        } else {
            secret
        };
        let stored = self
            .engine
            .vault()
            .set(&id, kind, &secret, self.now())
            .map_err(|e| CommandError::field(e.code(), "id", e.to_string()))?;
        drop(secret);
        self.credentials()?
            .into_iter()
            .find(|c| c.id == stored.id.as_str())
            .ok_or_else(|| {
                CommandError::new(ErrorCode::Internal, "the stored credential is not listed")
            })
    }

    pub fn remove_credential(&self, id: &str) -> Result<(), CommandError> {
        reserved(id)?;
        self.engine
            .vault()
            .remove(id)
            .map_err(|e| CommandError::field(e.code(), "id", e.to_string()))
    }
}

/// The broker's own keychain entries cannot be written or removed from the console.
fn reserved(id: &str) -> Result<(), CommandError> {
    if id == audit::AUDIT_KEY_ID {
        return Err(CommandError::field(
            ErrorCode::InvalidInput,
            "id",
            format!("`{id}` is the broker's audit signing key; it cannot be changed here."),
        ));
    }
    Ok(())
}
