//! Starting the sandbox (Linux): bubblewrap, held after the sandbox is set up and before
//! the command runs (see [`READY_FD`]), with what it
//! cannot do itself added from here. Before bubblewrap is executed, its process
//! (and so everything it starts) gets no_new_privs, a fresh anonymous session keyring
//! (the user's session keyring is not inherited), and a Landlock domain that scopes
//! abstract unix sockets and signals to the sandbox; bubblewrap then installs the
//! seccomp filter ([`seccomp_program`]) that refuses the kernel keyring calls.
//!
//! Never: let the command run before the broker has inspected and accepted the sandbox,
//! or leave bubblewrap running when anything before that fails.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};

/// Where bubblewrap finds its descriptors in its own process.
const INFO_FD: i32 = 100;
const SECCOMP_FD: i32 = 102;
/// The sandbox's first command says on READY_FD that the sandbox is set up (every mount
/// made, the root changed, the filter installed), then waits on GO_FD, closes both and
/// becomes the agent. (bubblewrap's own `--block-fd` is no help here: its pid is known
/// before the mounts are made, with nothing to say when they are.)
const READY_FD: i32 = 8;
const GO_FD: i32 = 9;
/// The waiting step, run by the sandbox's /bin/sh.
/// (Single digits: a POSIX shell's redirections take no more.)
const HOLD: &str = "printf r >&8; read -r _ <&9; exec 8>&- 9<&-; exec \"$@\"";

/// Landlock's system calls (the same number on every architecture).
const SYS_LANDLOCK_CREATE_RULESET: libc::c_long = 444;
const SYS_LANDLOCK_RESTRICT_SELF: libc::c_long = 446;
const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
const LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1;
const LANDLOCK_SCOPE_SIGNAL: u64 = 2;
/// `KEYCTL_JOIN_SESSION_KEYRING`: with no name, a new anonymous session keyring.
const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;

#[repr(C)]
struct LandlockRulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

/// The Landlock ABI version this kernel offers (0 where it has none).
#[allow(unsafe_code)]
pub fn landlock_abi() -> i64 {
    // SAFETY: the version query takes no pointer (null, size 0) and only returns a number.
    let abi = unsafe {
        libc::syscall(
            SYS_LANDLOCK_CREATE_RULESET,
            std::ptr::null::<LandlockRulesetAttr>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    abi.max(0)
}

/// Whether this kernel can scope abstract unix sockets (Landlock ABI 6, Linux 6.12).
pub fn landlock_scopes() -> bool {
    landlock_abi() >= 6
}

/// A Landlock ruleset that handles no file or network access and scopes abstract unix
/// sockets and signals; `None` where the kernel cannot.
#[allow(unsafe_code)]
fn scoped_ruleset() -> Option<OwnedFd> {
    if !landlock_scopes() {
        return None;
    }
    let attr = LandlockRulesetAttr {
        handled_access_fs: 0,
        handled_access_net: 0,
        scoped: LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL,
    };
    // SAFETY: `attr` is a live, correctly laid out `landlock_ruleset_attr` of the size
    // passed; the call returns a new descriptor (close-on-exec) or -1.
    let fd = unsafe {
        libc::syscall(
            SYS_LANDLOCK_CREATE_RULESET,
            &raw const attr,
            std::mem::size_of::<LandlockRulesetAttr>(),
            0u32,
        )
    };
    let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The architecture seccomp sees, and the numbers of the calls a shield refuses.
#[cfg(target_arch = "x86_64")]
const ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "x86_64")]
const KEYRING_CALLS: [u32; 3] = [248, 249, 250]; // add_key, request_key, keyctl
#[cfg(target_arch = "aarch64")]
const ARCH: u32 = 0xc000_00b7;
#[cfg(target_arch = "aarch64")]
const KEYRING_CALLS: [u32; 3] = [217, 218, 219];

/// A classic BPF seccomp program, as bubblewrap's `--seccomp` reads it: refuse
/// `add_key`, `request_key` and `keyctl` with EPERM; refuse every call from another
/// architecture's ABI (32-bit or x32 entry points, whose numbers differ) the same way;
/// allow the rest.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub fn seccomp_program() -> Vec<u8> {
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const ALLOW: u32 = 0x7fff_0000;
    let deny: u32 = 0x0005_0000 | libc::EPERM as u32; // SECCOMP_RET_ERRNO
    let ins = |code: u16, jt: u8, jf: u8, k: u32| (code, jt, jf, k);
    let n = KEYRING_CALLS.len() as u8;
    let mut prog = vec![
        ins(LD_W_ABS, 0, 0, 4), // seccomp_data.arch
        ins(JEQ_K, 1, 0, ARCH),
        ins(RET_K, 0, 0, deny),
        ins(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        // x32 calls carry bit 30.
        ins(JGE_K, n + 1, 0, 0x4000_0000),
    ];
    for (i, nr) in KEYRING_CALLS.iter().enumerate() {
        // Jump to the deny at the end (past the remaining checks and the allow).
        let to_deny = n - i as u8;
        prog.push(ins(JEQ_K, to_deny, 0, *nr));
    }
    prog.push(ins(RET_K, 0, 0, ALLOW));
    prog.push(ins(RET_K, 0, 0, deny));
    let mut bytes = Vec::with_capacity(prog.len() * 8);
    for (code, jt, jf, k) in prog {
        bytes.extend_from_slice(&code.to_ne_bytes());
        bytes.push(jt);
        bytes.push(jf);
        bytes.extend_from_slice(&k.to_ne_bytes());
    }
    bytes
}

/// bubblewrap started and held before the command: its pid and first sandboxed process.
pub struct Held {
    child: Child,
    /// The sandbox's first process, in this (the host's) pid namespace.
    pub sandbox_pid: u32,
    release: std::fs::File,
}

impl Held {
    /// Lets the command run; returns bubblewrap's process to wait for.
    pub fn release(mut self) -> std::io::Result<Child> {
        self.release.write_all(b"go\n")?;
        drop(self.release);
        Ok(self.child)
    }

    /// Stops the sandbox before its command ran.
    pub fn abort(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Why bubblewrap did not come up.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("bubblewrap could not be started: {0}")]
    Spawn(std::io::Error),
    #[error("{0}")]
    Setup(String),
    #[error(
        "the sandbox did not come up (bubblewrap: {status}); the message above says why. If it says \"setting up uid map\" or \"No permissions to create new \
         namespace\", unprivileged user namespaces are disabled: enable them with `sudo \
         sysctl kernel.unprivileged_userns_clone=1` (Debian) or, on Ubuntu 24.04 and later, \
         allow bwrap in AppArmor (`sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0` \
         or an AppArmor profile for /usr/bin/bwrap)"
    )]
    Exited { status: String },
}

/// Starts `bwrap` with `args`, then `command`, held before the command runs.
#[allow(unsafe_code)]
pub fn start(
    bwrap: &std::path::Path,
    args: &[OsString],
    command: &[OsString],
) -> Result<Held, StartError> {
    let setup = |what: &str, e: std::io::Error| StartError::Setup(format!("{what}: {e}"));
    let (info_read, info_write) = pipe().map_err(|e| setup("a pipe", e))?;
    let (ready_read, ready_write) = pipe().map_err(|e| setup("a pipe", e))?;
    let (go_read, go_write) = pipe().map_err(|e| setup("a pipe", e))?;
    let (seccomp_read, seccomp_write) = pipe().map_err(|e| setup("a pipe", e))?;
    {
        let mut w = std::fs::File::from(seccomp_write);
        w.write_all(&seccomp_program())
            .map_err(|e| setup("the seccomp filter", e))?;
    }
    let ruleset = scoped_ruleset();
    let mut cmd = Command::new(bwrap);
    cmd.args([
        "--info-fd",
        &INFO_FD.to_string(),
        "--seccomp",
        &SECCOMP_FD.to_string(),
    ]);
    cmd.args(args);
    cmd.args(["--", "/bin/sh", "-c", HOLD, "postern-shield"]);
    cmd.args(command);
    let fds = [
        (info_write.as_raw_fd(), INFO_FD),
        (seccomp_read.as_raw_fd(), SECCOMP_FD),
        (ready_write.as_raw_fd(), READY_FD),
        (go_read.as_raw_fd(), GO_FD),
    ];
    let ruleset_fd = ruleset.as_ref().map(AsRawFd::as_raw_fd);
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe system calls (dup2, fcntl, prctl, syscall) on descriptors that
    // are open in it; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            // First out of the way (a source may sit on another's target), then into
            // place; the copies out of the way close on exec.
            let mut moved = [0i32; 4];
            for (slot, (from, _)) in moved.iter_mut().zip(fds) {
                *slot = libc::fcntl(from, libc::F_DUPFD_CLOEXEC, 200);
                if *slot < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (from, (_, to)) in moved.into_iter().zip(fds) {
                if libc::dup2(from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // A new anonymous session keyring: the user's own is not inherited.
            if libc::syscall(libc::SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, 0usize) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = ruleset_fd
                && libc::syscall(SYS_LANDLOCK_RESTRICT_SELF, fd, 0u32) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(StartError::Spawn)?;
    drop((info_write, seccomp_read, ready_write, go_read, ruleset));
    let pid = read_child_pid(std::fs::File::from(info_read));
    // One byte once the sandbox is set up; nothing if bubblewrap stopped first.
    let mut ready = [0u8; 1];
    let set_up = std::fs::File::from(ready_read)
        .read(&mut ready)
        .is_ok_and(|n| n == 1);
    match pid.filter(|_| set_up) {
        Some(sandbox_pid) => Ok(Held {
            child,
            sandbox_pid,
            release: std::fs::File::from(go_write),
        }),
        None => {
            let _ = child.kill();
            let status = child
                .wait()
                .map_or_else(|e| e.to_string(), |s| s.to_string());
            Err(StartError::Exited { status })
        }
    }
}

/// Passes terminal resizes on to the agent. The sandbox runs in a session of its own
/// (so it cannot push keystrokes into the user's terminal), which also means the
/// terminal's SIGWINCH reaches this process and not the agent: each one is sent on to the
/// process group of the sandbox's command, the child of its first process `sandbox`.
///
/// `resized` is made before the sandbox is released, so no resize falls between the
/// command starting and this listening.
pub async fn forward_resizes(sandbox: u32, mut resized: tokio::signal::unix::Signal) {
    while resized.recv().await.is_some() {
        if let Some(group) = command_group(sandbox) {
            signal_group(group, libc::SIGWINCH);
        }
    }
}

/// The process group of the sandbox's command: the first child of its first process.
fn command_group(sandbox: u32) -> Option<i32> {
    let children =
        std::fs::read_to_string(format!("/proc/{sandbox}/task/{sandbox}/children")).ok()?;
    let command: u32 = children.split_whitespace().next()?.parse().ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{command}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) in parentheses: state, ppid,
    // pgrp.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(2)?.parse().ok()
}

#[allow(unsafe_code)]
fn signal_group(group: i32, signal: i32) {
    if group > 1 {
        // SAFETY: kill takes plain integers; a negative pid names a process group.
        unsafe {
            libc::kill(-group, signal);
        }
    }
}

/// Reads bubblewrap's `--info-fd` until its JSON names the child (bubblewrap may keep
/// the descriptor open) or the descriptor ends.
fn read_child_pid(mut info: std::fs::File) -> Option<u32> {
    let mut text = Vec::new();
    let mut chunk = [0u8; 1024];
    while text.len() < 64 * 1024 {
        let n = info.read(&mut chunk).ok()?;
        if n == 0 {
            break;
        }
        text.extend_from_slice(&chunk[..n]);
        if let Some(pid) = std::str::from_utf8(&text).ok().and_then(child_pid) {
            return Some(pid);
        }
    }
    None
}

/// The `child-pid` of bubblewrap's `--info-fd` JSON.
fn child_pid(info: &str) -> Option<u32> {
    let value: serde_json::Value = serde_json::from_str(info.trim()).ok()?;
    value
        .get("child-pid")?
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
}

#[allow(unsafe_code)]
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are new descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_seccomp_program_is_whole_instructions_ending_in_allow_and_deny() {
        let prog = seccomp_program();
        assert_eq!(prog.len() % 8, 0);
        let n = prog.len() / 8;
        let ret = |i: usize| u32::from_ne_bytes(prog[i * 8 + 4..i * 8 + 8].try_into().unwrap());
        assert_eq!(ret(n - 2), 0x7fff_0000);
        assert_eq!(ret(n - 1), 0x0005_0000 | libc::EPERM as u32);
        // Every keyring call's jump lands on the deny.
        for (i, _) in KEYRING_CALLS.iter().enumerate() {
            let at = 5 + i;
            let jt = prog[at * 8 + 2] as usize;
            assert_eq!(at + 1 + jt, n - 1);
        }
        // The x32 check lands there too.
        assert_eq!(4 + 1 + prog[4 * 8 + 2] as usize, n - 1);
    }

    #[test]
    fn bubblewraps_info_names_the_child() {
        assert_eq!(
            child_pid("{\n \"child-pid\": 4242,\n \"mnt-namespace\": 1\n}\n"),
            Some(4242)
        );
        assert_eq!(child_pid("not json"), None);
    }
}
