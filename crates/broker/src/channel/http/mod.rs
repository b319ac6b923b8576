//! The HTTP channel: an agent's request against a configured target, with the
//! credential injected from the keychain. The [invocation
//! pipeline](crate::invocation::pipeline) runs it; this module holds what is HTTP's own,
//! one file per step:
//!
//! - `validate`: the request checked against the target before anything is touched.
//! - `inject`: the credential put on the wire for one attempt, and the redactor.
//! - `exchange`: connection setup (dns, tcp, tls; each failure recorded, capped
//!   internal retries), the dispatch gate, the response read, scrubbed and committed.
//! - [`transport`]: reqwest with the boundaries made visible.
//! - `tunnel`: the same attempt through a proxy's CONNECT tunnel (hyper on the tunnel).
//! - [`status`]: a complete response → outcome, code, retry.
//!
//! Around the pipeline: same-target redirects for targets that opt in, retries by the
//! record's decision, and the configured reconcile query for an unknown outcome.

mod exchange;
mod inject;
pub mod status;
pub mod transport;
mod tunnel;
mod validate;

use serde::{Deserialize, Serialize};

use crate::action::NormalizedHttp;
use crate::approvals::ApprovalDetail;
use crate::channel::guard::{AddressPolicy, Resolver};
use crate::channel::redact::{Redactor, percent_encode};
use crate::config::{Config, ConfigHandle, HttpTarget};
use crate::contract::{Code, ConfidenceSource, IdempotencyEvidence, Outcome, RemoteContract};
use crate::invocation::outcome::unrecorded;
use crate::invocation::{
    Accepted, Attempt, Bound, CallContext, Channel, Failure, Invalid, Pipeline, Recorder,
    Validated, new_invocation_id,
};
use crate::journal::events::{self, OperationFacts, Settlement as Reconciled};
use crate::journal::{Journal, NewInvocation, StoredResult};
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
    /// The target's `allow_private`, for the approval card's address check.
    allow_private: bool,
    /// The proxy (`host:port`) the target's requests go through, for the approval card.
    proxy: Option<String>,
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
            reconcile_configured: target.is_some_and(|t| t.reconcile.is_some()),
            retry_budget: RETRY_BUDGET,
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
        let detail = ApprovalDetail {
            resolved,
            proxy: p.proxy.clone(),
            method: Some(p.http.method.clone()),
            url: Some(p.http.url()),
            body: (!p.request.body.is_empty())
                .then(|| crate::display::BodyPreview::of(&p.request.body)),
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
            },
            journal,
            vault,
            config,
        )
    }

    /// Runs one agent request as a new invocation, and follows a same-target redirect
    /// when the target opted in.
    pub async fn execute(&self, request: HttpRequest, ctx: &CallContext) -> HttpOutcome {
        self.execute_following(&request, ctx, 0).await
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
        let child = HttpRequest {
            url: next.to_string(),
            method,
            headers: request.headers.clone(),
            query: Vec::new(),
            body,
            idempotency_key: None,
            timeout_ms: request.timeout_ms,
        };
        Box::pin(self.execute_following(&child, ctx, redirects + 1)).await
    }

    /// `retry_invocation`: the stored request, retried if the record's decision allows.
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
        if p.outcome != Outcome::Unknown || !p.terminal {
            return self.recorded_outcome(&rec);
        }
        let config = self.config().current();
        let Some(target) = p.target.as_deref().and_then(|t| config.http_target(t)) else {
            return self.outcome_of(&rec);
        };
        let Some(query) = &target.reconcile else {
            return self.outcome_of(&rec);
        };
        let key = p
            .operation
            .as_ref()
            .and_then(|o| o.idempotency.as_ref())
            .map(|i| i.key.clone());
        let path = match (&key, query.path.contains("{idempotency_key}")) {
            (Some(k), true) => query
                .path
                .replace("{idempotency_key}", &percent_encode(k.as_bytes())),
            (None, true) => return self.outcome_of(&rec),
            (_, false) => query.path.clone(),
        };
        let base = target.base_url.as_str().trim_end_matches('/');
        let request = HttpRequest {
            url: format!("{base}/{}", path.trim_start_matches('/')),
            method: query.method.clone(),
            ..Default::default()
        };
        let ctx = CallContext {
            session: Some(format!("reconcile:{invocation_id}")),
            ..Default::default()
        };
        let probe = match new_invocation_id() {
            Ok(id) => self.execute_query(id, &request, &ctx).await,
            Err(e) => return unrecorded(invocation_id, &e),
        };
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
        let bound = match self.bind(&rec, validated) {
            Ok(b) => b,
            Err(outcome) => return *outcome,
        };
        let mut rec = rec;
        self.attempt(&mut rec, &bound, ctx).await
    }
}

fn stored_request((meta, body): (serde_json::Value, Vec<u8>)) -> HttpRequest {
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
