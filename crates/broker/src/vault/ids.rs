//! A credential's name, version and kind, and the metadata stored beside it.

use std::fmt;
use std::str::FromStr;

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use serde::{Deserialize, Serialize};

use super::MAX_ID_LEN;
use super::error::VaultError;

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

pub(super) fn is_valid_name(name: &str) -> bool {
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
