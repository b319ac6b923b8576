//! Validation of an HTTP request: everything that can be checked before a secret is
//! touched or a socket opened. A refusal names the field to fix; nothing is sent.

use std::time::Duration;

use super::status::Repeat;
use super::{HttpRequest, Plan};
use crate::action::{NormalizedAction, NormalizedHttp};
use crate::config::batch::BatchContract;
use crate::config::{Config, HttpTarget, Injection};
use crate::contract::Code;
use crate::invocation::{Invalid, Validated};

/// Headers only the broker may set: credentials, routing and framing (RFC 9112 §6), and
/// `accept-encoding`: the broker asks for `identity` and decodes whatever still arrives
/// encoded itself, because a body it cannot decode is a body it cannot scrub.
pub(crate) const FORBIDDEN_HEADERS: &[&str] = &[
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
pub(super) const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
];
pub(crate) const MAX_HEADER_BYTES: usize = 64 * 1024;
pub(crate) const MAX_HEADERS: usize = 100;
/// The longest request URL the channel sends, query included. RFC 9110 §4.1 recommends
/// that senders and recipients support URIs of at least 8000 octets; longer ones are
/// refused by many servers and proxies (414), and past 64 KiB the HTTP stack cannot
/// even build the request line.
const MAX_URL_BYTES: usize = 8 * 1024;
/// Query parameters per request, from the URL and the `query` argument together. The
/// URL limit bounds their bytes; this bounds the work done before it is applied.
pub(crate) const MAX_QUERY_PAIRS: usize = 1024;
/// The longest idempotency key a caller may choose. It travels as a header value and in
/// the reconcile query's URL, and is stored with every record of the invocation.
pub(crate) const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

/// Everything that can be checked before a secret is touched or a socket opened, against
/// the configuration in force.
pub(super) fn validate(request: &HttpRequest, config: &Config) -> Result<Validated<Plan>, Invalid> {
    check_sizes_before_parsing(request)?;
    let action = NormalizedHttp::new(
        &request.method,
        &request.url,
        &request.headers,
        &request.query,
        &request.body,
    )
    .map_err(|e| Invalid::new(e.code, e.field.clone(), e.message.clone()))?;
    check_assembled_url(request, &action)?;
    let target = config.resolve_normalized_http(&action).map_err(|_| {
        Invalid::new(
            Code::InvalidTarget,
            "url",
            "The URL does not fall under a configured target.",
        )
    })?;
    if !target.methods.contains(&action.method) {
        return Err(Invalid::new(
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
    check_headers(request, |lower| {
        let reserved = FORBIDDEN_HEADERS.contains(&lower)
            || Some(lower) == injection_header
            || Some(lower) == idempotency_header;
        reserved.then(|| {
            if lower == "accept-encoding" {
                "The header accept-encoding is set by the broker, not the caller: it asks for identity and decodes gzip and deflate itself, so what it returns can be scrubbed.".to_string()
            } else {
                format!("The header {lower} is set by the broker, not the caller.")
            }
        })
    })?;
    if let Injection::Query { param } = &target.inject {
        check_query_pollution(request, &action, param)?;
    }
    if request.body.len() as u64 > target.max_request_body_bytes {
        return Err(Invalid::too_large(
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
        return Err(Invalid::new(
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
    // A batch's members are read before anything is touched: an unknown batch still
    // knows what it held, member by member.
    let batch_members = match &target.batch {
        Some(batch) if is_batch(target, batch, &action) => Some(
            batch
                .member_ids(&request.body)
                .map_err(|reason| Invalid::new(Code::InvalidRequest, "body", reason))?,
        ),
        _ => None,
    };
    let timeout_ms = request
        .timeout_ms
        .map_or(target.timeout_ms, |t| t.min(target.timeout_ms));
    let stored = serde_json::json!({
        "method": request.method,
        "url": request.url,
        "headers": request.headers,
        "query": request.query,
        "idempotency_key": idempotency_key,
        "timeout_ms": request.timeout_ms,
    });
    let added = super::card::added(
        target,
        request,
        &host_header(&action),
        idempotency_key.as_deref(),
    );
    Ok(Validated {
        target: target.name.clone(),
        action: NormalizedAction::Http(action.clone()),
        idempotency_key,
        timeout: Duration::from_millis(timeout_ms.max(1)),
        stored: (stored, request.body.clone()),
        plan: Plan {
            request: request.clone(),
            http: action,
            repeat,
            batch_members,
            allow_private: target.allow_private,
            proxy: target.proxy.via().map(|p| p.authority()),
            added,
        },
    })
}

/// The `host` header the HTTP stack sends for `action` (RFC 9110 §7.2: the port only
/// when it is not the scheme's default).
fn host_header(action: &NormalizedHttp) -> String {
    match action.port {
        Some(port) => format!("{}:{port}", action.host),
        None => action.host.clone(),
    }
}

/// Whether `action` is a batch under the target's `[http.batch]`: a request that can
/// change state, to the batch path (relative to the base URL).
fn is_batch(target: &HttpTarget, batch: &BatchContract, action: &NormalizedHttp) -> bool {
    let base = target.base_url.path().trim_end_matches('/');
    let path = format!("{base}{}", batch.path);
    !matches!(action.method.as_str(), "GET" | "HEAD" | "OPTIONS") && action.path == path
}

/// Limits that need no parsing: a huge URL or query list is refused before any work.
fn check_sizes_before_parsing(request: &HttpRequest) -> Result<(), Invalid> {
    if request.url.len() > MAX_URL_BYTES {
        return Err(Invalid::too_large(
            "url",
            format!("The URL is limited to {MAX_URL_BYTES} bytes."),
        ));
    }
    if request.query.len() > MAX_QUERY_PAIRS {
        return Err(Invalid::too_large(
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
        return Err(Invalid::too_large(
            field,
            format!("A request is limited to {MAX_QUERY_PAIRS} query parameters."),
        ));
    }
    if action.url().len() > MAX_URL_BYTES {
        return Err(Invalid::too_large(
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
        return Err(Invalid::too_large(
            "idempotency_key",
            format!("An idempotency key is limited to {MAX_IDEMPOTENCY_KEY_BYTES} bytes."),
        ));
    }
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Invalid::new(
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
            return Err(Invalid::new(
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

/// A broker-initiated query (the target's reconcile or member query): validated like an
/// agent's request, except that its method may be outside the agent-facing method list
/// (it is the operator's configuration, so only the rest applies), and it is read-only
/// by configuration, so it counts as idempotent.
pub(crate) fn validate_query(
    request: &HttpRequest,
    config: &Config,
) -> Result<Validated<Plan>, Invalid> {
    let mut validated = match validate(request, config) {
        Ok(v) => v,
        Err(v) => {
            if v.code != Code::UnsupportedAction {
                return Err(v);
            }
            let as_get = HttpRequest {
                method: "GET".into(),
                ..request.clone()
            };
            let mut v = validate(&as_get, config)?;
            v.plan.request.method = request.method.clone();
            v.stored.0["method"] = serde_json::Value::String(request.method.clone());
            v
        }
    };
    validated.plan.repeat = Repeat::Idempotent;
    Ok(validated)
}

/// A secret-free description for people: method and URL as the agent gave them (the
/// credential is injected later and never appears here).
pub(crate) fn summary(request: &HttpRequest) -> String {
    let url: String = request.url.chars().take(512).collect();
    format!("{} {url}", request.method)
}

fn generated_key() -> String {
    format!("pstn_{}", hex::encode(crate::channel::random_16()))
}

/// The caller's headers: none that `reserved` answers with a reason (given the lower-case
/// name), each one the HTTP stack accepts, and within the count and size limits.
pub(crate) fn check_headers(
    request: &HttpRequest,
    reserved: impl Fn(&str) -> Option<String>,
) -> Result<(), Invalid> {
    let mut header_bytes = 0usize;
    for (i, (name, value)) in request.headers.iter().enumerate() {
        let lower = name.to_ascii_lowercase();
        if let Some(reason) = reserved(&lower) {
            return Err(Invalid::new(
                Code::ForbiddenHeader,
                format!("headers[{i}].name"),
                reason,
            ));
        }
        // What the HTTP stack accepts, checked here so that nothing the caller sent
        // can fail later, after the credential was read.
        check_header_syntax(i, name, value)?;
        header_bytes += name.len() + value.len();
    }
    if request.headers.len() > MAX_HEADERS || header_bytes > MAX_HEADER_BYTES {
        return Err(Invalid::too_large(
            "headers",
            format!("Headers are limited to {MAX_HEADERS} entries and {MAX_HEADER_BYTES} bytes."),
        ));
    }
    Ok(())
}

/// Header `i` is a field name and value the HTTP stack accepts (RFC 9110 §5.1, §5.5).
fn check_header_syntax(i: usize, name: &str, value: &str) -> Result<(), Invalid> {
    if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Err(Invalid::new(
            Code::InvalidRequest,
            format!("headers[{i}].name"),
            "Not a valid HTTP field name (RFC 9110 §5.1).",
        ));
    }
    if reqwest::header::HeaderValue::from_str(value).is_err() {
        return Err(Invalid::new(
            Code::InvalidRequest,
            format!("headers[{i}].value"),
            "Not a valid HTTP field value: control characters (CR, LF, NUL, ...) are not allowed (RFC 9110 §5.5).",
        ));
    }
    Ok(())
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
