//! Postern's agent-facing side: the MCP server agents reach over a local socket, and the
//! stdio bridge (`postern mcp`) their MCP clients launch.
//!
//! # Layout
//! - [`tools`]: tool names, descriptions and exact input schemas.
//! - [`server`]: one session's MCP server over the agent side's handle
//!   ([`postern_broker::AgentApi`]: never the broker, its vault, journal or
//!   configuration); delivery acknowledgements; the registry of agent sessions, held
//!   beside the broker by whoever serves the socket.
//! - [`daemon`]: the agent socket of the headless broker (opened by the console crate's
//!   `headless`, which holds the operator side): socket (0600, in a directory others cannot write;
//!   only its own stale socket replaced; a named pipe on Windows), peer user checked,
//!   input lines guarded ([`input`]: the reader the MCP layer reads a connection
//!   through).
//! - [`bridge`]: stdio ↔ socket relay that answers malformed input itself and delivers
//!   what it owes before exiting; BROKER_UNAVAILABLE when no broker runs or may be reached.
//! - [`caller`]: the process at the other end of the agent socket (its credentials, and
//!   the agent process behind a bridge). "Peer" is kept for federated brokers ([`peering`]).
//! - [`peering`]: the federation endpoint another broker calls (MCP Streamable HTTP
//!   over TCP, the three peering tools only), over
//!   [`postern_broker::federation::serve::PeerService`].

pub mod admission;
pub mod bridge;
pub mod caller;
pub mod daemon;
mod input;
pub mod peering;
pub mod server;
pub mod tools;

use std::path::{Path, PathBuf};

/// Which keychain the broker reads credentials from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeychainChoice {
    SecretService,
    Keyutils,
    /// Sealed files in the data dir; the key from `--vault-key-file` or systemd's
    /// credential directory.
    File,
    /// The macOS login keychain.
    MacosKeychain,
    /// The Windows Credential Manager.
    WindowsCredentialManager,
}

impl KeychainChoice {
    /// The name the console's overview shows.
    pub fn as_str(self) -> &'static str {
        match self {
            KeychainChoice::SecretService => "secret-service",
            KeychainChoice::Keyutils => "keyutils",
            KeychainChoice::File => "file",
            KeychainChoice::MacosKeychain => "macos-keychain",
            KeychainChoice::WindowsCredentialManager => "windows-credential-manager",
        }
    }

    /// The person's OS keychain on this platform: the Secret Service on Linux, the login
    /// keychain on macOS, the Credential Manager on Windows.
    pub fn platform_default() -> KeychainChoice {
        match postern_broker::vault::KeychainBackend::platform_default() {
            postern_broker::vault::KeychainBackend::MacosKeychain => KeychainChoice::MacosKeychain,
            postern_broker::vault::KeychainBackend::WindowsCredentialManager => {
                KeychainChoice::WindowsCredentialManager
            }
            _ => KeychainChoice::SecretService,
        }
    }
}

/// `postern daemon` arguments.
#[derive(Debug, Clone)]
pub struct DaemonArgs {
    pub data_dir: PathBuf,
    pub config: PathBuf,
    pub socket: Option<PathBuf>,
    pub keychain: KeychainChoice,
    /// Keychain service name (tests use their own; the product uses "postern").
    pub service: String,
    /// The audit anchor outside the data dir [default: `audit::default_anchor`].
    pub anchor: Option<PathBuf>,
    /// The `file` keychain's key file [default: `$CREDENTIALS_DIRECTORY/postern-vault-key`].
    pub vault_key_file: Option<PathBuf>,
}

/// `postern mcp` arguments.
#[derive(Debug, Clone)]
pub struct BridgeArgs {
    pub socket: PathBuf,
}

/// The data directory when none is given: `$XDG_DATA_HOME/postern`, else
/// `~/.local/share/postern` (the platform's application data location on Linux; see
/// [`postern_broker::platform::default_data_dir`] for macOS and Windows).
pub fn default_data_dir() -> PathBuf {
    postern_broker::platform::default_data_dir()
}

/// The socket a daemon listens on by default: inside a private directory of the data dir
/// (on Windows a named pipe derived from it, [`postern_broker::platform::default_endpoint`]).
pub fn default_socket(data_dir: &Path) -> PathBuf {
    postern_broker::platform::default_endpoint(data_dir)
}

/// Runs the stdio bridge an agent's MCP client launches.
pub async fn run_bridge(args: BridgeArgs) -> Result<(), String> {
    bridge::run(&args.socket).await.map_err(|e| e.to_string())
}
