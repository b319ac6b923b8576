//! From a complete HTTP response to outcome, code and retry. Only a complete final
//! response settles an exchange; a status alone never makes a repeat safe. The table in `docs/errors.md` is generated from
//! [`MAPPING_EXAMPLES`] through [`classify`], so the documentation is the code.
//!
//! Status alone does not make repeating safe. Whether a new attempt may follow depends
//! on [`Repeat`]: what the target's configuration says about this method and key.

use crate::contract::{Code, Outcome, Retry};

/// What the configuration says about repeating this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repeat {
    /// The target declares the method idempotent (RFC 9110 §9.2.2, as configured).
    Idempotent,
    /// Not idempotent, but sent under the target's de-duplication contract with a key.
    SameKey,
    /// No safe basis to repeat.
    Unsafe,
}

/// How a complete response settles the exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settlement {
    pub outcome: Outcome,
    pub code: Option<Code>,
    pub retry: Retry,
}

/// Classifies a complete final response. `retry_after` says whether the response
/// supplied timing (RFC 9110 §10.2.3).
pub fn classify(status: u16, repeat: Repeat, retry_after: bool) -> Settlement {
    let settle = |outcome, code, retry| Settlement {
        outcome,
        code,
        retry,
    };
    let safe = repeat != Repeat::Unsafe;
    match status {
        // Success and redirects are complete results of this exchange; a 202 settles
        // the submission, not the job it queued.
        200..=399 => settle(Outcome::Committed, None, Retry::Never),
        401 | 403 => settle(
            Outcome::Rejected,
            Some(Code::RemoteUnauthorized),
            Retry::AfterCorrection,
        ),
        // The server refused to process it now; repeating is allowed only when it is
        // safe to repeat. Without a safe basis this invocation is not repeated.
        408 | 429 if safe => settle(
            Outcome::Rejected,
            Some(Code::RemoteRateLimited),
            Retry::Backoff,
        ),
        408 | 429 => settle(
            Outcome::Rejected,
            Some(Code::RemoteRateLimited),
            Retry::Never,
        ),
        400..=499 => settle(
            Outcome::Rejected,
            Some(Code::RemoteRejected),
            Retry::AfterCorrection,
        ),
        // 503 with Retry-After is an explicit "not now"; otherwise a 5xx is a known
        // answer from an application that may have changed state before producing it.
        503 if retry_after && safe => settle(
            Outcome::Rejected,
            Some(Code::RemoteRateLimited),
            Retry::Backoff,
        ),
        _ => {
            let retry = match repeat {
                Repeat::Idempotent => Retry::Backoff,
                Repeat::SameKey => Retry::SameIdempotencyKey,
                Repeat::Unsafe => Retry::Reconcile,
            };
            settle(Outcome::Committed, Some(Code::RemoteServerError), retry)
        }
    }
}

/// Representative rows for the documentation table: (status, repeat, retry-after).
pub const MAPPING_EXAMPLES: &[(u16, Repeat, bool)] = &[
    (200, Repeat::Unsafe, false),
    (201, Repeat::Unsafe, false),
    (202, Repeat::Unsafe, false),
    (307, Repeat::Unsafe, false),
    (400, Repeat::Unsafe, false),
    (401, Repeat::Idempotent, false),
    (403, Repeat::Unsafe, false),
    (404, Repeat::Idempotent, false),
    (409, Repeat::Unsafe, false),
    (429, Repeat::Idempotent, true),
    (429, Repeat::SameKey, true),
    (429, Repeat::Unsafe, true),
    (500, Repeat::Idempotent, false),
    (500, Repeat::SameKey, false),
    (500, Repeat::Unsafe, false),
    (502, Repeat::Unsafe, false),
    (503, Repeat::Idempotent, true),
    (503, Repeat::Unsafe, true),
    (503, Repeat::Idempotent, false),
];

/// The status mapping as a Markdown table.
pub fn mapping_table_markdown() -> String {
    let mut out = String::from(
        "\n## HTTP status mapping\n\n\
         A complete final response settles the exchange (1xx never does). \"repeat\" is \
         what the target's configuration says: `idempotent` (method listed in \
         `idempotent_methods`), `same_key` (sent under `[http.idempotency]` with a key), \
         `unsafe` (neither). Generated from `channel::http::status::classify`.\n\n\
         | status | repeat | Retry-After | outcome | code | retry |\n\
         |---|---|---|---|---|---|\n",
    );
    for &(status, repeat, retry_after) in MAPPING_EXAMPLES {
        let s = classify(status, repeat, retry_after);
        out.push_str(&format!(
            "| {status} | {} | {} | {} | {} | {} |\n",
            match repeat {
                Repeat::Idempotent => "idempotent",
                Repeat::SameKey => "same_key",
                Repeat::Unsafe => "unsafe",
            },
            if retry_after { "yes" } else { "no" },
            s.outcome.as_str(),
            s.code
                .map_or("—".to_string(), |c| format!("`{}`", c.as_str())),
            s.retry.as_str(),
        ));
    }
    out
}
