//! Why the daemon could not start or stopped, and what it found at a path it would not
//! touch.

use postern_broker::OpenError;

/// What was found at a path the daemon would not touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    RegularFile,
    Directory,
    Symlink,
    Fifo,
    Device,
    Socket,
    Other,
}

impl Found {
    pub(super) fn of(file_type: &std::fs::FileType) -> Found {
        if file_type.is_symlink() {
            Found::Symlink
        } else if file_type.is_file() {
            Found::RegularFile
        } else if file_type.is_dir() {
            Found::Directory
        } else {
            Found::special(file_type)
        }
    }

    #[cfg(unix)]
    fn special(file_type: &std::fs::FileType) -> Found {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_socket() {
            Found::Socket
        } else if file_type.is_fifo() {
            Found::Fifo
        } else if file_type.is_block_device() || file_type.is_char_device() {
            Found::Device
        } else {
            Found::Other
        }
    }

    #[cfg(windows)]
    fn special(_file_type: &std::fs::FileType) -> Found {
        Found::Other
    }
}

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Found::RegularFile => "a regular file",
            Found::Directory => "a directory",
            Found::Symlink => "a symbolic link (not followed)",
            Found::Fifo => "a named pipe",
            Found::Device => "a device file",
            Found::Socket => "a socket",
            Found::Other => "a file of an unknown type",
        })
    }
}

/// Why the daemon could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{0}")]
    Config(#[from] postern_broker::config::ConfigError),
    #[error("{0}")]
    Journal(#[from] postern_broker::journal::JournalError),
    #[error("{0}")]
    Vault(#[from] postern_broker::vault::VaultError),
    #[error("{0}")]
    AuditKey(#[from] postern_broker::audit::AuditKeyError),
    #[error("{0}")]
    VaultKey(#[from] postern_broker::sealed_store::KeyError),
    #[error("socket {path}: {source}")]
    Socket {
        path: String,
        source: std::io::Error,
    },
    #[error("another broker is already listening on {0}")]
    AlreadyRunning(String),
    #[error(
        "{path} is {found}, not a socket; refusing to replace it (the daemon replaces only a \
         stale socket of its own). Remove it yourself or choose another --socket"
    )]
    SocketPathOccupied { path: String, found: Found },
    #[error(
        "{path} is a socket owned by uid {owner}, not by this user (uid {me}); refusing to \
         replace it"
    )]
    SocketOwnedByOther { path: String, owner: u32, me: u32 },
    #[error(
        "the socket directory {path} {problem}: another user could replace the broker's \
         socket there. Choose a directory only this user (or root) can write, such as the \
         default DATA_DIR/run"
    )]
    UnsafeSocketDir { path: String, problem: String },
    #[error(
        "refusing the socket path {path}: {component} {reason}. Choose a path whose \
         directories and links only root or this user can change, such as the default \
         DATA_DIR/run"
    )]
    SocketPathUntrusted {
        path: String,
        component: String,
        /// The component's owner, when it could be read.
        owner: Option<u32>,
        reason: String,
    },
    #[error("the socket directory {path} is {found}, not a directory")]
    SocketDirNotDirectory { path: String, found: Found },
    #[error("cannot create the socket directory {path}: {source}")]
    SocketDir {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "the data directory {path} is not writable ({source}): the journal ({journal}) needs \
         write access. Give this user write access to it, or choose another with --data-dir"
    )]
    DataDirNotWritable {
        path: String,
        journal: String,
        source: std::io::Error,
    },
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error("the data directory {path} is {found}, not a directory")]
    DataDirNotDirectory { path: String, found: Found },
    #[error("cannot tell which user this process runs as")]
    NoUid,
    #[error(
        "{path} is not a named pipe name: on Windows the broker listens on \\\\.\\pipe\\NAME \
         (the default is derived from the data dir)"
    )]
    NotAPipeName { path: String },
    #[error(
        "the pipe name {path} is already taken by another program or user; refusing to \
         share it. Choose another --socket"
    )]
    PipeInUse { path: String },
    #[error("{0}")]
    Unsupported(&'static str),
}

impl From<OpenError> for DaemonError {
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::Config(e) => DaemonError::Config(e),
            OpenError::Journal(e) => DaemonError::Journal(e),
            OpenError::Vault(e) => DaemonError::Vault(e),
            OpenError::AuditKey(e) => DaemonError::AuditKey(e),
        }
    }
}
