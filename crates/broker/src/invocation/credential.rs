//! The injection step's read: the credential an invocation bound, read from the vault
//! while the pipeline records the binding, and refused when it was rotated since.

use std::sync::Arc;

use crate::action::ConfigSnapshot;
use crate::contract::{Code, Failure, Phase, Retry};
use crate::vault::{CredentialMeta, Secret, Vault, VaultError};

/// A keychain read in flight ([`CredentialRead::start`]), for the version an invocation
/// bound; [`CredentialRead::finish`] waits for it.
pub struct CredentialRead {
    read: tokio::task::JoinHandle<Result<(CredentialMeta, Secret), VaultError>>,
    version: String,
}

impl CredentialRead {
    /// Starts reading the credential `snapshot` bound, in a task of its own: the caller
    /// goes on (recording the binding) while the keychain answers. Dropping it drops the
    /// secret unused once the read ends.
    pub fn start(vault: &Arc<Vault>, snapshot: &ConfigSnapshot) -> Self {
        let read = vault
            .clone()
            .read_secret_async(snapshot.credential_id.clone());
        CredentialRead {
            read: tokio::spawn(read),
            version: snapshot.credential_version.clone(),
        }
    }

    /// The credential's metadata and secret. A credential rotated since binding is
    /// refused: it is a changed bound value, so a new invocation.
    pub async fn finish(self) -> Result<(CredentialMeta, Secret), Failure> {
        let (meta, secret) = match self.read.await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => {
                return Err(Failure {
                    phase: Phase::CredentialInjection,
                    code: e.code(),
                    retry: e.code().spec().retry,
                    message: e.agent_message(),
                });
            }
            Err(_) => {
                return Err(Failure {
                    phase: Phase::CredentialInjection,
                    code: Code::VaultLocked,
                    retry: Retry::AfterCorrection,
                    message: "The keychain read did not finish.".into(),
                });
            }
        };
        if meta.version.as_str() != self.version {
            return Err(Failure {
                phase: Phase::Validation,
                code: Code::FingerprintMismatch,
                retry: Retry::AfterCorrection,
                message:
                    "The credential was rotated after this request was bound; nothing was sent."
                        .into(),
            });
        }
        Ok((meta, secret))
    }
}

/// Reads the credential an invocation bound, off the async threads. A credential
/// rotated since binding is refused: it is a changed bound value, so a new invocation.
/// The use is recorded by the authorization that follows
/// ([`crate::journal::Journal::authorize_and_start`]), not here; `_now_ms` is kept for
/// callers.
pub async fn read_bound_credential(
    vault: &Arc<Vault>,
    snapshot: &ConfigSnapshot,
    _now_ms: i64,
) -> Result<(CredentialMeta, Secret), Failure> {
    CredentialRead::start(vault, snapshot).finish().await
}
