//! Who an agent session is, as SESSION_OPENED records it: the process the broker read
//! (its executable's digest, its ancestors) and what the bridge claimed. Plain record
//! types; reading them from the operating system and recording them is
//! [`crate::provenance`]'s.
//!
//! Never: change a field's serialized form (records already signed must keep their bytes).

use serde::{Deserialize, Serialize};

/// The blake3 of an executable's bytes, or why it could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
pub enum ExecutableDigest {
    /// Lowercase hex of blake3 over the whole file, read through `/proc/<pid>/exe` on
    /// Linux (the inode the process runs, even if the path was replaced or deleted
    /// since); elsewhere through the executable's path ([`crate::platform::process_image`]).
    Blake3 { hex: String },
    /// The bytes could not be read; the reason is the operating system's.
    Unreadable { reason: String },
}

impl ExecutableDigest {
    /// The digest with an unreadable reason escaped for display (the reason is the
    /// operating system's text about a path the agent may have chosen).
    pub fn escaped(&self) -> ExecutableDigest {
        match self {
            ExecutableDigest::Unreadable { reason } => ExecutableDigest::Unreadable {
                reason: crate::display::escape_text(reason),
            },
            digest => digest.clone(),
        }
    }

    /// The hex digest, when there is one.
    pub fn hex(&self) -> Option<&str> {
        match self {
            ExecutableDigest::Blake3 { hex } => Some(hex),
            ExecutableDigest::Unreadable { .. } => None,
        }
    }
}

/// The agent process, as the platform described it when its bridge connected (/proc on
/// Linux; [`crate::platform`] says what each platform gives).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessIdentity {
    pub pid: u32,
    /// Effective uid (`/proc/<pid>/status`); `None` on Windows, which names users by SID.
    pub uid: Option<u32>,
    /// The uid's (or SID's) account name when the broker read the record, if it has
    /// one. Omitted when absent, so records from before it keep their bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_name: Option<String>,
    /// The user SID, on Windows only (absent from the record elsewhere, so Linux and
    /// macOS records keep their bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sid: Option<String>,
    /// Start time: clock ticks since boot on Linux (`/proc/<pid>/stat` field 22); see
    /// [`crate::platform::process_start`] for the other platforms' units. With the pid,
    /// what makes this process distinct from a later one reusing the pid.
    pub start_ticks: u64,
    /// The same start time as unix milliseconds, for people.
    pub started_at_ms: Option<i64>,
    /// The executable's path (what `/proc/<pid>/exe` points to on Linux), as the broker
    /// read it itself; `None` when it could not (another user's process).
    pub executable: Option<String>,
    pub executable_digest: ExecutableDigest,
    pub cwd: Option<String>,
}

/// One ancestor of the agent process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(deny_unknown_fields)]
pub struct Ancestor {
    pub pid: u32,
    pub executable: Option<String>,
}

/// How the agent reached the broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Transport {
    /// `unix_socket`: the broker's local socket, peer uid checked with SO_PEERCRED (or
    /// getpeereid on macOS); `named_pipe` on Windows, the peer's user SID checked.
    pub kind: String,
    /// The connecting process (the `postern mcp` bridge the agent launched).
    pub bridge_pid: u32,
    pub bridge_executable: Option<String>,
}

/// What SESSION_OPENED records: one bridge connection of one agent session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionOpened {
    /// `sess_<pid>_<start ticks>`, the id invocations carry in ACTION_ACCEPTED.
    pub session: String,
    pub transport: Transport,
    pub agent: ProcessIdentity,
    /// Parents of the agent, nearest first (at most [`crate::provenance::MAX_ANCESTORS`]).
    pub parent_chain: Vec<Ancestor>,
    /// What the bridge said about itself and the process that started it: a claim,
    /// never checked by the broker. Omitted when the client sent none (a client that
    /// talks to the socket directly), so records from before it keep their bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge_report: Option<BridgeReport>,
    /// How the agent is confined, as the broker established it: `shield` when the
    /// bridge connected on a shield's own socket from inside that shield's sandbox (the
    /// broker checked the sandbox and the connecting process's namespaces itself).
    /// Omitted when not confined, so records from before it keep their bytes.
    #[serde(default, skip_serializing_if = "Confinement::is_none")]
    pub confinement: Confinement,
}

/// How an agent session is confined. Established by the broker, never claimed by the
/// agent: a session is `Shield` only when it arrived on the socket the broker made for
/// one shield, from a process inside the sandbox the broker inspected for it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Confinement {
    /// Started without a shield: the agent may read whatever its user can.
    #[default]
    None,
    /// Started by `postern shield`.
    Shield(ShieldConfinement),
}

impl Confinement {
    pub fn is_none(&self) -> bool {
        matches!(self, Confinement::None)
    }

    pub fn is_confined(&self) -> bool {
        !self.is_none()
    }

    /// `shield` or `none`, for lists and filters.
    pub fn kind(&self) -> &'static str {
        match self {
            Confinement::None => "none",
            Confinement::Shield(_) => "shield",
        }
    }

    /// The confinement as a card shows it: its paths escaped (a working directory's name
    /// is the agent's to choose).
    pub fn escaped(&self) -> Confinement {
        match self {
            Confinement::None => Confinement::None,
            Confinement::Shield(s) => Confinement::Shield(ShieldConfinement {
                writable: s
                    .writable
                    .iter()
                    .map(|p| crate::display::escape_text(p))
                    .collect(),
                ..s.clone()
            }),
        }
    }

    /// One line for people: `none`, or `shield shd_… (network full, profile blake3:…)`.
    pub fn describe(&self) -> String {
        match self {
            Confinement::None => "none".to_string(),
            Confinement::Shield(s) => format!(
                "shield {} (network {}, profile {})",
                s.shield,
                s.network,
                s.profile_digest.chars().take(19).collect::<String>()
            ),
        }
    }
}

/// One shield's sandbox, as the broker checked it when the shield registered it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShieldConfinement {
    /// `shd_<16 hex>`: the shield, one per `postern shield` run.
    pub shield: String,
    /// `blake3:<hex>` of the profile's canonical form: what was hidden, what was
    /// writable, the network and the options.
    pub profile_digest: String,
    /// `full` or `broker_only` (no route out but Postern's socket).
    pub network: String,
    /// Whether the user's SSH agent and `~/.ssh` were let in (`--ssh-agent-ok`).
    pub ssh_agent: bool,
    /// The paths the agent may write, besides its private /tmp.
    pub writable: Vec<String>,
}

/// What a bridge reports, right after the agent's `initialize` request, about the process that
/// started it (the agent, read through the bridge's own `/proc/PPID/exe`, which works
/// where the broker runs as another user) and about itself. Recorded and shown as a
/// claim: any program the agent starts can send it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeReport {
    /// The bridge's parent.
    pub parent_pid: u32,
    pub parent_executable: Option<String>,
    pub parent_executable_digest: ExecutableDigest,
    pub bridge_executable: Option<String>,
}

impl BridgeReport {
    /// The report as a card shows it: every agent-written text escaped.
    pub fn escaped(&self) -> BridgeReport {
        let esc = |s: &Option<String>| s.as_deref().map(crate::display::escape_text);
        BridgeReport {
            parent_pid: self.parent_pid,
            parent_executable: esc(&self.parent_executable),
            parent_executable_digest: self.parent_executable_digest.escaped(),
            bridge_executable: esc(&self.bridge_executable),
        }
    }
}
