//! The HTTP channel: an agent's request against a configured target, with the
//! credential injected from the keychain, classified by the last boundary the records
//! prove (seed 000, "Connection setup needs a precise endpoint" through "Idempotency is
//! a remote contract").
//!
//! The order of one call: accept → validate (nothing touched yet) → bind the snapshot
//! and fingerprint → approval → read the credential → lease an attempt → connection
//! setup (dns, tcp, tls; each failure recorded, capped internal retries) →
//! DISPATCH_STARTED (fsynced, fingerprint re-verified against the live config) → send →
//! response → store the settled result (fsynced) → return.
//!
//! - [`transport`]: reqwest with the boundaries made visible.
//! - [`status`]: complete response → outcome, code, retry.

pub mod status;
pub mod transport;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rustls::client::WebPkiServerVerifier;
use serde::{Deserialize, Serialize};

use super::redact::{Redactor, percent_encode};
use super::{
    ApprovalRequest, ApprovalStop, CallContext, ConfigHandle, Credentials, unrecorded_failure,
};
use crate::action::{ConfigSnapshot, Fingerprint, NormalizedAction, NormalizedHttp};
use crate::config::{ApprovalMode, HttpTarget, Injection};
use crate::contract::{
    Code, ConfidenceSource, Envelope, IdempotencyEvidence, Outcome, Phase, RemoteContract, Retry,
};
use crate::invocation::{Exchange, Recorder, RetryPlan, StepError, new_invocation_id};
use crate::journal::events::{Channel, OperationFacts, ResultFacts, Settlement as Reconciled};
use crate::journal::projection::Projection;
use crate::journal::{Journal, JournalError, NewInvocation, ResultToStore, Settle};
use crate::retry::{Decision, RetryRequest};
use status::Repeat;
use transport::{
    Decoded, DispatchLayer, GateVerdict, MarkingBody, Probe, RecordingResolver, RecordingVerifier,
};

/// Headers only the broker may set: credentials, routing and framing (RFC 9112 §6), and
/// `accept-encoding`: the broker asks for `identity` and decodes whatever still arrives
/// encoded itself, because a body it cannot decode is a body it cannot scrub.
const FORBIDDEN_HEADERS: &[&str] = &[
    "accept-encoding",
    "authorization",
    "proxy-authorization",
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "te",
    "upgrade",
    "keep-alive",
    "proxy-connection",
    "expect",
];
/// Hop-by-hop headers never returned to the caller (RFC 9110 §7.6.1).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
];
const MAX_HEADER_BYTES: usize = 64 * 1024;
const MAX_HEADERS: usize = 100;
/// The longest request URL the channel sends, query included. RFC 9110 §4.1 recommends
/// that senders and recipients support URIs of at least 8000 octets; longer ones are
/// refused by many servers and proxies (414), and past 64 KiB the HTTP stack cannot
/// even build the request line.
const MAX_URL_BYTES: usize = 8 * 1024;
/// Query parameters per request, from the URL and the `query` argument together. The
/// URL limit bounds their bytes; this bounds the work done before it is applied.
const MAX_QUERY_PAIRS: usize = 1024;
/// The longest idempotency key a caller may choose. It travels as a header value and in
/// the reconcile query's URL, and is stored with every record of the invocation.
const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;
/// Connection-setup attempts per invocation attempt (seed 000: "cap the attempts").
const MAX_SETUP_ATTEMPTS: u32 = 2;
/// Dispatches an invocation may make in total, across retries and restarts.
const RETRY_BUDGET: u32 = 3;
/// How long a redirect chain the channel follows for a target that opted in.
const MAX_REDIRECTS: u32 = 5;

/// What an agent asks for (DESIGN.md, `http_request`).
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

/// What a call produced: a settled response (which may still carry an error code, a
/// 500 for instance), or an envelope saying what the records prove.
#[derive(Debug, Clone)]
pub struct HttpOutcome {
    pub invocation_id: String,
    pub outcome: Outcome,
    pub response: Option<HttpResponse>,
    /// Present when the record carries a code.
    pub error: Option<Envelope>,
    /// For a retry: the manifest the decision was recorded with.
    pub manifest: Option<crate::retry::RetryManifest>,
}

/// What the HTTP channel needs from the broker.
#[derive(Clone)]
pub struct HttpChannel {
    inner: Arc<Shared>,
}

struct Shared {
    journal: Journal,
    credentials: Arc<Credentials>,
    config: ConfigHandle,
    /// Lease holder name of this broker process.
    holder: String,
    /// Verifiers per (target, ca_file): loading system roots costs milliseconds.
    verifiers: Mutex<HashMap<String, Arc<WebPkiServerVerifier>>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

/// Everything bound at preflight that an attempt needs.
#[derive(Clone)]
struct Prepared {
    target: String,
    action: NormalizedHttp,
    snapshot: ConfigSnapshot,
    fingerprint: String,
    request: HttpRequest,
    idempotency_key: Option<String>,
    timeout: Duration,
    repeat: Repeat,
}

/// Why a request is refused before anything is touched.
struct Invalid {
    code: Code,
    field: String,
    message: String,
}

fn invalid(code: Code, field: impl Into<String>, message: impl Into<String>) -> Invalid {
    Invalid {
        code,
        field: field.into(),
        message: message.into(),
    }
}

/// Limits that need no parsing: a huge URL or query list is refused before any work.
fn check_sizes_before_parsing(request: &HttpRequest) -> Result<(), Invalid> {
    if request.url.len() > MAX_URL_BYTES {
        return Err(invalid(
            Code::PayloadLimit,
            "url",
            format!("The URL is limited to {MAX_URL_BYTES} bytes."),
        ));
    }
    if request.query.len() > MAX_QUERY_PAIRS {
        return Err(invalid(
            Code::PayloadLimit,
            "query",
            format!("A request is limited to {MAX_QUERY_PAIRS} query parameters."),
        ));
    }
    Ok(())
}

/// The URL as it goes on the wire (the `query` pairs encoded and appended) stays within
/// the limits; the field is the part the caller should shorten.
fn check_assembled_url(request: &HttpRequest, action: &NormalizedHttp) -> Result<(), Invalid> {
    let field = if request.query.is_empty() {
        "url"
    } else {
        "query"
    };
    if action.query.len() > MAX_QUERY_PAIRS {
        return Err(invalid(
            Code::PayloadLimit,
            field,
            format!("A request is limited to {MAX_QUERY_PAIRS} query parameters."),
        ));
    }
    if action.url().len() > MAX_URL_BYTES {
        return Err(invalid(
            Code::PayloadLimit,
            field,
            format!(
                "The URL with its query parameters, percent-encoded, is limited to {MAX_URL_BYTES} bytes."
            ),
        ));
    }
    Ok(())
}

/// A caller-chosen key: sent as a header value (RFC 9110 §5.5) and compared byte for
/// byte, so visible ASCII only, no whitespace, and bounded.
fn check_idempotency_key(key: &str) -> Result<(), Invalid> {
    if key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
        return Err(invalid(
            Code::PayloadLimit,
            "idempotency_key",
            format!("An idempotency key is limited to {MAX_IDEMPOTENCY_KEY_BYTES} bytes."),
        ));
    }
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(
            Code::InvalidRequest,
            "idempotency_key",
            "An idempotency key must be visible ASCII (0x21-0x7E): no spaces, control characters (CR, LF, NUL, ...) or non-ASCII.",
        ));
    }
    Ok(())
}

/// On a target that injects the credential as query parameter `param`, refuses every
/// caller parameter a server could read as that same parameter: the name compared after
/// percent-decoding (`+` as space), trimming whitespace, ASCII case folding, cutting an
/// array suffix (`token[]`, `token[0]`, `token%5B%5D`) and reading `.` and inner spaces
/// as `_` (PHP does). Pieces after a `;` count as parameters too, as some servers split
/// on it.
fn check_query_pollution(
    request: &HttpRequest,
    action: &NormalizedHttp,
    param: &str,
) -> Result<(), Invalid> {
    let wanted = query_name_key(param.as_bytes());
    // `action.query` is the URL's own pairs followed by the `query` argument's.
    let from_url = action.query.len().saturating_sub(request.query.len());
    for (j, (name, value)) in action.query.iter().enumerate() {
        let pair = format!("{name}={value}");
        let polluted = pair.split(';').any(|piece| {
            let name = piece.split_once('=').map_or(piece, |(k, _)| k);
            query_name_key(&percent_decode(name)) == wanted
        });
        if polluted {
            let field = if j < from_url {
                "url".to_string()
            } else {
                format!("query[{}].name", j - from_url)
            };
            return Err(invalid(
                Code::InvalidRequest,
                field,
                format!(
                    "The query parameter {param} carries the credential and is set by the broker; no caller parameter may resemble it."
                ),
            ));
        }
    }
    Ok(())
}

/// The name a lenient server would file a query parameter under: anything from the
/// first `[` on removed, whitespace trimmed, ASCII lowercase, `.` and spaces as `_`.
fn query_name_key(decoded: &[u8]) -> Vec<u8> {
    let base = decoded
        .iter()
        .position(|&b| b == b'[')
        .map_or(decoded, |i| &decoded[..i]);
    base.trim_ascii()
        .iter()
        .map(|&b| match b {
            b'.' | b' ' => b'_',
            other => other.to_ascii_lowercase(),
        })
        .collect()
}

/// application/x-www-form-urlencoded decoding of a name: `%XX` escapes and `+` as space;
/// a malformed escape stays as it is.
fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |k: usize| b.get(k).and_then(|&h| char::from(h).to_digit(16));
        match (b[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'%'));
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

impl HttpChannel {
    pub fn new(journal: Journal, credentials: Arc<Credentials>, config: ConfigHandle) -> Self {
        HttpChannel {
            inner: Arc::new(Shared {
                journal,
                credentials,
                config,
                holder: format!("pid-{}", std::process::id()),
                verifiers: Mutex::new(HashMap::new()),
                provider: Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
            }),
        }
    }

    pub fn journal(&self) -> &Journal {
        &self.inner.journal
    }

    /// Runs one agent request as a new invocation.
    pub async fn execute(&self, request: HttpRequest, ctx: &CallContext) -> HttpOutcome {
        let id = match new_invocation_id() {
            Ok(id) => id,
            Err(e) => return self.unrecorded("inv_unassigned", &e),
        };
        self.execute_as(id, request, ctx, 0).await
    }

    fn unrecorded(&self, id: &str, e: &JournalError) -> HttpOutcome {
        let env = unrecorded_failure(id, e);
        HttpOutcome {
            invocation_id: id.to_string(),
            outcome: env.error.outcome,
            response: None,
            error: Some(env),
            manifest: None,
        }
    }

    fn outcome_of(&self, rec: &Recorder) -> HttpOutcome {
        match rec.projection() {
            Ok(p) => self.outcome_of_projection(&p),
            Err(e) => self.unrecorded(rec.id(), &e),
        }
    }

    fn outcome_of_projection(&self, p: &Projection) -> HttpOutcome {
        HttpOutcome {
            invocation_id: p.invocation_id.clone(),
            outcome: p.outcome,
            response: None,
            error: p.envelope(self.inner.journal.now_ms()),
            manifest: None,
        }
    }

    fn stopped(&self, rec: &Recorder, e: StepError) -> HttpOutcome {
        match e {
            StepError::Stopped(env) => HttpOutcome {
                invocation_id: rec.id().to_string(),
                outcome: env.error.outcome,
                response: None,
                error: Some(*env),
                manifest: None,
            },
            StepError::Journal(e) => self.journal_failed(rec, &e),
        }
    }

    /// The journal failed mid-invocation. If dispatch was recorded the remote may have
    /// acted; otherwise nothing was sent.
    fn journal_failed(&self, rec: &Recorder, e: &JournalError) -> HttpOutcome {
        let envelope = super::journal_failure(rec, e, self.inner.journal.now_ms());
        HttpOutcome {
            invocation_id: rec.id().to_string(),
            outcome: envelope.error.outcome,
            response: None,
            error: Some(envelope),
            manifest: None,
        }
    }

    fn fail(
        &self,
        rec: &Recorder,
        phase: Phase,
        code: Code,
        retry: Retry,
        message: &str,
        field: Option<&str>,
    ) -> HttpOutcome {
        match rec.fail_field(phase, code, retry, message, field) {
            Ok(appended) => self.outcome_of_projection(&appended.projection),
            Err(e) => self.journal_failed(rec, &e),
        }
    }

    /// Records a validation failure (nothing touched, nothing sent).
    fn reject(&self, rec: &Recorder, v: &Invalid) -> HttpOutcome {
        self.fail(
            rec,
            Phase::Validation,
            v.code,
            Retry::AfterCorrection,
            &v.message,
            Some(&v.field),
        )
    }

    async fn execute_as(
        &self,
        id: String,
        request: HttpRequest,
        ctx: &CallContext,
        redirects: u32,
    ) -> HttpOutcome {
        let config = self.inner.config.current();
        let target = NormalizedHttp::new(&request.method, &request.url, &[], &[], &[])
            .ok()
            .and_then(|a| {
                config
                    .resolve_normalized_http(&a)
                    .ok()
                    .map(|t| t.name.clone())
            });
        // Pipelined: the preflight below waits, and fails if acceptance did.
        let rec = match Recorder::accept_pipelined(
            &self.inner.journal,
            NewInvocation {
                invocation_id: id.clone(),
                channel: Channel::Http,
                target: target.clone().unwrap_or_default(),
                summary: summary(&request),
                session: ctx.session.clone(),
                idempotency_key: request.idempotency_key.clone(),
            },
        ) {
            Ok(rec) => rec,
            Err(e) => return self.unrecorded(&id, &e),
        };
        let prepared = match self.validate(&request) {
            Ok(p) => p,
            Err(v) => {
                return self.reject(&rec, &v);
            }
        };
        let prepared = match self.bind(&rec, prepared).await {
            Ok(p) => p,
            Err(outcome) => return *outcome,
        };
        if let Err(outcome) = self.approve(&rec, &prepared, ctx).await {
            return *outcome;
        }
        let mut rec = rec;
        let outcome = self.run_attempt(&mut rec, &prepared, ctx).await;
        self.follow_redirect(outcome, &prepared, ctx, redirects)
            .await
    }

    /// Everything that can be checked before a secret is touched or a socket opened.
    fn validate(&self, request: &HttpRequest) -> Result<Prepared, Invalid> {
        let config = self.inner.config.current();
        check_sizes_before_parsing(request)?;
        let action = NormalizedHttp::new(
            &request.method,
            &request.url,
            &request.headers,
            &request.query,
            &request.body,
        )
        .map_err(|e| invalid(e.code, e.field.clone(), e.message.clone()))?;
        check_assembled_url(request, &action)?;
        let target = config.resolve_normalized_http(&action).map_err(|_| {
            invalid(
                Code::InvalidTarget,
                "url",
                "The URL does not fall under a configured target.",
            )
        })?;
        if !target.methods.contains(&action.method) {
            return Err(invalid(
                Code::UnsupportedAction,
                "method",
                format!(
                    "{} is not allowed for target {}.",
                    action.method, target.name
                ),
            ));
        }
        let injection_header = match &target.inject {
            Injection::Header { name, .. } => Some(name.as_str()),
            _ => None,
        };
        let idempotency_header = target.idempotency.as_ref().map(|c| c.header.as_str());
        let mut header_bytes = 0usize;
        for (i, (name, value)) in request.headers.iter().enumerate() {
            let lower = name.to_ascii_lowercase();
            if FORBIDDEN_HEADERS.contains(&lower.as_str())
                || Some(lower.as_str()) == injection_header
                || Some(lower.as_str()) == idempotency_header
            {
                return Err(invalid(
                    Code::ForbiddenHeader,
                    format!("headers[{i}].name"),
                    if lower == "accept-encoding" {
                        "The header accept-encoding is set by the broker, not the caller: it asks for identity and decodes gzip and deflate itself, so what it returns can be scrubbed.".to_string()
                    } else {
                        format!("The header {lower} is set by the broker, not the caller.")
                    },
                ));
            }
            // What the HTTP stack accepts, checked here so that nothing the caller sent
            // can fail later, after the credential was read.
            if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(invalid(
                    Code::InvalidRequest,
                    format!("headers[{i}].name"),
                    "Not a valid HTTP field name (RFC 9110 §5.1).",
                ));
            }
            if reqwest::header::HeaderValue::from_str(value).is_err() {
                return Err(invalid(
                    Code::InvalidRequest,
                    format!("headers[{i}].value"),
                    "Not a valid HTTP field value: control characters (CR, LF, NUL, ...) are not allowed (RFC 9110 §5.5).",
                ));
            }
            header_bytes += name.len() + value.len();
        }
        if request.headers.len() > MAX_HEADERS || header_bytes > MAX_HEADER_BYTES {
            return Err(invalid(
                Code::PayloadLimit,
                "headers",
                format!(
                    "Headers are limited to {MAX_HEADERS} entries and {MAX_HEADER_BYTES} bytes."
                ),
            ));
        }
        if let Injection::Query { param } = &target.inject {
            check_query_pollution(request, &action, param)?;
        }
        if request.body.len() as u64 > target.max_request_body_bytes {
            return Err(invalid(
                Code::PayloadLimit,
                "body",
                format!(
                    "The body exceeds this target's limit of {} bytes.",
                    target.max_request_body_bytes
                ),
            ));
        }
        if let Some(key) = &request.idempotency_key {
            check_idempotency_key(key)?;
        }
        if request.timeout_ms == Some(0) {
            return Err(invalid(
                Code::InvalidRequest,
                "timeout_ms",
                "timeout_ms must be at least 1 (omit it to use the target's timeout).",
            ));
        }
        let idempotent = target.idempotent_methods.contains(&action.method);
        // With a configured contract, a non-idempotent request always carries a key: one
        // the caller chose, or one the broker makes and keeps for retries.
        let idempotency_key = match (&request.idempotency_key, &target.idempotency) {
            (Some(k), _) => Some(k.clone()),
            (None, Some(_)) if !idempotent => Some(generated_key()),
            _ => None,
        };
        let repeat = if idempotent {
            Repeat::Idempotent
        } else if target.idempotency.is_some() && idempotency_key.is_some() {
            Repeat::SameKey
        } else {
            Repeat::Unsafe
        };
        let timeout_ms = request
            .timeout_ms
            .map_or(target.timeout_ms, |t| t.min(target.timeout_ms));
        Ok(Prepared {
            target: target.name.clone(),
            action,
            // Bound properly in `bind`, once the credential version is known.
            snapshot: ConfigSnapshot::for_http(target, "", idempotency_key.clone()),
            fingerprint: String::new(),
            request: request.clone(),
            idempotency_key,
            timeout: Duration::from_millis(timeout_ms.max(1)),
            repeat,
        })
    }

    /// Binds the configuration snapshot and fingerprint (PREFLIGHT_VALIDATED).
    async fn bind(&self, rec: &Recorder, mut p: Prepared) -> Result<Prepared, Box<HttpOutcome>> {
        let config = self.inner.config.current();
        let Some(target) = config.http_target(&p.target) else {
            return Err(Box::new(self.fail(
                rec,
                Phase::Validation,
                Code::InvalidTarget,
                Retry::AfterCorrection,
                "The target disappeared from the configuration.",
                Some("url"),
            )));
        };
        // An indexed read of non-secret metadata: microseconds, fine inline.
        let meta = match self.inner.credentials.meta(target.credential.as_str()) {
            Ok(meta) => meta,
            Err(e) => {
                return Err(Box::new(self.fail(
                    rec,
                    Phase::CredentialInjection,
                    e.code(),
                    e.code().spec().retry,
                    &e.to_string(),
                    None,
                )));
            }
        };
        p.snapshot =
            ConfigSnapshot::for_http(target, meta.version.as_str(), p.idempotency_key.clone());
        p.fingerprint =
            Fingerprint::compute(&NormalizedAction::Http(p.action.clone()), &p.snapshot)
                .to_string();
        let now = self.inner.journal.now_ms();
        let contract = target.idempotency.as_ref();
        let remote_contract = if contract.is_some() {
            RemoteContract::Configured
        } else {
            RemoteContract::None
        };
        let operation = OperationFacts {
            idempotent: p.repeat == Repeat::Idempotent,
            remote_contract,
            idempotency: p.idempotency_key.as_ref().map(|key| IdempotencyEvidence {
                key: key.clone(),
                scope: contract.map(|c| c.scope.clone()),
                fingerprint: p.fingerprint.clone(),
                remote_contract,
                expires_at_ms: contract.map(|c| {
                    now.saturating_add(i64::try_from(c.retention.as_millis()).unwrap_or(i64::MAX))
                }),
            }),
            reconcile_configured: target.reconcile.is_some(),
            retry_budget: RETRY_BUDGET,
        };
        if let Err(e) = rec.preflight(&p.fingerprint, p.snapshot.clone(), operation) {
            return Err(Box::new(self.stopped(rec, e)));
        }
        let meta = serde_json::json!({
            "method": p.request.method,
            "url": p.request.url,
            "headers": p.request.headers,
            "query": p.request.query,
            "idempotency_key": p.idempotency_key,
            "timeout_ms": p.request.timeout_ms,
        });
        if let Err(e) = self
            .inner
            .journal
            .store_request(rec.id(), meta, p.request.body.clone())
        {
            return Err(Box::new(self.journal_failed(rec, &e)));
        }
        Ok(p)
    }

    async fn approve(
        &self,
        rec: &Recorder,
        p: &Prepared,
        ctx: &CallContext,
    ) -> Result<(), Box<HttpOutcome>> {
        let config = self.inner.config.current();
        let mode = config
            .http_target(&p.target)
            .map(|t| t.approval)
            .unwrap_or(ApprovalMode::None);
        let request = ApprovalRequest {
            idempotency_key: p.idempotency_key.clone(),
            ..ApprovalRequest::bound(
                rec.id(),
                ctx,
                summary(&p.request),
                p.fingerprint.clone(),
                &p.snapshot,
                super::ApprovalDetail {
                    method: Some(p.action.method.clone()),
                    url: Some(p.action.url()),
                    body: (!p.request.body.is_empty())
                        .then(|| crate::display::BodyPreview::of(&p.request.body)),
                    ..Default::default()
                },
            )
        };
        super::seek_approval(rec, mode, request, ctx)
            .await
            .map_err(|stop| {
                Box::new(match stop {
                    ApprovalStop::Step(e) => self.stopped(rec, e),
                    ApprovalStop::Journal(e) => self.journal_failed(rec, &e),
                    ApprovalStop::Failed { code, message } => self.fail(
                        rec,
                        Phase::CredentialInjection,
                        code,
                        Retry::AfterCorrection,
                        message,
                        None,
                    ),
                })
            })
    }

    fn verifier(&self, target: &HttpTarget) -> Result<Arc<WebPkiServerVerifier>, String> {
        let key = format!("{}|{:?}", target.name, target.ca_file);
        if let Ok(cache) = self.inner.verifiers.lock()
            && let Some(v) = cache.get(&key)
        {
            return Ok(v.clone());
        }
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for cert in native.certs {
            // A malformed system certificate is skipped, as every TLS client does.
            let _ = roots.add(cert);
        }
        if let Some(path) = &target.ca_file {
            use rustls::pki_types::pem::PemObject;
            let certs = rustls::pki_types::CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("ca_file {}: {e}", path.display()))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("ca_file {}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("ca_file {}: {e}", path.display()))?;
            }
        }
        let verifier = WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            self.inner.provider.clone(),
        )
        .build()
        .map_err(|e| format!("trust roots: {e}"))?;
        if let Ok(mut cache) = self.inner.verifiers.lock() {
            cache.insert(key, verifier.clone());
        }
        Ok(verifier)
    }

    /// Injects the credential and runs one attempt (with capped connection-setup
    /// retries) up to a stored result or a recorded failure.
    async fn run_attempt(
        &self,
        rec: &mut Recorder,
        p: &Prepared,
        ctx: &CallContext,
    ) -> HttpOutcome {
        let config = self.inner.config.current();
        let Some(target) = config.http_target(&p.target).cloned() else {
            return self.fail(
                rec,
                Phase::Validation,
                Code::FingerprintMismatch,
                Retry::AfterCorrection,
                "The target changed after this request was bound; nothing was sent.",
                None,
            );
        };
        // The credential: the only place secret bytes leave the keychain.
        let now = self.inner.journal.now_ms();
        let (meta, secret) =
            match super::read_bound_credential(&self.inner.credentials, &p.snapshot, now).await {
                Ok(pair) => pair,
                Err(f) => return self.fail(rec, f.phase, f.code, f.retry, &f.message, None),
            };
        let ttl = i64::try_from(p.timeout.as_millis())
            .unwrap_or(i64::MAX)
            .saturating_add(30_000);
        let authorized = rec.authorize_and_start(
            &p.snapshot.credential_id,
            meta.version.as_str(),
            &self.inner.holder,
            ttl,
        );
        if let Err(e) = authorized {
            return self.journal_failed(rec, &e);
        }

        // Build what goes on the wire. Rendered credential forms feed the redactor.
        let mut url = p.action.url();
        let mut headers: Vec<(String, String)> = p.request.headers.clone();
        // The broker owns the coding: what it cannot decode it cannot scrub.
        headers.push(("accept-encoding".into(), "identity".into()));
        let secret_text = String::from_utf8_lossy(secret.expose()).into_owned();
        let mut rendered: Vec<Vec<u8>> = Vec::new();
        match &target.inject {
            Injection::Header { name, format } => {
                let value = format.replace("{secret}", &secret_text);
                rendered.push(value.clone().into_bytes());
                headers.push((name.clone(), value));
            }
            Injection::Basic { user } => {
                use base64::Engine;
                let pair = format!("{user}:{secret_text}");
                let value = format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair.as_bytes())
                );
                rendered.push(pair.into_bytes());
                rendered.push(value.clone().into_bytes());
                headers.push(("authorization".into(), value));
            }
            Injection::Query { param } => {
                let sep = if url.contains('?') { '&' } else { '?' };
                url = format!(
                    "{url}{sep}{}={}",
                    percent_encode(param.as_bytes()),
                    percent_encode(secret.expose())
                );
            }
        }
        if let (Some(contract), Some(key)) = (&target.idempotency, &p.idempotency_key) {
            headers.push((contract.header.clone(), key.clone()));
        }
        let rendered_refs: Vec<&[u8]> = rendered.iter().map(Vec::as_slice).collect();
        let redactor = Redactor::new(secret.expose(), &rendered_refs);
        drop(secret_text);

        let https = p.action.scheme == "https";
        // The local TLS setup (trust roots, ca_file) failed: nothing was sent.
        let tls_setup_failed = |message: String| {
            self.fail(
                rec,
                Phase::ConnectionSetup,
                Code::TlsRejected,
                Retry::AfterCorrection,
                &message,
                None,
            )
        };
        let verifier = if https {
            match self.verifier(&target) {
                Ok(v) => Some(v),
                Err(message) => return tls_setup_failed(message),
            }
        } else {
            None
        };

        for n in 1..=MAX_SETUP_ATTEMPTS {
            let probe = Arc::new(Probe::default());
            let gate_error: Arc<Mutex<Option<StepError>>> = Arc::new(Mutex::new(None));
            let connection_id = format!("{}/g{}/c{n}", rec.id(), rec.generation());
            let client = match self.client(
                &probe,
                verifier.clone(),
                rec,
                p,
                gate_error.clone(),
                connection_id,
            ) {
                Ok(c) => c,
                Err(message) => return tls_setup_failed(message),
            };
            let method = match reqwest::Method::from_bytes(p.action.method.as_bytes()) {
                Ok(m) => m,
                Err(_) => {
                    return self.fail(
                        rec,
                        Phase::Validation,
                        Code::InvalidRequest,
                        Retry::AfterCorrection,
                        "The method is not a valid token.",
                        Some("method"),
                    );
                }
            };
            let mut builder = client.request(method, &url);
            for (name, value) in &headers {
                builder = builder.header(name.as_str(), value.as_str());
            }
            let body = MarkingBody::new(Bytes::from(p.request.body.clone()), probe.clone());
            let exchange = async {
                let response = builder.body(reqwest::Body::wrap(body)).send().await?;
                Ok::<_, reqwest::Error>(response)
            };
            let deadline = tokio::time::sleep(p.timeout);
            tokio::pin!(deadline);
            let sent = tokio::select! {
                r = exchange => Ok(r),
                () = &mut deadline => Err(Code::RemoteTimeout),
                () = ctx.cancel.cancelled() => Err(Code::CallerCancelled),
            };
            let dispatched = probe.gate() == Some(GateVerdict::Dispatched);
            let response = match sent {
                Ok(Ok(response)) => response,
                Ok(Err(error)) => {
                    if dispatched {
                        self.mark_request(rec, &probe);
                        return self.fail(rec, Phase::RemoteExecution, Code::RemoteOutcomeUnknown, Retry::Reconcile,
                            "The connection failed after dispatch and before a complete response; the remote may have acted.", None);
                    }
                    if probe.gate() == Some(GateVerdict::Refused) {
                        return match gate_error.lock().ok().and_then(|mut g| g.take()) {
                            Some(e) => self.stopped(rec, e),
                            None => self.outcome_of(rec),
                        };
                    }
                    // The HTTP stack refused to build the request (a header value or the
                    // URL it cannot put on the wire): no connection was tried, and waiting
                    // will not change the request.
                    if error.is_builder() {
                        return self.fail(
                            rec,
                            Phase::Validation,
                            Code::InvalidRequest,
                            Retry::AfterCorrection,
                            "The request could not be built: a header value or the URL is not valid on the wire; nothing was sent.",
                            None,
                        );
                    }
                    let (io_kind, tls) = transport::error_chain_facts(&error);
                    let (stage, code) = probe.setup_failure(https, io_kind, tls);
                    if let Err(e) = rec.connection_attempt(n, stage, code) {
                        return self.journal_failed(rec, &e);
                    }
                    if code.spec().retry == Retry::Backoff && n < MAX_SETUP_ATTEMPTS {
                        continue;
                    }
                    let reason = match probe.tls() {
                        Some(transport::TlsVerdict::Rejected { reason }) => {
                            format!(" (certificate {reason})")
                        }
                        _ => String::new(),
                    };
                    let message = format!("{}{reason}", code.spec().meaning);
                    return self.fail(
                        rec,
                        Phase::ConnectionSetup,
                        code,
                        code.spec().retry,
                        &message,
                        None,
                    );
                }
                Err(code) => {
                    if dispatched {
                        self.mark_request(rec, &probe);
                        let message = if code == Code::CallerCancelled {
                            "The caller cancelled after dispatch; the remote may still be running."
                        } else {
                            "No complete response arrived in time after dispatch; the remote may still be running."
                        };
                        return self.fail(
                            rec,
                            Phase::RemoteExecution,
                            code,
                            Retry::Reconcile,
                            message,
                            None,
                        );
                    }
                    let (stage, setup_code) = if code == Code::RemoteTimeout {
                        let stage = if probe.tls().is_some() || (probe.connected() && https) {
                            crate::contract::Stage::TlsHandshake
                        } else if probe.dns().is_none()
                            && p.action.host.parse::<std::net::IpAddr>().is_err()
                        {
                            crate::contract::Stage::Dns
                        } else {
                            crate::contract::Stage::TcpConnect
                        };
                        (stage, Code::ConnectTimeout)
                    } else {
                        (crate::contract::Stage::TcpConnect, Code::CallerCancelled)
                    };
                    if setup_code == Code::ConnectTimeout {
                        let _ = rec.connection_attempt(n, stage, setup_code);
                    }
                    let message = if setup_code == Code::CallerCancelled {
                        "The caller cancelled before dispatch; nothing was sent."
                    } else {
                        "Connection setup did not finish in time; nothing was sent."
                    };
                    return self.fail(
                        rec,
                        Phase::ConnectionSetup,
                        setup_code,
                        Retry::Backoff,
                        message,
                        None,
                    );
                }
            };
            return self
                .read_response(rec, p, &target, response, &probe, &redactor, ctx)
                .await;
        }
        self.outcome_of(rec)
    }

    fn mark_request(&self, rec: &Recorder, probe: &Probe) {
        // Markers are diagnosis, not proof (seed 000); a failure to record them must not
        // hide the failure being reported.
        if probe.headers_taken() || probe.body_taken() {
            let _ = rec.request_sent(probe.headers_taken(), probe.body_taken());
        }
    }

    fn client(
        &self,
        probe: &Arc<Probe>,
        verifier: Option<Arc<WebPkiServerVerifier>>,
        rec: &Recorder,
        p: &Prepared,
        gate_error: Arc<Mutex<Option<StepError>>>,
        connection_id: String,
    ) -> Result<reqwest::Client, String> {
        let gate_rec = rec.clone();
        let config = self.inner.config.clone();
        let target_name = p.target.clone();
        let action = p.action.clone();
        let bound = p.snapshot.clone();
        let gate_probe = probe.clone();
        let gate: transport::Gate = Arc::new(move || {
            let rec = gate_rec.clone();
            let config = config.clone();
            let target_name = target_name.clone();
            let action = action.clone();
            let bound = bound.clone();
            let gate_error = gate_error.clone();
            let probe = gate_probe.clone();
            let connection_id = connection_id.clone();
            Box::pin(async move {
                // Re-verify against the live configuration: a reload that changed the
                // target changes the fingerprint, and nothing is sent.
                let current = config.current();
                let fingerprint_now = match current.http_target(&target_name) {
                    Some(t) => {
                        let snapshot = ConfigSnapshot::for_http(
                            t,
                            bound.credential_version.clone(),
                            bound.idempotency_key.clone(),
                        );
                        Fingerprint::compute(&NormalizedAction::Http(action), &snapshot).to_string()
                    }
                    None => String::from("target-removed"),
                };
                let peer = match probe.tls() {
                    Some(transport::TlsVerdict::Verified { peer }) => Some(peer),
                    _ => None,
                };
                let result = tokio::task::spawn_blocking(move || {
                    rec.dispatch_started(&fingerprint_now, Some(connection_id), peer)
                })
                .await;
                match result {
                    Ok(Ok(_)) => true,
                    Ok(Err(e)) => {
                        if let Ok(mut slot) = gate_error.lock() {
                            *slot = Some(e);
                        }
                        false
                    }
                    Err(_) => false,
                }
            })
        });
        let builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never())
            .no_proxy()
            .pool_max_idle_per_host(0)
            .http1_only()
            .dns_resolver(Arc::new(RecordingResolver {
                probe: probe.clone(),
            }))
            .connector_layer(DispatchLayer {
                probe: probe.clone(),
                gate,
            });
        // Always hand reqwest a prepared TLS config: building its default one loads the
        // platform's roots on every client (milliseconds per request).
        let base = rustls::ClientConfig::builder_with_provider(self.inner.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e}"))?;
        let tls = match verifier {
            Some(inner) => base
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(RecordingVerifier {
                    inner,
                    probe: probe.clone(),
                }))
                .with_no_client_auth(),
            // Plain http (loopback only): TLS is never used, so trust nothing.
            None => base
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        };
        builder
            .tls_backend_preconfigured(tls)
            .build()
            .map_err(|e| format!("HTTP client setup: {e}"))
    }

    #[allow(clippy::too_many_arguments)]
    async fn read_response(
        &self,
        rec: &Recorder,
        p: &Prepared,
        target: &HttpTarget,
        mut response: reqwest::Response,
        probe: &Probe,
        redactor: &Redactor,
        ctx: &CallContext,
    ) -> HttpOutcome {
        let status = response.status().as_u16();
        // Recorded in the journal as it arrives: scrubbed like every other header.
        let request_id = header(&response, "x-request-id").map(|v| redactor.scrub_str(&v).0);
        // On the success path the markers go in with the result, in one transaction; a
        // failure while the body arrives records them first.
        let head = || {
            self.mark_request(rec, probe);
            let _ = rec.response_started(Some(status), request_id.clone());
        };
        // What arrived is not a result: recorded as incomplete, never returned.
        let incomplete = |message: String| {
            head();
            self.fail(
                rec,
                Phase::RemoteExecution,
                Code::RemoteResultIncomplete,
                Retry::Reconcile,
                &message,
                None,
            )
        };
        let limit = target.max_response_bytes;
        let mut body: Vec<u8> = Vec::new();
        let deadline = tokio::time::sleep(p.timeout);
        tokio::pin!(deadline);
        loop {
            let chunk = tokio::select! {
                c = response.chunk() => c,
                () = &mut deadline => {
                    head();
                    return self.fail(rec, Phase::RemoteExecution, Code::RemoteTimeout, Retry::Reconcile,
                        "The response body did not complete in time; what arrived is not a result.", None);
                }
                () = ctx.cancel.cancelled() => {
                    head();
                    return self.fail(rec, Phase::RemoteExecution, Code::CallerCancelled, Retry::Reconcile,
                        "The caller cancelled while the response was arriving; what arrived is not a result.", None);
                }
            };
            match chunk {
                Ok(Some(bytes)) => {
                    if (body.len() + bytes.len()) as u64 > limit {
                        let message = format!(
                            "The response exceeded this target's limit of {limit} bytes; it is not returned as a result."
                        );
                        return incomplete(message);
                    }
                    body.extend_from_slice(&bytes);
                }
                Ok(None) => break,
                Err(_) => {
                    // Framing failed (short Content-Length, broken chunking, early close):
                    // the partial body is discarded, never returned as a result.
                    let message = format!(
                        "The response broke off after {} body bytes; a partial body is not a result.",
                        body.len()
                    );
                    return incomplete(message);
                }
            }
        }
        let digest = format!("blake3:{}", blake3::hash(&body).to_hex());
        // Whatever still arrives encoded is decoded (bounded) before it is scrubbed, or
        // withheld: nothing the broker cannot scrub is returned or stored.
        let codings = transport::codings(response.headers());
        let recoded = !codings.is_empty();
        let (body, decoded_from, body_withheld) = match transport::decode_body(
            &codings, body, limit,
        ) {
            Decoded::Plain(body) => (body, None, None),
            Decoded::Decoded { body, from } => (body, Some(from), None),
            Decoded::Withheld(reason) => (Vec::new(), None, Some(reason)),
            Decoded::TooLarge => {
                let message = format!(
                    "The response decoded to more than this target's limit of {limit} bytes; it is not returned as a result."
                );
                return incomplete(message);
            }
        };
        let mut redactions = 0u32;
        let mut headers: Vec<(String, String)> = Vec::new();
        for (name, value) in response.headers() {
            let name = name.as_str().to_string();
            if HOP_BY_HOP.contains(&name.as_str()) {
                continue;
            }
            // They described the encoded body; the decoded one gets its own length.
            if recoded && matches!(name.as_str(), "content-encoding" | "content-length") {
                continue;
            }
            let (value, n) = redactor.scrub_str(&String::from_utf8_lossy(value.as_bytes()));
            redactions = redactions.saturating_add(n);
            headers.push((name, value));
        }
        let (body, n) = redactor.scrub(&body);
        redactions = redactions.saturating_add(n);
        // The length of what is returned: the decoded body, or one the scrubber changed.
        if (recoded && body_withheld.is_none()) || n > 0 {
            headers.retain(|(name, _)| name != "content-length");
            headers.push(("content-length".into(), body.len().to_string()));
        }
        let retry_after = header(&response, "retry-after");
        let not_before_ms = retry_after
            .as_deref()
            .and_then(|v| v.trim().parse::<i64>().ok())
            .map(|secs| {
                self.inner
                    .journal
                    .now_ms()
                    .saturating_add(secs.saturating_mul(1000))
            });
        let settlement = status::classify(status, p.repeat, retry_after.is_some());
        let location = header(&response, "location").map(|l| redactor.scrub_str(&l).0);
        let facts_request_id = request_id.clone();
        let facts = ResultFacts {
            http_status: Some(status),
            remote_request_id: request_id.clone(),
            status_resource: if status == 202 {
                location.clone()
            } else {
                None
            },
            redirect_location: if (300..400).contains(&status) {
                location
            } else {
                None
            },
            not_before_ms,
            ..Default::default()
        };
        let mut meta = serde_json::json!({ "status": status, "headers": headers });
        if let Some(from) = &decoded_from {
            meta["decoded_from"] = serde_json::Value::String(from.clone());
        }
        if let Some(reason) = &body_withheld {
            meta["body_withheld"] = serde_json::to_value(reason).unwrap_or_default();
            meta["body_withheld"]["message"] = serde_json::Value::String(reason.message());
        }
        let stored = ResultToStore {
            meta,
            streams: vec![("body".to_string(), body.clone())],
        };
        let settle = Settle {
            outcome: settlement.outcome,
            code: settlement.code,
            retry: settlement.retry,
            facts,
            confidence: ConfidenceSource::RemoteResponse,
            redactions,
        };
        let exchange = Exchange {
            headers_sent: probe.headers_taken(),
            body_complete: probe.body_taken(),
            http_status: Some(status),
            remote_request_id: facts_request_id,
            digest,
        };
        match rec.commit_exchange(exchange, stored, settle) {
            Ok(appended) => {
                let mut outcome = self.outcome_of_projection(&appended.projection);
                outcome.response = Some(HttpResponse {
                    status,
                    headers,
                    body,
                    decoded_from,
                    body_withheld,
                });
                outcome
            }
            Err(e) => self.journal_failed(rec, &e),
        }
    }

    /// Follows a redirect only for a target that opted in, and only to a URL under the
    /// same target (same origin, same credential): a credential never crosses origins.
    /// The child exchange is its own invocation with its own dispatch record.
    async fn follow_redirect(
        &self,
        outcome: HttpOutcome,
        p: &Prepared,
        ctx: &CallContext,
        redirects: u32,
    ) -> HttpOutcome {
        let config = self.inner.config.current();
        let Some(target) = config.http_target(&p.target) else {
            return outcome;
        };
        let Some(response) = &outcome.response else {
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
        let Ok(base) = url::Url::parse(&p.request.url) else {
            return outcome;
        };
        let Ok(next) = base.join(&location) else {
            return outcome;
        };
        let same_target = NormalizedHttp::new(&p.request.method, next.as_str(), &[], &[], &[])
            .ok()
            .and_then(|a| {
                config
                    .resolve_normalized_http(&a)
                    .ok()
                    .map(|t| t.name.clone())
            })
            .is_some_and(|name| name == p.target);
        if !same_target {
            return outcome;
        }
        // RFC 9110 §15.4: 307/308 keep method and body; 301/302/303 become GET.
        let (method, body) = if matches!(status, 307 | 308) {
            (p.request.method.clone(), p.request.body.clone())
        } else {
            ("GET".to_string(), Vec::new())
        };
        let child = HttpRequest {
            url: next.to_string(),
            method,
            headers: p.request.headers.clone(),
            query: Vec::new(),
            body,
            idempotency_key: None,
            timeout_ms: p.request.timeout_ms,
        };
        let id = match new_invocation_id() {
            Ok(id) => id,
            Err(e) => return self.unrecorded("inv_unassigned", &e),
        };
        Box::pin(self.execute_as(id, child, ctx, redirects + 1)).await
    }

    /// `retry_invocation`: applies `decide()` to the record. A new attempt starts only on
    /// a safe basis; otherwise the recorded evidence and the manifest come back.
    pub async fn retry(&self, invocation_id: &str, ctx: &CallContext) -> HttpOutcome {
        let mut rec = match Recorder::resume(&self.inner.journal, invocation_id) {
            Ok(r) => r,
            Err(e) => return self.unrecorded(invocation_id, &e),
        };
        let stored = match self.inner.journal.load_request(invocation_id) {
            Ok(Some(stored)) => stored,
            Ok(None) => return self.outcome_of(&rec),
            Err(e) => return self.unrecorded(invocation_id, &e),
        };
        let request = stored_request(stored);
        let bound = match rec.projection() {
            Ok(p) => p,
            Err(e) => return self.unrecorded(invocation_id, &e),
        };
        // Re-derive the request under the current configuration; any change to a bound
        // value means a new invocation, never a mutation of this one.
        let prepared = self.validate(&request).ok().and_then(|mut p| {
            let snapshot = bound
                .fingerprint
                .as_ref()
                .and_then(|_| self.bound_snapshot(invocation_id))?;
            p.snapshot = ConfigSnapshot {
                target_version: self
                    .inner
                    .config
                    .current()
                    .http_target(&p.target)
                    .map(|t| t.version())?,
                ..snapshot
            };
            p.idempotency_key = p.snapshot.idempotency_key.clone();
            p.fingerprint =
                Fingerprint::compute(&NormalizedAction::Http(p.action.clone()), &p.snapshot)
                    .to_string();
            Some(p)
        });
        let fingerprint_now = prepared
            .as_ref()
            .map(|p| p.fingerprint.clone())
            .unwrap_or_default();
        if bound.fingerprint.as_deref() != Some(fingerprint_now.as_str()) {
            let mut outcome = self.outcome_of(&rec);
            outcome.error = outcome
                .error
                .or_else(|| bound.envelope(self.inner.journal.now_ms()));
            if let Some(env) = outcome.error.as_mut() {
                env.error.message = format!(
                    "The target's configuration changed since this invocation was bound; submit a new request. {}",
                    env.error.message
                );
            }
            return outcome;
        }
        let plan: RetryPlan = match rec.plan_retry(&RetryRequest {
            fingerprint: fingerprint_now,
        }) {
            Ok(plan) => plan,
            Err(e) => return self.journal_failed(&rec, &e),
        };
        let Some(prepared) = prepared else {
            return self.outcome_of(&rec);
        };
        let now = self.inner.journal.now_ms();
        let not_before = rec
            .projection()
            .ok()
            .and_then(|p| p.result_facts.and_then(|f| f.not_before_ms));
        let too_early =
            plan.decision == Decision::RetryWhenAllowed && not_before.is_some_and(|t| now < t);
        if !plan.decision.starts_attempt() || too_early {
            let mut outcome = self.recorded_outcome(&rec);
            outcome.manifest = Some(plan.manifest);
            return outcome;
        }
        let mut outcome = self.run_attempt(&mut rec, &prepared, ctx).await;
        outcome.manifest = Some(plan.manifest);
        outcome
    }

    fn bound_snapshot(&self, invocation_id: &str) -> Option<ConfigSnapshot> {
        self.inner
            .journal
            .events(invocation_id)
            .ok()?
            .into_iter()
            .find_map(|e| match e.body {
                crate::journal::events::EventBody::PreflightValidated { snapshot, .. } => {
                    Some(snapshot)
                }
                _ => None,
            })
    }

    /// The record plus its stored response, if any (a read, never a re-run).
    pub fn recorded_outcome(&self, rec: &Recorder) -> HttpOutcome {
        let mut outcome = self.outcome_of(rec);
        if let Ok(p) = rec.projection()
            && let Some(result_id) = p.result_id
            && let Ok(stored) = self.inner.journal.read_result(&result_id)
        {
            outcome.response = stored_response(&stored);
        }
        outcome
    }

    /// Runs the target's configured reconcile query for an unknown outcome (with the
    /// credential, as its own invocation) and records what it proves as `remote_query`
    /// evidence on the original. Returns the original's outcome afterwards.
    pub async fn reconcile(&self, invocation_id: &str, by: &str) -> HttpOutcome {
        let rec = match Recorder::resume(&self.inner.journal, invocation_id) {
            Ok(r) => r,
            Err(e) => return self.unrecorded(invocation_id, &e),
        };
        let p = match rec.projection() {
            Ok(p) => p,
            Err(e) => return self.unrecorded(invocation_id, &e),
        };
        if p.outcome != Outcome::Unknown || !p.terminal {
            return self.recorded_outcome(&rec);
        }
        let config = self.inner.config.current();
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
            Ok(id) => self.execute_query(id, request, &ctx).await,
            Err(e) => return self.unrecorded(invocation_id, &e),
        };
        let Some(response) = &probe.response else {
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
        request: HttpRequest,
        ctx: &CallContext,
    ) -> HttpOutcome {
        let rec = match Recorder::accept(
            &self.inner.journal,
            NewInvocation {
                invocation_id: id.clone(),
                channel: Channel::Http,
                target: String::new(),
                summary: summary(&request),
                session: ctx.session.clone(),
                idempotency_key: None,
            },
        ) {
            Ok(rec) => rec,
            Err(e) => return self.unrecorded(&id, &e),
        };
        let mut prepared = match self.validate(&request) {
            Ok(p) => p,
            Err(v) => {
                // The configured query method may be outside the agent-facing method
                // list; it is the operator's configuration, so only the rest applies.
                if v.code != Code::UnsupportedAction {
                    return self.reject(&rec, &v);
                }
                match self.validate(&HttpRequest {
                    method: "GET".into(),
                    ..request.clone()
                }) {
                    Ok(mut p) => {
                        p.request.method = request.method.clone();
                        p
                    }
                    Err(v) => {
                        return self.reject(&rec, &v);
                    }
                }
            }
        };
        prepared.repeat = Repeat::Idempotent;
        let prepared = match self.bind(&rec, prepared).await {
            Ok(p) => p,
            Err(outcome) => return *outcome,
        };
        let mut rec = rec;
        self.run_attempt(&mut rec, &prepared, ctx).await
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

fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// A secret-free description for people: method and URL as the agent gave them (the
/// credential is injected later and never appears here).
fn summary(request: &HttpRequest) -> String {
    let url: String = request.url.chars().take(512).collect();
    format!("{} {url}", request.method)
}

fn generated_key() -> String {
    let mut bytes = [0u8; 16];
    // Without randomness the key would collide; fall back to a time-based key that is
    // still unique within this process rather than failing the request.
    if getrandom::fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes.copy_from_slice(&nanos.to_le_bytes());
    }
    format!("pstn_{}", hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::{percent_decode, query_name_key};

    fn key(raw: &str) -> Vec<u8> {
        query_name_key(&percent_decode(raw))
    }

    // Regression: issue 10
    #[test]
    fn query_names_a_lenient_server_merges_with_the_injected_one_share_its_key() {
        for spelling in [
            "api_key",
            "API_KEY",
            "api_key[]",
            "api_key%5B%5D",
            "Api_Key[0][1]",
            "+api_key",
            "%20api_key%20",
            "api.key",
            "api+key",
            "api%2Ekey",
            "api%5Fkey",
        ] {
            assert_eq!(key(spelling), b"api_key", "{spelling}");
        }
        for other in [
            "api_keys",
            "my_api_key",
            "api_key%255B%255D",
            "apikey",
            "api-key",
        ] {
            assert_ne!(key(other), b"api_key", "{other}");
        }
        assert_eq!(percent_decode("%zz%4"), b"%zz%4", "malformed escapes stay");
    }
}
