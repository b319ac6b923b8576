//! Who is on the other end of the socket: the peer's credentials from the kernel
//! ([`postern_broker::platform::peer_of`]: SO_PEERCRED on Linux, getpeereid on macOS,
//! the pipe client's token on Windows), and the agent process behind the bridge
//! (/proc on Linux; see [`postern_broker::platform`] for the others).
//!
//! The bridge (`postern mcp`) is launched by the agent's MCP client, so the agent is the
//! bridge's parent. A session is keyed by that process's pid and start time, so a
//! recycled pid never inherits another process's session.

use serde::Serialize;

use postern_broker::platform;

/// Facts about one process, as the platform gives them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessInfo {
    pub pid: u32,
    /// Start time in clock ticks since boot (/proc/PID/stat field 22) on Linux; the
    /// platform's own start stamp elsewhere ([`platform::process_start`]).
    pub start_time: u64,
    pub ppid: u32,
    pub executable: Option<String>,
    /// The command line, arguments joined by spaces, cut to 200 characters (empty where
    /// the platform does not give it).
    pub command: String,
    pub cwd: Option<String>,
}

/// The agent behind a bridge, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentIdentity {
    /// `sess_<pid>_<start time>`.
    pub session: String,
    pub agent: ProcessInfo,
    pub bridge_pid: u32,
    /// Parents of the agent, nearest first (at most 8).
    pub parent_chain: Vec<ProcessInfo>,
}

/// Reads one process's facts; `None` if it is gone or unreadable.
pub fn process_info(pid: u32) -> Option<ProcessInfo> {
    let (ppid, start_time) = platform::process_start(pid)?;
    Some(ProcessInfo {
        pid,
        start_time,
        ppid,
        executable: platform::process_executable(pid),
        command: platform::process_command(pid),
        cwd: platform::process_cwd(pid),
    })
}

/// Identifies the agent behind the bridge process `bridge_pid`.
pub fn identify_agent(bridge_pid: u32) -> Option<AgentIdentity> {
    let bridge = process_info(bridge_pid)?;
    let agent = process_info(bridge.ppid)?;
    let mut parent_chain = Vec::new();
    let mut next = agent.ppid;
    while next > 1 && parent_chain.len() < 8 {
        let Some(p) = process_info(next) else { break };
        next = p.ppid;
        parent_chain.push(p);
    }
    Some(AgentIdentity {
        session: format!("sess_{}_{}", agent.pid, agent.start_time),
        agent,
        bridge_pid,
        parent_chain,
    })
}

/// Whether the process that owns `session` is still running (same pid and start time).
pub fn session_alive(identity: &AgentIdentity) -> bool {
    process_info(identity.agent.pid).is_some_and(|p| p.start_time == identity.agent.start_time)
}

/// Only the broker's own user may talk to it. The socket's directory (0700) and mode
/// (0600) already keep others out; this is the second lock. (On Windows the users are
/// SIDs, [`platform::UserId`].)
pub fn peer_allowed<U: PartialEq>(peer_uid: U, own_uid: U) -> bool {
    peer_uid == own_uid
}

/// The effective uid of this process (geteuid: no /proc read, on Linux or macOS).
#[cfg(unix)]
pub fn own_uid() -> Option<u32> {
    platform::own_uid()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_described_from_proc() {
        let me = process_info(std::process::id()).unwrap();
        assert_eq!(me.pid, std::process::id());
        assert!(me.start_time > 0);
        assert!(me.executable.is_some());
    }

    #[test]
    fn a_session_ends_when_its_agent_process_exits() {
        #[cfg(unix)]
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        #[cfg(windows)]
        let mut child = std::process::Command::new("ping")
            .args(["-n", "30", "127.0.0.1"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let agent = process_info(child.id()).unwrap();
        let identity = AgentIdentity {
            session: format!("sess_{}_{}", agent.pid, agent.start_time),
            agent,
            bridge_pid: 0,
            parent_chain: Vec::new(),
        };
        assert!(session_alive(&identity));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!session_alive(&identity));
    }

    #[test]
    fn only_the_same_uid_is_allowed() {
        assert!(peer_allowed(1000, 1000));
        assert!(!peer_allowed(65534, 1000));
        assert!(!peer_allowed(0, 1000));
    }
}
