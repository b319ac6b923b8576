//! The headless broker's agent socket: serves MCP sessions, over the agent side's handle
//! ([`postern_broker::AgentApi`]), on a local socket that only its own user can reach (or
//! the users a privilege-separated install admits). The broker itself is opened by the
//! operator side (the console crate's `headless::open_broker`), which hands this module
//! its `AgentApi`. Where the socket and the data dir may go, and whom a path trusts:
//! [`socket_path`].

mod error;
#[cfg(unix)]
pub mod shield;
pub mod socket_path;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rmcp::ErrorData as McpError;
use rmcp::model::{ClientNotification, ClientRequest, ServerConfig, ServerResult};
use rmcp::service::{NotificationContext, RequestContext, RoleServer, Service, ServiceExt};
use tokio::io::AsyncWriteExt;

use postern_broker::AgentApi;
use postern_broker::platform::{self, Accepted, Listener};
use postern_broker::record::session::Confinement;
use tokio::sync::OwnedSemaphorePermit;

use crate::admission::Admission;

use crate::caller::{caller_allowed, identify_agent};
use crate::input::{Acks, GuardedInput};
use crate::server::{DELIVERED, Session, Sessions};

pub use error::{DaemonError, Found};
pub use socket_path::{bind, bind_with_mode, check_socket_path, prepare_data_dir};

/// How long a closing connection waits for its last acknowledgements to be recorded.
const ACK_GRACE: Duration = Duration::from_secs(2);

/// A session that counts the delivery acknowledgements it has handled. The MCP layer
/// runs each notification in a task of its own, so the last acknowledgement of a
/// connection can still be waiting to run when the connection's end is seen; without
/// the count, `connection_closed` would record that result as undelivered.
struct Counted {
    session: Session,
    acks: Arc<Acks>,
}

impl Service<RoleServer> for Counted {
    fn handle_request(
        &self,
        request: ClientRequest,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ServerResult, McpError>> + Send + '_ {
        Service::handle_request(&self.session, request, context)
    }

    async fn handle_notification(
        &self,
        notification: ClientNotification,
        context: NotificationContext<RoleServer>,
    ) -> Result<(), McpError> {
        let ack = matches!(&notification,
            ClientNotification::CustomNotification(n) if n.method == DELIVERED);
        let result = Service::handle_notification(&self.session, notification, context).await;
        if ack {
            self.acks.handled.fetch_add(1, Ordering::SeqCst);
            self.acks.changed.notify_waiters();
        }
        result
    }

    fn get_info(&self) -> ServerConfig {
        Service::get_info(&self.session)
    }

    fn supported_protocol_versions(
        &self,
    ) -> std::borrow::Cow<'static, [rmcp::model::ProtocolVersion]> {
        Service::supported_protocol_versions(&self.session)
    }
}

/// Which users may open MCP sessions on the agent socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AgentAccess {
    /// Only the broker's own uid (single-user mode: the broker runs as the person).
    #[default]
    OwnUser,
    /// Any local user: the broker runs as its own system user and the people whose
    /// agents use it are other uids. They get MCP only; the operator side is another
    /// socket.
    AnyLocalUser,
}

/// Serves one connection: checks the peer's uid, identifies the agent behind the bridge,
/// records it in `sessions`, and runs an MCP session until the bridge goes away.
pub async fn serve_connection(agents: AgentApi, sessions: Arc<Sessions>, stream: Accepted) {
    let admission = Admission::new(1, 1);
    if let Some(slot) = admission.slot().await {
        serve_connection_with(
            agents,
            sessions,
            stream,
            AgentAccess::OwnUser,
            &admission,
            slot,
            None,
        )
        .await;
    }
}

/// [`serve_connection`] admitting the peers `access` names and, on a shield's socket,
/// only processes inside that shield's sandbox (`gate`), whose sessions are recorded as
/// confined.
async fn serve_connection_with(
    agents: AgentApi,
    sessions: Arc<Sessions>,
    stream: Accepted,
    access: AgentAccess,
    admission: &Arc<Admission>,
    slot: OwnedSemaphorePermit,
    gate: Option<Arc<Gate>>,
) {
    let Ok(cred) = platform::peer_of(&stream) else {
        return;
    };
    // A user past its own cap is told so in one line and closed (see
    // [`crate::admission`]); nothing from the connection is read.
    let Some(_admitted) = admission.admit(slot, &cred.user) else {
        let mut stream = stream;
        let line = crate::server::refused_line(&format!(
            "This user already holds {} connections to the broker; nothing from this \
             connection was read or run. Close idle sessions or retry later.",
            crate::admission::MAX_PER_USER
        ));
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            stream.write_all(&line).await?;
            stream.shutdown().await
        })
        .await;
        return;
    };
    let Ok(me) = platform::current_user() else {
        return;
    };
    if access == AgentAccess::OwnUser && !caller_allowed(&cred.user, &me) {
        // Another user: refuse without a word.
        return;
    }
    let Some(mut identity) = cred.pid.and_then(|pid| identify_agent(pid, &cred.user)) else {
        return;
    };
    if let Some(gate) = &gate {
        // A shield's socket admits only its sandbox: the bridge and the agent must both
        // be inside it (the kernel's pid for the bridge, /proc for the agent).
        match gate.admit(&identity) {
            Some(confinement) => identity.confinement = confinement,
            None => return,
        }
    }
    sessions.connected(&identity, agents.now_ms());
    let report = Arc::new(std::sync::OnceLock::new());
    let session = Session::reported(agents.clone(), identity.clone(), report.clone());
    let undelivered = session.clone();
    let acks = Arc::new(Acks::default());
    let (read, write) = platform::split(stream);
    let input = GuardedInput::new(read, acks.clone()).taking_report(report);
    let counted = Counted {
        session,
        acks: acks.clone(),
    };
    // A bridge that fails the MCP handshake simply ends its connection.
    if let Ok(running) = counted.serve((input, write)).await {
        let _ = running.waiting().await;
        // The bridge's last acknowledgements are recorded before anything is called
        // undelivered.
        acks.settled(ACK_GRACE).await;
    }
    undelivered.connection_closed();
    sessions.disconnected(&identity, agents.now_ms());
}

/// Accepts agent connections on `listener`, recording their sessions in `sessions`, and
/// sweeps ended sessions, until `stop` completes.
pub async fn serve(
    agents: AgentApi,
    sessions: Arc<Sessions>,
    listener: Listener,
    stop: impl std::future::Future<Output = ()>,
) {
    serve_with(agents, sessions, listener, stop, AgentAccess::OwnUser).await;
}

/// [`serve`] admitting the peers `access` names.
pub async fn serve_with(
    agents: AgentApi,
    sessions: Arc<Sessions>,
    listener: Listener,
    stop: impl std::future::Future<Output = ()>,
    access: AgentAccess,
) {
    serve_gated(agents, sessions, listener, stop, access, None).await;
}

/// Who a shield's socket admits and what their sessions are recorded as: the sandbox
/// the broker inspected, once the shield has registered it (see [`shield`]). Before
/// then it admits nobody.
pub trait Admits: Send + Sync {
    /// The confinement of `identity`'s session, or `None` to refuse the connection.
    fn admit(&self, identity: &crate::caller::AgentIdentity) -> Option<Confinement>;
}

type Gate = dyn Admits;

/// [`serve_with`] where `gate`, when given, decides which connections are admitted.
async fn serve_gated(
    agents: AgentApi,
    sessions: Arc<Sessions>,
    mut listener: Listener,
    stop: impl std::future::Future<Output = ()>,
    access: AgentAccess,
    gate: Option<Arc<Gate>>,
) {
    let admission = Admission::for_descriptors(platform::raise_descriptor_limit());
    let mut sweep = tokio::time::interval(std::time::Duration::from_secs(5));
    tokio::pin!(stop);
    loop {
        // While every slot is taken nothing is accepted: new connections wait in the
        // backlog, and past it are refused (BROKER_UNAVAILABLE at the bridge).
        let slot = tokio::select! {
            slot = admission.slot() => slot,
            _ = sweep.tick() => {
                sessions.sweep(agents.now_ms());
                continue;
            }
            () = &mut stop => break,
        };
        let Some(slot) = slot else { break };
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok(stream) = accepted {
                    let (agents, sessions, admission, gate) =
                        (agents.clone(), sessions.clone(), admission.clone(), gate.clone());
                    tokio::spawn(async move {
                        serve_connection_with(
                            agents, sessions, stream, access, &admission, slot, gate,
                        )
                        .await;
                    });
                }
            }
            _ = sweep.tick() => sessions.sweep(agents.now_ms()),
            () = &mut stop => break,
        }
    }
}

/// The file identity (device, inode) at `path`, without following a symlink; `None` on
/// Windows, whose pipes leave no file behind.
pub fn file_identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .and_then(|m| platform::file_identity(&m))
}

// Unix socket paths: directories, modes, owners.
