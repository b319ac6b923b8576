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

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};

use keyring_core::{CredentialStore, Entry};

use crate::sealed_store::{SealedStore, StoreError, VaultKey};
use rusqlite::Connection;
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use serde::{Deserialize, Serialize};
use zeroize::Zeroize;

use crate::contract::Code;

/// The `0002` journal migration that creates the credential metadata table.
///
/// The journal's migration runner applies it inside its own transaction; it contains no
/// transaction statements of its own.
pub const SCHEMA_SQL: &str = include_str!("journal/migrations/0002_credentials.sql");

/// The keychain service name the product uses.
pub const DEFAULT_SERVICE: &str = "postern";

/// The longest accepted credential id, in bytes.
pub const MAX_ID_LEN: usize = 128;

// ---------------------------------------------------------------------------------------
// Secret
// ---------------------------------------------------------------------------------------

pub use crate::secret::Secret;

// ---------------------------------------------------------------------------------------
// Identifiers and metadata
// ---------------------------------------------------------------------------------------

/// A credential's name: 1 to 128 characters from `A-Z a-z 0-9 . _ -`.
///
/// The restricted alphabet keeps ids safe to embed in keychain entry names (no `@`, no
/// separators a backend might interpret) and in shell-quoted CLI hints.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CredentialId(String);

impl CredentialId {
    /// Validates `id`.
    ///
    /// # Errors
    ///
    /// [`VaultError::InvalidId`] if `id` is empty, longer than [`MAX_ID_LEN`] or contains a
    /// character outside `A-Z a-z 0-9 . _ -`.
    pub fn new(id: impl Into<String>) -> Result<Self, VaultError> {
        let id = id.into();
        if is_valid_name(&id) {
            Ok(Self(id))
        } else {
            // The rejected text is not echoed: a caller that confused arguments may have
            // passed a secret where the id belongs.
            Err(VaultError::InvalidId { len: id.len() })
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn is_valid_name(name: &str) -> bool {
    (1..=MAX_ID_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl fmt::Display for CredentialId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for CredentialId {
    type Err = VaultError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for CredentialId {
    type Error = VaultError;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<CredentialId> for String {
    fn from(id: CredentialId) -> Self {
        id.0
    }
}

impl AsRef<str> for CredentialId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Which keychain entry holds a credential's current secret: `v<n>-<8 hex digits>`.
///
/// `n` counts versions of the credential (1 for the first set) and the hex suffix is
/// fresh randomness, so a tag is unique even if metadata is lost and recreated. Tags are
/// never derived from the secret: they are safe to log, journal and show.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct VersionTag(String);

impl VersionTag {
    /// Generates the tag that follows `previous` (or the first tag when `None`).
    ///
    /// # Errors
    ///
    /// [`VaultError::Entropy`] if the OS random number generator fails.
    pub fn generate(previous: Option<&VersionTag>) -> Result<Self, VaultError> {
        let generation = previous.map_or(1, |p| p.generation().saturating_add(1));
        let mut random = [0u8; 4];
        getrandom::fill(&mut random).map_err(|e| VaultError::Entropy {
            reason: e.to_string(),
        })?;
        let [a, b, c, d] = random;
        Ok(Self(format!("v{generation}-{a:02x}{b:02x}{c:02x}{d:02x}")))
    }

    /// Parses a tag previously produced by [`VersionTag::generate`].
    pub fn parse(tag: &str) -> Option<Self> {
        let (generation, random) = tag.strip_prefix('v')?.split_once('-')?;
        let generation_ok = !generation.starts_with('0')
            && generation.bytes().all(|b| b.is_ascii_digit())
            && generation.parse::<u64>().is_ok();
        let random_ok = random.len() == 8
            && random
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        (generation_ok && random_ok).then(|| Self(tag.to_owned()))
    }

    /// The version number `n` (1 for a credential's first secret).
    pub fn generation(&self) -> u64 {
        self.0
            .strip_prefix('v')
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(n, _)| n.parse().ok())
            .unwrap_or(0)
    }

    /// The tag as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VersionTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The error for a string that is not a [`VersionTag`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a credential version tag (expected `v<n>-<8 hex digits>`)")]
pub struct InvalidVersionTag;

impl TryFrom<String> for VersionTag {
    type Error = InvalidVersionTag;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value).ok_or(InvalidVersionTag)
    }
}

impl From<VersionTag> for String {
    fn from(tag: VersionTag) -> Self {
        tag.0
    }
}

/// What a credential is used for; decides how the injection step attaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CredentialKind {
    /// A bearer or API token attached to HTTP requests.
    Token,
    /// An SSH private key used for user authentication.
    SshKey,
    /// A private key used to sign requests or artifacts.
    SigningKey,
}

impl CredentialKind {
    /// Every kind.
    pub const ALL: &'static [CredentialKind] = &[
        CredentialKind::Token,
        CredentialKind::SshKey,
        CredentialKind::SigningKey,
    ];

    /// The stored and wire form, e.g. `"ssh_key"`.
    pub fn as_str(self) -> &'static str {
        match self {
            CredentialKind::Token => "token",
            CredentialKind::SshKey => "ssh_key",
            CredentialKind::SigningKey => "signing_key",
        }
    }
}

impl fmt::Display for CredentialKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error for a string that is not a [`CredentialKind`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown credential kind (expected token, ssh_key or signing_key)")]
pub struct UnknownCredentialKind;

impl FromStr for CredentialKind {
    type Err = UnknownCredentialKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or(UnknownCredentialKind)
    }
}

/// The non-secret facts about one credential, as stored in SQLite.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialMeta {
    pub id: CredentialId,
    pub kind: CredentialKind,
    /// The keychain entry holding the current secret.
    pub version: VersionTag,
    pub created_at_ms: i64,
    /// When the current version was written (equals `created_at_ms` before any rotation).
    pub rotated_at_ms: i64,
    /// When the secret was last read for injection, if ever.
    pub last_used_at_ms: Option<i64>,
}

impl ToSql for CredentialId {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for CredentialId {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        CredentialId::new(value.as_str()?).map_err(|e| FromSqlError::Other(Box::new(e)))
    }
}

impl ToSql for VersionTag {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for VersionTag {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        VersionTag::parse(value.as_str()?).ok_or(FromSqlError::Other(Box::new(InvalidVersionTag)))
    }
}

impl ToSql for CredentialKind {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for CredentialKind {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        value
            .as_str()?
            .parse()
            .map_err(|e| FromSqlError::Other(Box::new(e)))
    }
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------
// Keychain
// ---------------------------------------------------------------------------------------

/// Which OS keychain holds the secrets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeychainBackend {
    /// The freedesktop Secret Service over the D-Bus session bus (GNOME Keyring, KWallet,
    /// KeePassXC). Persistent across reboots.
    SecretService,
    /// The Linux kernel key retention service (session keyring, linked to the persistent
    /// keyring when available). Secrets vanish on reboot.
    Keyutils,
    /// Sealed files in the data dir under a key from outside it
    /// ([`crate::sealed_store`]): for a broker running as its own system user.
    File,
    /// The macOS login keychain (generic passwords, through the Security framework).
    MacosKeychain,
    /// The Windows Credential Manager (generic credentials of this user, persisted on
    /// this machine only: never roamed to a domain profile).
    WindowsCredentialManager,
}

impl KeychainBackend {
    /// The config and display form, e.g. `"secret_service"`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeychainBackend::SecretService => "secret_service",
            KeychainBackend::Keyutils => "keyutils",
            KeychainBackend::File => "file",
            KeychainBackend::MacosKeychain => "macos_keychain",
            KeychainBackend::WindowsCredentialManager => "windows_credential_manager",
        }
    }

    /// The OS keychain a person's broker uses on this platform by default: the Secret
    /// Service on Linux, the login keychain on macOS, the Credential Manager on Windows.
    pub fn platform_default() -> KeychainBackend {
        if cfg!(target_os = "macos") {
            KeychainBackend::MacosKeychain
        } else if cfg!(windows) {
            KeychainBackend::WindowsCredentialManager
        } else {
            KeychainBackend::SecretService
        }
    }
}

impl fmt::Display for KeychainBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Secret storage in one OS keychain backend under one service name.
///
/// Each `Keychain` owns its own credential store object rather than using the keyring
/// ecosystem's process-wide default store, so several backends and service names can
/// coexist in one process (tests rely on this).
///
/// The store is opened lazily on first use and reopened after a platform failure, so a
/// broker started before the user logs in, or outliving a keyring daemon restart,
/// recovers without a restart of its own.
pub struct Keychain {
    backend: KeychainBackend,
    service: String,
    store: Mutex<Option<Arc<CredentialStore>>>,
    /// The `file` backend's store (`None` for the OS keychains).
    sealed: Option<SealedStore>,
    /// The Secret Service reads of injections: one connection and session, and where
    /// each entry is (its object path, never its secret), so a read is one round trip.
    #[cfg(all(
        unix,
        not(any(target_os = "macos", target_os = "ios", target_os = "android"))
    ))]
    reads: reads::Reads,
}

impl fmt::Debug for Keychain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keychain")
            .field("backend", &self.backend)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

impl Keychain {
    /// A keychain in `backend` whose entries live under `service` (normally
    /// [`DEFAULT_SERVICE`]). Does not touch the keychain yet.
    ///
    /// # Errors
    ///
    /// [`VaultError::InvalidId`] if `service` does not follow the credential id rules
    /// (it becomes part of entry names, so the same alphabet applies).
    pub fn new(backend: KeychainBackend, service: impl Into<String>) -> Result<Self, VaultError> {
        let service = service.into();
        if !is_valid_name(&service) {
            return Err(VaultError::InvalidId { len: service.len() });
        }
        Ok(Self {
            backend,
            service,
            store: Mutex::new(None),
            sealed: None,
            #[cfg(all(
                unix,
                not(any(target_os = "macos", target_os = "ios", target_os = "android"))
            ))]
            reads: reads::Reads::default(),
        })
    }

    /// The `file` keychain: sealed records in `data_dir/vault` under `key`, entries
    /// under `service`.
    ///
    /// # Errors
    ///
    /// [`VaultError::InvalidId`] for a bad service name, [`VaultError::Locked`] if the
    /// store directory cannot be made.
    pub fn file(
        data_dir: &Path,
        key: &VaultKey,
        service: impl Into<String>,
    ) -> Result<Self, VaultError> {
        let mut keychain = Self::new(KeychainBackend::File, service)?;
        keychain.sealed =
            Some(
                SealedStore::open(data_dir, key).map_err(|e| VaultError::Locked {
                    backend: KeychainBackend::File,
                    reason: e.to_string(),
                })?,
            );
        Ok(keychain)
    }

    /// Runs `op` on the sealed store, for the `file` backend; `None` for the others.
    fn with_sealed<T>(
        &self,
        id: &CredentialId,
        version: &VersionTag,
        op: impl FnOnce(&SealedStore, &str, &str) -> Result<T, StoreError>,
    ) -> Option<Result<T, VaultError>> {
        if self.backend != KeychainBackend::File {
            return None;
        }
        let Some(store) = self.sealed.as_ref() else {
            return Some(Err(VaultError::Locked {
                backend: KeychainBackend::File,
                reason: "the file keychain was opened without its vault key".to_owned(),
            }));
        };
        let user = entry_user(id, version);
        Some(op(store, &self.service, &user).map_err(|e| match e {
            StoreError::Missing => VaultError::Missing {
                credential: id.to_string(),
            },
            StoreError::Unsealable => VaultError::Corrupt {
                credential: id.to_string(),
                reason: e.to_string(),
            },
            StoreError::Io(reason) => VaultError::Locked {
                backend: KeychainBackend::File,
                reason,
            },
        }))
    }

    /// The backend this keychain uses.
    pub fn backend(&self) -> KeychainBackend {
        self.backend
    }

    /// The service name entries are stored under.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// Stores `secret` as version `version` of credential `id`, replacing any entry
    /// with the same id and version.
    ///
    /// # Errors
    ///
    /// [`VaultError::Locked`] if the keychain cannot be reached or written.
    pub fn put(
        &self,
        id: &CredentialId,
        version: &VersionTag,
        secret: &Secret,
    ) -> Result<(), VaultError> {
        if let Some(done) = self.with_sealed(id, version, |s, svc, user| s.put(svc, user, secret)) {
            return done;
        }
        self.with_entry(id, version, |entry| entry.set_secret(secret.expose()))
    }

    /// Reads version `version` of credential `id`.
    ///
    /// # Errors
    ///
    /// [`VaultError::Missing`] if there is no such entry, [`VaultError::Locked`] if the
    /// keychain cannot be reached or read.
    pub fn get(&self, id: &CredentialId, version: &VersionTag) -> Result<Secret, VaultError> {
        if let Some(done) = self.with_sealed(id, version, |s, svc, user| s.get(svc, user)) {
            return done;
        }
        self.with_entry(id, version, |entry| entry.get_secret().map(Secret::new))
    }

    /// The Secret Service's one-round-trip read of version `version` of credential `id`
    /// ([`reads`]), awaited on the caller's runtime: no thread blocks while the bus
    /// answers. `None` when it does not answer (another backend; an entry missing, locked
    /// or not unique; a bus error): [`Keychain::get`] then reads it the keyring store's
    /// way, which unlocks and says what went wrong.
    pub async fn get_fast(&self, id: &CredentialId, version: &VersionTag) -> Option<Secret> {
        #[cfg(all(
            unix,
            not(any(target_os = "macos", target_os = "ios", target_os = "android"))
        ))]
        if self.backend == KeychainBackend::SecretService {
            return self
                .reads
                .get(&self.service, &entry_user(id, version))
                .await;
        }
        let _ = (id, version);
        None
    }

    /// Deletes version `version` of credential `id`.
    ///
    /// # Errors
    ///
    /// [`VaultError::Missing`] if there is no such entry, [`VaultError::Locked`] if the
    /// keychain cannot be reached or written.
    pub fn delete(&self, id: &CredentialId, version: &VersionTag) -> Result<(), VaultError> {
        if let Some(done) = self.with_sealed(id, version, |s, svc, user| s.delete(svc, user)) {
            return done;
        }
        self.with_entry(id, version, Entry::delete_credential)
    }

    /// Builds the entry for (`id`, `version`) and runs `op` on it, mapping keyring errors
    /// (including those from opening the store) into [`VaultError`].
    fn with_entry<T>(
        &self,
        id: &CredentialId,
        version: &VersionTag,
        op: impl FnOnce(&Entry) -> keyring_core::Result<T>,
    ) -> Result<T, VaultError> {
        let result = self.store().and_then(|store| {
            let user = entry_user(id, version);
            let entry = match self.backend {
                // A readable label for keyring UIs such as Seahorse; the Secret Service
                // store would otherwise label items `keyring:<user>@<service>`.
                KeychainBackend::SecretService => {
                    let label = format!("Postern credential {id} ({version})");
                    let modifiers = HashMap::from([("label", label.as_str())]);
                    store.build(&self.service, &user, Some(&modifiers))?
                }
                // Local: the Credential Manager would otherwise roam the secret with an
                // enterprise profile to every machine the user signs in to.
                KeychainBackend::WindowsCredentialManager => {
                    let modifiers = HashMap::from([("persistence", "Local")]);
                    store.build(&self.service, &user, Some(&modifiers))?
                }
                KeychainBackend::Keyutils
                | KeychainBackend::File
                | KeychainBackend::MacosKeychain => store.build(&self.service, &user, None)?,
            };
            op(&entry)
        });
        result.map_err(|err| {
            if matches!(
                err,
                keyring_core::Error::PlatformFailure(_) | keyring_core::Error::NoStorageAccess(_)
            ) {
                // The connection may be dead (daemon restarted, bus gone); the next call
                // reconnects instead of failing forever on a stale handle.
                self.forget_store();
            }
            self.map_error(err, id)
        })
    }

    fn store(&self) -> keyring_core::Result<Arc<CredentialStore>> {
        let mut slot = self.store.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(store) = slot.as_ref() {
            return Ok(Arc::clone(store));
        }
        let store = open_store(self.backend)?;
        *slot = Some(Arc::clone(&store));
        Ok(store)
    }

    fn forget_store(&self) {
        *self.store.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    fn map_error(&self, err: keyring_core::Error, id: &CredentialId) -> VaultError {
        use keyring_core::Error as K;
        let credential = id.to_string();
        let locked = |reason: String| VaultError::Locked {
            backend: self.backend,
            reason,
        };
        match err {
            K::NoEntry => VaultError::Missing { credential },
            K::NoStorageAccess(e) => locked(format!("access denied: {e}")),
            K::PlatformFailure(e) => locked(e.to_string()),
            K::NoDefaultStore => locked("no credential store is configured".to_owned()),
            K::NotSupportedByStore(what) => locked(format!("not supported: {what}")),
            // Both carry the raw bytes read from the keychain: wipe them and keep only
            // the fact that they were unusable.
            K::BadEncoding(mut bytes) => {
                bytes.zeroize();
                VaultError::Corrupt {
                    credential,
                    reason: "the stored data is not valid text".to_owned(),
                }
            }
            K::BadDataFormat(mut bytes, _) => {
                bytes.zeroize();
                VaultError::Corrupt {
                    credential,
                    reason: "the stored data is malformed".to_owned(),
                }
            }
            K::BadStoreFormat(reason) => VaultError::Corrupt { credential, reason },
            K::Ambiguous(entries) => VaultError::Corrupt {
                credential,
                reason: format!("{} keychain entries match one version", entries.len()),
            },
            // The Windows Credential Manager holds at most 2560 bytes a credential; its
            // store names the secret ("secret", "password encoded as UTF-16").
            K::TooLong(what, _) if what == "secret" || what.starts_with("password") => {
                VaultError::InvalidSecret {
                    reason: "it is larger than this keychain can hold",
                }
            }
            // Only the id, version and service name reach the backend, and the first two
            // are validated; a backend limit on them is reported against the id.
            K::TooLong(..) | K::Invalid(..) => VaultError::InvalidId {
                len: credential.len(),
            },
            // Variants added to the (non-exhaustive) keyring error later may carry
            // payload bytes, so neither their Display nor their Debug is trusted here.
            _ => locked("unexpected keychain error".to_owned()),
        }
    }
}

#[cfg(all(
    unix,
    not(any(target_os = "macos", target_os = "ios", target_os = "android"))
))]
fn open_secret_service() -> keyring_core::Result<Arc<CredentialStore>> {
    let store: Arc<CredentialStore> = zbus_secret_service_keyring_store::Store::new()?;
    Ok(store)
}

#[cfg(not(all(
    unix,
    not(any(target_os = "macos", target_os = "ios", target_os = "android"))
)))]
fn open_secret_service() -> keyring_core::Result<Arc<CredentialStore>> {
    Err(keyring_core::Error::NotSupportedByStore(
        "the Secret Service backend is not available on this platform".to_owned(),
    ))
}

#[cfg(target_os = "linux")]
fn open_keyutils() -> keyring_core::Result<Arc<CredentialStore>> {
    let store: Arc<CredentialStore> = linux_keyutils_keyring_store::Store::new()?;
    Ok(store)
}

#[cfg(not(target_os = "linux"))]
fn open_keyutils() -> keyring_core::Result<Arc<CredentialStore>> {
    Err(keyring_core::Error::NotSupportedByStore(
        "the keyutils backend is only available on Linux".to_owned(),
    ))
}

#[cfg(target_os = "macos")]
fn open_macos_keychain() -> keyring_core::Result<Arc<CredentialStore>> {
    let store: Arc<CredentialStore> = apple_native_keyring_store::keychain::Store::new()?;
    Ok(store)
}

#[cfg(not(target_os = "macos"))]
fn open_macos_keychain() -> keyring_core::Result<Arc<CredentialStore>> {
    Err(keyring_core::Error::NotSupportedByStore(
        "the macOS keychain is only available on macOS".to_owned(),
    ))
}

#[cfg(windows)]
fn open_windows_credential_manager() -> keyring_core::Result<Arc<CredentialStore>> {
    let store: Arc<CredentialStore> = windows_native_keyring_store::Store::new()?;
    Ok(store)
}

#[cfg(not(windows))]
fn open_windows_credential_manager() -> keyring_core::Result<Arc<CredentialStore>> {
    Err(keyring_core::Error::NotSupportedByStore(
        "the Windows Credential Manager is only available on Windows".to_owned(),
    ))
}

fn open_store(backend: KeychainBackend) -> keyring_core::Result<Arc<CredentialStore>> {
    match backend {
        KeychainBackend::SecretService => open_secret_service(),
        KeychainBackend::Keyutils => open_keyutils(),
        KeychainBackend::MacosKeychain => open_macos_keychain(),
        KeychainBackend::WindowsCredentialManager => open_windows_credential_manager(),
        // Never reached: the file backend's entries go through `with_sealed`.
        KeychainBackend::File => Err(keyring_core::Error::NotSupportedByStore(
            "the file keychain has no OS store".to_owned(),
        )),
    }
}

/// The keychain entry's user name for version `version` of credential `id`: each
/// version is its own entry under the keychain's service.
fn entry_user(id: &CredentialId, version: &VersionTag) -> String {
    format!("{id}@{version}")
}

/// Secret Service reads in one round trip, awaited on the caller's runtime.
///
/// The keyring store finds an entry by its attributes (SearchItems) and then reads it
/// (GetSecret): two calls through the bus per read, over a connection it locks for both.
/// Here the entry's object path, once found, is remembered (a path says where a secret
/// is; it is not the secret), so a read is GetSecret alone, over one connection and one
/// encrypted (DH) session kept open. The secret itself is read from the keychain on
/// every call and never kept.
///
/// Anything unusual is left to the keyring store: an entry not found or not unique, a
/// locked item, any bus or session error (the connection is then dropped, and opened
/// again on a later read).
#[cfg(all(
    unix,
    not(any(target_os = "macos", target_os = "ios", target_os = "android"))
))]
mod reads {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use secret_service::{EncryptionType, SecretService};
    use zbus::zvariant::OwnedObjectPath;

    use super::Secret;

    #[derive(Default)]
    pub(super) struct Reads {
        /// The open connection and session; locked only to open or drop them, so
        /// concurrent reads share one connection side by side.
        open: tokio::sync::Mutex<Option<Arc<Open>>>,
    }

    struct Open {
        service: SecretService<'static>,
        /// `user` → the item's object path (one map per keychain service).
        paths: Mutex<HashMap<String, OwnedObjectPath>>,
    }

    impl Reads {
        /// The secret of the entry (`service`, `user`), or `None` when the keyring store
        /// should answer instead.
        pub(super) async fn get(&self, service: &str, user: &str) -> Option<Secret> {
            let open = self.open().await?;
            let known = open.paths.lock().ok()?.get(user).cloned();
            let path = match known {
                Some(path) => path,
                None => {
                    let attributes = HashMap::from([("service", service), ("username", user)]);
                    let found = open.service.search_items(attributes).await.ok()?;
                    let [item] = found.unlocked.as_slice() else {
                        return None;
                    };
                    if !found.locked.is_empty() {
                        return None;
                    }
                    let path = item.item_path.clone();
                    open.paths
                        .lock()
                        .ok()?
                        .insert(user.to_string(), path.clone());
                    path
                }
            };
            let read = match open.service.get_item_by_path(path).await {
                Ok(item) => item.get_secret().await,
                Err(e) => Err(e),
            };
            match read {
                Ok(bytes) => Some(Secret::new(bytes)),
                Err(_) => {
                    // The item may be gone (removed, rotated away) or locked, or the bus
                    // or session broken: start over next time; the keyring store decides
                    // this read.
                    self.forget(&open).await;
                    None
                }
            }
        }

        /// The open connection and session, opening them if none is.
        async fn open(&self) -> Option<Arc<Open>> {
            let mut slot = self.open.lock().await;
            if let Some(open) = slot.as_ref() {
                return Some(open.clone());
            }
            let service = SecretService::connect(EncryptionType::Dh).await.ok()?;
            let open = Arc::new(Open {
                service,
                paths: Mutex::default(),
            });
            *slot = Some(open.clone());
            Some(open)
        }

        /// Drops `open` if it is still the current one: the next read opens anew.
        async fn forget(&self, open: &Arc<Open>) {
            let mut slot = self.open.lock().await;
            if slot
                .as_ref()
                .is_some_and(|current| Arc::ptr_eq(current, open))
            {
                *slot = None;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Metadata queries
// ---------------------------------------------------------------------------------------

/// Plain queries over the `credentials` table. They never see secret bytes.
pub mod meta {
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
}

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
