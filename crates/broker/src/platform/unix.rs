//! What Linux and macOS share: Unix domain sockets (tokio), the peer's credentials through
//! tokio's safe `peer_cred` (SO_PEERCRED on Linux, getpeereid and LOCAL_PEEREPID on
//! macOS), the effective uid, mode bits and statvfs.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};

use super::{Accepted, Connected, FileStamp, PeerCred, UserId};

/// The read half of an accepted connection.
pub type AcceptedRead = tokio::net::unix::OwnedReadHalf;
/// The write half of an accepted connection.
pub type AcceptedWrite = tokio::net::unix::OwnedWriteHalf;

/// A bound local endpoint: a Unix domain socket.
#[derive(Debug)]
pub struct Listener(UnixListener);

impl Listener {
    /// Binds a socket at `path`. What may be replaced there, and the file's mode, are the
    /// caller's decisions (`postern_mcp::daemon` makes them).
    ///
    /// # Errors
    ///
    /// The operating system's.
    pub fn bind(path: &Path) -> io::Result<Listener> {
        UnixListener::bind(path).map(Listener)
    }

    /// The next connection. Cancel safe, like tokio's `accept`.
    ///
    /// # Errors
    ///
    /// The operating system's.
    pub async fn accept(&mut self) -> io::Result<Accepted> {
        self.0.accept().await.map(|(stream, _)| stream)
    }
}

/// Connects to the socket at `path`.
///
/// # Errors
///
/// The operating system's: `NotFound` or `ConnectionRefused` when nothing listens,
/// `PermissionDenied` when file permissions keep this user out.
pub async fn connect(path: &Path) -> io::Result<Connected> {
    UnixStream::connect(path).await
}

/// Splits an accepted connection into halves that can move to separate tasks.
pub fn split(stream: Accepted) -> (AcceptedRead, AcceptedWrite) {
    stream.into_split()
}

/// The kernel's word on who is on the other end of `stream`.
///
/// # Errors
///
/// The operating system's, when the credentials cannot be read.
pub fn peer_of(stream: &Accepted) -> io::Result<PeerCred> {
    let cred = stream.peer_cred()?;
    Ok(PeerCred {
        user: UserId::Uid(cred.uid()),
        gid: Some(cred.gid()),
        pid: cred.pid().and_then(|pid| u32::try_from(pid).ok()),
    })
}

/// Completes when the process is asked to stop other than by Ctrl-C: SIGTERM. The
/// handler is registered when this is called, not when it is first polled.
///
/// # Errors
///
/// The operating system's, when the handler cannot be registered.
pub fn termination() -> io::Result<impl Future<Output = ()>> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    Ok(async move {
        term.recv().await;
    })
}

/// This process's effective gid (getegid).
pub fn own_gid() -> u32 {
    rustix::process::getegid().as_raw()
}

/// The most descriptors the broker asks for: enough for its connection caps with room
/// for the journal, the keychain and outgoing connections.
const WANTED_DESCRIPTORS: u64 = 65_536;

/// Raises this process's soft descriptor limit toward its hard limit (at most
/// [`WANTED_DESCRIPTORS`]), as far as it is allowed; returns the soft limit in force
/// after. An agent flood must hit the broker's own connection caps, not the 1024 a
/// login session starts with (issue 26).
pub fn raise_descriptor_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    let current = limit.current?;
    let wanted = limit
        .maximum
        .map_or(WANTED_DESCRIPTORS, |max| max.min(WANTED_DESCRIPTORS));
    if wanted > current {
        limit.current = Some(wanted);
        if setrlimit(Resource::Nofile, limit).is_err() {
            return Some(current);
        }
    }
    getrlimit(Resource::Nofile).current
}

/// See [`super::harden_process`].
pub(super) fn harden_process() -> io::Result<()> {
    use rustix::process::{Resource, Rlimit, setrlimit};
    setrlimit(
        Resource::Core,
        Rlimit {
            current: Some(0),
            maximum: Some(0),
        },
    )?;
    #[cfg(target_os = "linux")]
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
    Ok(())
}

/// The effective uid of this process (geteuid: no /proc read, so no way to fail).
pub fn own_uid() -> Option<u32> {
    Some(rustix::process::geteuid().as_raw())
}

pub(super) fn current_user() -> io::Result<UserId> {
    Ok(UserId::Uid(rustix::process::geteuid().as_raw()))
}

/// The login name of `user` from /etc/passwd, if it has one there.
pub fn user_name(user: &UserId) -> Option<String> {
    let UserId::Uid(uid) = user else { return None };
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id: u32 = fields.nth(1)?.parse().ok()?;
        (id == *uid).then(|| name.to_string())
    })
}

pub(super) fn owner_only_dir(builder: &mut std::fs::DirBuilder) -> &mut std::fs::DirBuilder {
    builder.mode(0o700)
}

pub(super) fn file_mode(
    options: &mut std::fs::OpenOptions,
    mode: u32,
) -> &mut std::fs::OpenOptions {
    options.mode(mode)
}

pub(super) fn protect_dir(dir: &Path) -> io::Result<()> {
    // The umask may have taken bits away; the directory is ours to set.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

pub(super) fn create_owner_only_dir_all(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

pub(super) fn mode_of(meta: &std::fs::Metadata) -> Option<u32> {
    Some(meta.permissions().mode() & 0o7777)
}

pub(super) fn file_stamp(m: &std::fs::Metadata) -> Option<FileStamp> {
    Some((
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    ))
}

pub(super) fn file_identity(m: &std::fs::Metadata) -> Option<(u64, u64)> {
    Some((m.dev(), m.ino()))
}

pub(super) fn free_bytes(dir: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(dir).ok()?;
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// A process's command line as the session record shows it: its non-empty arguments
/// joined by spaces, cut at 200 characters.
pub(super) fn shown_command(args: impl IntoIterator<Item = String>) -> String {
    args.into_iter()
        .filter(|a| !a.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(200)
        .collect()
}

pub(super) fn default_endpoint(data_dir: &Path) -> PathBuf {
    data_dir.join("run").join("postern.sock")
}

pub(super) fn sibling_endpoint(endpoint: &Path, name: &str) -> PathBuf {
    endpoint.parent().unwrap_or(Path::new(".")).join(name)
}
