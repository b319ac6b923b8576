//! Requests and assertions the HTTP channel tests share.

use postern_broker::channel::http::{HttpOutcome, HttpRequest};
use postern_broker::contract::{Code, Envelope, Outcome, Phase, Retry};

/// A JSON POST of `body` to `url`.
pub fn post(url: String, body: &str) -> HttpRequest {
    HttpRequest {
        url,
        method: "POST".into(),
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// A GET of `url`.
pub fn get(url: String) -> HttpRequest {
    HttpRequest {
        url,
        method: "GET".into(),
        ..Default::default()
    }
}

/// The envelope of an outcome that must carry one.
#[allow(clippy::panic)]
pub fn error(outcome: &HttpOutcome) -> &Envelope {
    outcome
        .error
        .as_ref()
        .unwrap_or_else(|| panic!("expected an envelope: {outcome:?}"))
}

/// The envelope says `phase`, `o`, `retry` and `code`, and the outcome agrees.
pub fn assert_error(outcome: &HttpOutcome, phase: Phase, o: Outcome, retry: Retry, code: Code) {
    let env = error(outcome);
    assert_eq!(
        (
            env.error.phase,
            env.error.outcome,
            env.error.retry,
            env.error.code
        ),
        (phase, o, retry, code),
        "{env:#?}"
    );
    assert_eq!(outcome.outcome, o);
}
