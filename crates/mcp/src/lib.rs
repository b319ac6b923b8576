//! Postern's agent-facing side (being written).

use std::path::{Path, PathBuf};

/// Which keychain the broker reads credentials from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeychainChoice {
    SecretService,
    Keyutils,
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
}

/// `postern mcp` arguments.
#[derive(Debug, Clone)]
pub struct BridgeArgs {
    pub socket: PathBuf,
}

/// The socket a daemon listens on by default: inside a private directory of the data dir.
pub fn default_socket(data_dir: &Path) -> PathBuf {
    data_dir.join("run").join("postern.sock")
}

/// Runs the headless broker until interrupted.
pub async fn run_daemon(_args: DaemonArgs) -> Result<(), String> {
    Err("not yet".into())
}

/// Runs the stdio bridge an agent's MCP client launches.
pub async fn run_bridge(_args: BridgeArgs) -> Result<(), String> {
    Err("not yet".into())
}
