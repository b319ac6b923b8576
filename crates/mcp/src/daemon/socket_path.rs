//! Where the daemon's socket and data dir may go, and whom a path on the way trusts.
//!
//! # Paths it is given
//! The daemon changes nothing it did not make. A missing data dir or socket directory is
//! created with mode 0700 (each missing level, none above); an existing directory keeps
//! its mode. At the socket path it replaces only a stale socket of its own (a socket file
//! owned by this uid that nobody answers on); a regular file, directory, symlink (never
//! followed), other file type or another user's socket is an error naming the path and
//! what is there. The socket itself gets 0600.
//!
//! An existing directory the socket goes into must not be writable by others: one that is
//! group- or world-writable without the sticky bit, or owned by another user than this
//! one or root, is refused, not warned about. Whoever can write that directory can
//! replace the socket with a listener of their own and receive every request, with its
//! arguments, that agents meant for the broker; a warning in a daemon's log would go
//! unread while agents talk to the impostor. (/tmp, 1777, is fine: the sticky bit stops
//! others from replacing a file they do not own.) When the socket's directory is created,
//! it is ours and 0700; the existing directory it is created in must not be
//! world-writable (without the sticky bit) or another user's, since whoever can write
//! there can rename our directory away and put theirs in its place. Writable by this
//! user's own primary group is accepted there: it is how homes look under a
//! user-private-group umask (002), and the default data dir is created under
//! ~/.local/share.
//!
//! Every other component of the socket path is checked too, from `/` down, one level at a
//! time without following anything unchecked (`walk_trusted`; issue 26): each directory
//! must be owned by root or this user and not writable by others (nor by a group other
//! than this user's own primary group, which user-private-group homes are) unless it is
//! a sticky directory of root's or this user's, like /tmp, inside which the next
//! component must again be root's or this user's, since anyone may create a name there.
//! A symlink is followed only when root or this user owns it: whoever owns a link can
//! re-point it at a listener of their own once the broker runs, and capture every
//! `tools/call` an agent sends. Anything else is refused as
//! [`DaemonError::SocketPathUntrusted`], naming the component, its owner and why. The
//! bridge runs the same walk before it sends anything (see [`crate::bridge`]).
//!
//! The journal lives in the data dir, so the data dir must take new files and an existing
//! journal must be writable; that is checked before anything else is created (no keychain
//! entry, no journal file, no socket directory), and said as what it is.
//!
//! # On Windows
//! The endpoint is a named pipe (`\\.\pipe\NAME`), which has no directory, owner or
//! mode to check: the pipe is created as the first instance of its name (a name someone
//! else holds is refused: [`DaemonError::AlreadyRunning`] when this user's broker answers
//! on it, [`DaemonError::PipeInUse`] otherwise), remote clients are rejected, and every
//! client's user is checked as on unix ([`postern_broker::platform`]). The data dir's new
//! levels get a DACL for this user and SYSTEM instead of 0700. Serving other users'
//! agents (a mode other than 0600) is refused there.

use std::path::{Path, PathBuf};

use postern_broker::platform::{self, Listener};

use super::error::{DaemonError, Found};
#[cfg(unix)]
use crate::caller::own_uid;

/// Directories along `path` that do not exist yet, outermost first, and the nearest one
/// that does. Nothing is followed at a missing level: a dangling symlink is not missing.
fn missing_levels(path: &Path) -> std::io::Result<(Vec<PathBuf>, PathBuf)> {
    let mut missing = Vec::new();
    let mut level = path.to_path_buf();
    loop {
        match std::fs::symlink_metadata(&level) {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                missing.push(level.clone());
                match level.parent() {
                    Some(parent) if !parent.as_os_str().is_empty() => level = parent.to_path_buf(),
                    _ => {
                        level = PathBuf::from(".");
                        break;
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    missing.reverse();
    Ok((missing, level))
}

/// Creates each of `levels` (outermost first) with mode 0700 (on Windows, a DACL for
/// this user and SYSTEM). Only these, which this process made, get their mode set.
fn create_private_levels(levels: &[PathBuf]) -> std::io::Result<()> {
    for level in levels {
        platform::owner_only_dir(&mut std::fs::DirBuilder::new()).create(level)?;
        // The umask may have taken bits away; the directory is ours to set.
        platform::protect_dir(level)?;
    }
    Ok(())
}

/// This process's effective gid: a directory writable by this group alone is this
/// user's (see [`Trust`]).
#[cfg(unix)]
pub(crate) fn own_gid() -> u32 {
    platform::own_gid()
}

/// Whom a walk along a socket path ([`walk_trusted`]) trusts.
#[cfg(unix)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Trust {
    /// This process's effective uid.
    pub(crate) me: u32,
    /// This process's effective gid: a directory writable by its group is accepted when
    /// the group is this one (how homes look under a user-private-group umask, 002).
    pub(crate) gid: u32,
    /// Another owner a directory on the path may have: the socket's owner, for the bridge
    /// (a privilege-separated broker runs as its own user). Never trusted for a symlink
    /// or for an entry in a shared sticky directory, where anyone may create a name.
    pub(crate) also: Option<u32>,
}

#[cfg(unix)]
impl Trust {
    /// Root or this process's user: who may own a followed symlink, a shared sticky
    /// directory, or an entry inside one.
    fn own(&self, uid: u32) -> bool {
        uid == 0 || uid == self.me
    }

    fn owner_ok(&self, uid: u32) -> bool {
        self.own(uid) || self.also == Some(uid)
    }

    fn own_names(&self) -> String {
        format!("root or this user (uid {})", self.me)
    }

    fn owner_names(&self) -> String {
        match self.also {
            Some(also) if !self.own(also) => format!(
                "root, this user (uid {}) or the socket's owner (uid {also})",
                self.me
            ),
            _ => self.own_names(),
        }
    }
}

/// A component of a path that [`walk_trusted`] does not trust.
#[cfg(unix)]
#[derive(Debug)]
pub(crate) struct Untrusted {
    pub(crate) component: PathBuf,
    pub(crate) owner: Option<u32>,
    /// Why, as the rest of a sentence that starts with the component.
    pub(crate) reason: String,
}

/// Why a walk stopped.
#[cfg(unix)]
#[derive(Debug)]
pub(crate) enum WalkError {
    Untrusted(Untrusted),
    /// A component could not be examined (no search permission, say).
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Where a walk ended.
#[cfg(unix)]
#[derive(Debug)]
pub(crate) struct Walked {
    /// The path with every symlink resolved, as far as it exists.
    pub(crate) resolved: PathBuf,
    /// What is at `resolved`, never a symlink.
    pub(crate) meta: std::fs::Metadata,
    /// Some component after `resolved` does not exist.
    pub(crate) missing: bool,
}

/// Symlinks followed in one walk at most, as Linux's own resolution (ELOOP).
#[cfg(unix)]
const MAX_LINKS: usize = 40;

/// One step of a walk.
#[cfg(unix)]
enum Step {
    Parent,
    Name(std::ffi::OsString),
}

#[cfg(unix)]
fn steps(path: &Path) -> Vec<Step> {
    use std::path::Component;
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(Step::Name(name.to_os_string())),
            Component::ParentDir => Some(Step::Parent),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// Refuses a directory the walk looks into that others could change: owned by another
/// user than `trust` names, writable by others without the sticky bit (or by a group
/// other than this user's own), or a shared sticky directory of another user's (its
/// owner may remove anything in it).
#[cfg(unix)]
fn check_walked_dir(dir: &Path, meta: &std::fs::Metadata, trust: &Trust) -> Result<(), Untrusted> {
    use std::os::unix::fs::MetadataExt;
    let (uid, mode) = (meta.uid(), meta.mode() & 0o7777);
    let reason = if !trust.owner_ok(uid) {
        format!(
            "is a directory owned by uid {uid}, not by {}: its owner can replace what is in it",
            trust.owner_names()
        )
    } else if mode & 0o022 != 0 && mode & 0o1000 != 0 {
        if trust.own(uid) {
            return Ok(());
        }
        format!(
            "is a shared sticky directory (mode {mode:04o}) owned by uid {uid}, not by {}: its \
             owner may remove or replace anything in it",
            trust.own_names()
        )
    } else if mode & 0o002 != 0 {
        format!(
            "is a directory writable by others without the sticky bit (mode {mode:04o}): \
             anyone can rename what is in it"
        )
    } else if mode & 0o020 != 0 && meta.gid() != trust.gid {
        format!(
            "is a directory writable by its group (gid {}, not this user's own gid {}) \
             without the sticky bit (mode {mode:04o}): the group's members can rename what is \
             in it",
            meta.gid(),
            trust.gid
        )
    } else {
        return Ok(());
    };
    Err(Untrusted {
        component: dir.to_path_buf(),
        owner: Some(uid),
        reason,
    })
}

/// Walks `path` from `/` one component at a time with `lstat`, checking every directory
/// it looks into ([`check_walked_dir`]) and every symlink before following it (root's
/// or this user's only), and requiring an entry of a shared sticky directory to be root's
/// or this user's. The last component is resolved (a trusted symlink followed) but not
/// judged: that is the caller's. A relative path starts at the current directory.
#[cfg(unix)]
pub(crate) fn walk_trusted(path: &Path, trust: &Trust) -> Result<Walked, WalkError> {
    use std::os::unix::fs::MetadataExt;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| WalkError::Io { path, source }
    };
    let untrusted = |component: &Path, owner: Option<u32>, reason: String| {
        WalkError::Untrusted(Untrusted {
            component: component.to_path_buf(),
            owner,
            reason,
        })
    };
    let root = Path::new("/");
    let mut todo: std::collections::VecDeque<Step> = if path.is_absolute() {
        steps(path).into()
    } else {
        let cwd = std::env::current_dir().map_err(io(Path::new(".")))?;
        let mut all = steps(&cwd);
        all.extend(steps(path));
        all.into()
    };
    let mut at = root.to_path_buf();
    let mut meta = std::fs::symlink_metadata(root).map_err(io(root))?;
    let mut links = 0;
    while let Some(step) = todo.pop_front() {
        if !meta.is_dir() {
            return Err(untrusted(
                &at,
                Some(meta.uid()),
                format!("is {}, not a directory", Found::of(&meta.file_type())),
            ));
        }
        check_walked_dir(&at, &meta, trust).map_err(WalkError::Untrusted)?;
        let name = match step {
            Step::Parent => {
                // `at` has no symlink in it, so its parent is the real one, checked on
                // the way down.
                at.pop();
                meta = std::fs::symlink_metadata(&at).map_err(io(&at))?;
                continue;
            }
            Step::Name(name) => name,
        };
        let mode = meta.mode();
        let shared_sticky = mode & 0o1000 != 0 && mode & 0o022 != 0;
        let next = at.join(&name);
        let found = match std::fs::symlink_metadata(&next) {
            Ok(found) => found,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Walked {
                    resolved: at,
                    meta,
                    missing: true,
                });
            }
            Err(e) => return Err(io(&next)(e)),
        };
        if found.file_type().is_symlink() {
            if !trust.own(found.uid()) {
                return Err(untrusted(
                    &next,
                    Some(found.uid()),
                    format!(
                        "is a symbolic link owned by uid {}, not by {}: its owner can \
                         re-point it at a listener of their own",
                        found.uid(),
                        trust.own_names()
                    ),
                ));
            }
            links += 1;
            let target = std::fs::read_link(&next).map_err(io(&next))?;
            if links > MAX_LINKS || target.as_os_str().is_empty() {
                return Err(untrusted(
                    &next,
                    Some(found.uid()),
                    "is a symbolic link that leads nowhere (empty, or too many links)".into(),
                ));
            }
            if target.is_absolute() {
                at = root.to_path_buf();
                meta = std::fs::symlink_metadata(root).map_err(io(root))?;
            }
            for step in steps(&target).into_iter().rev() {
                todo.push_front(step);
            }
            continue;
        }
        if shared_sticky && !trust.own(found.uid()) {
            return Err(untrusted(
                &next,
                Some(found.uid()),
                format!(
                    "is owned by uid {} inside the shared sticky directory {}, where anyone \
                     may create a name: only {} is trusted there",
                    found.uid(),
                    at.display(),
                    trust.own_names()
                ),
            ));
        }
        at = next;
        meta = found;
    }
    Ok(Walked {
        resolved: at,
        meta,
        missing: false,
    })
}

/// Refuses the directory the socket goes in, or the one its missing directories are made
/// in, when others could write into it (see the module docs for why). `group_may_write`:
/// accept one writable by this user's own group (see the module docs for when).
#[cfg(unix)]
fn check_dir_safe(
    dir: &Path,
    meta: &std::fs::Metadata,
    trust: &Trust,
    group_may_write: bool,
) -> Result<(), DaemonError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let me = trust.me;
    let mode = meta.permissions().mode();
    let own_group = group_may_write && meta.gid() == trust.gid;
    let writable = if own_group { 0o002 } else { 0o022 };
    let problem = if !trust.own(meta.uid()) {
        Some(format!(
            "is owned by uid {}, not by this user (uid {me}) or root",
            meta.uid()
        ))
    } else if mode & writable != 0 && mode & 0o1000 == 0 {
        Some(format!(
            "is writable by {} without the sticky bit (mode {:04o})",
            if mode & 0o002 != 0 {
                "others".to_string()
            } else if group_may_write {
                format!("its group (gid {}, not this user's own)", meta.gid())
            } else {
                "its group".to_string()
            },
            mode & 0o7777
        ))
    } else {
        None
    };
    match problem {
        Some(problem) => Err(DaemonError::UnsafeSocketDir {
            path: dir.display().to_string(),
            problem,
        }),
        None => Ok(()),
    }
}

/// Where the socket will go, checked without changing anything.
#[cfg(unix)]
struct SocketPlan {
    /// Directories to create, outermost first.
    create: Vec<PathBuf>,
    /// A socket of ours is at the path (stale unless something answers on it).
    own_socket: bool,
}

#[cfg(unix)]
fn inspect_socket_path(socket: &Path, me: u32) -> Result<SocketPlan, DaemonError> {
    use std::os::unix::fs::MetadataExt;
    let dir = socket
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dir_err = |path: &Path| {
        let path = path.display().to_string();
        move |source| DaemonError::SocketDir { path, source }
    };
    let (create, existing) = missing_levels(dir).map_err(dir_err(dir))?;
    // Every component up to the directory the socket goes in (or the one the new ones
    // are made in): a symlink is followed only when it is root's or ours.
    let trust = Trust {
        me,
        gid: own_gid(),
        also: None,
    };
    let walked = walk_trusted(&existing, &trust).map_err(|e| match e {
        WalkError::Untrusted(u) => DaemonError::SocketPathUntrusted {
            path: socket.display().to_string(),
            component: u.component.display().to_string(),
            owner: u.owner,
            reason: u.reason,
        },
        WalkError::Io { path, source } => dir_err(&path)(source),
    })?;
    if walked.missing {
        // A symlink that leads nowhere, or a level removed while we looked.
        return Err(dir_err(&existing)(std::io::Error::from(
            std::io::ErrorKind::NotFound,
        )));
    }
    let meta = walked.meta;
    if !meta.is_dir() {
        return Err(DaemonError::SocketDirNotDirectory {
            path: existing.display().to_string(),
            found: Found::of(&meta.file_type()),
        });
    }
    check_dir_safe(&existing, &meta, &trust, !create.is_empty())?;
    if !create.is_empty() {
        return Ok(SocketPlan {
            create,
            own_socket: false,
        });
    }
    let path = socket.display().to_string();
    match std::fs::symlink_metadata(socket) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(SocketPlan {
            create,
            own_socket: false,
        }),
        Err(source) => Err(DaemonError::Socket { path, source }),
        Ok(meta) => match Found::of(&meta.file_type()) {
            Found::Socket if meta.uid() == me => Ok(SocketPlan {
                create,
                own_socket: true,
            }),
            Found::Socket => Err(DaemonError::SocketOwnedByOther {
                path,
                owner: meta.uid(),
                me,
            }),
            found => Err(DaemonError::SocketPathOccupied { path, found }),
        },
    }
}

/// Checks the socket path as [`bind`] will use it, changing nothing: the daemon calls it
/// before it creates anything else.
#[cfg(unix)]
pub fn check_socket_path(socket: &Path) -> Result<(), DaemonError> {
    let me = own_uid().ok_or(DaemonError::NoUid)?;
    inspect_socket_path(socket, me).map(|_| ())
}

/// Checks the pipe name as [`bind`] will use it, changing nothing.
#[cfg(windows)]
pub fn check_socket_path(socket: &Path) -> Result<(), DaemonError> {
    if platform::is_pipe_name(socket) {
        Ok(())
    } else {
        Err(DaemonError::NotAPipeName {
            path: socket.display().to_string(),
        })
    }
}

/// Binds the socket, mode 0600, creating missing directories 0700 and replacing only a
/// stale socket of our own (see the module docs).
pub async fn bind(socket: &Path) -> Result<Listener, DaemonError> {
    bind_with_mode(socket, 0o600).await
}

/// [`bind`] with the socket file given `mode` instead of 0600: 0666 for an agent socket
/// other local users reach (a broker running as its own system user, [`AgentAccess::
/// AnyLocalUser`]), 0660 for a group's socket.
#[cfg(unix)]
pub async fn bind_with_mode(socket: &Path, mode: u32) -> Result<Listener, DaemonError> {
    use std::os::unix::fs::PermissionsExt;
    let me = own_uid().ok_or(DaemonError::NoUid)?;
    let plan = inspect_socket_path(socket, me)?;
    let err = |source| DaemonError::Socket {
        path: socket.display().to_string(),
        source,
    };
    create_private_levels(&plan.create).map_err(|source| DaemonError::SocketDir {
        path: socket
            .parent()
            .unwrap_or(Path::new("."))
            .display()
            .to_string(),
        source,
    })?;
    if plan.own_socket {
        // A live broker answers; a stale socket from a crash does not.
        if platform::connect(socket).await.is_ok() {
            return Err(DaemonError::AlreadyRunning(socket.display().to_string()));
        }
        std::fs::remove_file(socket).map_err(err)?;
    }
    let listener = Listener::bind(socket).map_err(err)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(mode & 0o777)).map_err(err)?;
    Ok(listener)
}

/// [`bind`] on Windows: the first instance of the pipe `socket`. Only `mode` 0600 (this
/// user) is served: see the module docs.
#[cfg(windows)]
pub async fn bind_with_mode(socket: &Path, mode: u32) -> Result<Listener, DaemonError> {
    if mode & 0o077 != 0 {
        return Err(DaemonError::Unsupported(
            "on Windows the broker's pipe admits its own user only: serving other users' \
             agents (--agent-users any) or an operator group is not supported there",
        ));
    }
    check_socket_path(socket)?;
    let path = socket.display().to_string();
    match Listener::bind(socket) {
        Ok(listener) => Ok(listener),
        // ERROR_ACCESS_DENIED: the name exists. This user's broker answers on it, or
        // someone else holds it.
        Err(e) if e.raw_os_error() == Some(5) => match platform::connect(socket).await {
            Ok(_) => Err(DaemonError::AlreadyRunning(path)),
            Err(_) => Err(DaemonError::PipeInUse { path }),
        },
        Err(source) => Err(DaemonError::Socket { path, source }),
    }
}

/// Makes sure the data dir exists (missing levels created 0700, an existing one left as
/// it is) and that the journal in it can be written, before anything is created in it.
pub fn prepare_data_dir(dir: &Path) -> Result<(), DaemonError> {
    let path = dir.display().to_string();
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(meta) => {
            return Err(DaemonError::DataDirNotDirectory {
                path,
                found: Found::of(&meta.file_type()),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let (create, _) = missing_levels(dir).map_err(|source| DaemonError::DataDir {
                path: path.clone(),
                source,
            })?;
            create_private_levels(&create).map_err(|source| DaemonError::DataDir {
                path: path.clone(),
                source,
            })?;
        }
        Err(source) => return Err(DaemonError::DataDir { path, source }),
    }
    let journal = dir.join("journal.db");
    let not_writable = |source| DaemonError::DataDirNotWritable {
        path: path.clone(),
        journal: journal.display().to_string(),
        source,
    };
    if std::fs::symlink_metadata(&journal).is_ok() {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&journal)
            .map_err(not_writable)?;
    }
    // SQLite makes journal.db-wal and -shm beside the journal: the directory itself
    // must take new files. A probe file says so, and is removed at once.
    let probe = dir.join(format!(".postern-write-check-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {}
        // Left by an earlier process with this pid: removing it proves write access too.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(not_writable(source)),
    }
    std::fs::remove_file(&probe).map_err(not_writable)
}

#[cfg(test)]
#[cfg(unix)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn running_as_root() -> bool {
        own_uid() == Some(0)
    }

    // Regression: issue 10
    #[tokio::test]
    async fn a_regular_file_at_the_socket_path_is_refused_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("postern.sock");
        std::fs::write(&path, "keep").unwrap();
        let err = bind(&path).await.unwrap_err();
        assert!(
            matches!(
                err,
                DaemonError::SocketPathOccupied {
                    found: Found::RegularFile,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains(&path.display().to_string()));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep");
    }

    // Regression: issue 10
    #[tokio::test]
    async fn a_symlink_to_a_stale_socket_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.sock");
        drop(std::os::unix::net::UnixListener::bind(&real).unwrap());
        let link = dir.path().join("postern.sock");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let err = bind(&link).await.unwrap_err();
        assert!(
            matches!(
                err,
                DaemonError::SocketPathOccupied {
                    found: Found::Symlink,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(
            std::fs::symlink_metadata(&real)
                .unwrap()
                .file_type()
                .is_socket()
        );
    }

    // Regression: issue 10
    #[tokio::test]
    async fn existing_directories_keep_their_mode_and_the_socket_is_owner_only() {
        for shared in [0o755, 0o1777, 0o711] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(shared)).unwrap();
            let path = dir.path().join("postern.sock");
            let _listener = bind(&path).await.unwrap();
            assert_eq!(mode(dir.path()), shared);
            assert_eq!(mode(&path) & 0o777, 0o600);
        }
    }

    // Regression: issue 10
    #[tokio::test]
    async fn a_directory_others_can_write_without_the_sticky_bit_is_refused() {
        for open in [0o777, 0o770] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(open)).unwrap();
            let err = bind(&dir.path().join("postern.sock")).await.unwrap_err();
            assert!(matches!(err, DaemonError::UnsafeSocketDir { .. }), "{err}");
            assert!(!dir.path().join("postern.sock").exists(), "nothing created");
            assert_eq!(mode(dir.path()), open);
        }
        // Creating the socket's directory inside a world-writable one is refused too.
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = bind(&dir.path().join("a").join("postern.sock"))
            .await
            .unwrap_err();
        assert!(matches!(err, DaemonError::UnsafeSocketDir { .. }), "{err}");
        assert!(!dir.path().join("a").exists(), "nothing created");
    }

    #[tokio::test]
    async fn a_private_socket_directory_may_be_created_in_a_group_writable_home() {
        // A user-private-group umask (002) leaves ~/.local/share 0775.
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o775)).unwrap();
        let path = dir.path().join("postern").join("run").join("postern.sock");
        let _listener = bind(&path).await.unwrap();
        assert_eq!(mode(dir.path()), 0o775);
        assert_eq!(mode(&dir.path().join("postern").join("run")), 0o700);
    }

    // Regression: issue 10
    #[tokio::test]
    async fn missing_directories_are_created_0700_and_only_they() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("a").join("b").join("postern.sock");
        let _listener = bind(&path).await.unwrap();
        assert_eq!(mode(dir.path()), 0o755);
        assert_eq!(mode(&dir.path().join("a")), 0o700);
        assert_eq!(mode(&dir.path().join("a").join("b")), 0o700);
    }

    #[tokio::test]
    async fn a_stale_own_socket_is_replaced_and_a_live_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("postern.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let live = bind(&path).await.unwrap();
        let err = bind(&path).await.unwrap_err();
        assert!(matches!(err, DaemonError::AlreadyRunning(_)), "{err}");
        drop(live);
    }

    // Regression: issue 10
    #[tokio::test]
    async fn another_users_socket_is_refused() {
        if !running_as_root() {
            eprintln!("skipped: not root, cannot give a socket to another uid");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("postern.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        let err = bind(&path).await.unwrap_err();
        assert!(
            matches!(err, DaemonError::SocketOwnedByOther { owner: 65534, .. }),
            "{err}"
        );
        assert!(std::fs::symlink_metadata(&path).is_ok());
    }

    // Regression: issue 10
    #[test]
    fn the_data_dir_is_created_private_and_an_existing_one_keeps_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("x").join("data");
        prepare_data_dir(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o700);
        assert_eq!(mode(&dir.path().join("x")), 0o700);
        std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o750)).unwrap();
        prepare_data_dir(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o750);
        assert_eq!(
            std::fs::read_dir(&fresh).unwrap().count(),
            0,
            "no probe left behind"
        );
    }

    /// A trust for a broker running as `me` (with `me` as its group), whatever this
    /// process runs as: the walk can then be tried against owners this test sets.
    fn trust_as(me: u32) -> Trust {
        Trust {
            me,
            gid: me,
            also: None,
        }
    }

    fn untrusted(result: Result<Walked, WalkError>) -> Untrusted {
        match result {
            Err(WalkError::Untrusted(u)) => u,
            other => panic!("expected an untrusted component, got {other:?}"),
        }
    }

    // Regression: issue 26 (item 3): a socket path through another user's symlink was
    // accepted, and the link later re-pointed at that user's own listener.
    #[tokio::test]
    async fn a_symlink_on_the_socket_path_owned_by_another_user_is_refused() {
        if !running_as_root() {
            eprintln!("skipped: not root, cannot give a symlink to another uid");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
        let err = bind(&link.join("postern.sock")).await.unwrap_err();
        match &err {
            DaemonError::SocketPathUntrusted {
                component, owner, ..
            } => {
                assert_eq!(component, &link.display().to_string(), "{err}");
                assert_eq!(*owner, Some(65534), "{err}");
            }
            other => panic!("expected SocketPathUntrusted, got {other}"),
        }
        assert!(
            err.to_string().contains("symbolic link owned by uid 65534"),
            "{err}"
        );
        assert!(!real.join("postern.sock").exists(), "nothing created");
        // Where the link is root's (ours), it is followed.
        std::os::unix::fs::lchown(&link, Some(0), Some(0)).unwrap();
        let _listener = bind(&link.join("postern.sock")).await.unwrap();
        assert!(real.join("postern.sock").exists());
    }

    // Regression: issue 26 (item 3)
    #[test]
    fn symlinks_are_followed_only_when_root_or_the_broker_owns_them() {
        if !running_as_root() {
            eprintln!("skipped: not root, cannot give symlinks to other uids");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let socket_dir = |link: &Path| link.join("sub");
        std::fs::create_dir(real.join("sub")).unwrap();
        std::os::unix::fs::chown(real.join("sub"), Some(4242), Some(4242)).unwrap();
        // A chain: a root link to a relative link of the broker's, to the real directory.
        let second = dir.path().join("second");
        std::os::unix::fs::symlink("real", &second).unwrap();
        std::os::unix::fs::lchown(&second, Some(4242), Some(4242)).unwrap();
        let first = dir.path().join("first");
        std::os::unix::fs::symlink(&second, &first).unwrap();
        let walked = walk_trusted(&socket_dir(&first), &trust_as(4242)).unwrap();
        assert_eq!(walked.resolved, real.join("sub"));
        assert!(!walked.missing);
        // The same chain with the middle link another user's is refused at that link.
        std::os::unix::fs::lchown(&second, Some(4243), Some(4243)).unwrap();
        let refused = untrusted(walk_trusted(&socket_dir(&first), &trust_as(4242)));
        assert_eq!(refused.component, second);
        assert_eq!(refused.owner, Some(4243));
        assert!(
            refused.reason.contains("symbolic link"),
            "{}",
            refused.reason
        );
    }

    // Regression: issue 26 (item 3)
    #[tokio::test]
    async fn a_group_or_world_writable_ancestor_without_the_sticky_bit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir_all(open.join("inner")).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let socket = open.join("inner").join("postern.sock");
        let err = bind(&socket).await.unwrap_err();
        match &err {
            DaemonError::SocketPathUntrusted {
                component, reason, ..
            } => {
                assert_eq!(component, &open.display().to_string(), "{err}");
                assert!(reason.contains("writable by others"), "{err}");
            }
            other => panic!("expected SocketPathUntrusted, got {other}"),
        }
        assert!(!socket.exists(), "nothing created");
        // Writable by this user's own group is how a user-private-group home looks.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o775)).unwrap();
        drop(bind(&socket).await.unwrap());
        // Writable by another group is not.
        if running_as_root() {
            std::os::unix::fs::chown(&open, None, Some(65534)).unwrap();
            let err = bind(&socket).await.unwrap_err();
            assert!(
                matches!(&err, DaemonError::SocketPathUntrusted { reason, .. }
                    if reason.contains("writable by its group (gid 65534")),
                "{err}"
            );
        } else {
            eprintln!("skipped the foreign-group case: not root, cannot chgrp");
        }
    }

    // Regression: issue 26 (item 3)
    #[test]
    fn a_broker_directory_inside_a_root_owned_sticky_directory_is_accepted_and_another_users_is_not()
     {
        if !running_as_root() {
            eprintln!("skipped: not root, cannot give directories to other uids");
            return;
        }
        // A /tmp of its own: root's, 1777; the broker runs as uid 4242.
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let mine = tmp.join("mine");
        std::fs::create_dir(&mine).unwrap();
        std::os::unix::fs::chown(&mine, Some(4242), Some(4242)).unwrap();
        let walked = walk_trusted(&mine.join("postern.sock"), &trust_as(4242)).unwrap();
        assert_eq!(walked.resolved, mine);
        assert!(walked.missing, "the socket is not there yet");
        // Another user's directory there, even one it keeps private, is refused.
        std::os::unix::fs::chown(&mine, Some(4243), Some(4243)).unwrap();
        let refused = untrusted(walk_trusted(&mine.join("postern.sock"), &trust_as(4242)));
        assert_eq!(refused.component, mine);
        assert_eq!(refused.owner, Some(4243));
        assert!(refused.reason.contains("sticky"), "{}", refused.reason);
        // A sticky directory that is another user's is refused itself: its owner may
        // remove anything in it.
        std::os::unix::fs::chown(&mine, Some(4242), Some(4242)).unwrap();
        std::os::unix::fs::chown(&tmp, Some(4243), Some(4243)).unwrap();
        let refused = untrusted(walk_trusted(&mine.join("postern.sock"), &trust_as(4242)));
        assert_eq!(refused.component, tmp);
        assert_eq!(refused.owner, Some(4243));
    }

    // Regression: issue 26 (item 3)
    #[tokio::test]
    async fn the_usual_socket_places_are_accepted() {
        // A fresh temp dir of ours (under /tmp, root's and sticky), with levels we create.
        let dir = tempfile::tempdir().unwrap();
        let _a = bind(&dir.path().join("postern.sock")).await.unwrap();
        let _b = bind(&dir.path().join("data").join("run").join("postern.sock"))
            .await
            .unwrap();
        // A relative path, walked from the current directory.
        let trust = Trust {
            me: own_uid().unwrap(),
            gid: own_gid(),
            also: None,
        };
        let here = std::env::current_dir().unwrap();
        if let Ok(absolute) = walk_trusted(&here, &trust) {
            let relative = walk_trusted(Path::new("."), &trust).unwrap();
            assert_eq!(relative.resolved, absolute.resolved);
        }
        // $XDG_RUNTIME_DIR, where there is one.
        if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR") {
            let walked = walk_trusted(Path::new(&runtime), &trust);
            assert!(walked.is_ok(), "{runtime:?}: {walked:?}");
        }
    }

    #[test]
    fn a_file_where_the_data_dir_should_be_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("data");
        std::fs::write(&file, "").unwrap();
        let err = prepare_data_dir(&file).unwrap_err();
        assert!(
            matches!(
                err,
                DaemonError::DataDirNotDirectory {
                    found: Found::RegularFile,
                    ..
                }
            ),
            "{err}"
        );
    }
}

// Named pipes: what replaces the socket path checks on Windows.
#[cfg(test)]
#[cfg(windows)]
mod windows_tests {
    use super::*;

    fn pipe(tag: &str) -> PathBuf {
        PathBuf::from(format!(
            r"\\.\pipe\postern-test-{tag}-{}",
            std::process::id()
        ))
    }

    #[tokio::test]
    async fn a_second_broker_on_the_same_pipe_is_told_one_already_runs() {
        let name = pipe("twice");
        let _first = bind(&name).await.unwrap();
        let second = bind(&name).await;
        assert!(
            matches!(second, Err(DaemonError::AlreadyRunning(_))),
            "{second:?}"
        );
    }

    #[tokio::test]
    async fn a_path_or_a_mode_for_other_users_is_refused() {
        let path = bind(Path::new(r"C:\postern\run\postern.sock")).await;
        assert!(
            matches!(path, Err(DaemonError::NotAPipeName { .. })),
            "{path:?}"
        );
        let shared = bind_with_mode(&pipe("shared"), 0o666).await;
        assert!(
            matches!(shared, Err(DaemonError::Unsupported(_))),
            "{shared:?}"
        );
    }
}
