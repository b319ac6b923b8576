//! The headless broker: opens the journal (audit key from the keychain), recovers what a
//! crash interrupted, and serves MCP sessions on a local socket that only its own user
//! can reach.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use rmcp::ServiceExt;
use tokio::net::{UnixListener, UnixStream};

use postern_broker::audit::signing_key_from_vault;
use postern_broker::channel::http::HttpChannel;
use postern_broker::channel::ssh::SshChannel;
use postern_broker::channel::{ConfigHandle, Credentials};
use postern_broker::clock::{Clock, SystemClock};
use postern_broker::config::Config;
use postern_broker::journal::{Journal, JournalOptions};
use postern_broker::vault::{Keychain, KeychainBackend, Vault};

use crate::peer::{identify_agent, own_uid, peer_allowed};
use crate::server::{Broker, Session};
use crate::{DaemonArgs, KeychainChoice, default_socket};

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
    #[error("socket {path}: {source}")]
    Socket {
        path: String,
        source: std::io::Error,
    },
    #[error("another broker is already listening on {0}")]
    AlreadyRunning(String),
}

fn keychain(args: &DaemonArgs) -> Result<Keychain, postern_broker::vault::VaultError> {
    let backend = match args.keychain {
        KeychainChoice::SecretService => KeychainBackend::SecretService,
        KeychainChoice::Keyutils => KeychainBackend::Keyutils,
    };
    Keychain::new(backend, args.service.clone())
}

fn private_dir(path: &Path) -> Result<(), DaemonError> {
    let err = |source| DaemonError::Socket {
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).map_err(err)
}

/// Opens the broker the headless daemon serves (no approval console attached).
pub fn open_broker(args: &DaemonArgs) -> Result<Arc<Broker>, DaemonError> {
    open_broker_with(args, None)
}

/// Opens the broker with an approval console attached (the desktop app).
pub fn open_broker_with(
    args: &DaemonArgs,
    approver: Option<Arc<dyn postern_broker::channel::Approver>>,
) -> Result<Arc<Broker>, DaemonError> {
    private_dir(&args.data_dir)?;
    let db = args.data_dir.join("journal.db");
    let clock = Arc::new(SystemClock);
    let signing_key = signing_key_from_vault(&Vault::new(keychain(args)?), &db, clock.now_ms())?;
    if let Some(previous) = postern_broker::audit::last_checkpoint_key(&db)
        && previous != signing_key.verifying_key().to_bytes()
    {
        // Say it loudly: earlier checkpoints verify only against the key that signed them.
        eprintln!(
            "postern: warning: the audit signing key in the keychain is not the key that signed \
             this journal's earlier checkpoints (the keychain lost it); `postern audit verify` \
             will report those checkpoints as not signed by the current key"
        );
    }
    let journal = Journal::open(
        &db,
        JournalOptions {
            clock,
            signing_key,
            checkpoint_every: postern_broker::journal::DEFAULT_CHECKPOINT_EVERY,
        },
    )?;
    // What a crash interrupted is closed with what its evidence proves.
    journal.recover_interrupted()?;
    let credentials = Arc::new(Credentials::open(Vault::new(keychain(args)?), &db)?);
    let config = ConfigHandle::new(Config::load(&args.config)?);
    let channel = HttpChannel::new(journal.clone(), credentials.clone(), config.clone());
    let ssh = SshChannel::new(journal.clone(), credentials.clone(), config.clone());
    Ok(Arc::new(Broker {
        channel,
        ssh,
        journal,
        config,
        approver,
        sessions: Default::default(),
        credentials,
    }))
}

/// Binds the socket in a directory only this user can enter, mode 0600.
pub async fn bind(socket: &Path) -> Result<UnixListener, DaemonError> {
    let err = |source| DaemonError::Socket {
        path: socket.display().to_string(),
        source,
    };
    if let Some(dir) = socket.parent() {
        private_dir(dir)?;
    }
    if socket.exists() {
        // A live broker answers; a stale socket from a crash does not.
        if UnixStream::connect(socket).await.is_ok() {
            return Err(DaemonError::AlreadyRunning(socket.display().to_string()));
        }
        std::fs::remove_file(socket).map_err(err)?;
    }
    let listener = UnixListener::bind(socket).map_err(err)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    Ok(listener)
}

/// Serves one connection: checks the peer's uid, identifies the agent behind the bridge,
/// and runs an MCP session until the bridge goes away.
pub async fn serve_connection(broker: Arc<Broker>, stream: UnixStream) {
    let Ok(cred) = stream.peer_cred() else { return };
    let Some(me) = own_uid() else { return };
    if !peer_allowed(cred.uid(), me) {
        // Another user: refuse without a word.
        return;
    }
    let identity = cred
        .pid()
        .and_then(|pid| u32::try_from(pid).ok())
        .and_then(identify_agent);
    let Some(identity) = identity else { return };
    broker
        .sessions
        .connected(&identity, broker.journal.now_ms());
    let session = Session::new(broker.clone(), identity.clone());
    let undelivered = session.clone();
    // A bridge that fails the MCP handshake simply ends its connection.
    if let Ok(running) = session.serve(stream).await {
        let _ = running.waiting().await;
    }
    undelivered.connection_closed();
    broker
        .sessions
        .disconnected(&identity, broker.journal.now_ms());
}

/// Accepts agent connections on `listener` and sweeps ended sessions, until `stop`
/// completes.
pub async fn serve(
    broker: Arc<Broker>,
    listener: UnixListener,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut sweep = tokio::time::interval(std::time::Duration::from_secs(5));
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    tokio::spawn(serve_connection(broker.clone(), stream));
                }
            }
            _ = sweep.tick() => broker.sessions.sweep(broker.journal.now_ms()),
            () = &mut stop => break,
        }
    }
}

/// Runs until SIGINT/SIGTERM.
pub async fn run(args: DaemonArgs) -> Result<(), DaemonError> {
    let broker = open_broker(&args)?;
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(|| default_socket(&args.data_dir));
    let listener = bind(&socket).await?;
    eprintln!("postern: broker listening on {}", socket.display());
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| DaemonError::Socket {
        path: socket.display().to_string(),
        source,
    })?;
    let stop = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = terminate.recv() => {},
        }
    };
    serve(broker.clone(), listener, stop).await;
    let _ = std::fs::remove_file(&socket);
    // Clean shutdown signs a final audit checkpoint.
    broker.journal.clone().close()?;
    Ok(())
}
