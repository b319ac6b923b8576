//! One agent session's MCP server: the tools, served over one bridge connection.
//!
//! Who the agent is (SESSION_OPENED, [`postern_broker::provenance`]) is recorded when
//! the bridge opens the MCP session; calls that run invocations wait for that record
//! and are refused if it could not be written.
//!
//! Results are written back through the bridge, which acknowledges each response it has
//! written to the agent's stdout with a `notifications/postern/delivered` notification.
//! Only that acknowledgement records RESULT_DELIVERED; a connection that closes first
//! leaves the result stored with `result_delivery` / `fetch_result`.
//!
//! A result over [`delivery::PIECE_CAP`] goes out as its first piece and a cursor
//! ([`postern_broker::delivery`]); RESULT_DELIVERED waits for the acknowledgement of
//! the answer that carried the last piece.
//!
//! # Where each part is
//! - `mod.rs`: the [`Session`] and its bookkeeping of answers the bridge has not yet
//!   acknowledged, the MCP handler (tool dispatch, the pause, the delivered
//!   notification) and the custom notifications bridge and broker exchange.
//! - `opening`: SESSION_OPENED, recorded once per connection before anything runs.
//! - `calls`: one method per tool (`http_request`, `ssh_exec`, `fetch_result`,
//!   `get_invocation`, `poll_job`, `retry_invocation`, `list_targets`).
//! - `answers`: an outcome made into a tool result (JSON, capped into pieces).
//! - `sessions`: the registry of agent sessions the console lists.

mod answers;
mod calls;
mod opening;
mod sessions;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};

use rmcp::ErrorData as McpError;
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CustomNotification,
    InitializeRequestParams, InitializeResult, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use serde_json::{Value, json};

use postern_broker::AgentApi;
use postern_broker::api::{NotOwned, Owned, Receipt};
use postern_broker::contract::{Code, Outcome, Retry};
use postern_broker::delivery::{self, Piece};
use postern_broker::invocation::CallContext;
use postern_broker::provenance::BridgeReport;

use crate::caller::AgentIdentity;
use crate::tools::{self, NoArgs};
pub use answers::{result_of, ssh_result_of};
use calls::Early;
use opening::Opening;
pub use sessions::{SessionRecord, Sessions};

/// The custom notification a bridge sends after writing a response to the agent.
pub const DELIVERED: &str = "notifications/postern/delivered";
/// The first line a bridge sends: what it reports about the agent that started it
/// ([`postern_broker::provenance::BridgeReport`]). Taken by the daemon's input guard, as
/// the connection's first line only; never handed to the MCP layer.
pub const BRIDGE_REPORT: &str = "notifications/postern/bridge_report";
/// The one line the broker sends on a connection it will not serve (a user past its
/// connection cap), before closing it: nothing from that connection was read or run.
/// Its params say `BROKER_UNAVAILABLE`, `backoff` and why; the bridge answers every
/// request it forwarded with them.
pub const REFUSED: &str = "notifications/postern/refused";

/// The [`REFUSED`] line for `message`.
pub fn refused_line(message: &str) -> Vec<u8> {
    let mut line = serde_json::to_vec(&json!({
        "jsonrpc": "2.0",
        "method": REFUSED,
        "params": {
            "code": Code::BrokerUnavailable,
            "phase": Code::BrokerUnavailable.spec().phase,
            "outcome": Outcome::NotAttempted,
            "retry": Retry::Backoff,
            "message": message,
        },
    }))
    .unwrap_or_default();
    line.push(b'\n');
    line
}

/// One bridge connection, for one agent session, over the agent side's handle on the
/// broker ([`AgentApi`]). Clones share state.
#[derive(Clone)]
pub struct Session {
    agents: AgentApi,
    identity: AgentIdentity,
    /// JSON-RPC request id (as JSON text) → invocation and whether the answer carried
    /// the whole result (or its last piece), until the bridge acknowledges.
    undelivered: Arc<Mutex<HashMap<String, (Receipt, bool)>>>,
    /// Invocations whose answer carried only part of the result and was acknowledged:
    /// delivered once an answer with the last piece is, undelivered if the connection
    /// closes first.
    partial: Arc<Mutex<std::collections::HashSet<Receipt>>>,
    /// Who the agent is, as the journal records it before any invocation runs.
    opening: Arc<Opening>,
    /// What the bridge reported as its connection's first line, if it did.
    report: Arc<OnceLock<BridgeReport>>,
}

impl Session {
    /// A session for `identity`. SESSION_OPENED is recorded when the MCP session opens
    /// ([`Session::start_recording`]); calls that run invocations wait for it.
    pub fn new(agents: AgentApi, identity: AgentIdentity) -> Self {
        Self::reported(agents, identity, Arc::new(OnceLock::new()))
    }

    /// [`Session::new`] for a connection whose bridge report (its first line) is put in
    /// `report` by the input guard before any MCP message is read.
    pub fn reported(
        agents: AgentApi,
        identity: AgentIdentity,
        report: Arc<OnceLock<BridgeReport>>,
    ) -> Self {
        Session {
            agents,
            identity,
            undelivered: Arc::new(Mutex::new(HashMap::new())),
            partial: Arc::new(Mutex::new(std::collections::HashSet::new())),
            opening: Arc::new(Opening {
                started: AtomicBool::new(false),
                task: Mutex::new(None),
                done: tokio::sync::OnceCell::new(),
            }),
            report,
        }
    }

    pub fn identity(&self) -> &AgentIdentity {
        &self.identity
    }

    /// Records every result the bridge never acknowledged as undelivered: the remote
    /// outcome stands, and the agent can read it with `fetch_result`.
    pub fn connection_closed(&self) {
        let mut undelivered: Vec<Receipt> = match self.undelivered.lock() {
            Ok(mut map) => map.drain().map(|(_, (id, _))| id).collect(),
            Err(_) => Vec::new(),
        };
        if let Ok(mut partial) = self.partial.lock() {
            undelivered.extend(partial.drain());
        }
        for id in undelivered {
            // Best effort: a journal that refuses this leaves the result undelivered, which
            // is what `fetch_result` reads anyway.
            let _ = self.agents.delivery_failed(
                &id,
                "The agent's bridge closed before the result reached it.",
            );
        }
    }

    fn owned(&self, invocation_id: &str) -> Result<Owned, McpError> {
        self.agents
            .owned(&self.identity.session, invocation_id)
            .map_err(|NotOwned(id)| {
                McpError::invalid_params(format!("no invocation {id} in this session"), None)
            })
    }

    /// Waits for the bridge's acknowledgement of this answer; `whole` when it carried
    /// the whole result or its last piece.
    fn remember(&self, context: &RequestContext<RoleServer>, receipt: Receipt, whole: bool) {
        if let (Ok(key), Ok(mut map)) =
            (serde_json::to_string(&context.id), self.undelivered.lock())
        {
            map.insert(key, (receipt, whole));
        }
    }

    /// The first piece of `invocation_id`'s stored result, when its `bytes` exceed the
    /// cap and the stored copy can be read piecewise.
    fn first_piece(&self, invocation_id: &str, bytes: u64) -> Option<Piece> {
        if !delivery::needs_pieces(bytes) {
            return None;
        }
        let owned = self
            .agents
            .owned(&self.identity.session, invocation_id)
            .ok()?;
        self.agents.piece(&owned, None, None).ok()
    }

    /// The context an agent's call runs in: its session, the broker's approver, and
    /// the request's cancellation.
    fn call_context(&self, context: &RequestContext<RoleServer>) -> CallContext {
        self.agents
            .context(Some(self.identity.session.clone()), context.ct.clone())
            .with_confinement(self.identity.confinement.clone())
    }
}

/// The tools that run an invocation (and so stop while the operator pauses agents);
/// the others read what the agent's own calls recorded.
fn starts_invocation(tool: &str) -> bool {
    matches!(
        tool,
        tools::HTTP_REQUEST | tools::SSH_EXEC | tools::RETRY_INVOCATION | tools::POLL_JOB
    )
}

/// The refusal while the operator paused agent calls: nothing was accepted, so there is
/// no invocation id.
fn agents_paused() -> CallToolResult {
    CallToolResult::structured_error(json!({
        "invocation_id": null,
        "error": postern_broker::pause::AgentPause::refusal(),
        "outcome": Outcome::NotAttempted,
        "recorded": false,
    }))
}

fn parse<T: serde::de::DeserializeOwned>(request: &CallToolRequestParams) -> Result<T, McpError> {
    let args = Value::Object(request.arguments.clone().unwrap_or_default());
    serde_json::from_value(args)
        .map_err(|e| McpError::invalid_params(format!("{}: {e}", request.name), None))
}

/// Instructions every client receives at initialization.
pub const INSTRUCTIONS: &str = "Postern sends HTTP requests for you with credentials you never \
see, and tells you what its records prove when something fails. Read `outcome` and \
`error.retry`; never resend an `unknown` request yourself.";

/// What every Postern MCP server announces: tools, and the instructions.
pub fn server_info() -> ServerConfig {
    let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
    info.instructions = Some(INSTRUCTIONS.to_string());
    info
}

impl ServerHandler for Session {
    fn get_info(&self) -> ServerConfig {
        server_info()
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    /// The MCP session is open (the client's `notifications/initialized`): who the
    /// agent is gets recorded now, before any call. Not at `initialize`: the bridge's
    /// report follows the initialize request, and is in by the time this arrives.
    async fn on_initialized(&self, _context: NotificationContext<RoleServer>) {
        self.start_recording();
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools::tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if starts_invocation(request.name.as_ref()) && self.agents.agents_paused() {
            return Ok(agents_paused().into());
        }
        let answered = match request.name.as_ref() {
            tools::HTTP_REQUEST => self.http_request(parse(&request)?, &context).await,
            tools::SSH_EXEC => self.ssh_exec(parse(&request)?, &context).await,
            tools::FETCH_RESULT => self.fetch_result(parse(&request)?, &context),
            tools::GET_INVOCATION => self.get_invocation(parse(&request)?),
            tools::RETRY_INVOCATION => self.retry_invocation(parse(&request)?, &context).await,
            tools::POLL_JOB => self.poll_job(parse(&request)?, &context).await,
            tools::LIST_TARGETS => {
                let _: NoArgs = parse(&request)?;
                Ok(self.list_targets().await)
            }
            other => {
                return Err(McpError::invalid_params(
                    format!("unknown tool {other}"),
                    None,
                ));
            }
        };
        match answered {
            Ok(result) | Err(Early::Answer(result)) => Ok(result.into()),
            Err(Early::Error(e)) => Err(e),
        }
    }

    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleServer>,
    ) {
        if notification.method != DELIVERED {
            return;
        }
        let Some(id) = notification.params.as_ref().and_then(|p| p.get("id")) else {
            return;
        };
        let key = id.to_string();
        let acknowledged = self
            .undelivered
            .lock()
            .ok()
            .and_then(|mut map| map.remove(&key));
        match acknowledged {
            Some((receipt, true)) => {
                if let Ok(mut partial) = self.partial.lock() {
                    partial.remove(&receipt);
                }
                let _ = self.agents.delivered(&receipt);
            }
            Some((receipt, false)) => {
                if let Ok(mut partial) = self.partial.lock() {
                    partial.insert(receipt);
                }
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caller::{AgentIdentity, process_info};
    use postern_broker::audit::AUDIT_KEY_ID;
    use postern_broker::provenance;
    use postern_broker::vault::KeychainBackend;
    use postern_broker::{Broker, BrokerOptions, OperatorApi};

    fn secret_service_enabled() -> bool {
        if std::env::var_os("POSTERN_TEST_SKIP_SECRET_SERVICE").is_some_and(|v| v == "1") {
            eprintln!("skipped: POSTERN_TEST_SKIP_SECRET_SERVICE=1");
            return false;
        }
        true
    }

    /// A broker over a fresh data dir and a keychain service no user has.
    fn broker(dir: &std::path::Path) -> OperatorApi {
        std::fs::write(dir.join("postern.toml"), "").unwrap();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let opened = Broker::open(BrokerOptions {
            data_dir: dir.to_path_buf(),
            config: dir.join("postern.toml"),
            keychain: KeychainBackend::SecretService,
            service: format!("postern-test-{}-{nanos}", std::process::id()),
            approver: None,
            anchor: None,
            vault_key: None,
        })
        .unwrap();
        opened.operator
    }

    /// This test process, as the agent behind a bridge.
    fn this_agent() -> AgentIdentity {
        let agent = process_info(std::process::id()).unwrap();
        AgentIdentity {
            session: format!("sess_u0_{}_{}", agent.pid, agent.start_time),
            bridge_pid: agent.pid,
            parent_chain: process_info(agent.ppid).into_iter().collect(),
            agent,
            confinement: Default::default(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_is_recorded_once_per_connection_before_it_runs_anything() {
        if !secret_service_enabled() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let broker = broker(dir.path());
        let identity = this_agent();
        let session = Session::new(broker.agent(), identity.clone());
        let clone = session.clone();
        let (a, b) = tokio::join!(session.opened(), clone.opened());
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a, b, "one record per connection, whoever waits for it");
        let recorded = provenance::recorded_session_in(broker.journal(), &identity.session)
            .unwrap()
            .unwrap();
        assert_eq!(recorded.seq, a);
        assert_eq!(recorded.opened.agent.pid, std::process::id());
        assert_eq!(recorded.opened.transport.bridge_pid, identity.bridge_pid);
        let _ = broker.vault().remove(AUDIT_KEY_ID);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_whose_record_cannot_be_written_runs_nothing() {
        if !secret_service_enabled() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let broker = broker(dir.path());
        let _ = broker.vault().remove(AUDIT_KEY_ID);
        // The journal's writer is gone: SESSION_OPENED cannot be written.
        broker.journal().clone().close().unwrap();
        let session = Session::new(broker.agent(), this_agent());
        let refusal = session.opened().await.unwrap_err();
        assert_eq!(refusal.is_error, Some(true));
        let value = refusal.structured_content.unwrap();
        assert_eq!(value["error"]["code"], "BROKER_UNAVAILABLE");
        assert_eq!(value["error"]["outcome"], "not_attempted");
        assert_eq!(value["error"]["retry"], "backoff");
        assert!(value["invocation_id"].is_null());
        assert_eq!(value["recorded"], false);
        // Asked again, the answer is the same refusal.
        assert!(session.opened().await.is_err());
    }
}
