//! `postern daemon`: the headless broker with both of its sockets. The agent socket
//! serves MCP; the operator socket serves the console's commands ([`crate::operator`]),
//! with an approvals queue so per-call approvals can be answered from it. With
//! `--peer-listen`, a third listener serves federated peer brokers
//! ([`postern_mcp::peering`]); their per-call approvals land in the same queue.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use postern_broker::approvals::{Approvals, Approver};
use postern_broker::clock::SystemClock;
use postern_broker::sealed_store::load_key;
use postern_broker::vault::KeychainBackend;
use postern_broker::{Broker, BrokerOptions, OperatorApi};
use postern_mcp::daemon::{
    self, AgentAccess, DaemonError, bind_with_mode, check_socket_path, file_identity,
};
use postern_mcp::peering::{self, PeeringError, Reach};
use postern_mcp::server::Sessions;
use postern_mcp::{DaemonArgs, KeychainChoice, default_socket};

use crate::console::{Console, Mode, Paths};
use crate::operator::{
    OperatorError, OperatorServer, bind_operator, default_operator_socket, lookup_group,
    serve_operator,
};

/// What a targets file made on first run says.
pub const EMPTY_CONFIG: &str = "\
# Postern targets. Add one from the console's Targets screen or by editing this file;
# `postern config check FILE` validates it. See examples/postern.toml in the source.
";

/// The default targets file of `data_dir` (`DATA_DIR/postern.toml`), made empty (with
/// the data dir, owner-only) when missing: what the console and `postern daemon` without
/// `--config` start with.
pub fn default_config(data_dir: &std::path::Path) -> std::io::Result<PathBuf> {
    let config = data_dir.join("postern.toml");
    if !config.exists() {
        postern_broker::platform::owner_only_dir(std::fs::DirBuilder::new().recursive(true))
            .create(data_dir)?;
        std::fs::write(&config, EMPTY_CONFIG)?;
    }
    Ok(config)
}

/// Everything `postern daemon` is told.
#[derive(Debug, Clone)]
pub struct HeadlessArgs {
    pub daemon: DaemonArgs,
    /// The operator socket [default: `operator.sock` beside the agent socket].
    pub operator_socket: Option<PathBuf>,
    /// Members of this group may operate the broker (socket 0660, this group).
    pub operator_group: Option<String>,
    /// Who may open MCP sessions on the agent socket.
    pub agent_access: AgentAccess,
    /// How long a request waits for an operator's answer.
    pub approval_timeout: Duration,
    /// Serve federated peers on this address (loopback only unless `Reach::Any`).
    pub peer_listen: Option<(SocketAddr, Reach)>,
}

/// Why the headless broker could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum HeadlessError {
    #[error("{0}")]
    Daemon(#[from] DaemonError),
    #[error("{0}")]
    Operator(#[from] OperatorError),
    #[error("the operator socket must not be the agent socket ({0})")]
    SameSocket(String),
    #[error("{0}")]
    Peering(#[from] PeeringError),
}

/// Runs until SIGINT or SIGTERM (on Windows: Ctrl-C, Ctrl-Break, the console closing or
/// the system shutting down).
pub async fn run(args: HeadlessArgs) -> Result<(), HeadlessError> {
    // Before any secret is read: no same-user process may read this one's memory.
    if let Err(e) = postern_broker::platform::harden_process() {
        eprintln!("postern: warning: this process could not be made non-dumpable ({e})");
    }
    let socket = args
        .daemon
        .socket
        .clone()
        .unwrap_or_else(|| default_socket(&args.daemon.data_dir));
    let operator_socket = args
        .operator_socket
        .clone()
        .unwrap_or_else(|| default_operator_socket(&socket));
    if operator_socket == socket {
        return Err(HeadlessError::SameSocket(socket.display().to_string()));
    }
    // Nothing is created (data dir, keychain entry, journal) before both socket paths
    // and the group are known to be usable.
    check_socket_path(&socket)?;
    check_socket_path(&operator_socket)?;
    if let Some(limit) = postern_broker::platform::raise_descriptor_limit() {
        eprintln!("postern: up to {limit} open descriptors");
    }
    let group = args
        .operator_group
        .as_deref()
        .map(lookup_group)
        .transpose()?;
    let peer_listener = match args.peer_listen {
        Some((addr, reach)) => Some((peering::bind(addr, reach).await?, reach)),
        None => None,
    };
    let approvals = Arc::new(Approvals::new(
        args.approval_timeout.max(Duration::from_secs(1)),
        Arc::new(SystemClock),
    ));
    let engine = open_broker(&args.daemon, Some(approvals.clone()))?;
    let agent_mode = match args.agent_access {
        AgentAccess::OwnUser => 0o600,
        AgentAccess::AnyLocalUser => 0o666,
    };
    let listener = bind_with_mode(&socket, agent_mode).await?;
    let operator_listener = bind_operator(&operator_socket, group.as_ref()).await?;
    // Shields are for agents of this user on this machine: a privilege-separated broker
    // runs as another user and cannot inspect their sandboxes.
    #[cfg(unix)]
    let shields = match args.agent_access {
        AgentAccess::OwnUser => {
            let control = daemon::shield::control_socket(&socket);
            Some((daemon::shield::bind_control(&socket).await?, control))
        }
        AgentAccess::AnyLocalUser => None,
    };
    let bound = (file_identity(&socket), file_identity(&operator_socket));
    let sessions = Arc::new(Sessions::default());
    let mode = if group.is_some() || args.agent_access == AgentAccess::AnyLocalUser {
        Mode::PrivilegeSeparated
    } else {
        Mode::SingleUser
    };
    let console = Arc::new(
        Console::new(
            engine.clone(),
            sessions.clone(),
            approvals,
            Paths {
                data_dir: args.daemon.data_dir.clone(),
                config: args.daemon.config.clone(),
                socket: socket.clone(),
                keychain: args.daemon.keychain.as_str().to_string(),
            },
        )
        .with_mode(mode),
    );
    let server = Arc::new(OperatorServer::new(console, group.clone())?);
    eprintln!("postern: broker listening on {}", socket.display());
    eprintln!(
        "postern: operator socket on {} ({})",
        operator_socket.display(),
        match &group {
            Some(g) => format!("this user, root and group {}", g.name),
            None => "this user and root only".to_string(),
        }
    );
    let terminate =
        postern_broker::platform::termination().map_err(|source| DaemonError::Socket {
            path: socket.display().to_string(),
            source,
        })?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let operator = tokio::spawn(serve_operator(
        server,
        operator_listener,
        stopped(stop_rx.clone()),
    ));
    let witnessing = tokio::spawn(engine.witnessing().clone().run());
    let peers = match peer_listener {
        Some((listener, reach)) => {
            if let Ok(addr) = listener.local_addr() {
                eprintln!("postern: peering on http://{addr}{}", peering::PATH);
            }
            // Refusals go to the daemon's log (see federation::serve for why not the
            // journal).
            let service =
                Arc::new(engine.peer_service(Arc::new(|line: &str| eprintln!("postern: {line}"))));
            Some(tokio::spawn(peering::serve(
                service,
                listener,
                reach,
                stopped(stop_rx.clone()),
            )))
        }
        None => None,
    };
    #[cfg(unix)]
    let shielding = shields.map(|(listener, control)| {
        let identity = file_identity(&control);
        let setup =
            daemon::shield::ShieldSetup::for_daemon(&args.daemon, &socket, Some(&operator_socket));
        let task = tokio::spawn(daemon::shield::serve_control(
            engine.agent(),
            sessions.clone(),
            setup,
            listener,
            stopped(stop_rx.clone()),
        ));
        (task, control, identity)
    });
    let agents = tokio::spawn(daemon::serve_with(
        engine.agent(),
        sessions,
        listener,
        stopped(stop_rx),
        args.agent_access,
    ));
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = terminate => {},
    }
    let _ = stop_tx.send(true);
    let _ = operator.await;
    let _ = agents.await;
    if let Some(peers) = peers {
        let _ = peers.await;
    }
    #[cfg(unix)]
    if let Some((task, control, identity)) = shielding {
        let _ = task.await;
        if identity.is_some() && file_identity(&control) == identity {
            let _ = std::fs::remove_file(&control);
        }
    }
    witnessing.abort();
    // Remove each socket only if it is still the one this daemon bound.
    for (path, identity) in [(&socket, bound.0), (&operator_socket, bound.1)] {
        if identity.is_some() && file_identity(path) == identity {
            let _ = std::fs::remove_file(path);
        }
    }
    // Clean shutdown signs a final audit checkpoint.
    engine
        .journal()
        .clone()
        .close()
        .map_err(DaemonError::from)?;
    Ok(())
}

/// Opens the broker a daemon serves: checks the data dir ([`prepare_data_dir`]), loads
/// the `file` keychain's key when that is the keychain, opens the engine with `approver`
/// attached (the desktop app's console, or the headless daemon's queue answered over its
/// operator socket), and prints what the operator should know as `postern: warning: …`.
pub fn open_broker(
    args: &DaemonArgs,
    approver: Option<Arc<dyn Approver>>,
) -> Result<OperatorApi, DaemonError> {
    daemon::prepare_data_dir(&args.data_dir)?;
    let vault_key = match args.keychain {
        KeychainChoice::File => Some(load_key(args.vault_key_file.as_deref())?),
        KeychainChoice::SecretService
        | KeychainChoice::Keyutils
        | KeychainChoice::MacosKeychain
        | KeychainChoice::WindowsCredentialManager => None,
    };
    let opened = Broker::open(BrokerOptions {
        data_dir: args.data_dir.clone(),
        config: args.config.clone(),
        keychain: match args.keychain {
            KeychainChoice::SecretService => KeychainBackend::SecretService,
            KeychainChoice::Keyutils => KeychainBackend::Keyutils,
            KeychainChoice::File => KeychainBackend::File,
            KeychainChoice::MacosKeychain => KeychainBackend::MacosKeychain,
            KeychainChoice::WindowsCredentialManager => KeychainBackend::WindowsCredentialManager,
        },
        service: args.service.clone(),
        approver,
        anchor: args
            .anchor
            .clone()
            .or_else(|| postern_broker::audit::default_anchor(&args.data_dir)),
        vault_key,
    })?;
    // Said loudly: earlier checkpoints verify only against the key that signed them, and
    // a target without a pinned host key waits for an operator's approval.
    for warning in &opened.warnings {
        eprintln!("postern: warning: {warning}");
    }
    Ok(opened.operator)
}
