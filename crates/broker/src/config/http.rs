//! `[[http]]`: the HTTP target as the broker uses it ([`HttpTarget`], with how the
//! credential is injected, the idempotency contract and the reconcile query), its raw
//! TOML form, and the validation and normalization from one to the other.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use url::Url;

use super::batch::{BatchContract, BatchProblem, RawBatch};
use super::field::{
    check_credential, check_methods, check_range, is_loopback, is_uppercase_token, parse_duration,
    plain_text,
};
use super::job::{JobContract, JobProblem, RawJob};
use super::proxy::ProxySetting;
use super::{
    ApprovalMode, ConfigError, Ctx, MAX_PAYLOAD_BYTES, MAX_TIMEOUT_MS, Problem, default_timeout,
};
use crate::canonical::{is_token, normalize_path};
use crate::vault::CredentialId;

const DEFAULT_MAX_RESPONSE_BYTES: u64 = 10 * 1024 * 1024;
const DEFAULT_MAX_REQUEST_BODY_BYTES: u64 = 1024 * 1024;
const IDEMPOTENCY_KEY_PLACEHOLDER: &str = "{idempotency_key}";
const SECRET_PLACEHOLDER: &str = "{secret}";

/// How the secret is attached to an HTTP request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Injection {
    /// `name` is stored lowercase (field names are case-insensitive, RFC 9110 §5.1);
    /// `format` contains `{secret}` exactly once.
    Header { name: String, format: String },
    /// HTTP Basic (RFC 7617) with this user id and the secret as password.
    Basic { user: String },
    /// The secret as the value of this query parameter.
    Query { param: String },
}

impl Injection {
    /// The non-secret injection mode recorded in a snapshot: `header:<lowercase name>`,
    /// `basic` or `query:<param>`.
    pub fn mode(&self) -> String {
        match self {
            Injection::Header { name, .. } => format!("header:{name}"),
            Injection::Basic { .. } => "basic".to_owned(),
            Injection::Query { param } => format!("query:{param}"),
        }
    }

    /// The lowercase header the credential travels in, if it travels in one (Basic uses
    /// `authorization`).
    pub fn header_name(&self) -> Option<&str> {
        match self {
            Injection::Header { name, .. } => Some(name),
            Injection::Basic { .. } => Some("authorization"),
            Injection::Query { .. } => None,
        }
    }
}

/// The API's documented idempotency-key contract: a key is a promise only the remote can
/// make. Without it, a key proves nothing and is never sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyContract {
    /// Stored lowercase.
    pub header: String,
    pub scope: String,
    /// How long the remote retains keys; automatic retries stop before it runs out.
    pub retention: Duration,
}

/// How to ask the remote whether an unknown outcome was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileQuery {
    pub method: String,
    /// Relative to the target's base URL; contains `{idempotency_key}` at most once,
    /// or no placeholder at all.
    pub path: String,
    pub committed_status: Vec<u16>,
    pub not_applied_status: Vec<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpTarget {
    pub name: String,
    /// Origin plus path prefix; the path is normalized (RFC 3986 §6.2.2) and has no
    /// trailing slash unless it is `/`.
    pub base_url: Url,
    /// Sorted, deduplicated.
    pub methods: Vec<String>,
    pub credential: CredentialId,
    pub inject: Injection,
    pub approval: ApprovalMode,
    /// What this API guarantees, not what RFC 9110 says in general. Sorted, deduplicated.
    pub idempotent_methods: Vec<String>,
    /// Resolved against the config file's directory.
    pub ca_file: Option<PathBuf>,
    pub timeout_ms: u64,
    pub max_response_bytes: u64,
    pub max_request_body_bytes: u64,
    pub follow_redirects: bool,
    pub idempotency: Option<IdempotencyContract>,
    pub reconcile: Option<ReconcileQuery>,
    /// `allow_private = true`: the host may resolve to loopback, private and link-local
    /// addresses (never to a metadata endpoint). See [`crate::channel::guard`].
    pub allow_private: bool,
    /// `require_confined = true`: only sessions that arrive through a shield (an agent
    /// started by `postern shield`) may call this target; others are refused at
    /// validation (`CONFINEMENT_REQUIRED`) before a credential is read.
    pub require_confined: bool,
    /// How this API's 202 Accepted names its job and how its status resource reads.
    pub job: Option<JobContract>,
    /// Which requests are batches and how their members are reported.
    pub batch: Option<BatchContract>,
    /// Whether requests go through an HTTP proxy (see [`proxy`](super::proxy)).
    pub proxy: ProxySetting,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
    pub(super) name: String,
    base_url: String,
    methods: Vec<String>,
    credential: String,
    inject: RawInjection,
    approval: ApprovalMode,
    // Absent means the API guarantees nothing: the conservative reading.
    #[serde(default)]
    idempotent_methods: Vec<String>,
    ca_file: Option<PathBuf>,
    #[serde(default = "default_timeout")]
    timeout_ms: u64,
    #[serde(default = "default_max_response")]
    max_response_bytes: u64,
    #[serde(default = "default_max_request_body")]
    max_request_body_bytes: u64,
    #[serde(default)]
    follow_redirects: bool,
    idempotency: Option<RawIdempotency>,
    reconcile: Option<RawReconcile>,
    #[serde(default)]
    allow_private: bool,
    #[serde(default)]
    require_confined: bool,
    job: Option<RawJob>,
    batch: Option<RawBatch>,
    proxy: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInjection {
    header: Option<String>,
    format: Option<String>,
    basic_user: Option<String>,
    query: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIdempotency {
    header: String,
    scope: String,
    retention: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReconcile {
    method: String,
    path: String,
    committed_status: Vec<u16>,
    #[serde(default)]
    not_applied_status: Vec<u16>,
}

fn default_max_response() -> u64 {
    DEFAULT_MAX_RESPONSE_BYTES
}
fn default_max_request_body() -> u64 {
    DEFAULT_MAX_REQUEST_BODY_BYTES
}

fn check_base_url(ctx: &Ctx<'_>, raw: &str) -> Result<Url, ConfigError> {
    let field = "base_url";
    let mut url = Url::parse(raw).map_err(|e| {
        ctx.err(
            field,
            Problem::InvalidUrl {
                reason: e.to_string(),
            },
        )
    })?;
    match url.scheme() {
        "https" => {}
        "http" => {
            // Plain http would expose the injected credential on the network.
            if !url.host().is_some_and(|h| is_loopback(&h)) {
                return Err(ctx.err(field, Problem::PlainHttpNotLoopback));
            }
        }
        other => {
            let problem = Problem::UnsupportedScheme {
                scheme: other.to_owned(),
            };
            return Err(ctx.err(field, problem));
        }
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ctx.err(field, Problem::UserinfoInUrl));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ctx.err(field, Problem::QueryOrFragmentInUrl));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(ctx.err(
            field,
            Problem::InvalidUrl {
                reason: "no host".to_owned(),
            },
        ));
    }
    // Normalize like request paths so prefix matching compares like with like; a
    // trailing slash is dropped so `/v1/` and `/v1` claim the same prefix.
    let path = normalize_path(url.path()).map_err(|r| {
        ctx.err(
            field,
            Problem::InvalidUrl {
                reason: r.to_owned(),
            },
        )
    })?;
    let trimmed = path.trim_end_matches('/');
    url.set_path(if trimmed.is_empty() { "/" } else { trimmed });
    Ok(url)
}

/// Headers the transport owns (RFC 9110 §7.2, §7.6.1; RFC 9112 §6): a credential placed
/// there would break framing or routing.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "te",
    "trailer",
    "upgrade",
    "keep-alive",
    "proxy-connection",
    // Asks the server to answer before the body arrives (RFC 9110 §10.1.1).
    "expect",
];

fn check_header_name(ctx: &Ctx<'_>, field: &str, name: &str) -> Result<String, ConfigError> {
    if !is_token(name) {
        return Err(ctx.err(field, Problem::InvalidHeaderName));
    }
    let lower = name.to_ascii_lowercase();
    if RESERVED_HEADERS.contains(&lower.as_str()) {
        return Err(ctx.err(field, Problem::ReservedHeader { name: lower }));
    }
    Ok(lower)
}

fn check_injection(ctx: &Ctx<'_>, raw: RawInjection) -> Result<Injection, ConfigError> {
    match raw {
        RawInjection {
            header: Some(name),
            format,
            basic_user: None,
            query: None,
        } => {
            let name = check_header_name(ctx, "inject.header", &name)?;
            let format = format.unwrap_or_else(|| SECRET_PLACEHOLDER.to_owned());
            if format.matches(SECRET_PLACEHOLDER).count() != 1 {
                return Err(ctx.err("inject.format", Problem::SecretPlaceholder));
            }
            // A CR or LF here would split the header line (RFC 9110 §5.5).
            if format.chars().any(|c| c.is_control() && c != '\t') {
                return Err(ctx.err("inject.format", Problem::InvalidCharacters));
            }
            Ok(Injection::Header { name, format })
        }
        RawInjection {
            header: None,
            format: None,
            basic_user: Some(user),
            query: None,
        } => {
            if user.is_empty() {
                return Err(ctx.err("inject.basic_user", Problem::Empty));
            }
            if user.contains(':') {
                return Err(ctx.err("inject.basic_user", Problem::ColonInBasicUser));
            }
            if user.chars().any(char::is_control) {
                return Err(ctx.err("inject.basic_user", Problem::InvalidCharacters));
            }
            Ok(Injection::Basic { user })
        }
        RawInjection {
            header: None,
            format: None,
            basic_user: None,
            query: Some(param),
        } => {
            if param.is_empty() {
                return Err(ctx.err("inject.query", Problem::Empty));
            }
            if !plain_text(&param) {
                return Err(ctx.err("inject.query", Problem::InvalidCharacters));
            }
            Ok(Injection::Query { param })
        }
        _ => Err(ctx.err("inject", Problem::InjectionForm)),
    }
}

pub(super) fn check_ca_file(ctx: &Ctx<'_>, path: &Path) -> Result<(), ConfigError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let bytes = std::fs::read(path).map_err(|e| {
        let problem = Problem::UnreadableFile {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        ctx.err("ca_file", problem)
    })?;
    let mut certificates = 0usize;
    for cert in CertificateDer::pem_slice_iter(&bytes) {
        cert.map_err(|e| {
            let problem = Problem::InvalidPem {
                path: path.to_path_buf(),
                reason: e.to_string(),
            };
            ctx.err("ca_file", problem)
        })?;
        certificates += 1;
    }
    if certificates == 0 {
        let problem = Problem::NoCertificate {
            path: path.to_path_buf(),
        };
        return Err(ctx.err("ca_file", problem));
    }
    Ok(())
}

fn check_idempotency(
    ctx: &Ctx<'_>,
    raw: RawIdempotency,
) -> Result<IdempotencyContract, ConfigError> {
    let header = check_header_name(ctx, "idempotency.header", &raw.header)?;
    if raw.scope.is_empty() {
        return Err(ctx.err("idempotency.scope", Problem::Empty));
    }
    if raw.scope.chars().any(char::is_control) {
        return Err(ctx.err("idempotency.scope", Problem::InvalidCharacters));
    }
    let retention = parse_duration(&raw.retention).ok_or_else(|| {
        ctx.err(
            "idempotency.retention",
            Problem::InvalidDuration {
                value: raw.retention.clone(),
            },
        )
    })?;
    Ok(IdempotencyContract {
        header,
        scope: raw.scope,
        retention,
    })
}

fn check_statuses(ctx: &Ctx<'_>, field: &str, list: Vec<u16>) -> Result<Vec<u16>, ConfigError> {
    for (i, &status) in list.iter().enumerate() {
        if !(100..=599).contains(&status) {
            return Err(ctx.err(format!("{field}[{i}]"), Problem::InvalidStatus { status }));
        }
    }
    let mut list = list;
    list.sort_unstable();
    list.dedup();
    Ok(list)
}

fn check_reconcile(
    ctx: &Ctx<'_>,
    raw: RawReconcile,
    has_contract: bool,
) -> Result<ReconcileQuery, ConfigError> {
    let method = raw.method;
    if !is_uppercase_token(&method) {
        let problem = Problem::InvalidMethod { value: method };
        return Err(ctx.err("reconcile.method", problem));
    }
    let path = raw.path;
    let placeholders = path.matches(IDEMPOTENCY_KEY_PLACEHOLDER).count();
    let rest = path.replace(IDEMPOTENCY_KEY_PLACEHOLDER, "");
    let path_ok = path.starts_with('/')
        && placeholders <= 1
        && !rest.contains(['{', '}', '#'])
        && !path.chars().any(|c| c.is_whitespace() || c.is_control());
    if !path_ok {
        return Err(ctx.err("reconcile.path", Problem::InvalidReconcilePath));
    }
    // The key only identifies the operation at the remote if the remote was sent it.
    if placeholders == 1 && !has_contract {
        return Err(ctx.err("reconcile.path", Problem::PlaceholderWithoutContract));
    }
    if raw.committed_status.is_empty() {
        return Err(ctx.err("reconcile.committed_status", Problem::Empty));
    }
    let committed = check_statuses(ctx, "reconcile.committed_status", raw.committed_status)?;
    let not_applied = check_statuses(ctx, "reconcile.not_applied_status", raw.not_applied_status)?;
    if let Some(&status) = committed.iter().find(|s| not_applied.contains(s)) {
        return Err(ctx.err(
            "reconcile.not_applied_status",
            Problem::ConflictingStatus { status },
        ));
    }
    Ok(ReconcileQuery {
        method,
        path,
        committed_status: committed,
        not_applied_status: not_applied,
    })
}

pub(super) fn validate_http(
    ctx: &Ctx<'_>,
    raw: RawHttp,
    base_dir: &Path,
) -> Result<HttpTarget, ConfigError> {
    let base_url = check_base_url(ctx, &raw.base_url)?;
    if raw.methods.is_empty() {
        return Err(ctx.err("methods", Problem::Empty));
    }
    let methods = check_methods(ctx, "methods", raw.methods)?;
    let credential = check_credential(ctx, raw.credential)?;
    let inject = check_injection(ctx, raw.inject)?;
    // Indexes in errors are positions in the file, so the list is kept before sorting.
    let listed = raw.idempotent_methods.clone();
    let idempotent_methods = check_methods(ctx, "idempotent_methods", raw.idempotent_methods)?;
    // A method agents cannot use is a typo or a stale list, never a guarantee.
    if let Some((i, m)) = listed
        .iter()
        .enumerate()
        .find(|(_, m)| !methods.contains(m))
    {
        let problem = Problem::NotInMethods { value: m.clone() };
        return Err(ctx.err(format!("idempotent_methods[{i}]"), problem));
    }
    let ca_file = match raw.ca_file {
        Some(p) if p.as_os_str().is_empty() => return Err(ctx.err("ca_file", Problem::Empty)),
        Some(p) => Some(base_dir.join(p)),
        None => None,
    };
    check_range(ctx, "timeout_ms", raw.timeout_ms, 1, MAX_TIMEOUT_MS)?;
    check_range(
        ctx,
        "max_response_bytes",
        raw.max_response_bytes,
        1,
        u64::MAX,
    )?;
    check_range(
        ctx,
        "max_request_body_bytes",
        raw.max_request_body_bytes,
        1,
        MAX_PAYLOAD_BYTES,
    )?;
    let idempotency = raw
        .idempotency
        .map(|i| check_idempotency(ctx, i))
        .transpose()?;
    // Both would be set by the broker on the same request: one value would replace or
    // sit beside the credential, and the key could end up where the secret belongs.
    if let Some(contract) = &idempotency
        && inject.header_name() == Some(contract.header.as_str())
    {
        let problem = Problem::IdempotencyHeaderIsInjectionHeader {
            name: contract.header.clone(),
        };
        return Err(ctx.err("idempotency.header", problem));
    }
    let reconcile = raw
        .reconcile
        .map(|r| check_reconcile(ctx, r, idempotency.is_some()))
        .transpose()?;
    let job = raw
        .job
        .map(JobContract::check)
        .transpose()
        .map_err(|problem| match problem {
            JobProblem::Pointer { field } => ctx.err(field, Problem::InvalidPointer),
            JobProblem::StatesWithoutPointer => {
                ctx.err("job.state_pointer", Problem::StatesWithoutPointer)
            }
            JobProblem::NoSuccessState => ctx.err("job.succeeded", Problem::NoSuccessState),
            JobProblem::ConflictingState { value } => {
                ctx.err("job", Problem::ConflictingState { value })
            }
        })?;
    let batch =
        raw.batch
            .map(BatchContract::check)
            .transpose()
            .map_err(|problem| match problem {
                BatchProblem::Pointer { field } => ctx.err(field, Problem::InvalidPointer),
                BatchProblem::Path { field } => ctx.err(field, Problem::InvalidBatchPath),
                BatchProblem::Empty { field } => ctx.err(field, Problem::Empty),
                BatchProblem::Conflicting { value } => {
                    ctx.err("batch", Problem::ConflictingState { value })
                }
                BatchProblem::Method { value } => {
                    ctx.err("batch.query.method", Problem::InvalidMethod { value })
                }
                BatchProblem::Status { status } => {
                    ctx.err("batch.query", Problem::InvalidStatus { status })
                }
                BatchProblem::HeaderName => {
                    ctx.err("batch.partial_header", Problem::InvalidHeaderName)
                }
            })?;
    let proxy = match raw.proxy {
        None => ProxySetting::Environment,
        Some(text) => ProxySetting::parse(&text)
            .map_err(|problem| ctx.err("proxy", Problem::InvalidProxy { problem }))?,
    };
    Ok(HttpTarget {
        name: raw.name,
        base_url,
        methods,
        credential,
        inject,
        approval: raw.approval,
        idempotent_methods,
        ca_file,
        timeout_ms: raw.timeout_ms,
        max_response_bytes: raw.max_response_bytes,
        max_request_body_bytes: raw.max_request_body_bytes,
        follow_redirects: raw.follow_redirects,
        idempotency,
        reconcile,
        allow_private: raw.allow_private,
        require_confined: raw.require_confined,
        job,
        batch,
        proxy,
    })
}
