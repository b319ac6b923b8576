//! What loads but deserves the operator's attention before the first call: a
//! [`Caution`] about a field, located like an error ([`ConfigWarning`]).

use std::path::PathBuf;

use super::{Config, Section, TargetRef};

/// What a target's configuration allows but an operator should know about before the
/// first call. Closed, like [`Problem`](super::Problem).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Caution {
    #[error(
        "no host key is pinned: the first connection waits for the console to approve the \
         server's key, and a headless daemon fails it with HOST_KEY_UNKNOWN; pin one with \
         `postern config pin-host-key`"
    )]
    HostKeyNotPinned,
}

/// A field that loads but deserves attention, located like an
/// [`InvalidField`](super::InvalidField).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {target}: field `{field}`: {caution}", file.display())]
pub struct ConfigWarning {
    pub file: PathBuf,
    pub target: TargetRef,
    pub field: String,
    pub caution: Caution,
}

impl Config {
    /// What loads but deserves the operator's attention, for `postern config check` and a
    /// starting daemon to print. Computed from the targets, so every caller of
    /// [`Config::load`] can ask without a change to what `load` returns.
    pub fn warnings(&self) -> Vec<ConfigWarning> {
        self.ssh
            .iter()
            .enumerate()
            .filter(|(_, t)| t.host_key.is_none())
            .map(|(index, t)| ConfigWarning {
                file: self.source.clone(),
                target: TargetRef::named(Section::Ssh, index, &t.name),
                field: "host_key".to_owned(),
                caution: Caution::HostKeyNotPinned,
            })
            .collect()
    }
}
