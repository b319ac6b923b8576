//! Validation of a request to a peer capability: everything this broker can check
//! before anything is sent. The agent names a configured peer and one of its
//! capabilities; it never sees or chooses the peer's URL or keys.

use std::time::Duration;

use base64::Engine;

use super::listing::{Listed, Listings};
use super::{Plan, SCHEME, target_name};
use crate::action::{NormalizedAction, NormalizedPeer};
use crate::channel::http::HttpRequest;
use crate::config::Config;
use crate::contract::Code;
use crate::federation::wire::PeerRequest;
use crate::invocation::{Invalid, Validated};

// The same limits and broker-owned headers as a local target: the peer broker owns
// credentials, routing and framing, and the agent cannot set them here either.
use crate::channel::http::validate::{
    FORBIDDEN_HEADERS, MAX_IDEMPOTENCY_KEY_BYTES, MAX_QUERY_PAIRS, summary,
};
const MAX_PATH_BYTES: usize = 8 * 1024;
/// The largest body sent to a peer: it travels base64 inside one MCP message.
pub const MAX_BODY_BYTES: usize = 10 * 1024 * 1024;

fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// `peer://<peer>/<capability>[/<path>][?<query>]` → peer, capability, path (starting
/// with `/`, query kept).
pub(super) fn parse(url: &str) -> Result<(String, String, String), Invalid> {
    let bad = |message: &str| Invalid::new(Code::InvalidTarget, "url", message);
    if !super::is_peer_url(url) {
        return Err(bad("Not a peer URL (peer://<peer>/<capability>/<path>)."));
    }
    let rest = &url[SCHEME.len()..];
    if rest
        .bytes()
        .any(|b| b.is_ascii_control() || b == b' ' || b == b'#')
    {
        return Err(bad(
            "A peer URL holds no spaces, control characters or fragment.",
        ));
    }
    let (peer, rest) = rest.split_once('/').unwrap_or((rest, ""));
    let (capability, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if !name_ok(peer) {
        return Err(bad(
            "The peer name is 1 to 64 letters, digits, `-`, `_` or `.`.",
        ));
    }
    if !name_ok(capability) {
        return Err(bad(
            "Name a capability after the peer: peer://<peer>/<capability>/<path>.",
        ));
    }
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    if path
        .split(['?'])
        .next()
        .is_some_and(|p| p.split('/').any(|s| s == ".." || s == "."))
    {
        return Err(bad("A peer path may not hold `.` or `..` segments."));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(Invalid::too_large(
            "url",
            format!("A peer path is limited to {MAX_PATH_BYTES} bytes."),
        ));
    }
    Ok((peer.to_string(), capability.to_string(), path))
}

pub(super) fn validate(
    request: &HttpRequest,
    config: &Config,
    listings: &Listings,
) -> Result<Validated<Plan>, Invalid> {
    let (peer_name, capability, path) = parse(&request.url)?;
    // The same answer for a peer that is not configured and one this broker does not
    // call: the agent learns nothing about the configuration beyond list_targets.
    let peer = config
        .peer(&peer_name)
        .filter(|p| p.url.is_some())
        .ok_or_else(|| {
            Invalid::new(
                Code::InvalidTarget,
                "url",
                format!("No peer named {peer_name} is configured to be called; see list_targets."),
            )
        })?;
    let method = request.method.clone();
    if method.is_empty() || method.len() > 16 || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(Invalid::new(
            Code::InvalidRequest,
            "method",
            "The method is an upper-case token (GET, POST, ...).",
        ));
    }
    let listed = listings.cached(&peer_name);
    let mut idempotent = false;
    if let Some(Listed { capabilities, .. }) = &listed {
        let Some(cap) = capabilities.iter().find(|c| c.name == capability) else {
            return Err(Invalid::new(
                Code::InvalidTarget,
                "url",
                format!(
                    "Peer {peer_name} does not list {capability} for this broker; see list_targets."
                ),
            ));
        };
        if !cap.methods.contains(&method) {
            return Err(Invalid::new(
                Code::UnsupportedAction,
                "method",
                format!("{method} is not allowed for peer/{peer_name}/{capability}."),
            ));
        }
        idempotent = cap.idempotent_methods.contains(&method);
    }
    crate::channel::http::check_headers(request, |lower| {
        FORBIDDEN_HEADERS
            .contains(&lower)
            .then(|| format!("The header {lower} is set by the peer broker, not the caller."))
    })?;
    if request.query.len() > MAX_QUERY_PAIRS {
        return Err(Invalid::too_large(
            "query",
            format!("At most {MAX_QUERY_PAIRS} query parameters."),
        ));
    }
    if request.body.len() > MAX_BODY_BYTES {
        return Err(Invalid::too_large(
            "body",
            format!("A body sent to a peer is limited to {MAX_BODY_BYTES} bytes."),
        ));
    }
    if let Some(key) = &request.idempotency_key
        && (key.is_empty()
            || key.len() > MAX_IDEMPOTENCY_KEY_BYTES
            || !key.bytes().all(|b| b.is_ascii_graphic()))
    {
        return Err(Invalid::new(
            Code::InvalidRequest,
            "idempotency_key",
            format!(
                "An idempotency key is 1 to {MAX_IDEMPOTENCY_KEY_BYTES} visible ASCII characters."
            ),
        ));
    }
    let per_try_ms = u64::try_from(peer.timeout.as_millis()).unwrap_or(u64::MAX);
    if request.timeout_ms == Some(0) {
        return Err(Invalid::new(
            Code::InvalidRequest,
            "timeout_ms",
            "timeout_ms must be at least 1 (omit it to use the peer's timeout).",
        ));
    }
    let timeout_ms = request.timeout_ms.map(|t| t.min(per_try_ms));
    let wire = PeerRequest {
        capability: capability.clone(),
        method: method.clone(),
        path: path.clone(),
        headers: request.headers.clone(),
        query: request.query.clone(),
        body_base64: base64::engine::general_purpose::STANDARD.encode(&request.body),
        idempotency_key: request.idempotency_key.clone(),
        timeout_ms,
    };
    let request_fingerprint = wire.fingerprint(&request.body);
    let stored = serde_json::json!({
        "method": request.method,
        "url": request.url,
        "headers": request.headers,
        "query": request.query,
        "idempotency_key": request.idempotency_key,
        "timeout_ms": request.timeout_ms,
    });
    let window = super::attempt_window(&peer.attempts, peer.timeout);
    Ok(Validated {
        target: target_name(&peer_name, &capability),
        action: NormalizedAction::Peer(NormalizedPeer {
            peer: peer_name.clone(),
            capability: capability.clone(),
            method,
            path,
            request_fingerprint,
        }),
        idempotency_key: request.idempotency_key.clone(),
        timeout: window.max(Duration::from_millis(1)),
        stored: (stored, request.body.clone()),
        plan: Plan {
            peer: peer_name,
            capability,
            request: wire,
            body: request.body.clone(),
            idempotent,
            policy_version: listed.map(|l| l.policy_version),
            summary: summary(request),
        },
    })
}
