//! Who is on the other end of the socket: the peer's credentials from the kernel
//! ([`postern_broker::platform::peer_of`]: SO_PEERCRED on Linux, getpeereid on macOS,
//! the pipe client's token on Windows), and the agent process behind the bridge
//! (/proc on Linux; see [`postern_broker::platform`] for the others).
//!
//! The bridge (`postern mcp`) is launched by the agent's MCP client, so the agent is the
//! bridge's parent. A session is keyed by the connecting user (from the kernel, never
//! from the process table) and by that process's pid and start time, so a recycled pid
//! never inherits another process's session and a session never spans two users. When
//! the parent is not the agent's own (another user's process, such as a root supervisor
//! that starts agents as different users, or init and the service managers that adopt
//! orphans), the session is keyed by the bridge process itself (issue 26).

use serde::Serialize;

use postern_broker::platform;
use postern_broker::record::session::Confinement;

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
    /// `sess_<user>_<pid>_<start time>` of the agent, or `sess_<user>_b<pid>_<start
    /// time>` when the bridge's parent is not an agent of the connecting user and the
    /// bridge itself stands for the agent (see [`session_key`]).
    pub session: String,
    /// The process the session belongs to: the bridge's parent, or the bridge itself.
    /// The session ends when it exits.
    pub agent: ProcessInfo,
    pub bridge_pid: u32,
    /// Parents of the agent, nearest first (at most 8).
    pub parent_chain: Vec<ProcessInfo>,
    /// How the agent is confined: set by the daemon when the connection arrived on a
    /// shield's socket from inside its sandbox ([`crate::daemon::shield`]), never from
    /// anything the agent sent.
    pub confinement: Confinement,
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

/// The part of a session key that names the connecting user: `u<uid>`, or on Windows
/// `s` and the start of the SID's blake3 (a SID has characters a key should not).
pub fn user_tag(user: &platform::UserId) -> String {
    match user {
        platform::UserId::Uid(uid) => format!("u{uid}"),
        platform::UserId::Sid(sid) => {
            let digest = blake3::hash(sid.as_bytes()).to_hex();
            format!("s{}", &digest.as_str()[..16])
        }
    }
}

/// Service managers that adopt orphaned processes as subreapers; a bridge whose parent is
/// one of them has no agent of its own behind it.
const ADOPTERS: &[&str] = &["systemd", "init", "launchd", "tini", "dumb-init", "runit"];

/// Whether `parent` can key a session for a bridge connecting as `user`: a process of
/// that same user that is not init or a service manager that adopts orphans.
fn parent_owns_session(parent: &ProcessInfo, user: &platform::UserId) -> bool {
    if parent.pid <= 1 {
        return false;
    }
    let same_user = match user {
        platform::UserId::Uid(uid) => platform::process_uid(parent.pid) == Some(*uid),
        platform::UserId::Sid(sid) => {
            platform::process_sid(parent.pid).as_deref() == Some(sid.as_str())
        }
    };
    let adopter = parent
        .executable
        .as_deref()
        .and_then(|exe| exe.rsplit(['/', '\\']).next())
        .is_some_and(|name| ADOPTERS.contains(&name.trim_end_matches(".exe")));
    same_user && !adopter
}

/// The session key of a bridge connecting as `user`, and whether its parent is the agent
/// ([`parent_owns_session`]); otherwise the bridge itself stands for the agent.
pub fn session_key(
    user: &platform::UserId,
    bridge: &ProcessInfo,
    parent: &ProcessInfo,
) -> (String, bool) {
    let tag = user_tag(user);
    if parent_owns_session(parent, user) {
        (
            format!("sess_{tag}_{}_{}", parent.pid, parent.start_time),
            true,
        )
    } else {
        (
            format!("sess_{tag}_b{}_{}", bridge.pid, bridge.start_time),
            false,
        )
    }
}

/// Identifies the agent behind the bridge process `bridge_pid`, which connected as `user`
/// (the kernel's word for the socket's peer).
pub fn identify_agent(bridge_pid: u32, user: &platform::UserId) -> Option<AgentIdentity> {
    let bridge = process_info(bridge_pid)?;
    let parent = process_info(bridge.ppid)?;
    let (session, parent_is_agent) = session_key(user, &bridge, &parent);
    let (agent, mut next) = if parent_is_agent {
        let next = parent.ppid;
        (parent, next)
    } else {
        (bridge, parent.pid)
    };
    let mut parent_chain = Vec::new();
    while next > 1 && parent_chain.len() < 8 {
        let Some(p) = process_info(next) else { break };
        next = p.ppid;
        parent_chain.push(p);
    }
    Some(AgentIdentity {
        session,
        agent,
        bridge_pid,
        parent_chain,
        confinement: Confinement::None,
    })
}

/// Whether the process that owns `session` is still running (same pid and start time).
pub fn session_alive(identity: &AgentIdentity) -> bool {
    process_info(identity.agent.pid).is_some_and(|p| p.start_time == identity.agent.start_time)
}

/// Only the broker's own user may talk to it. The socket's directory (0700) and mode
/// (0600) already keep others out; this is the second lock. (On Windows the users are
/// SIDs, [`platform::UserId`].)
pub fn caller_allowed<U: PartialEq>(peer_uid: U, own_uid: U) -> bool {
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
            session: format!("sess_u0_{}_{}", agent.pid, agent.start_time),
            agent,
            bridge_pid: 0,
            parent_chain: Vec::new(),
            confinement: Confinement::None,
        };
        assert!(session_alive(&identity));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!session_alive(&identity));
    }

    // Regression: issue 26 (item 2): two bridges of different users under one parent
    // (a root supervisor), or both orphaned, shared one session.
    #[test]
    #[cfg(unix)]
    fn a_session_is_never_shared_across_users_or_through_a_parent_that_is_not_the_agent() {
        let me = process_info(std::process::id()).unwrap();
        let my_uid = platform::own_uid().unwrap();
        let bridge = |pid: u32, start_time: u64| ProcessInfo {
            pid,
            start_time,
            ppid: me.pid,
            executable: None,
            command: String::new(),
            cwd: None,
        };
        let (b1, b2) = (bridge(900_001, 11), bridge(900_002, 22));
        let alice = platform::UserId::Uid(my_uid);
        let bob = platform::UserId::Uid(my_uid + 1);
        // A parent of the connecting user keys the session: both of its bridges share it.
        let (a1, parent_is_agent) = session_key(&alice, &b1, &me);
        let (a2, _) = session_key(&alice, &b2, &me);
        assert_eq!(a1, a2);
        assert!(parent_is_agent);
        assert!(
            a1.starts_with(&format!("sess_u{my_uid}_{}_", me.pid)),
            "{a1}"
        );
        // The same parent, a bridge of another user: another session, keyed by the bridge
        // (the parent is not that user's).
        let (other, parent_is_agent) = session_key(&bob, &b2, &me);
        assert_ne!(other, a2);
        assert!(!parent_is_agent);
        assert!(
            other.ends_with(&format!("_b{}_{}", b2.pid, b2.start_time)),
            "{other}"
        );
        assert!(
            other.starts_with(&format!("sess_u{}_b", my_uid + 1)),
            "{other}"
        );
        // Orphans (parent pid 1) of one user: one session per bridge.
        let init = ProcessInfo {
            pid: 1,
            ..me.clone()
        };
        let (o1, _) = session_key(&alice, &b1, &init);
        let (o2, _) = session_key(&alice, &b2, &init);
        assert_ne!(o1, o2);
        // A service manager that adopts orphans is not an agent either.
        let adopter = ProcessInfo {
            executable: Some("/usr/lib/systemd/systemd".into()),
            ..me.clone()
        };
        let (s1, _) = session_key(&alice, &b1, &adopter);
        let (s2, _) = session_key(&alice, &b2, &adopter);
        assert_ne!(s1, s2);
    }

    #[test]
    fn only_the_same_uid_is_allowed() {
        assert!(caller_allowed(1000, 1000));
        assert!(!caller_allowed(65534, 1000));
        assert!(!caller_allowed(0, 1000));
    }
}
