//! What an HTTP approval card shows beyond the method and URL: every header the agent
//! supplied, in the order sent, flagged when it changes what the request means, and what
//! the broker itself adds. The card promises to be exactly what will be sent; this is
//! the part of that promise a method and a URL cannot keep (issue 26).

use super::HttpRequest;
use crate::config::{HttpTarget, Injection};
use crate::display::{HeaderPreview, escape_text};

/// Why a header changes what the request means, by its lowercase name; `None` for an
/// ordinary one. Checked in this order, so `x-forwarded-user` is an identity claim first
/// and a forwarding header second.
pub(super) fn header_flag(lower: &str) -> Option<&'static str> {
    const IDENTITY: &[&str] = &[
        "user",
        "auth",
        "token",
        "impersonat",
        "principal",
        "identity",
        "role",
        "sudo",
        "behalf",
        "api-key",
        "apikey",
        "secret",
        "password",
        "session",
    ];
    // Names software, not a caller, though the word "user" is in it.
    if lower == "user-agent" {
        return None;
    }
    if lower == "cookie" || lower == "cookie2" {
        return Some("cookie: acts as whoever the cookie's session belongs to");
    }
    if lower.contains("method") {
        return Some("method override: the server may run another method than the one shown");
    }
    if matches!(
        lower,
        "x-original-url" | "x-rewrite-url" | "x-override-url" | "x-original-uri"
    ) || lower.starts_with("x-forwarded-path")
        || lower.starts_with("x-forwarded-prefix")
    {
        return Some("path override: the server may route to another path than the one shown");
    }
    if IDENTITY.iter().any(|word| lower.contains(word)) {
        return Some("identity: claims who is calling or carries a credential of its own");
    }
    if lower == "forwarded"
        || lower == "via"
        || lower.starts_with("x-forwarded-")
        || lower.ends_with("-ip")
        || lower.contains("client-ip")
        || lower.contains("originating")
    {
        return Some("forwarding: claims where the request came from or which host it is for");
    }
    None
}

/// The agent's headers as the card shows them, in the order sent, and a caution line for
/// each flagged one (the card lists those first).
pub(super) fn headers(request: &HttpRequest) -> (Vec<HeaderPreview>, Vec<String>) {
    let mut cautions = Vec::new();
    let shown = request
        .headers
        .iter()
        .map(|(name, value)| {
            let flag = header_flag(&name.to_ascii_lowercase());
            let preview = HeaderPreview::of(name, value.as_bytes(), flag.map(str::to_string));
            if let Some(flag) = flag {
                cautions.push(format!("header {}: {flag}", preview.name));
            }
            preview
        })
        .collect();
    (shown, cautions)
}

/// What the broker and its HTTP stack add to the agent's request, in display form: the
/// routing and framing headers, the coding the broker asks for, the credential (named by
/// id, never its value) and the idempotency key.
pub(super) fn added(
    target: &HttpTarget,
    request: &HttpRequest,
    host: &str,
    idempotency_key: Option<&str>,
) -> Vec<String> {
    let credential = format!("<credential {}>", target.credential);
    let has = |name: &str| {
        request
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(name))
    };
    let mut added = vec![format!("host: {}", escape_text(host))];
    if !has("accept") {
        added.push("accept: */*".to_string());
    }
    // Framing: the HTTP stack sends the length even of an empty body.
    added.push(format!("content-length: {}", request.body.len()));
    added.push("accept-encoding: identity".to_string());
    added.push(match &target.inject {
        Injection::Header { name, format } => {
            format!(
                "{name}: {}",
                escape_text(&format.replace("{secret}", &credential))
            )
        }
        Injection::Basic { user } => format!(
            "authorization: Basic base64({}:{credential})",
            escape_text(user)
        ),
        Injection::Query { param } => {
            format!("query parameter {}={credential}", escape_text(param))
        }
    });
    if let (Some(contract), Some(key)) = (&target.idempotency, idempotency_key) {
        added.push(format!("{}: {}", contract.header, escape_text(key)));
    }
    added
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_that_change_a_request_are_flagged_and_ordinary_ones_are_not() {
        for name in [
            "x-http-method-override",
            "x-http-method",
            "x-method-override",
            "x-forwarded-user",
            "x-remote-user",
            "x-auth-token",
            "x-api-key",
            "x-impersonate-user",
            "cookie",
            "x-forwarded-for",
            "forwarded",
            "x-real-ip",
            "true-client-ip",
            "x-forwarded-host",
            "x-original-url",
        ] {
            assert!(header_flag(name).is_some(), "{name} should be flagged");
        }
        for name in [
            "accept",
            "content-type",
            "x-pad",
            "x-do",
            "if-match",
            "user-agent",
        ] {
            let flag = header_flag(name);
            assert!(flag.is_none(), "{name} should not be flagged: {flag:?}");
        }
        assert!(header_flag("x-forwarded-user").is_some_and(|f| f.starts_with("identity")));
        assert!(header_flag("x-http-method-override").is_some_and(|f| f.starts_with("method")));
    }

    #[test]
    fn the_card_keeps_every_header_in_the_order_sent() {
        let request = HttpRequest {
            headers: vec![
                ("X-Pad".into(), "A".repeat(60 * 1024)),
                ("X-Do".into(), "wire-transfer".into()),
                ("Cookie".into(), "session=stolen".into()),
            ],
            ..Default::default()
        };
        let (shown, cautions) = headers(&request);
        let names: Vec<&str> = shown.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["X-Pad", "X-Do", "Cookie"]);
        assert!(shown[0].truncated);
        assert_eq!(shown[1].value, "wire-transfer");
        assert_eq!(cautions.len(), 1);
        assert!(cautions[0].starts_with("header Cookie: cookie"));
    }
}
