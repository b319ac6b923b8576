//! Where a targets file goes wrong: the section and target a field belongs to
//! ([`TargetRef`]), the closed list of what can be wrong with it ([`Problem`]), the
//! errors of loading ([`ConfigError`]) and of mapping a request to a target
//! ([`ResolveError`]), and the validation context that builds them.

use std::fmt;
use std::path::{Path, PathBuf};

use super::proxy::ProxyProblem;
use crate::contract::Code;

/// Which array a target is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Section {
    Http,
    Ssh,
    Witness,
    /// `[results]`: the retention of stored results.
    Results,
    Peer,
}

/// A target as a person finds it in the file: by name, or by position when the name
/// itself is what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetRef {
    pub section: Section,
    /// 0-based position within its array.
    pub index: usize,
    pub name: Option<String>,
}

impl TargetRef {
    /// The target at `index` of `section`, by its name.
    pub(super) fn named(section: Section, index: usize, name: &str) -> Self {
        TargetRef {
            section,
            index,
            name: Some(name.to_string()),
        }
    }
}

impl fmt::Display for TargetRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let section = match self.section {
            Section::Http => "[[http]]",
            Section::Ssh => "[[ssh]]",
            Section::Witness => "[[witness]]",
            Section::Results => "[results]",
            Section::Peer => "[[peer]]",
        };
        match &self.name {
            Some(name) => write!(f, "{section} \"{name}\""),
            None => write!(f, "{section} #{}", self.index),
        }
    }
}

/// What is wrong with a field. Closed, so tests and the console can branch on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("must match [a-z0-9][a-z0-9_-]{{0,63}}")]
    InvalidName,
    #[error("the name is already used by {first}")]
    DuplicateName { first: TargetRef },
    #[error("not a valid URL: {reason}")]
    InvalidUrl { reason: String },
    #[error("scheme `{scheme}` is not allowed; use https (or http on loopback)")]
    UnsupportedScheme { scheme: String },
    #[error("plain http is allowed only for loopback hosts")]
    PlainHttpNotLoopback,
    #[error("credentials in the URL are not allowed; use `credential`")]
    UserinfoInUrl,
    #[error("a base URL may not have a query or fragment")]
    QueryOrFragmentInUrl,
    #[error("the same origin and path prefix is already claimed by [[http]] \"{other}\"")]
    SamePrefix { other: String },
    #[error("must not be empty")]
    Empty,
    #[error("not a cosignature/v1 verifier key (as `postern witness init` prints): {reason}")]
    InvalidWitnessKey { reason: String },
    #[error("`{value}` is not an uppercase RFC 9110 method token")]
    InvalidMethod { value: String },
    #[error("not a valid RFC 9110 field name")]
    InvalidHeaderName,
    #[error("header `{name}` is owned by the broker and cannot carry a credential")]
    ReservedHeader { name: String },
    #[error("must contain `{{secret}}` exactly once")]
    SecretPlaceholder,
    #[error("contains control characters or whitespace that are not allowed here")]
    InvalidCharacters,
    #[error("a Basic user id may not contain `:` (RFC 7617 §2)")]
    ColonInBasicUser,
    #[error("set exactly one of `header` (with optional `format`), `basic_user` or `query`")]
    InjectionForm,
    #[error("must be between {min} and {max}")]
    OutOfRange { min: u64, max: u64 },
    #[error("`{value}` is not a duration like 90s, 30m, 24h or 7d")]
    InvalidDuration { value: String },
    #[error("`{value}` is not a size like 500MiB, 1GiB or 1048576 (bytes)")]
    InvalidSize { value: String },
    #[error("{status} is not an HTTP status code (100..=599)")]
    InvalidStatus { status: u16 },
    #[error("status {status} is listed as both committed and not applied")]
    ConflictingStatus { status: u16 },
    #[error("must start with `/` and contain no placeholder other than `{{idempotency_key}}`")]
    InvalidReconcilePath,
    #[error("`{{idempotency_key}}` needs an [http.idempotency] contract to mean anything")]
    PlaceholderWithoutContract,
    #[error("not a JSON pointer (RFC 6901): it must be empty or start with `/`")]
    InvalidPointer,
    #[error("job states are listed but `state_pointer` does not say where to read them")]
    StatesWithoutPointer,
    #[error("`state_pointer` is set but no value in `succeeded` says the job finished")]
    NoSuccessState,
    #[error("`{value}` is listed under two states")]
    ConflictingState { value: String },
    #[error(
        "must start with `/` and hold no query, fragment or placeholder (a member query's path holds `{{member_id}}` exactly once)"
    )]
    InvalidBatchPath,
    #[error("a peer name is 1 to 64 letters, digits, `-`, `_` or `.`")]
    InvalidPeerName,
    #[error("not a broker key (as `postern audit key` prints it): {reason}")]
    InvalidPeerKey { reason: String },
    #[error("a peer needs `url` (this broker calls it) or `exports` (it calls this broker)")]
    UnusedPeer,
    #[error("out of range: {reason}")]
    InvalidPeerSetting { reason: String },
    #[error("`{name}` is not an [[http]] target of this file, so it cannot be exported")]
    UnknownExport { name: String },
    #[error("`{name}` is exported twice")]
    DuplicateExport { name: String },
    #[error("not a valid host name or IP address")]
    InvalidHost,
    #[error("not `<algorithm> <base64 key>`: {reason}")]
    InvalidHostKey { reason: String },
    #[error(
        "`{name}` is the header the credential is injected into; the idempotency key needs its own header"
    )]
    IdempotencyHeaderIsInjectionHeader { name: String },
    #[error("`{value}` is not listed in `methods`, so no request can use it")]
    NotInMethods { value: String },
    #[error("{}: cannot read: {reason}", path.display())]
    UnreadableFile { path: PathBuf, reason: String },
    #[error("{}: not valid PEM: {reason}", path.display())]
    InvalidPem { path: PathBuf, reason: String },
    #[error("{}: contains no PEM certificate", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{problem}")]
    InvalidProxy { problem: ProxyProblem },
    #[error("the proxy in the environment's {variable} applies to this target: {problem}")]
    InvalidEnvironmentProxy {
        variable: &'static str,
        problem: ProxyProblem,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, a wrong type or an unknown key. `message` is the TOML parser's text.
    #[error("{}: {message}", file.display())]
    Syntax { file: PathBuf, message: String },
    /// A value that parsed but breaks a rule. Boxed: it is the cold path and large.
    #[error(transparent)]
    Invalid(Box<InvalidField>),
}

/// One field that breaks a validation rule, located by file, target and field path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {target}: field `{field}`: {problem}", file.display())]
pub struct InvalidField {
    pub file: PathBuf,
    pub target: TargetRef,
    /// A dotted path with indexes, e.g. `inject.format` or `methods[1]`.
    pub field: String,
    pub problem: Problem,
}

/// Why a URL or host maps to no target. Always `INVALID_TARGET` on the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("`{url}` does not fall under any configured http target")]
    NoHttpTarget { url: String },
    #[error("`{host}` is not a configured ssh target name or host")]
    NoSshTarget { host: String },
    #[error("host `{host}` is shared by ssh targets {names:?}; name the target instead")]
    AmbiguousSshHost { host: String, names: Vec<String> },
    #[error("the URL path is malformed: {reason}")]
    MalformedUrl { reason: String },
}

impl ResolveError {
    pub fn code(&self) -> Code {
        Code::InvalidTarget
    }
}

/// Validation context of one target: builds errors that name file, target and field.
pub(super) struct Ctx<'a> {
    pub(super) file: &'a Path,
    pub(super) target: TargetRef,
}

impl Ctx<'_> {
    pub(super) fn err(&self, field: impl Into<String>, problem: Problem) -> ConfigError {
        ConfigError::Invalid(Box::new(InvalidField {
            file: self.file.to_path_buf(),
            target: self.target.clone(),
            field: field.into(),
            problem,
        }))
    }
}
