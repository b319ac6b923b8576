//! The HTTP channel: an agent's request against a configured target, with the
//! credential injected from the keychain. The [invocation
//! pipeline](crate::invocation::pipeline) runs it; this module holds what is HTTP's own,
//! one file per step:
//!
//! - `validate`: the request checked against the target before anything is touched.
//! - `card`: what the approval card shows of the headers, the agent's and the broker's.
//! - `inject`: the credential put on the wire for one attempt, and the redactor.
//! - `exchange`: connection setup (dns, tcp, tls; each failure recorded, capped
//!   internal retries), the dispatch gate, the response read, scrubbed and committed.
//! - [`transport`]: reqwest with the boundaries made visible.
//! - `tunnel`: the same attempt through a proxy's CONNECT tunnel (hyper on the tunnel).
//! - [`status`]: a complete response → outcome, code, retry.
//!
//! Around the pipeline: same-target redirects for targets that opt in, retries by the
//! record's decision, and the configured reconcile query for an unknown outcome.

mod card;
mod exchange;
mod inject;
pub mod status;
pub mod transport;
mod tunnel;
pub(crate) mod validate;
pub(crate) use validate::check_header_syntax;

use serde::{Deserialize, Serialize};

use crate::action::{NormalizedHttp, percent_encode};
use crate::approvals::ApprovalDetail;
use crate::channel::guard::{AddressPolicy, Resolver};
use crate::channel::redact::Redactor;
use crate::config::{Config, ConfigHandle, HttpTarget, ReconcileQuery};
use crate::contract::{Code, ConfidenceSource, IdempotencyEvidence, Outcome, RemoteContract};
use crate::invocation::outcome::unrecorded;
use crate::invocation::{
    Accepted, Attempt, Bound, CallContext, Channel, Failure, Invalid, Pipeline, Recorder,
    Validated, new_invocation_id,
};
use crate::journal::events::{
    self, BatchOperation, OperationFacts, ParentLink, Relation, Settlement as Reconciled,
};
use crate::journal::{Journal, NewInvocation, StoredResult};
use crate::retry::SourceQueryPredicate;
use crate::vault::{Secret, Vault};
use status::Repeat;

/// Dispatches an invocation may make in total, across retries and restarts.
const RETRY_BUDGET: u32 = 3;
/// How long building an approval card waits for the host's addresses.
const CARD_LOOKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a redirect chain the channel follows for a target that opted in.
const MAX_REDIRECTS: u32 = 5;

/// What an agent asks for (the `http_request` tool).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpRequest {
    pub url: String,
    pub method: String,
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    #[serde(default)]
    pub query: Vec<(String, String)>,
    #[serde(default)]
    pub body: Vec<u8>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// A complete response, secrets scrubbed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The content codings the broker undid before scrubbing, as the remote applied
    /// them (`"gzip"`, `"gzip, deflate"`); `body` is the decoded body and the headers no
    /// longer carry `content-encoding`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoded_from: Option<String>,
    /// Set when the body could not be scrubbed and so is neither returned nor stored
    /// (`body` is empty). The response is still the remote's complete answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_withheld: Option<BodyWithheld>,
}

/// Why a complete response's body is withheld.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum BodyWithheld {
    /// The remote used a coding the broker cannot decode (`br`, `zstd`, ...).
    UnsupportedEncoding { coding: String },
    /// The body claimed a coding the broker knows but did not decode as one.
    UndecodableBody { coding: String },
}

impl BodyWithheld {
    /// For people and agents.
    pub fn message(&self) -> String {
        match self {
            BodyWithheld::UnsupportedEncoding { coding } => format!(
                "The response body was encoded as {coding}, which the broker cannot decode and so cannot scrub of the credential; the body is withheld."
            ),
            BodyWithheld::UndecodableBody { coding } => format!(
                "The response body did not decode as the {coding} it declared, so the broker cannot scrub it of the credential; the body is withheld."
            ),
        }
    }
}

/// What an HTTP call produced.
pub type HttpOutcome = crate::invocation::Outcome<HttpResponse>;

/// The HTTP channel, run by the invocation pipeline.
pub type HttpChannel = Pipeline<Http>;

/// What validation found that the attempt reads.
#[derive(Debug, Clone)]
pub struct Plan {
    request: HttpRequest,
    http: NormalizedHttp,
    repeat: Repeat,
    /// For a batch under the target's `[http.batch]`: its member ids, in order.
    batch_members: Option<Vec<String>>,
    /// The target's `allow_private`, for the approval card's address check.
    allow_private: bool,
    /// The proxy (`host:port`) the target's requests go through, for the approval card.
    proxy: Option<String>,
    /// What the broker adds to the request, for the approval card (`card::added`).
    added: Vec<String>,
}

/// One attempt's request with the credential in it. The URL and header values that may
/// carry it are wiped when the attempt ends.
pub struct Armed {
    target: HttpTarget,
    url: String,
    headers: Vec<(String, String)>,
    redactor: Redactor,
    verifier: Option<std::sync::Arc<rustls::client::WebPkiServerVerifier>>,
}

impl Drop for Armed {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        self.url.zeroize();
        for (_, value) in &mut self.headers {
            value.zeroize();
        }
    }
}

/// HTTP's steps of the pipeline.
pub struct Http {
    trust: inject::Trust,
    /// Where host names resolve; the address guard checks its answers.
    resolver: Resolver,
    /// Held while a submission's job is looked up and, if missing, created, so two
    /// polls of one submission never track its job twice.
    jobs: std::sync::Mutex<()>,
}

/// What `poll_job` answers: the job's record after the read, and the read itself.
#[derive(Debug, Clone)]
pub struct JobPoll {
    /// The job invocation's outcome: unknown while it is pending, committed once its
    /// status resource said it finished.
    pub job: HttpOutcome,
    /// The read of the status resource, when one was made (not for a settled job or
    /// a status resource outside the target).
    pub poll: Option<HttpOutcome>,
}

/// Why `poll_job` read nothing.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PollRefused {
    #[error(
        "{0} is not a job and queued none: only an HTTP 202 Accepted that names a status resource (Location) starts a job"
    )]
    NotAJob(String),
    #[error("the journal could not be read or written: {0}")]
    Journal(String),
}

impl From<crate::journal::JournalError> for PollRefused {
    fn from(e: crate::journal::JournalError) -> Self {
        PollRefused::Journal(e.to_string())
    }
}

/// The target's reconcile query bound to one invocation: `{idempotency_key}` filled in
/// (percent-encoded). `None` when the path needs a key the invocation does not have.
fn source_query(query: &ReconcileQuery, key: Option<&str>) -> Option<SourceQueryPredicate> {
    let path = match (key, query.path.contains("{idempotency_key}")) {
        (Some(k), true) => query
            .path
            .replace("{idempotency_key}", &percent_encode(k.as_bytes())),
        (None, true) => return None,
        (_, false) => query.path.clone(),
    };
    Some(SourceQueryPredicate {
        method: query.method.clone(),
        path,
        committed_status: query.committed_status.clone(),
        not_applied_status: query.not_applied_status.clone(),
    })
}

/// The target whose base URL and path prefix cover `url`.
fn target_of<'c>(config: &'c Config, method: &str, url: &str) -> Option<&'c HttpTarget> {
    let action = NormalizedHttp::new(method, url, &[], &[], &[]).ok()?;
    config.resolve_normalized_http(&action).ok()
}

impl Channel for Http {
    type Request = HttpRequest;
    type Plan = Plan;
    type Armed = Armed;
    type Result = HttpResponse;

    const KIND: events::Channel = events::Channel::Http;
    const TARGET_FIELD: &'static str = "url";
    /// The secret goes out in the request's headers, after the gate: a proxy's own
    /// credentials come from its URL, not the keychain.
    const DEFER_AUTHORIZATION: bool = true;

    fn accepted(&self, request: &HttpRequest, config: &Config) -> Accepted {
        Accepted {
            target: target_of(config, &request.method, &request.url).map(|t| t.name.clone()),
            summary: validate::summary(request),
            idempotency_key: request.idempotency_key.clone(),
        }
    }

    fn validate(&self, request: &HttpRequest, config: &Config) -> Result<Validated<Plan>, Invalid> {
        validate::validate(request, config)
    }

    fn operation(&self, config: &Config, bound: &Bound<Plan>, now_ms: i64) -> OperationFacts {
        let target = config.http_target(&bound.target);
        let contract = target.and_then(|t| t.idempotency.as_ref());
        let remote_contract = if contract.is_some() {
            RemoteContract::Configured
        } else {
            RemoteContract::None
        };
        OperationFacts {
            idempotent: bound.plan.repeat == Repeat::Idempotent,
            remote_contract,
            idempotency: bound
                .idempotency_key
                .as_ref()
                .map(|key| IdempotencyEvidence {
                    key: key.clone(),
                    scope: contract.map(|c| c.scope.clone()),
                    fingerprint: bound.fingerprint.clone(),
                    remote_contract,
                    expires_at_ms: contract.map(|c| {
                        now_ms.saturating_add(
                            i64::try_from(c.retention.as_millis()).unwrap_or(i64::MAX),
                        )
                    }),
                }),
            reconcile_configured: target.is_some_and(|t| {
                t.reconcile.is_some()
                    || (bound.plan.batch_members.is_some()
                        && t.batch.as_ref().is_some_and(|b| b.query.is_some()))
            }),
            batch: bound.plan.batch_members.as_ref().map(|members| {
                let contract = target.and_then(|t| t.batch.as_ref());
                Box::new(BatchOperation {
                    members: members.clone(),
                    atomic: contract.is_some_and(|b| b.atomic),
                    member_query: contract.and_then(|b| b.query.clone()),
                })
            }),
            source_query: target
                .and_then(|t| t.reconcile.as_ref())
                .and_then(|q| source_query(q, bound.idempotency_key.as_deref()))
                .map(Box::new),
            retry_budget: RETRY_BUDGET,
            peer: None,
        }
    }

    async fn approval(&self, bound: &Bound<Plan>) -> (String, ApprovalDetail) {
        let p = &bound.plan;
        let policy = AddressPolicy::for_host(&p.http.host, p.allow_private);
        // Through a proxy the proxy resolves the host: what the broker's resolver says
        // would not be where the request goes.
        let resolved = match &p.proxy {
            Some(_) => None,
            None => Some(
                tokio::time::timeout(
                    CARD_LOOKUP_TIMEOUT,
                    self.resolver.describe(&p.http.host, policy),
                )
                .await
                .unwrap_or_else(|_| "did not resolve in time".to_string()),
            ),
        };
        let (headers, cautions) = card::headers(&p.request);
        let detail = ApprovalDetail {
            resolved,
            proxy: p.proxy.clone(),
            method: Some(p.http.method.clone()),
            url: Some(p.http.url()),
            body: (!p.request.body.is_empty())
                .then(|| crate::display::BodyPreview::of(&p.request.body)),
            headers,
            added: p.added.clone(),
            cautions,
            ..Default::default()
        };
        (validate::summary(&p.request), detail)
    }

    fn arm(&self, config: &Config, bound: &Bound<Plan>, secret: Secret) -> Result<Armed, Failure> {
        inject::arm(&self.trust, config, bound, secret)
    }

    async fn attempt(
        &self,
        attempt: Attempt<'_, Self>,
        armed: Armed,
        ctx: &CallContext,
    ) -> HttpOutcome {
        exchange::attempt(&self.trust, &self.resolver, attempt, armed, ctx).await
    }

    fn stored_result(stored: &StoredResult) -> Option<HttpResponse> {
        stored_response(stored)
    }
}

impl Pipeline<Http> {
    pub fn new(journal: Journal, vault: std::sync::Arc<Vault>, config: ConfigHandle) -> Self {
        Self::with_resolver(journal, vault, config, Resolver::system())
    }

    /// [`Pipeline::new`] resolving through `resolver` (a hosts-style map in tests; the
    /// daemon and the app always use the system resolver).
    pub fn with_resolver(
        journal: Journal,
        vault: std::sync::Arc<Vault>,
        config: ConfigHandle,
        resolver: Resolver,
    ) -> Self {
        Pipeline::with(
            Http {
                trust: inject::Trust::new(),
                resolver,
                jobs: std::sync::Mutex::new(()),
            },
            journal,
            vault,
            config,
        )
    }

    /// Runs one agent request as a new invocation, and follows a same-target redirect
    /// when the target opted in.
    pub async fn execute(&self, request: HttpRequest, ctx: &CallContext) -> HttpOutcome {
        let outcome = self.execute_following(&request, ctx, 0).await;
        if outcome.result.as_ref().is_some_and(|r| r.status == 202) {
            // A failure here loses nothing: the submission's record names the status
            // resource, and poll_job tracks the job when it is first asked.
            let _ = self.ensure_job(&outcome.invocation_id);
        }
        outcome
    }

    /// The job invocation a submission's 202 queued: the one already tracked, or a new
    /// one (relation `job`, same session and target) when the submission's result names
    /// a status resource. `None` when it names none.
    pub fn ensure_job(&self, submission: &str) -> Result<Option<String>, PollRefused> {
        let _held = self.channel().jobs.lock().map_err(|_| {
            PollRefused::Journal("a job lookup panicked earlier in this process".into())
        })?;
        let journal = self.journal();
        if let Some(job) = journal
            .children(submission)?
            .into_iter()
            .find(|c| c.relation == Relation::Job)
        {
            return Ok(Some(job.invocation_id));
        }
        let p = journal.projection(submission)?;
        let facts = p.result_facts.clone().unwrap_or_default();
        if p.outcome != Outcome::Committed || facts.http_status != Some(202) {
            return Ok(None);
        }
        let config = self.config().current();
        let target = p.target.as_deref().and_then(|t| config.http_target(t));
        let contract = target.and_then(|t| t.job.clone()).unwrap_or_default();
        let body = match &p.result_id {
            Some(id) => journal
                .read_result(id)
                .ok()
                .and_then(|r| stored_response(&r))
                .map(|r| r.body)
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let Some(resource) = facts
            .status_resource
            .clone()
            .or_else(|| contract.status_in_body(&body))
        else {
            return Ok(None);
        };
        // Relative references resolve against the submission's own URL.
        let submitted = journal
            .load_request(submission)?
            .and_then(|(meta, _)| meta["url"].as_str().map(str::to_string));
        let url = submitted
            .as_deref()
            .and_then(|u| url::Url::parse(u).ok())
            .and_then(|base| base.join(&resource).ok())
            .map_or(resource, |u| u.to_string());
        let target_name = p.target.clone().unwrap_or_default();
        // The credential goes only where the submission's target covers.
        let pollable = target_of(&config, "GET", &url).is_some_and(|t| t.name == target_name);
        let job_id = contract.job_id(&body);
        let id = new_invocation_id()?;
        journal.accept(NewInvocation {
            invocation_id: id.clone(),
            channel: events::Channel::Http,
            target: target_name,
            summary: match &job_id {
                Some(job) => format!("job {job} at {url}"),
                None => format!("job at {url}"),
            },
            session: p.session.clone(),
            idempotency_key: None,
            parent: Some(ParentLink {
                invocation_id: submission.to_string(),
                relation: Relation::Job,
            }),
        })?;
        journal.append(
            &id,
            events::EventBody::JobTracked {
                submission: submission.to_string(),
                job_id,
                status_resource: url,
                pollable,
            },
        )?;
        Ok(Some(id))
    }

    /// `poll_job`: reads a job's status resource once (as its own `job_poll`
    /// invocation) and records what it said on the job. `invocation_id` names the job
    /// or the submission that queued it. A settled job is answered from its record; the
    /// status resource is never read again.
    pub async fn poll_job(
        &self,
        invocation_id: &str,
        ctx: &CallContext,
    ) -> Result<JobPoll, PollRefused> {
        let journal = self.journal();
        let first = journal.projection(invocation_id)?;
        let job_id = if first.job.is_some() {
            invocation_id.to_string()
        } else {
            self.ensure_job(invocation_id)?
                .ok_or_else(|| PollRefused::NotAJob(invocation_id.to_string()))?
        };
        let job = journal.projection(&job_id)?;
        let Some(facts) = job.job.clone() else {
            return Err(PollRefused::NotAJob(invocation_id.to_string()));
        };
        let answer = |poll| -> Result<JobPoll, PollRefused> {
            let p = journal.projection(&job_id)?;
            Ok(JobPoll {
                job: crate::invocation::Outcome::of_projection(&p, journal.now_ms()),
                poll,
            })
        };
        if job.outcome != Outcome::Unknown || !facts.pollable {
            return answer(None);
        }
        let request = HttpRequest {
            url: facts.status_resource.clone(),
            method: "GET".into(),
            ..Default::default()
        };
        let poll_ctx = CallContext {
            parent: Some(ParentLink {
                invocation_id: job_id.clone(),
                relation: Relation::JobPoll,
            }),
            session: job.session.clone(),
            ..ctx.clone()
        };
        let poll = self.run(&request, &poll_ctx).await;
        if let Some(response) = &poll.result {
            let config = self.config().current();
            let contract = job
                .target
                .as_deref()
                .and_then(|t| config.http_target(t))
                .and_then(|t| t.job.clone())
                .unwrap_or_default();
            let state = contract.state_of(response.status, &response.body);
            journal.append(
                &job_id,
                events::EventBody::JobStatus {
                    poll: poll.invocation_id.clone(),
                    http_status: response.status,
                    state,
                },
            )?;
        }
        answer(Some(poll))
    }

    async fn execute_following(
        &self,
        request: &HttpRequest,
        ctx: &CallContext,
        redirects: u32,
    ) -> HttpOutcome {
        let outcome = self.run(request, ctx).await;
        self.follow_redirect(outcome, request, ctx, redirects).await
    }

    /// Follows a redirect only for a target that opted in, and only to a URL under the
    /// same target (same origin, same credential): a credential never crosses origins.
    /// The child exchange is its own invocation with its own dispatch record.
    async fn follow_redirect(
        &self,
        outcome: HttpOutcome,
        request: &HttpRequest,
        ctx: &CallContext,
        redirects: u32,
    ) -> HttpOutcome {
        let config = self.config().current();
        let Some(response) = &outcome.result else {
            return outcome;
        };
        let Some(target) = target_of(&config, &request.method, &request.url) else {
            return outcome;
        };
        if !target.follow_redirects || redirects >= MAX_REDIRECTS {
            return outcome;
        }
        let status = response.status;
        if !matches!(status, 301 | 302 | 303 | 307 | 308) {
            return outcome;
        }
        let Some(location) = response
            .headers
            .iter()
            .find(|(k, _)| k == "location")
            .map(|(_, v)| v.clone())
        else {
            return outcome;
        };
        let Ok(base) = url::Url::parse(&request.url) else {
            return outcome;
        };
        let Ok(next) = base.join(&location) else {
            return outcome;
        };
        let same_target = target_of(&config, &request.method, next.as_str())
            .is_some_and(|t| t.name == target.name);
        if !same_target {
            return outcome;
        }
        // RFC 9110 §15.4: 307/308 keep method and body; 301/302/303 become GET.
        let (method, body) = if matches!(status, 307 | 308) {
            (request.method.clone(), request.body.clone())
        } else {
            ("GET".to_string(), Vec::new())
        };
        let child_ctx = CallContext {
            parent: Some(ParentLink {
                invocation_id: outcome.invocation_id.clone(),
                relation: Relation::Redirect,
            }),
            ..ctx.clone()
        };
        let child = HttpRequest {
            url: next.to_string(),
            method,
            headers: request.headers.clone(),
            query: Vec::new(),
            body,
            idempotency_key: None,
            timeout_ms: request.timeout_ms,
        };
        Box::pin(self.execute_following(&child, &child_ctx, redirects + 1)).await
    }

    /// Runs the target's configured reconcile query for an unknown outcome (with the
    /// credential, as its own invocation) and records what it proves as `remote_query`
    /// evidence on the original. Returns the original's outcome afterwards.
    pub async fn reconcile(&self, invocation_id: &str, by: &str) -> HttpOutcome {
        let rec = match Recorder::resume(self.journal(), invocation_id) {
            Ok(r) => r,
            Err(e) => return unrecorded(invocation_id, &e),
        };
        let p = match rec.projection() {
            Ok(p) => p,
            Err(e) => return unrecorded(invocation_id, &e),
        };
        let member_query = p
            .operation
            .as_ref()
            .and_then(|o| o.batch.as_ref())
            .filter(|b| !b.atomic)
            .and_then(|b| b.member_query.clone());
        let unknown_members = p.members.iter().any(|m| m.outcome == Outcome::Unknown);
        if let Some(query) = member_query
            && unknown_members
            && p.terminal
        {
            return self.reconcile_members(&rec, &p, &query, by).await;
        }
        // A job settles through its status resource (poll_job) or an operator's
        // attestation, never through the target's query about a submission.
        if p.outcome != Outcome::Unknown || !p.terminal || p.job.is_some() {
            return self.recorded_outcome(&rec);
        }
        let config = self.config().current();
        let Some(target) = p.target.as_deref().and_then(|t| config.http_target(t)) else {
            return self.outcome_of(&rec);
        };
        // The query bound at preflight (what the retry manifest named); a record from
        // before binding reads the configuration.
        let key = p
            .operation
            .as_ref()
            .and_then(|o| o.idempotency.as_ref())
            .map(|i| i.key.clone());
        let bound_query = p
            .operation
            .as_ref()
            .and_then(|o| o.source_query.as_deref().cloned());
        let Some(query) = bound_query.or_else(|| {
            target
                .reconcile
                .as_ref()
                .and_then(|q| source_query(q, key.as_deref()))
        }) else {
            return self.outcome_of(&rec);
        };
        let probe = self.run_source_query(invocation_id, target, &query).await;
        let Some(response) = &probe.result else {
            let mut outcome = self.outcome_of(&rec);
            outcome.error = outcome.error.map(|mut env| {
                env.error.message = format!(
                    "The reconcile query did not complete ({}); the outcome stays unknown.",
                    probe.invocation_id
                );
                env
            });
            return outcome;
        };
        let settlement = if query.committed_status.contains(&response.status) {
            Reconciled::Committed
        } else if query.not_applied_status.contains(&response.status) {
            Reconciled::NotApplied
        } else {
            return self.outcome_of(&rec);
        };
        let note = format!(
            "reconcile query {} answered {}",
            probe.invocation_id, response.status
        );
        if let Err(e) = rec.reconcile(
            ConfidenceSource::RemoteQuery,
            settlement,
            by,
            &note,
            Some(response.status),
        ) {
            return self.journal_failed(&rec, &e);
        }
        self.outcome_of(&rec)
    }

    /// Settles a batch's unknown members one by one with the bound member query (each
    /// query its own invocation), then, once none is unknown, an unknown batch as a whole:
    /// committed if any member was applied, not applied if none was.
    async fn reconcile_members(
        &self,
        rec: &Recorder,
        p: &crate::journal::projection::Projection,
        query: &SourceQueryPredicate,
        by: &str,
    ) -> HttpOutcome {
        let config = self.config().current();
        let Some(target) = p.target.as_deref().and_then(|t| config.http_target(t)) else {
            return self.outcome_of(rec);
        };
        for member in p.members.iter().filter(|m| m.outcome == Outcome::Unknown) {
            let member_query = query.for_member(&member.id);
            let probe = self
                .run_source_query(&p.invocation_id, target, &member_query)
                .await;
            let Some(response) = &probe.result else {
                continue;
            };
            let settlement = if member_query.committed_status.contains(&response.status) {
                Reconciled::Committed
            } else if member_query.not_applied_status.contains(&response.status) {
                Reconciled::NotApplied
            } else {
                continue;
            };
            let note = format!(
                "member query {} answered {}",
                probe.invocation_id, response.status
            );
            if let Err(e) = rec.reconcile_member(
                &member.id,
                ConfidenceSource::RemoteQuery,
                settlement,
                by,
                &note,
                Some(response.status),
            ) {
                return self.journal_failed(rec, &e);
            }
        }
        let after = match rec.projection() {
            Ok(p) => p,
            Err(e) => return self.journal_failed(rec, &e),
        };
        let settled = after.members.iter().all(|m| m.outcome != Outcome::Unknown);
        if after.outcome == Outcome::Unknown && settled {
            let applied = after
                .members
                .iter()
                .filter(|m| m.outcome == Outcome::Committed)
                .count();
            let settlement = if applied > 0 {
                Reconciled::Committed
            } else {
                Reconciled::NotApplied
            };
            let note = format!(
                "member queries: {applied} of {} members applied",
                after.members.len()
            );
            if let Err(e) =
                rec.reconcile(ConfidenceSource::RemoteQuery, settlement, by, &note, None)
            {
                return self.journal_failed(rec, &e);
            }
        }
        self.outcome_of(rec)
    }

    /// Runs one source query on the target with its credential, as its own invocation
    /// linked to `for_invocation` (relation `reconcile_query`).
    async fn run_source_query(
        &self,
        for_invocation: &str,
        target: &HttpTarget,
        query: &SourceQueryPredicate,
    ) -> HttpOutcome {
        let base = target.base_url.as_str().trim_end_matches('/');
        let request = HttpRequest {
            url: format!("{base}/{}", query.path.trim_start_matches('/')),
            method: query.method.clone(),
            ..Default::default()
        };
        let ctx = CallContext {
            session: Some(format!("reconcile:{for_invocation}")),
            parent: Some(ParentLink {
                invocation_id: for_invocation.to_string(),
                relation: Relation::ReconcileQuery,
            }),
            ..Default::default()
        };
        match new_invocation_id() {
            Ok(id) => self.execute_query(id, &request, &ctx).await,
            Err(e) => unrecorded(for_invocation, &e),
        }
    }

    /// A broker-initiated query: validated and journaled like any request, but it is the
    /// operator's action, so agent approval policy does not apply.
    async fn execute_query(
        &self,
        id: String,
        request: &HttpRequest,
        ctx: &CallContext,
    ) -> HttpOutcome {
        let rec = match Recorder::accept(
            self.journal(),
            NewInvocation {
                invocation_id: id.clone(),
                channel: events::Channel::Http,
                target: String::new(),
                summary: validate::summary(request),
                session: ctx.session.clone(),
                idempotency_key: None,
                parent: ctx.parent.clone(),
            },
        ) {
            Ok(rec) => rec,
            Err(e) => return unrecorded(&id, &e),
        };
        let config = self.config().current();
        let mut validated = match validate::validate(request, &config) {
            Ok(v) => v,
            Err(v) => {
                // The configured query method may be outside the agent-facing method
                // list; it is the operator's configuration, so only the rest applies.
                if v.code != Code::UnsupportedAction {
                    return self.reject(&rec, &v);
                }
                let as_get = HttpRequest {
                    method: "GET".into(),
                    ..request.clone()
                };
                match validate::validate(&as_get, &config) {
                    Ok(mut v) => {
                        v.plan.request.method = request.method.clone();
                        v.stored.0["method"] = serde_json::Value::String(request.method.clone());
                        v
                    }
                    Err(v) => return self.reject(&rec, &v),
                }
            }
        };
        validated.plan.repeat = Repeat::Idempotent;
        let bound = match self.bind(&rec, validated).await {
            Ok(b) => b,
            Err(outcome) => return *outcome,
        };
        let mut rec = rec;
        self.attempt(&mut rec, &bound, ctx).await
    }
}

/// What the channels whose requests are HTTP requests (this one, and calls through a
/// peer) share.
impl<T> Pipeline<T>
where
    T: Channel<Request = HttpRequest, Result = HttpResponse>,
{
    /// `retry_invocation`: the stored request, retried if the record's decision allows
    /// (through a peer, the peer answers a repeat of this invocation from its record).
    pub async fn retry(&self, invocation_id: &str, ctx: &CallContext) -> HttpOutcome {
        let stored = match self.journal().load_request(invocation_id) {
            Ok(Some(stored)) => stored,
            Ok(None) => {
                return match Recorder::resume(self.journal(), invocation_id) {
                    Ok(rec) => self.outcome_of(&rec),
                    Err(e) => unrecorded(invocation_id, &e),
                };
            }
            Err(e) => return unrecorded(invocation_id, &e),
        };
        let request = stored_request(stored);
        self.retry_request(invocation_id, &request, ctx).await
    }
}

/// The request as the journal kept it (`store_request`): what a retry or a
/// reconciliation sends again, through the HTTP or the peer channel.
pub(crate) fn stored_request((meta, body): (serde_json::Value, Vec<u8>)) -> HttpRequest {
    let pairs = |v: &serde_json::Value| -> Vec<(String, String)> {
        serde_json::from_value(v.clone()).unwrap_or_default()
    };
    HttpRequest {
        url: meta["url"].as_str().unwrap_or_default().to_string(),
        method: meta["method"].as_str().unwrap_or_default().to_string(),
        headers: pairs(&meta["headers"]),
        query: pairs(&meta["query"]),
        body,
        idempotency_key: meta["idempotency_key"].as_str().map(str::to_string),
        timeout_ms: meta["timeout_ms"].as_u64(),
    }
}

/// The stored response of a settled invocation.
pub fn stored_response(stored: &crate::journal::StoredResult) -> Option<HttpResponse> {
    let status = u16::try_from(stored.meta["status"].as_u64()?).ok()?;
    let headers: Vec<(String, String)> =
        serde_json::from_value(stored.meta["headers"].clone()).unwrap_or_default();
    let body = stored
        .streams
        .iter()
        .find(|(n, _)| n == "body")
        .map(|(_, b)| b.clone())?;
    Some(HttpResponse {
        status,
        headers,
        body,
        decoded_from: stored.meta["decoded_from"].as_str().map(str::to_string),
        body_withheld: serde_json::from_value(stored.meta["body_withheld"].clone()).ok(),
    })
}
