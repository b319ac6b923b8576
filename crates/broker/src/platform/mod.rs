//! What differs between operating systems, behind one interface.
//!
//! Nothing else in the workspace names `std::os::unix`, `/proc` or a Win32 function: the
//! engine, the agent socket (`postern-mcp`), the operator socket (`postern-console`) and
//! the CLI call these. It is one module, in the engine, because the same facts serve
//! several crates and must be read the same way: the user a connection's peer runs as
//! decides admission on both sockets, and the process facts the session registry shows
//! are the ones provenance records in the journal.
//!
//! Each item below has a Linux, a macOS and a Windows implementation (`linux.rs`,
//! `macos.rs`, `windows.rs`; `unix.rs` holds what Linux and macOS share). Other
//! operating systems are refused at compile time rather than half supported.
//!
//! | item | Linux | macOS | Windows |
//! |---|---|---|---|
//! | [`Listener`], [`connect`] | Unix domain socket | Unix domain socket | named pipe `\\.\pipe\…` (tokio): first instance only, remote clients rejected, the server's user checked by the client |
//! | [`peer_of`] | SO_PEERCRED (tokio) | getpeereid + LOCAL_PEEREPID (tokio) | GetNamedPipeClientProcessId, then that process's token user SID |
//! | [`current_user`], [`own_uid`] | geteuid | geteuid | this process's token user SID (no uid) |
//! | process facts ([`process_start`] …) | `/proc/PID/{stat,status,exe,cwd,cmdline}` | proc_pidinfo, proc_pidpath, KERN_PROCARGS2 | toolhelp snapshot, QueryFullProcessImageNameW, GetProcessTimes; no cwd or command line (another process's memory is not read) |
//! | [`owner_only_dir`], [`create_mode`], [`protect_dir`] | mode 0700 / 0600 | the same | a protected DACL (this user and SYSTEM) on each directory Postern creates; files inherit it; no mode bits |
//! | [`mode_of`] | the mode bits | the same | `None`: nothing to check (see [`protect_dir`]) |
//! | [`sync_dir`] | fsync(2) of the directory | the same (F_FULLFSYNC, else fsync) | nothing: NTFS journals its metadata, and std cannot open a directory to flush it |
//! | [`free_bytes`] | statvfs | statvfs | GetDiskFreeSpaceExW |
//! | [`termination`] (besides Ctrl-C) | SIGTERM | SIGTERM | Ctrl-Break, console closed, system shutdown |
//! | [`file_stamp`], [`file_identity`] | device, inode, times | the same | `None` |
//! | [`default_data_dir`], [`anchor_dir`] | XDG base directories | `~/Library/Application Support` (dirs) | `%LOCALAPPDATA%` and `%APPDATA%` (dirs) |
//!
//! A feature a platform lacks is a typed error or an honest `None`, never a pretence:
//! the privilege-separated mode (operator groups, SO_PEERCRED supplementary groups,
//! systemd credentials) and the kernel keyring are Linux only.

use std::fmt;
use std::path::{Path, PathBuf};

#[cfg(not(any(target_os = "linux", target_os = "macos", windows)))]
compile_error!("Postern supports Linux, macOS and Windows; see crates/broker/src/platform");

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "macos")]
mod macos;
#[cfg(unix)]
mod unix;
#[cfg(windows)]
mod windows;

#[cfg(target_os = "linux")]
use linux as imp;
#[cfg(target_os = "macos")]
use macos as imp;
#[cfg(windows)]
use windows as imp;

/// The supplementary groups of a process, for the operator group check of the
/// privilege-separated mode, which is Linux only.
#[cfg(target_os = "linux")]
pub use linux::supplementary_groups;
#[cfg(unix)]
pub use unix::{
    AcceptedRead, AcceptedWrite, Listener, connect, own_gid, own_uid, peer_of,
    raise_descriptor_limit, split, termination, user_name,
};
#[cfg(windows)]
pub use windows::{
    AcceptedRead, AcceptedWrite, Listener, connect, is_pipe_name, peer_of, split, termination,
    user_name,
};

/// Whether `error` says this process or the system is out of descriptors (EMFILE,
/// ENFILE; WSAEMFILE on Windows): the broker's own state, never a remote's doing or a
/// credential problem (issue 26).
pub fn out_of_descriptors(error: &std::io::Error) -> bool {
    #[cfg(unix)]
    let codes = [
        rustix::io::Errno::MFILE.raw_os_error(),
        rustix::io::Errno::NFILE.raw_os_error(),
    ];
    #[cfg(windows)]
    let codes = [10024];
    error
        .raw_os_error()
        .is_some_and(|code| codes.contains(&code))
}

/// Windows has no descriptor limit to raise (handles are limited per process by memory).
#[cfg(windows)]
pub fn raise_descriptor_limit() -> Option<u64> {
    None
}

/// Keeps other processes of this user out of this one's memory, for a process that holds
/// secrets for a moment (the broker, the console): on Linux it becomes non-dumpable, so a
/// process of the same user without CAP_SYS_PTRACE can neither ptrace it nor read its
/// `/proc/PID/mem`, `environ` or `maps`; on every unix it writes no core file. Windows:
/// nothing here (a process's memory is guarded by its token's DACL).
pub fn harden_process() -> std::io::Result<()> {
    imp_harden()
}

#[cfg(unix)]
fn imp_harden() -> std::io::Result<()> {
    unix::harden_process()
}

#[cfg(windows)]
fn imp_harden() -> std::io::Result<()> {
    Ok(())
}

/// A connection a [`Listener`] accepted: a Unix stream, or the server end of a named pipe.
#[cfg(unix)]
pub type Accepted = tokio::net::UnixStream;
/// A connection a [`Listener`] accepted: a Unix stream, or the server end of a named pipe.
#[cfg(windows)]
pub type Accepted = tokio::net::windows::named_pipe::NamedPipeServer;

/// A connection [`connect`] opened: a Unix stream, or the client end of a named pipe.
#[cfg(unix)]
pub type Connected = tokio::net::UnixStream;
/// A connection [`connect`] opened: a Unix stream, or the client end of a named pipe.
#[cfg(windows)]
pub type Connected = tokio::net::windows::named_pipe::NamedPipeClient;

/// What the journal calls this platform's local transport (`Transport::kind`).
#[cfg(unix)]
pub const TRANSPORT_KIND: &str = "unix_socket";
/// What the journal calls this platform's local transport (`Transport::kind`).
#[cfg(windows)]
pub const TRANSPORT_KIND: &str = "named_pipe";

/// Who a local user is, as the operating system names them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UserId {
    /// A unix user id (Linux, macOS).
    Uid(u32),
    /// A Windows security identifier in its string form (`S-1-5-21-…`).
    Sid(String),
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UserId::Uid(uid) => write!(f, "uid {uid}"),
            UserId::Sid(sid) => write!(f, "user {sid}"),
        }
    }
}

/// What the operating system says about the other end of an accepted connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCred {
    /// The user the peer process runs as (its effective uid on unix).
    pub user: UserId,
    /// Its primary group (effective gid) on unix; Windows has none to give.
    pub gid: Option<u32>,
    /// The peer process, when the platform can name it.
    pub pid: Option<u32>,
}

/// The user this process runs as (effective uid on unix, token user SID on Windows).
///
/// # Errors
///
/// Only on Windows, when the process token cannot be read.
pub fn current_user() -> std::io::Result<UserId> {
    imp::current_user()
}

/// `(parent pid, start stamp)` of process `pid`; `None` when it is gone or unreadable.
///
/// The start stamp makes a process distinct from a later one reusing its pid. Its unit is
/// the platform's: clock ticks since boot on Linux (`/proc/PID/stat` field 22),
/// microseconds since the unix epoch on macOS, 100 ns intervals since 1601 (FILETIME) on
/// Windows. Only [`start_to_unix_ms`] interprets it. A parent pid of 0 means none is
/// known (on Windows, also a parent that has exited: Windows does not re-parent
/// orphans, and the recorded pid may since name another process).
pub fn process_start(pid: u32) -> Option<(u32, u64)> {
    imp::process_start(pid)
}

/// The executable's path as the kernel reports it.
pub fn process_executable(pid: u32) -> Option<String> {
    imp::process_executable(pid)
}

/// What to read to hash the executable process `pid` runs: on Linux `/proc/PID/exe`
/// (the inode the process runs, even if its path was replaced since); elsewhere the
/// executable's path (on Windows the image file cannot be rewritten while it runs; on
/// macOS it can, and the digest is then of the new bytes).
pub fn process_image(pid: u32) -> Option<PathBuf> {
    imp::process_image(pid)
}

/// The process's current directory, where the platform exposes it (not on Windows).
pub fn process_cwd(pid: u32) -> Option<String> {
    imp::process_cwd(pid)
}

/// The command line, arguments joined by spaces, cut to 200 characters; empty where the
/// platform does not expose it (Windows).
pub fn process_command(pid: u32) -> String {
    imp::process_command(pid)
}

/// The process's effective uid (unix); `None` on Windows, which has no uids.
pub fn process_uid(pid: u32) -> Option<u32> {
    imp::process_uid(pid)
}

/// The process's user SID (Windows); `None` on unix, where [`process_uid`] says it.
pub fn process_sid(pid: u32) -> Option<String> {
    imp::process_sid(pid)
}

/// A [`process_start`] stamp as unix milliseconds, for people.
pub fn start_to_unix_ms(start: u64) -> Option<i64> {
    imp::start_to_unix_ms(start)
}

/// One version of a file: device, inode, size, and modification and change times (the
/// change time cannot be set by a user, so a file rewritten in place gets a new stamp).
pub type FileStamp = (u64, u64, u64, i64, i64, i64, i64);

/// The [`FileStamp`] of `meta` on unix; `None` on Windows, where std exposes no change
/// time (nothing keyed by a stamp is then reused).
pub fn file_stamp(meta: &std::fs::Metadata) -> Option<FileStamp> {
    imp::file_stamp(meta)
}

/// The file's identity (device, inode) on unix; `None` on Windows, whose named pipes
/// leave no file to identify.
pub fn file_identity(meta: &std::fs::Metadata) -> Option<(u64, u64)> {
    imp::file_identity(meta)
}

/// Makes a [`std::fs::DirBuilder`] create owner-only directories: mode 0700 on unix. On
/// Windows it changes nothing; call [`protect_dir`] on what it created.
pub fn owner_only_dir(builder: &mut std::fs::DirBuilder) -> &mut std::fs::DirBuilder {
    imp::owner_only_dir(builder)
}

/// Makes [`std::fs::OpenOptions`] create a file with `mode` (unix; 0600 for an owner-only
/// file). On Windows it changes nothing: a new file inherits its directory's DACL.
pub fn create_mode(options: &mut std::fs::OpenOptions, mode: u32) -> &mut std::fs::OpenOptions {
    imp::file_mode(options, mode)
}

/// Makes a directory this process just created owner-only, whatever the umask or the
/// parent's inheritable ACL did: mode 0700 on unix; on Windows a protected DACL that
/// grants this user and SYSTEM full control, inherited by everything created in it.
///
/// # Errors
///
/// The operating system's, when the permissions cannot be set.
pub fn protect_dir(dir: &Path) -> std::io::Result<()> {
    imp::protect_dir(dir)
}

/// Creates `dir` and any missing parents, each new level owner-only (0700 on unix, a
/// protected DACL on Windows). Existing levels are left as they are.
///
/// # Errors
///
/// The operating system's.
pub fn create_owner_only_dir_all(dir: &Path) -> std::io::Result<()> {
    imp::create_owner_only_dir_all(dir)
}

/// The permission bits of `meta` (`mode & 0o7777`) on unix; `None` on Windows, whose
/// ACLs have no such summary.
pub fn mode_of(meta: &std::fs::Metadata) -> Option<u32> {
    imp::mode_of(meta)
}

/// Makes a rename or a new file in `dir` durable: fsync of the directory on unix. On
/// Windows nothing is done (NTFS journals its metadata, and std cannot open a directory
/// to flush it) and `Ok` is returned.
///
/// # Errors
///
/// The operating system's, on unix.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    imp::sync_dir(dir)
}

/// Bytes available to this user on the filesystem holding `path` (a directory, or a
/// file whose directory is asked), when the platform can tell.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let dir = if path.is_dir() {
        path
    } else {
        path.parent().filter(|p| !p.as_os_str().is_empty())?
    };
    imp::free_bytes(dir)
}

/// The data directory when none is given: on Linux `$XDG_DATA_HOME/postern`, else
/// `~/.local/share/postern`; on macOS `~/Library/Application Support/postern`; on Windows
/// `%LOCALAPPDATA%\postern` (not roaming: the journal is this machine's record). With no
/// home directory at all, the relative `.postern`, and every message names it.
pub fn default_data_dir() -> PathBuf {
    imp::default_data_dir()
}

/// The directory audit anchors go to, outside any data dir: `$XDG_STATE_HOME/postern/anchors`
/// when `XDG_STATE_HOME` is set (on every platform: the test suite relies on it); else on
/// Linux `~/.local/state/postern/anchors`, on macOS `~/Library/Application
/// Support/postern-anchors`, on Windows `%APPDATA%\postern\anchors` (the roaming profile,
/// another tree than the data dir's).
pub fn anchor_dir() -> Option<PathBuf> {
    imp::anchor_dir()
}

/// The endpoint a broker with data dir `data_dir` listens on by default: the socket
/// `DATA_DIR/run/postern.sock` on unix; on Windows the named pipe
/// `\\.\pipe\postern-<16 hex digits of blake3 of the data dir's absolute path, lowercased>`,
/// since a pipe has no directory to live in.
pub fn default_endpoint(data_dir: &Path) -> PathBuf {
    imp::default_endpoint(data_dir)
}

/// The endpoint named `name` beside `endpoint`: a socket in the same directory on unix;
/// on Windows the pipe `<endpoint>-<name without extension>`.
pub fn sibling_endpoint(endpoint: &Path, name: &str) -> PathBuf {
    imp::sibling_endpoint(endpoint, name)
}
