//! Why a vault operation failed, as a typed error that never carries a secret.

use super::ids::CredentialKind;
use super::keychain::KeychainBackend;
use crate::contract::Code;

/// Why a vault operation failed.
///
/// No variant holds secret bytes: keychain errors that carry a payload are scrubbed before
/// they are mapped, and rejected ids are reported by length only.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VaultError {
    /// The keychain is locked, its service is not running or not reachable (no D-Bus
    /// session, no Secret Service provider), access was denied, or the platform failed.
    #[error(
        "the OS keychain ({backend}) is locked or unreachable: {reason}; \
         unlock the keychain (or start its Secret Service) and retry"
    )]
    Locked {
        backend: KeychainBackend,
        /// The platform's description of the failure.
        reason: String,
    },

    /// No such credential, or its keychain entry is gone.
    #[error(
        "credential `{credential}` is not in the keychain; \
         add it with `postern vault set {credential}`"
    )]
    Missing { credential: String },

    /// A credential id (or keychain service name) is not 1-128 characters of
    /// `A-Z a-z 0-9 . _ -`.
    #[error(
        "invalid credential id ({len} bytes): use 1-128 characters from A-Z, a-z, 0-9, \
         `.`, `_` and `-`"
    )]
    InvalidId { len: usize },

    /// The secret is unusable (for example empty); nothing was stored.
    #[error("the secret was not stored: {reason}")]
    InvalidSecret { reason: &'static str },

    /// A set tried to change an existing credential's kind.
    #[error(
        "credential `{credential}` is a {stored} credential, not {requested}; \
         remove it with `postern vault remove {credential}` before adding it as {requested}"
    )]
    KindMismatch {
        credential: String,
        stored: CredentialKind,
        requested: CredentialKind,
    },

    /// Another set or remove changed the same credential at the same time.
    #[error("credential `{credential}` was changed concurrently; retry")]
    Conflict { credential: String },

    /// The keychain holds something for this credential that cannot be used (undecodable
    /// data, or several entries matching one version).
    #[error(
        "the keychain entry for credential `{credential}` is unusable: {reason}; \
         replace it with `postern vault set {credential}`"
    )]
    Corrupt { credential: String, reason: String },

    /// The OS random number generator failed while generating a version tag.
    #[error("could not generate a credential version tag: {reason}")]
    Entropy { reason: String },

    /// The metadata database failed.
    #[error("credential metadata storage failed: {0}")]
    Storage(#[from] rusqlite::Error),
}

/// Whether a keychain failure's reason is the broker running out of descriptors or
/// memory (EMFILE, ENFILE, ENOMEM), not the keychain: issue 26 found a flood of
/// connections turning other users' calls into VAULT_LOCKED / after_correction, which
/// sends a person to unlock a keychain that was never locked.
fn is_exhaustion(reason: &str) -> bool {
    [
        "os error 24",
        "os error 23",
        "os error 12",
        "Too many open files",
    ]
    .iter()
    .any(|sign| reason.contains(sign))
}

impl VaultError {
    /// Whether this is the broker short of descriptors or memory rather than a problem
    /// with the keychain or the credential.
    pub fn is_exhaustion(&self) -> bool {
        matches!(self, VaultError::Locked { reason, .. } if is_exhaustion(reason))
    }

    /// What the agent is told: the contract's own words for the code, never the
    /// credential id, the keychain service or the platform's detail (the operator reads
    /// those in the console and the CLI, where [`VaultError`]'s display is shown).
    pub fn agent_message(&self) -> String {
        let what = match self {
            e if e.is_exhaustion() => "The broker is out of resources right now; retry later.",
            VaultError::Missing { .. } => {
                "The target's credential is not in the keychain; an operator must add it."
            }
            VaultError::Locked { .. } => "The keychain is locked or cannot be reached.",
            VaultError::Corrupt { .. } => "The target's credential could not be read back.",
            _ => "The target's credential could not be read.",
        };
        format!("{what} Nothing was sent.")
    }

    /// The contract code an invocation reports for this error.
    pub fn code(&self) -> Code {
        match self {
            e if e.is_exhaustion() => Code::BrokerUnavailable,
            VaultError::Locked { .. } => Code::VaultLocked,
            VaultError::Missing { .. } => Code::CredentialMissing,
            VaultError::InvalidId { .. }
            | VaultError::InvalidSecret { .. }
            | VaultError::KindMismatch { .. } => Code::InvalidRequest,
            VaultError::Corrupt { .. } => Code::KeyDecryptionFailed,
            VaultError::Conflict { .. } | VaultError::Entropy { .. } | VaultError::Storage(_) => {
                Code::BrokerUnavailable
            }
        }
    }
}
