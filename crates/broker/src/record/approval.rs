//! The approval card: exactly what a person is shown before a request runs, and the agent
//! as the card names it. Plain record types: the card's digest is what APPROVAL_REQUESTED
//! and the answer record ([`crate::provenance`] builds and digests it).
//!
//! Never: hold a secret (the credential is named by id and version only).

use serde::{Deserialize, Serialize};

use crate::display::{BodyPreview, HeaderPreview, escape_text};
use crate::record::session::{
    Ancestor, BridgeReport, Confinement, ExecutableDigest, SessionOpened,
};

/// The agent as an approval card shows it: the recorded identity, escaped for display.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CardAgent {
    pub session: String,
    pub pid: u32,
    pub uid: Option<u32>,
    /// Omitted when absent, like the fields below, so cards recorded before them keep
    /// their digests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_name: Option<String>,
    /// Read by the broker itself; `None` (and the digest says why) when it could not.
    pub executable: Option<String>,
    pub executable_digest: ExecutableDigest,
    pub started_at_ms: Option<i64>,
    pub cwd: Option<String>,
    /// Ancestors, nearest first.
    pub parent_chain: Vec<Ancestor>,
    /// What the bridge claimed (never verified), escaped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge_report: Option<BridgeReport>,
    /// How the agent is confined, as the broker established it; omitted when it is not,
    /// so cards recorded before it keep their digests.
    #[serde(default, skip_serializing_if = "Confinement::is_none")]
    pub confinement: Confinement,
}

impl CardAgent {
    /// The card's view of a recorded session: every path escaped, so a crafted file
    /// name cannot hide or reorder what a person reads.
    pub fn of(opened: &SessionOpened) -> CardAgent {
        let esc = |s: &Option<String>| s.as_deref().map(escape_text);
        let a = &opened.agent;
        CardAgent {
            session: opened.session.clone(),
            pid: a.pid,
            uid: a.uid,
            user_name: esc(&a.user_name),
            executable: esc(&a.executable),
            executable_digest: a.executable_digest.escaped(),
            started_at_ms: a.started_at_ms,
            cwd: esc(&a.cwd),
            parent_chain: opened
                .parent_chain
                .iter()
                .map(|p| Ancestor {
                    pid: p.pid,
                    executable: esc(&p.executable),
                })
                .collect(),
            bridge_report: opened.bridge_report.as_ref().map(BridgeReport::escaped),
            confinement: opened.confinement.escaped(),
        }
    }
}

/// Exactly what an approval card displays, in display form (agent-written text
/// escaped). The console renders these fields and nothing else about the request; the
/// digest of this value is what APPROVAL_REQUESTED and the answer record. The request
/// and expiry times are not part of it: they are the journal's own timestamps.
///
/// Nothing here is secret: the credential is named by id and version only, and the
/// request parts are the agent's own (the credential is injected after approval).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalCard {
    pub invocation_id: String,
    /// `session`, `per_call` or `host_key`.
    pub mode: String,
    pub target: String,
    pub summary: String,
    pub method: Option<String>,
    pub url: Option<String>,
    pub body: Option<BodyPreview>,
    pub ssh_destination: Option<String>,
    pub command: Option<String>,
    pub host_key: Option<String>,
    /// What the host resolved to when the card was built (see `ApprovalDetail`).
    /// Omitted when absent, so cards recorded before it keep their digests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<String>,
    /// The proxy the request goes through (`host:port`). Omitted when absent, like
    /// `resolved`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
    /// What the person should look at first (see `ApprovalDetail`). This and the fields
    /// below are omitted when empty, so cards recorded before them keep their digests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cautions: Vec<String>,
    /// What approving covers (one send and its safe resends, a session, a host key).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub covers: String,
    /// Every header the agent supplied, in the order sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderPreview>,
    /// What the broker adds to the request (the credential by id only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<String>,
    /// SSH: the command's standard input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<BodyPreview>,
    pub credential_id: String,
    pub credential_version: String,
    pub injection_mode: String,
    pub idempotency_key: Option<String>,
    pub fingerprint: String,
    /// The agent, from its SESSION_OPENED record; `None` when the journal has none.
    pub agent: Option<CardAgent>,
}
