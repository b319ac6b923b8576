//! What every kind of target shares: when a person must approve ([`ApprovalMode`]),
//! and a configured target of either kind as the invocation pipeline reads it
//! ([`Target`]).

use serde::{Deserialize, Serialize};

use super::{HttpTarget, SshTarget, TargetVersion};
use crate::vault::CredentialId;

/// When a person must approve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalMode {
    None,
    Session,
    PerCall,
}

impl ApprovalMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalMode::None => "none",
            ApprovalMode::Session => "session",
            ApprovalMode::PerCall => "per_call",
        }
    }
}

/// A configured target of either kind: what the invocation pipeline reads of it.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    Http(&'a HttpTarget),
    Ssh(&'a SshTarget),
}

impl Target<'_> {
    pub fn name(&self) -> &str {
        match self {
            Target::Http(t) => &t.name,
            Target::Ssh(t) => &t.name,
        }
    }

    pub fn credential(&self) -> &CredentialId {
        match self {
            Target::Http(t) => &t.credential,
            Target::Ssh(t) => &t.credential,
        }
    }

    pub fn approval(&self) -> ApprovalMode {
        match self {
            Target::Http(t) => t.approval,
            Target::Ssh(t) => t.approval,
        }
    }

    /// Whether only confined sessions (a shield's) may call this target.
    pub fn require_confined(&self) -> bool {
        match self {
            Target::Http(t) => t.require_confined,
            Target::Ssh(t) => t.require_confined,
        }
    }

    pub fn version(&self) -> TargetVersion {
        match self {
            Target::Http(t) => t.version(),
            Target::Ssh(t) => t.version(),
        }
    }
}
