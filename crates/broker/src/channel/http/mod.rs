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
//! A channel holds only its hooks. What runs around the pipeline (same-target redirects
//! for targets that opt in, retries by the record's decision, a 202's job and its polls,
//! the configured reconcile query for an unknown outcome) is in
//! [`operations`](crate::operations), as methods on [`HttpChannel`].

mod card;
mod exchange;
mod inject;
pub mod status;
pub mod transport;
mod tunnel;
pub(crate) mod validate;
pub(crate) use validate::check_headers;

use serde::{Deserialize, Serialize};

use crate::action::{NormalizedHttp, percent_encode};
use crate::approvals::ApprovalDetail;
use crate::channel::guard::{AddressPolicy, Resolver};
use crate::channel::redact::Redactor;
use crate::config::{Config, ConfigHandle, HttpTarget, ReconcileQuery};
use crate::contract::{IdempotencyEvidence, RemoteContract};
use crate::invocation::{
    Accepted, Attempt, Bound, CallContext, Channel, Failure, Invalid, Pipeline, Validated,
};
use crate::journal::events::{self, BatchOperation, OperationFacts};
use crate::journal::{Journal, StoredResult};
use crate::retry::SourceQueryPredicate;
use crate::vault::{Secret, Vault};
use status::Repeat;

/// Dispatches an invocation may make in total, across retries and restarts.
const RETRY_BUDGET: u32 = 3;
/// How long building an approval card waits for the host's addresses.
const CARD_LOOKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

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
    /// polls of one submission never track its job twice ([`crate::operations::jobs`]).
    pub(crate) jobs: std::sync::Mutex<()>,
}

/// The target's reconcile query bound to one invocation: `{idempotency_key}` filled in
/// (percent-encoded). `None` when the path needs a key the invocation does not have.
pub(crate) fn source_query(
    query: &ReconcileQuery,
    key: Option<&str>,
) -> Option<SourceQueryPredicate> {
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
pub(crate) fn target_of<'c>(config: &'c Config, method: &str, url: &str) -> Option<&'c HttpTarget> {
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
