//! What one call answers: the [`Outcome`], and the envelopes for a journal that failed
//! part-way, which say only what can still be proved.

use super::recorder::Recorder;
use crate::contract::{self, Code, Envelope, ErrorBody, Evidence, Phase, Retry};
use crate::journal::projection::Projection;
use crate::journal::{JournalError, Unrecorded};
use crate::retry::RetryManifest;

/// What one call produced: a settled result (which may still carry an error code, an
/// HTTP 500 or a refused exec for instance), or an envelope saying what the records
/// prove.
#[derive(Debug, Clone)]
pub struct Outcome<R> {
    pub invocation_id: String,
    pub outcome: contract::Outcome,
    pub result: Option<R>,
    /// Present when the record carries a code.
    pub error: Option<Envelope>,
    /// For a retry: the manifest the decision was recorded with.
    pub manifest: Option<RetryManifest>,
}

impl<R> Outcome<R> {
    /// The answer for an envelope alone (nothing settled to return).
    pub fn of_envelope(envelope: Envelope) -> Self {
        Outcome {
            invocation_id: envelope.invocation_id.clone(),
            outcome: envelope.error.outcome,
            result: None,
            error: Some(envelope),
            manifest: None,
        }
    }

    /// What the record `p` says, without a result.
    pub fn of_projection(p: &Projection, now_ms: i64) -> Self {
        Outcome {
            invocation_id: p.invocation_id.clone(),
            outcome: p.outcome,
            result: None,
            error: p.envelope(now_ms),
            manifest: None,
        }
    }
}

/// The answer for a failure that could not even be recorded (the journal is down).
/// Nothing was sent: every path that reaches the network records DISPATCH_STARTED
/// first, and that record is what failed.
pub fn unrecorded<R>(invocation_id: &str, error: &JournalError) -> Outcome<R> {
    Outcome::of_envelope(unrecorded_failure(invocation_id, error))
}

/// The envelope of [`unrecorded`].
pub fn unrecorded_failure(invocation_id: &str, error: &JournalError) -> Envelope {
    broker_unavailable(
        invocation_id,
        format!("The broker could not record this request; nothing was sent. ({error})"),
    )
}

/// The journal failed and its record cannot even be read back, after this invocation
/// may have been dispatched: nothing can prove the request stayed unsent, so report the
/// conservative outcome (a broker that cannot prove an operation stayed unattempted
/// must not call it a preflight failure).
pub fn unprovable(invocation_id: &str, error: &JournalError) -> Envelope {
    Envelope {
        invocation_id: invocation_id.to_string(),
        error: ErrorBody {
            code: Code::ResultStoreFailed,
            phase: Phase::RemoteExecution,
            outcome: contract::Outcome::Unknown,
            retry: Retry::Reconcile,
            message: format!(
                "The journal failed and the record cannot be read; the request may have been sent. ({error})"
            ),
        },
        evidence: Evidence {
            dispatch_started: true,
            ..Evidence::default()
        },
    }
}

/// What to report when the journal failed part-way through an invocation: after a
/// recorded dispatch the outcome stands as recorded (the remote may have acted) with
/// RESULT_STORE_FAILED. Without one, nothing was sent, whether or not the record can be
/// read back: DISPATCH_STARTED is durable before the first byte goes out, so a request
/// this process never dispatched (and whose record shows no earlier dispatch) stayed
/// here. Only an invocation that may have dispatched and whose record is unreadable is
/// unprovable. What is answered for an invocation that left no record is remembered
/// for `get_invocation`.
pub fn journal_failure(rec: &Recorder, error: &JournalError, now_ms: i64) -> Envelope {
    // A step that failed because an earlier one was refused for space says only that
    // the invocation is missing; name the cause instead.
    let full;
    let error = if !error.is_disk_full() && rec.journal().low_space() {
        full = JournalError::DiskFull {
            detail: crate::journal::space::describe(rec.journal().path()),
        };
        &full
    } else {
        error
    };
    match rec.projection() {
        Ok(p) if p.ever_dispatched => {
            let retry = p.retry(now_ms);
            let mut envelope = p.envelope(now_ms).unwrap_or_else(|| Envelope {
                invocation_id: p.invocation_id.clone(),
                error: ErrorBody {
                    code: Code::ResultStoreFailed,
                    phase: p.phase,
                    outcome: p.outcome,
                    retry,
                    message: String::new(),
                },
                evidence: p.evidence(),
            });
            envelope.error.code = Code::ResultStoreFailed;
            envelope.error.message = format!("The journal failed after dispatch: {error}");
            envelope
        }
        Ok(p) => {
            // Close the record if the journal takes it now (the reserve a full disk gives
            // back is there for this), so it does not stay "in progress" until a restart.
            if !p.terminal {
                let _ = rec.fail(
                    p.phase,
                    Code::BrokerUnavailable,
                    Retry::Backoff,
                    "The journal failed before dispatch; nothing was sent.",
                );
            }
            unrecorded_failure(rec.id(), error)
        }
        Err(_) if rec.may_have_dispatched() => unprovable(rec.id(), error),
        Err(_) => {
            let envelope = unrecorded_failure(rec.id(), error);
            rec.journal().note_unrecorded(Unrecorded {
                invocation_id: rec.id().to_string(),
                session: rec.session().map(str::to_string),
                envelope: envelope.clone(),
            });
            envelope
        }
    }
}

/// BROKER_UNAVAILABLE: nothing was recorded and nothing was sent.
pub fn broker_unavailable(invocation_id: &str, message: String) -> Envelope {
    Envelope {
        invocation_id: invocation_id.to_string(),
        error: ErrorBody {
            code: Code::BrokerUnavailable,
            phase: Phase::Validation,
            outcome: contract::Outcome::NotAttempted,
            retry: Retry::Backoff,
            message,
        },
        evidence: Evidence::default(),
    }
}
