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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use base64::Engine;
use rmcp::ErrorData as McpError;
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CustomNotification,
    InitializeRequestParams, InitializeResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ServerCapabilities, ServerConfig,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use serde_json::{Value, json};

use postern_broker::AgentApi;
use postern_broker::api::{NotOwned, Owned, Receipt};
use postern_broker::channel::http::{HttpOutcome, HttpRequest, HttpResponse};
use postern_broker::channel::peer;
use postern_broker::channel::ssh::{SshOutcome, SshRequest, SshResult};
use postern_broker::contract::{Code, ErrorBody, Outcome, Phase, Retry};
use postern_broker::delivery::{self, DeliveryError, Piece};
use postern_broker::evidence;
use postern_broker::invocation::CallContext;
use postern_broker::journal::events::{Channel, Relation};
use postern_broker::operations::PollRefused;
use postern_broker::provenance::{BridgeReport, SessionOpened};

use crate::caller::AgentIdentity;
use crate::tools::{self, FetchResultArgs, HttpRequestArgs, InvocationArgs, NoArgs, SshExecArgs};

/// The progress notifications of one call, if it asked for them; stopped by `abort`.
struct Ticker(Option<tokio::task::JoinHandle<()>>);

impl Ticker {
    fn abort(self) {
        if let Some(task) = self.0 {
            task.abort();
        }
    }
}

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

/// One agent session as the broker knows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SessionRecord {
    pub identity: AgentIdentity,
    pub first_seen_ms: i64,
    /// Open bridge connections from this agent.
    pub connections: u32,
    /// Set once the agent process (same pid and start time) is gone.
    pub ended_at_ms: Option<i64>,
}

/// Agent sessions, keyed by agent pid and start time. A session ends when that process
/// exits; a recycled pid has a different start time and so a different session. One
/// registry per broker, held beside it by whoever serves the socket (the daemon, the
/// desktop console).
#[derive(Default)]
pub struct Sessions(Mutex<HashMap<String, SessionRecord>>);

impl Sessions {
    pub fn connected(&self, identity: &AgentIdentity, now_ms: i64) {
        if let Ok(mut map) = self.0.lock() {
            let record = map
                .entry(identity.session.clone())
                .or_insert_with(|| SessionRecord {
                    identity: identity.clone(),
                    first_seen_ms: now_ms,
                    connections: 0,
                    ended_at_ms: None,
                });
            record.connections += 1;
            record.ended_at_ms = None;
        }
    }

    /// A bridge went away; the session ends if its agent process is gone too.
    pub fn disconnected(&self, identity: &AgentIdentity, now_ms: i64) {
        if let Ok(mut map) = self.0.lock()
            && let Some(record) = map.get_mut(&identity.session)
        {
            record.connections = record.connections.saturating_sub(1);
            if !crate::caller::session_alive(identity) {
                record.ended_at_ms = Some(now_ms);
            }
        }
    }

    /// Marks sessions whose agent process exited as ended.
    pub fn sweep(&self, now_ms: i64) {
        if let Ok(mut map) = self.0.lock() {
            for record in map.values_mut() {
                if record.ended_at_ms.is_none() && !crate::caller::session_alive(&record.identity) {
                    record.ended_at_ms = Some(now_ms);
                }
            }
        }
    }

    pub fn list(&self) -> Vec<SessionRecord> {
        self.0
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// The SESSION_OPENED record of one connection: read from /proc and written when the
/// agent's MCP session opens (its `notifications/initialized`), or by the first call
/// that needs it, whichever comes first; awaited by every call that would run an invocation.
/// A bare connection that never speaks MCP (a liveness probe) records nothing.
struct Opening {
    /// Set once the recording has been started, so it runs once per connection.
    started: AtomicBool,
    task: Mutex<Option<tokio::task::JoinHandle<Result<u64, String>>>>,
    /// The record's sequence number, or why it could not be written.
    done: tokio::sync::OnceCell<Result<u64, String>>,
}

/// Reads the agent behind `identity` from /proc (hashing its executable) and appends
/// SESSION_OPENED, durably.
fn record_opening(
    agents: &AgentApi,
    identity: &AgentIdentity,
    report: Option<BridgeReport>,
) -> Result<u64, String> {
    let ancestors: Vec<u32> = identity.parent_chain.iter().map(|p| p.pid).collect();
    let opened = SessionOpened::observe(
        &identity.session,
        identity.agent.pid,
        identity.agent.start_time,
        &ancestors,
        identity.bridge_pid,
        report,
    )
    .map_err(|e| e.to_string())?;
    agents.record_session(opened).map_err(|e| e.to_string())
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

    /// Starts reading the agent from /proc (hashing its executable off the async
    /// threads) and appending SESSION_OPENED. Runs once per connection.
    pub fn start_recording(&self) {
        // Held while the task is started and stored: a call waiting in `opened` (the
        // `initialized` notification and the first call run concurrently) finds it.
        let slot = self.opening.task.lock();
        if self.opening.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let (agents, identity) = (self.agents.clone(), self.identity.clone());
        let report = self.report.get().cloned();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let task =
                    runtime.spawn_blocking(move || record_opening(&agents, &identity, report));
                if let Ok(mut slot) = slot {
                    *slot = Some(task);
                }
            }
            Err(_) => {
                let _ = self
                    .opening
                    .done
                    .set(record_opening(&agents, &identity, report));
            }
        }
    }

    /// Waits until this connection's SESSION_OPENED is on disk (starting the recording
    /// if the session has not). Its sequence number, or the refusal the agent gets
    /// instead of running anything unrecorded.
    pub async fn opened(&self) -> Result<u64, CallToolResult> {
        self.start_recording();
        let done = self
            .opening
            .done
            .get_or_init(|| async {
                let task = self.opening.task.lock().ok().and_then(|mut t| t.take());
                match task {
                    Some(task) => task
                        .await
                        .unwrap_or_else(|e| Err(format!("the recording task failed: {e}"))),
                    None => Err("the session was never recorded".to_string()),
                }
            })
            .await;
        done.clone().map_err(|reason| session_unrecorded(&reason))
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

    /// An `http_request` (or retry) answer, capped, and whether it carried the whole result.
    /// The context an agent's call runs in: its session, the broker's approver, and
    /// the request's cancellation.
    fn call_context(&self, context: &RequestContext<RoleServer>) -> CallContext {
        self.agents
            .context(Some(self.identity.session.clone()), context.ct.clone())
    }

    fn http_answer(&self, outcome: &HttpOutcome) -> (CallToolResult, bool) {
        let bytes = outcome.result.as_ref().map_or(0, |r| r.body.len() as u64);
        let mut answer = http_value(outcome);
        // A 202 queued a job: say which invocation tracks it, for poll_job. (Only then is
        // the journal asked: every other answer skips the lookup.)
        let accepted = outcome.result.as_ref().is_some_and(|r| r.status == 202);
        if let Some(job) = accepted
            .then(|| {
                let owned = self
                    .agents
                    .owned(&self.identity.session, &outcome.invocation_id);
                owned.ok().and_then(|o| self.agents.children(&o).ok())
            })
            .flatten()
            .and_then(|c| c.into_iter().find(|l| l.relation == Relation::Job))
        {
            answer.0["job"] = json!({
                "invocation_id": job.invocation_id,
                "poll_with": tools::POLL_JOB,
            });
        }
        match self.first_piece(&outcome.invocation_id, bytes) {
            Some(piece) => (pieced(answer, &piece), false),
            None => (wrap(answer), true),
        }
    }

    /// An `ssh_exec` answer, capped, and whether it carried the whole result.
    fn ssh_answer(&self, outcome: &SshOutcome) -> (CallToolResult, bool) {
        let bytes = outcome
            .result
            .as_ref()
            .map_or(0, |r| (r.stdout.len() + r.stderr.len()) as u64);
        match self.first_piece(&outcome.invocation_id, bytes) {
            Some(piece) => (pieced(ssh_value(outcome), &piece), false),
            None => (ssh_result_of(outcome), true),
        }
    }

    async fn http_request(
        &self,
        args: HttpRequestArgs,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        if let Err(refusal) = self.opened().await {
            return Ok(refusal);
        }
        let body = match (args.body, args.body_base64) {
            (Some(_), Some(_)) => {
                return Err(McpError::invalid_params(
                    "give body or body_base64, not both",
                    None,
                ));
            }
            (Some(text), None) => text.into_bytes(),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                .decode(b64.as_bytes())
                .map_err(|e| McpError::invalid_params(format!("body_base64: {e}"), None))?,
            (None, None) => Vec::new(),
        };
        let request = HttpRequest {
            url: args.url,
            method: args.method,
            headers: args.headers.into_iter().collect(),
            query: args.query,
            body,
            idempotency_key: args.idempotency_key,
            timeout_ms: args.timeout_ms,
        };
        let ctx = self.call_context(context);
        let progress = self.progress_ticker(context);
        // A capability another broker exports runs through the peer channel; the agent
        // names it, never the peer's URL or keys.
        let ran = if peer::is_peer_url(&request.url) {
            self.agents.peer(request, &ctx).await
        } else {
            self.agents.http(request, &ctx).await
        };
        progress.abort();
        let (answer, whole) = self.http_answer(&ran.outcome);
        self.remember(context, ran.receipt, whole);
        Ok(answer)
    }

    /// Progress notifications while the call waits (approval, remote), if the client
    /// asked for progress.
    /// (No task is started for a call that did not ask: most do not.)
    fn progress_ticker(&self, context: &RequestContext<RoleServer>) -> Ticker {
        let Some(token) = context.meta.get_progress_token() else {
            return Ticker(None);
        };
        let peer = context.peer.clone();
        Ticker(Some(tokio::spawn(async move {
            let mut n = 0u32;
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                n += 1;
                let mut param = ProgressNotificationParam::new(token.clone(), f64::from(n));
                param.message = Some("waiting for approval or for the remote system".into());
                if peer.notify_progress(param).await.is_err() {
                    return;
                }
            }
        })))
    }

    async fn ssh_exec(
        &self,
        args: SshExecArgs,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        if let Err(refusal) = self.opened().await {
            return Ok(refusal);
        }
        let request = SshRequest {
            host: args.host,
            command: args.command,
            stdin: args.stdin.map(String::into_bytes),
            timeout_ms: args.timeout_ms,
        };
        let ctx = self.call_context(context);
        let progress = self.progress_ticker(context);
        let ran = self.agents.ssh(request, &ctx).await;
        progress.abort();
        let (answer, whole) = self.ssh_answer(&ran.outcome);
        self.remember(context, ran.receipt, whole);
        Ok(answer)
    }

    /// What was answered for an invocation of this session that the journal could not
    /// record (a full disk, say): the same envelope, marked as not recorded.
    fn unrecorded(&self, invocation_id: &str) -> Option<CallToolResult> {
        let envelope = self
            .agents
            .unrecorded(&self.identity.session, invocation_id)?;
        let mut value = serde_json::to_value(&envelope).ok()?;
        value["recorded"] = Value::Bool(false);
        value["outcome"] = serde_json::to_value(envelope.error.outcome).ok()?;
        Some(CallToolResult::structured_error(value))
    }

    /// For a tool that may run something: this session's SESSION_OPENED on disk first
    /// (or its refusal), then [`Session::owned_or_unrecorded`].
    async fn opened_and_owned(
        &self,
        invocation_id: &str,
    ) -> Result<Result<Owned, CallToolResult>, McpError> {
        if let Err(refusal) = self.opened().await {
            return Ok(Err(refusal));
        }
        self.owned_or_unrecorded(invocation_id)
    }

    /// The invocation's projection, or the answer for one that was never recorded.
    fn owned_or_unrecorded(
        &self,
        invocation_id: &str,
    ) -> Result<Result<Owned, CallToolResult>, McpError> {
        match self.owned(invocation_id) {
            Ok(p) => Ok(Ok(p)),
            Err(e) => self.unrecorded(invocation_id).map(Err).ok_or(e),
        }
    }

    fn fetch_result(
        &self,
        args: FetchResultArgs,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let owned = match self.owned_or_unrecorded(&args.invocation_id)? {
            Ok(owned) => owned,
            Err(answer) => return Ok(answer),
        };
        let p = owned.projection();
        // A read of the record and its stored result, never a re-run.
        let unreadable = |e: postern_broker::journal::JournalError| {
            McpError::internal_error(e.to_string(), None)
        };
        let refuse = |e: &DeliveryError| {
            let envelope = self.agents.refusal(&owned, e);
            let mut value = serde_json::to_value(&envelope).unwrap_or(Value::Null);
            value["outcome"] = serde_json::to_value(p.outcome).unwrap_or(Value::Null);
            CallToolResult::structured_error(value)
        };
        if p.result_expired.is_some() {
            return Ok(refuse(&DeliveryError::Expired));
        }
        if args.cursor.is_some() || args.max_bytes.is_some() {
            return match self
                .agents
                .piece(&owned, args.cursor.as_deref(), args.max_bytes)
            {
                Ok(piece) => {
                    if piece.complete {
                        self.remember(context, owned.receipt(), true);
                    }
                    Ok(CallToolResult::structured(json!({
                        "invocation_id": p.invocation_id,
                        "outcome": p.outcome,
                        "delivery": piece,
                    })))
                }
                Err(DeliveryError::Journal(e)) => Err(unreadable(e)),
                Err(e) => Ok(refuse(&e)),
            };
        }
        let (answer, whole) = if p.channel == Some(Channel::Ssh) {
            let outcome = self.agents.recorded_ssh(&owned).map_err(unreadable)?;
            self.ssh_answer(&outcome)
        } else {
            let outcome = self.agents.recorded_http(&owned).map_err(unreadable)?;
            self.http_answer(&outcome)
        };
        if p.result_id.is_some() {
            self.remember(context, owned.receipt(), whole);
        }
        Ok(answer)
    }

    fn get_invocation(&self, args: InvocationArgs) -> Result<CallToolResult, McpError> {
        let owned = match self.owned_or_unrecorded(&args.invocation_id)? {
            Ok(owned) => owned,
            Err(answer) => return Ok(answer),
        };
        let now = self.agents.now_ms();
        let events = self
            .agents
            .events(&owned)
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let events: Vec<Value> = events
            .into_iter()
            .map(|e| {
                json!({
                    "seq": e.seq,
                    "kind": e.body.kind(),
                    "recorded_at_ms": e.recorded_at_ms,
                    "body": serde_json::to_value(&e.body).unwrap_or(Value::Null),
                })
            })
            .collect();
        let children = self
            .agents
            .children(&owned)
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let mut status = evidence::invocation_status(owned.projection(), now);
        status["children"] = serde_json::to_value(children).unwrap_or(Value::Null);
        status["events"] = Value::Array(events);
        Ok(CallToolResult::structured(status))
    }

    async fn poll_job(
        &self,
        args: InvocationArgs,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        // Only the agent's own submission or job is read.
        let owned = match self.opened_and_owned(&args.invocation_id).await? {
            Ok(owned) => owned,
            Err(answer) => return Ok(answer),
        };
        let ctx = self.call_context(context);
        let (polled, receipt) = match self.agents.poll_job(&owned, &ctx).await {
            Ok(polled) => polled,
            Err(PollRefused::NotAJob(id)) => {
                let error = ErrorBody {
                    code: Code::InvalidRequest,
                    phase: Phase::Validation,
                    outcome: Outcome::NotAttempted,
                    retry: Retry::AfterCorrection,
                    message: PollRefused::NotAJob(id.clone()).to_string(),
                };
                return Ok(CallToolResult::structured_error(json!({
                    "invocation_id": id,
                    "error": error,
                    "outcome": Outcome::NotAttempted,
                })));
            }
            Err(e) => return Err(McpError::internal_error(e.to_string(), None)),
        };
        if let Some(receipt) = receipt {
            self.remember(context, receipt, true);
        }
        // The job is this session's: it was started for the submission it owns.
        let job = self
            .agents
            .owned(&self.identity.session, &polled.job.invocation_id)
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let mut value = evidence::invocation_status(job.projection(), self.agents.now_ms());
        if let Some(envelope) = &polled.job.error {
            value["error"] = serde_json::to_value(&envelope.error).unwrap_or(Value::Null);
        }
        value["poll"] = match &polled.poll {
            Some(poll) => http_value(poll).0,
            None => Value::Null,
        };
        Ok(CallToolResult::structured(value))
    }

    async fn retry_invocation(
        &self,
        args: InvocationArgs,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let owned = match self.opened_and_owned(&args.invocation_id).await? {
            Ok(owned) => owned,
            Err(answer) => return Ok(answer),
        };
        if owned.projection().channel == Some(Channel::Ssh) {
            // A shell command is never assumed safe to repeat; the record and its retry
            // advice are what the caller gets.
            let outcome = SshOutcome::of_projection(owned.projection(), self.agents.now_ms());
            return Ok(ssh_result_of(&outcome));
        }
        let ctx = self.call_context(context);
        let ran = self.agents.retry(&owned, &ctx).await;
        let (answer, whole) = self.http_answer(&ran.outcome);
        self.remember(context, ran.receipt, whole);
        Ok(answer)
    }

    async fn list_targets(&self) -> CallToolResult {
        let config = self.agents.targets();
        let targets: Vec<Value> = config
            .http
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "kind": "http",
                    "base_url": t.base_url.as_str(),
                    "methods": t.methods,
                    "idempotent_methods": t.idempotent_methods,
                    "approval": t.approval.as_str(),
                    "idempotency_contract": t.idempotency.is_some(),
                })
            })
            .collect();
        let mut targets = targets;
        targets.extend(config.ssh.iter().map(|t| {
            json!({
                "name": t.name,
                "kind": "ssh",
                "host": t.host,
                "port": t.port,
                "user": t.user,
                "approval": t.approval.as_str(),
                "host_key_pinned": t.host_key.is_some(),
            })
        }));
        // What each peer lists for this broker. A peer whose listing failed or was
        // denied lists nothing; its URL and key are never shown.
        for (name, listing) in self.agents.peer_listings().await {
            let Ok(listing) = listing else { continue };
            let approval = config.peer(&name).map_or("none", |p| p.approval.as_str());
            targets.extend(listing.capabilities.iter().map(|c| {
                json!({
                    "name": peer::target_name(&name, &c.name),
                    "kind": "peer",
                    "url": format!("{}{name}/{}/", peer::SCHEME, c.name),
                    "methods": c.methods,
                    "idempotent_methods": c.idempotent_methods,
                    "approval": approval,
                    "peer_approval": c.approval,
                })
            }));
        }
        CallToolResult::structured(json!({ "targets": targets }))
    }
}

fn text_or_base64(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => Value::String(text.to_string()),
        Err(_) => json!({ "base64": base64::engine::general_purpose::STANDARD.encode(bytes) }),
    }
}

fn ssh_json(result: &SshResult) -> Value {
    json!({
        "exit_status": result.exit_status,
        "exit_signal": result.exit_signal,
        "stdout": text_or_base64(&result.stdout),
        "stderr": text_or_base64(&result.stderr),
        "stdout_complete": result.stdout_complete,
        "stderr_complete": result.stderr_complete,
        "host_key_fingerprint": result.host_key_fingerprint,
    })
}

/// An `ssh_exec` result: `{invocation_id, outcome, exit_status, exit_signal,
/// stdout, stderr, stdout_complete, stderr_complete, host_key_fingerprint}`, or the
/// envelope when the record carries a code.
pub fn ssh_result_of(outcome: &SshOutcome) -> CallToolResult {
    wrap(ssh_value(outcome))
}

/// An answer's JSON, and whether it is an error.
type Answer = (Value, bool);

fn wrap((value, error): Answer) -> CallToolResult {
    if error {
        CallToolResult::structured_error(value)
    } else {
        CallToolResult::structured(value)
    }
}

fn ssh_value(outcome: &SshOutcome) -> Answer {
    match (&outcome.error, &outcome.result) {
        (None, Some(result)) => {
            let mut value =
                json!({ "invocation_id": outcome.invocation_id, "outcome": outcome.outcome });
            if let (Value::Object(map), Value::Object(extra)) = (&mut value, ssh_json(result)) {
                map.extend(extra);
            }
            (value, false)
        }
        (Some(envelope), result) => {
            let mut value = serde_json::to_value(envelope).unwrap_or(Value::Null);
            if let Some(result) = result {
                value["result"] = ssh_json(result);
            }
            (value, true)
        }
        (None, None) => (
            json!({ "invocation_id": outcome.invocation_id, "outcome": outcome.outcome }),
            false,
        ),
    }
}

/// An answer whose result goes out in pieces: the streams' bytes are replaced by the
/// first piece (`delivery`), which carries the cursor of the next.
fn pieced((mut value, error): Answer, piece: &Piece) -> CallToolResult {
    const STREAM_KEYS: [&str; 4] = ["body", "body_base64", "stdout", "stderr"];
    for nested in ["", "response", "result"] {
        let target = if nested.is_empty() {
            Some(&mut value)
        } else {
            value.get_mut(nested)
        };
        if let Some(Value::Object(map)) = target {
            for key in STREAM_KEYS {
                map.remove(key);
            }
        }
    }
    value["delivery"] = serde_json::to_value(piece).unwrap_or(Value::Null);
    wrap((value, error))
}

fn response_json(response: &HttpResponse) -> Value {
    let headers: serde_json::Map<String, Value> = response
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let mut out = json!({ "status": response.status, "headers": headers });
    match std::str::from_utf8(&response.body) {
        Ok(text) => out["body"] = Value::String(text.to_string()),
        Err(_) => {
            out["body_base64"] =
                Value::String(base64::engine::general_purpose::STANDARD.encode(&response.body))
        }
    }
    if let Some(from) = &response.decoded_from {
        out["decoded_from"] = Value::String(from.clone());
    }
    if let Some(reason) = &response.body_withheld {
        out["body_withheld"] = serde_json::to_value(reason).unwrap_or(Value::Null);
        out["body_withheld"]["message"] = Value::String(reason.message());
    }
    out
}

/// A tool result: the remote response with `invocation_id` and `outcome`, or, when the
/// record carries a code, `isError` with the envelope (plus the response, if complete).
pub fn result_of(outcome: &HttpOutcome) -> CallToolResult {
    wrap(http_value(outcome))
}

fn http_value(outcome: &HttpOutcome) -> Answer {
    let mut value = match &outcome.error {
        Some(envelope) => serde_json::to_value(envelope).unwrap_or(Value::Null),
        None => json!({ "invocation_id": outcome.invocation_id, "outcome": outcome.outcome }),
    };
    if let Some(response) = &outcome.result {
        if outcome.error.is_some() {
            value["response"] = response_json(response);
        } else if let (Value::Object(map), Value::Object(extra)) =
            (&mut value, response_json(response))
        {
            map.extend(extra);
        }
    }
    if let Some(manifest) = &outcome.manifest {
        value["manifest"] = serde_json::to_value(manifest).unwrap_or(Value::Null);
    }
    (value, outcome.error.is_some())
}

/// The refusal an agent gets when its session could not be recorded: nothing runs
/// unrecorded. There is no invocation id, since nothing was accepted.
fn session_unrecorded(reason: &str) -> CallToolResult {
    let error = ErrorBody {
        code: Code::BrokerUnavailable,
        phase: Phase::Validation,
        outcome: Outcome::NotAttempted,
        retry: Retry::Backoff,
        message: format!(
            "The broker could not record who this agent is ({reason}); nothing was run. \
             Reconnect and try again."
        ),
    };
    CallToolResult::structured_error(json!({
        "invocation_id": null,
        "error": error,
        "outcome": Outcome::NotAttempted,
        "recorded": false,
    }))
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
        let result = match request.name.as_ref() {
            tools::HTTP_REQUEST => self.http_request(parse(&request)?, &context).await?,
            tools::SSH_EXEC => self.ssh_exec(parse(&request)?, &context).await?,
            tools::FETCH_RESULT => self.fetch_result(parse(&request)?, &context)?,
            tools::GET_INVOCATION => self.get_invocation(parse(&request)?)?,
            tools::RETRY_INVOCATION => self.retry_invocation(parse(&request)?, &context).await?,
            tools::POLL_JOB => self.poll_job(parse(&request)?, &context).await?,
            tools::LIST_TARGETS => {
                let _: NoArgs = parse(&request)?;
                self.list_targets().await
            }
            other => {
                return Err(McpError::invalid_params(
                    format!("unknown tool {other}"),
                    None,
                ));
            }
        };
        Ok(result.into())
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
