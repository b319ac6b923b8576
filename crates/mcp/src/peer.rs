//! Who is on the other end of the socket: the peer's credentials from the kernel
//! (SO_PEERCRED, through tokio's safe `peer_cred`), and the agent process behind the
//! bridge read from /proc.
//!
//! The bridge (`postern mcp`) is launched by the agent's MCP client, so the agent is the
//! bridge's parent. A session is keyed by that process's pid and start time, so a
//! recycled pid never inherits another process's session.

use std::path::Path;

use serde::Serialize;

/// Facts about one process, read from /proc.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessInfo {
    pub pid: u32,
    /// Start time in clock ticks since boot (/proc/PID/stat field 22).
    pub start_time: u64,
    pub ppid: u32,
    pub executable: Option<String>,
    /// The command line, arguments joined by spaces, cut to 200 characters.
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
    let proc = Path::new("/proc").join(pid.to_string());
    let stat = std::fs::read_to_string(proc.join("stat")).ok()?;
    // The command name is in parentheses and may itself contain spaces or ')': the
    // fields after the last ')' are positional.
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After ')': state is field 3, ppid field 4, starttime field 22 (1-based overall).
    let ppid = fields.get(1)?.parse().ok()?;
    let start_time = fields.get(19)?.parse().ok()?;
    let executable = std::fs::read_link(proc.join("exe"))
        .ok()
        .map(|p| p.display().to_string());
    let cwd = std::fs::read_link(proc.join("cwd"))
        .ok()
        .map(|p| p.display().to_string());
    let raw = std::fs::read(proc.join("cmdline")).unwrap_or_default();
    let command: String = raw
        .split(|b| *b == 0)
        .filter(|part| !part.is_empty())
        .map(|part| String::from_utf8_lossy(part).into_owned())
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(200)
        .collect();
    Some(ProcessInfo {
        pid,
        start_time,
        ppid,
        executable,
        command,
        cwd,
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
/// (0600) already keep others out; this is the second lock.
pub fn peer_allowed(peer_uid: u32, own_uid: u32) -> bool {
    peer_uid == own_uid
}

/// The effective uid of this process, read from /proc (no unsafe FFI needed).
pub fn own_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|euid| euid.parse().ok())
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
        let mut child = std::process::Command::new("sleep")
            .arg("30")
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
