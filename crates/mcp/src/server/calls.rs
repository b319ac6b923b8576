//! One method per tool: each checks what the agent may ask (its own invocations only),
//! waits for the session's record where the tool runs something, calls the agent side's
//! handle and makes the answer.

use base64::Engine;
use rmcp::ErrorData as McpError;
use rmcp::model::{CallToolResult, ProgressNotificationParam};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::{Value, json};

use postern_broker::api::Owned;
use postern_broker::channel::http::HttpRequest;
use postern_broker::channel::peer;
use postern_broker::channel::ssh::{SshOutcome, SshRequest};
use postern_broker::contract::{Code, ErrorBody, Outcome, Phase, Retry};
use postern_broker::delivery::DeliveryError;
use postern_broker::evidence;
use postern_broker::journal::events::Channel;
use postern_broker::operations::PollRefused;

use super::Session;
use super::answers::{http_value, ssh_result_of};
use crate::tools::{FetchResultArgs, HttpRequestArgs, InvocationArgs, SshExecArgs};

/// How a tool call ends before its answer is made: with an answer the agent gets (the
/// session's record was refused, or the invocation was never recorded), or an MCP error.
pub(super) enum Early {
    Answer(CallToolResult),
    Error(McpError),
}

impl From<McpError> for Early {
    fn from(e: McpError) -> Self {
        Early::Error(e)
    }
}

/// What a tool's method answers; `?` ends it early.
pub(super) type Answered = Result<CallToolResult, Early>;

/// The progress notifications of one call, if it asked for them; stopped by `abort`.
struct Ticker(Option<tokio::task::JoinHandle<()>>);

impl Ticker {
    fn abort(self) {
        if let Some(task) = self.0 {
            task.abort();
        }
    }
}

impl Session {
    pub(super) async fn http_request(
        &self,
        args: HttpRequestArgs,
        context: &RequestContext<RoleServer>,
    ) -> Answered {
        self.opened().await.map_err(Early::Answer)?;
        let body = match (args.body, args.body_base64) {
            (Some(_), Some(_)) => {
                return Err(
                    McpError::invalid_params("give body or body_base64, not both", None).into(),
                );
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

    pub(super) async fn ssh_exec(
        &self,
        args: SshExecArgs,
        context: &RequestContext<RoleServer>,
    ) -> Answered {
        self.opened().await.map_err(Early::Answer)?;
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
    async fn opened_and_owned(&self, invocation_id: &str) -> Result<Owned, Early> {
        self.opened().await.map_err(Early::Answer)?;
        self.owned_or_unrecorded(invocation_id)
    }

    /// The invocation's projection, or the answer for one that was never recorded.
    fn owned_or_unrecorded(&self, invocation_id: &str) -> Result<Owned, Early> {
        self.owned(invocation_id).map_err(|e| {
            self.unrecorded(invocation_id)
                .map_or(Early::Error(e), Early::Answer)
        })
    }

    pub(super) fn fetch_result(
        &self,
        args: FetchResultArgs,
        context: &RequestContext<RoleServer>,
    ) -> Answered {
        let owned = self.owned_or_unrecorded(&args.invocation_id)?;
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
                Err(DeliveryError::Journal(e)) => Err(unreadable(e).into()),
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

    pub(super) fn get_invocation(&self, args: InvocationArgs) -> Answered {
        let owned = self.owned_or_unrecorded(&args.invocation_id)?;
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

    pub(super) async fn poll_job(
        &self,
        args: InvocationArgs,
        context: &RequestContext<RoleServer>,
    ) -> Answered {
        // Only the agent's own submission or job is read.
        let owned = self.opened_and_owned(&args.invocation_id).await?;
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
            Err(e) => return Err(McpError::internal_error(e.to_string(), None).into()),
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

    pub(super) async fn retry_invocation(
        &self,
        args: InvocationArgs,
        context: &RequestContext<RoleServer>,
    ) -> Answered {
        let owned = self.opened_and_owned(&args.invocation_id).await?;
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

    pub(super) async fn list_targets(&self) -> CallToolResult {
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
