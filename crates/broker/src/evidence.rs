//! What an invocation's durable record means: the step each event belongs to, what the
//! record proves and what it does not, whether an unknown outcome still needs settling,
//! the status `get_invocation` reports, and an operator's attestation of an unknown
//! outcome.
//!
//! The console, the MCP server and the CLI all read a record through these functions, so
//! they give the same answers about the same evidence.

use serde::Serialize;
use serde_json::Value;

use crate::contract::{Code, ConfidenceSource, Evidence, Outcome, Phase, Retry};
use crate::display::escape_text;
use crate::invocation::Recorder;
use crate::journal::events::{Event, EventBody, Settlement};
use crate::journal::projection::Projection;
use crate::journal::{Appended, Journal, JournalError};
use crate::retry::Verdict;

// ----- steps of the lifecycle -----------------------------------------------------------

/// The step of an invocation's lifecycle an event belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    Accepted,
    Validated,
    Approval,
    Authorized,
    Connecting,
    Dispatched,
    Response,
    Committed,
    Delivered,
    Failed,
    Retry,
    Reconciled,
    /// A tracked job and what its status resource said.
    Job,
    /// A journal-level record (not an invocation's step).
    Journal,
    /// A session record (not an invocation step): who the agent is.
    Session,
}

impl Step {
    /// The step's name as the console shows it, e.g. `dispatched`.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Accepted => "accepted",
            Step::Validated => "validated",
            Step::Approval => "approval",
            Step::Authorized => "authorized",
            Step::Connecting => "connecting",
            Step::Dispatched => "dispatched",
            Step::Response => "response",
            Step::Committed => "committed",
            Step::Delivered => "delivered",
            Step::Failed => "failed",
            Step::Retry => "retry",
            Step::Reconciled => "reconciled",
            Step::Job => "job",
            Step::Journal => "journal",
            Step::Session => "session",
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The step of the lifecycle `body` records.
pub fn step_of(body: &EventBody) -> Step {
    match body {
        EventBody::ActionAccepted { .. } => Step::Accepted,
        EventBody::PreflightValidated { .. } => Step::Validated,
        EventBody::ApprovalRequested { .. }
        | EventBody::ApprovalGranted { .. }
        | EventBody::ApprovalDenied { .. } => Step::Approval,
        EventBody::CredentialAuthorized { .. } => Step::Authorized,
        EventBody::AttemptStarted { .. } | EventBody::ConnectionAttempt { .. } => Step::Connecting,
        EventBody::DispatchStarted { .. } | EventBody::RequestSent { .. } => Step::Dispatched,
        EventBody::RemoteResponseStarted { .. } | EventBody::RemoteResponseComplete { .. } => {
            Step::Response
        }
        EventBody::ResultCommitted { .. } => Step::Committed,
        EventBody::ResultDelivered
        | EventBody::DeliveryFailed { .. }
        | EventBody::ResultExpired { .. } => Step::Delivered,
        EventBody::Failed { .. } => Step::Failed,
        EventBody::RetryManifest { .. } => Step::Retry,
        EventBody::Reconciled { .. } | EventBody::MemberReconciled { .. } => Step::Reconciled,
        EventBody::JobTracked { .. } | EventBody::JobStatus { .. } => Step::Job,
        EventBody::SigningResumed { .. } | EventBody::AgentPause { .. } => Step::Journal,
        EventBody::SessionOpened(_) => Step::Session,
        // What a peer broker answered is its response; its signed "did not run" and
        // an incident end the call.
        EventBody::PeerAnswer(_) => Step::Response,
        EventBody::PeerNotRun { .. } | EventBody::PeerIncident(_) => Step::Failed,
    }
}

/// The facts of an event as `key=value` pairs separated by two spaces, without its kind
/// and without absent values; text values are escaped for display. (The journal holds no
/// secrets, so neither does this.) An approval card is named by its `card_digest`: the
/// card itself is read with [`crate::provenance::ApprovalRecord`].
pub fn describe(body: &EventBody) -> String {
    let Ok(Value::Object(map)) = serde_json::to_value(body) else {
        return String::new();
    };
    map.into_iter()
        .filter(|(k, v)| k != "kind" && k != "card" && !v.is_null())
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k}={}", escape_text(&s)),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join("  ")
}

// ----- what the record proves -----------------------------------------------------------

/// One thing the durable record of an invocation proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proved {
    /// The record has no DISPATCH_STARTED: the remote never saw the request.
    NothingSent,
    /// DISPATCH_STARTED at `seq`: from then on the remote may have received it.
    DispatchStarted { seq: u64 },
    /// The dispatching connection was to this verified peer.
    VerifiedPeer { peer: String },
    /// The whole request was written to the connection.
    RequestComplete,
    /// The remote began answering, with this HTTP status when there was one.
    RemoteAnswered { http_status: Option<u16> },
    /// The request carried this idempotency key.
    IdempotencyKey { key: String },
    /// The invocation was dispatched this many times (more than once).
    DispatchedTimes { times: u32 },
}

impl std::fmt::Display for Proved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Proved::NothingSent => f.write_str(
                "Nothing was sent: the record has no DISPATCH_STARTED, so the remote never saw \
                 this request.",
            ),
            Proved::DispatchStarted { seq } => write!(
                f,
                "Dispatch started (seq {seq}): from then on the remote may have received the \
                 request."
            ),
            Proved::VerifiedPeer { peer } => {
                write!(f, "The connection was to the verified peer {peer}.")
            }
            Proved::RequestComplete => {
                f.write_str("The whole request was written to the connection.")
            }
            Proved::RemoteAnswered {
                http_status: Some(status),
            } => write!(f, "The remote began answering (HTTP {status})."),
            Proved::RemoteAnswered { http_status: None } => {
                f.write_str("The remote began answering.")
            }
            Proved::IdempotencyKey { key } => write!(
                f,
                "It carried idempotency key {key}; the remote can be asked about that key."
            ),
            Proved::DispatchedTimes { times } => write!(f, "It was dispatched {times} times."),
        }
    }
}

/// One thing the durable record of an invocation does not prove.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotProved {
    /// The request was dispatched but not known to have been written whole.
    WholeRequestLeft,
    /// No response began: the remote may or may not have the request.
    RemoteReceived,
    /// An unknown outcome with no complete response.
    CompleteResponse,
    /// The outcome is unknown: the remote may or may not have applied it.
    RemoteApplied,
}

impl std::fmt::Display for NotProved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NotProved::WholeRequestLeft => "That the whole request left this machine.",
            NotProved::RemoteReceived => "That the remote received or processed the request.",
            NotProved::CompleteResponse => "A complete response: none was received.",
            NotProved::RemoteApplied => "Whether the remote applied the operation.",
        })
    }
}

/// What the durable record of one invocation proves and what it does not, in the order
/// an operator reads them. Each item displays as a sentence an operator can act on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecordProof {
    pub proves: Vec<Proved>,
    pub does_not_prove: Vec<NotProved>,
}

impl RecordProof {
    /// Reads the record of `p`, whose events are `events`.
    pub fn of(p: &Projection, events: &[Event]) -> RecordProof {
        let mut proves = Vec::new();
        let mut not = Vec::new();
        let dispatch = events.iter().find_map(|e| match &e.body {
            EventBody::DispatchStarted { peer_identity, .. } => {
                Some((e.seq, peer_identity.clone()))
            }
            _ => None,
        });
        match dispatch {
            None => proves.push(Proved::NothingSent),
            Some((seq, peer)) => {
                proves.push(Proved::DispatchStarted { seq });
                if let Some(peer) = peer {
                    proves.push(Proved::VerifiedPeer { peer });
                }
            }
        }
        let m = p.last_dispatched.as_ref().unwrap_or(&p.attempt);
        if p.ever_dispatched {
            if m.request_complete {
                proves.push(Proved::RequestComplete);
            } else {
                not.push(NotProved::WholeRequestLeft);
            }
            if m.response_headers_received {
                proves.push(Proved::RemoteAnswered {
                    http_status: m.http_status,
                });
            } else {
                not.push(NotProved::RemoteReceived);
            }
            if !m.response_complete && p.outcome == Outcome::Unknown {
                not.push(NotProved::CompleteResponse);
            }
        }
        if let Some(key) = p
            .operation
            .as_ref()
            .and_then(|o| o.idempotency.as_ref())
            .map(|i| i.key.clone())
        {
            proves.push(Proved::IdempotencyKey { key });
        }
        if p.dispatches > 1 {
            proves.push(Proved::DispatchedTimes {
                times: p.dispatches,
            });
        }
        if p.outcome == Outcome::Unknown {
            not.push(NotProved::RemoteApplied);
        }
        RecordProof {
            proves,
            does_not_prove: not,
        }
    }

    /// The record says the request never reached a transport.
    pub fn nothing_sent(&self) -> bool {
        self.proves.contains(&Proved::NothingSent)
    }

    /// What is proved, as sentences.
    pub fn proves_sentences(&self) -> Vec<String> {
        self.proves.iter().map(ToString::to_string).collect()
    }

    /// What is not proved, as sentences.
    pub fn does_not_prove_sentences(&self) -> Vec<String> {
        self.does_not_prove
            .iter()
            .map(ToString::to_string)
            .collect()
    }
}

/// What the durable record of `p` (with its `events`) proves and does not prove.
pub fn what_the_record_proves(p: &Projection, events: &[Event]) -> RecordProof {
    RecordProof::of(p, events)
}

// ----- settlement -----------------------------------------------------------------------

/// Whether `p` is an unknown outcome that nothing has settled
/// ([`Projection::is_unsettled`]). Only such an outcome can be queried or attested.
pub fn is_unsettled(p: &Projection) -> bool {
    p.is_unsettled()
}

/// A settlement's wire name: `committed` or `not_applied`.
pub fn settlement_name(settlement: Settlement) -> &'static str {
    match settlement {
        Settlement::Committed => "committed",
        Settlement::NotApplied => "not_applied",
    }
}

/// The settlement named `name` (`committed` or `not_applied`).
pub fn parse_settlement(name: &str) -> Option<Settlement> {
    [Settlement::Committed, Settlement::NotApplied]
        .into_iter()
        .find(|s| settlement_name(*s) == name)
}

/// A reconciliation recorded for an invocation (a RECONCILED event), as the console
/// shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct Reconciliation {
    /// `remote_query` or `operator_attested`.
    pub source: ConfidenceSource,
    pub settlement: Settlement,
    pub by: String,
    pub note: String,
    /// When it was recorded (unix ms).
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub at_ms: i64,
}

/// The newest reconciliation among `events`, if any.
pub fn latest_reconciliation(events: &[Event]) -> Option<Reconciliation> {
    events.iter().rev().find_map(|e| match &e.body {
        EventBody::Reconciled {
            source,
            settlement,
            by,
            note,
            ..
        } => Some(Reconciliation {
            source: *source,
            settlement: *settlement,
            by: by.clone(),
            note: note.clone(),
            at_ms: e.recorded_at_ms,
        }),
        _ => None,
    })
}

/// The verdict of the newest retry manifest among `events`, if a retry was planned.
pub fn latest_retry_verdict(events: &[Event]) -> Option<Verdict> {
    events.iter().rev().find_map(|e| match &e.body {
        EventBody::RetryManifest { verdict, .. } => Some(*verdict),
        _ => None,
    })
}

// ----- status ---------------------------------------------------------------------------

/// An invocation's status as `get_invocation` reports it (and the console shows it):
/// phase, outcome, retry now, code, delivery and the evidence, without the events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InvocationStatus {
    pub invocation_id: String,
    pub target: Option<String>,
    pub summary: Option<String>,
    pub phase: Phase,
    pub outcome: Outcome,
    /// The retry disposition at the time asked.
    pub retry: Retry,
    pub code: Option<Code>,
    pub delivered: bool,
    pub evidence: Evidence,
}

impl InvocationStatus {
    /// The status of `p` at `now_ms`.
    pub fn of(p: &Projection, now_ms: i64) -> InvocationStatus {
        InvocationStatus {
            invocation_id: p.invocation_id.clone(),
            target: p.target.clone(),
            summary: p.summary.clone(),
            phase: p.phase,
            outcome: p.outcome,
            retry: p.retry(now_ms),
            code: p.effective_code(),
            delivered: p.delivered,
            evidence: p.evidence(),
        }
    }

    /// As a JSON object (`Null` only if serialization failed, which plain data cannot).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// [`InvocationStatus::of`] as a JSON object.
pub fn invocation_status(p: &Projection, now_ms: i64) -> Value {
    InvocationStatus::of(p, now_ms).to_json()
}

// ----- attestation ----------------------------------------------------------------------

/// The longest note an attestation may carry, in characters.
pub const MAX_NOTE_CHARS: usize = 2000;

/// An operator's statement of what an unknown outcome turned out to be.
#[derive(Debug, Clone, Copy)]
pub struct Attestation<'a> {
    pub invocation_id: &'a str,
    /// `committed` or `not_applied`.
    pub settlement: &'a str,
    /// What the operator checked (trimmed before it is recorded).
    pub note: &'a str,
    /// Who attests, as recorded in the journal.
    pub by: &'a str,
}

/// Why an attestation was not recorded. Nothing was appended in any case.
#[derive(Debug, thiserror::Error)]
pub enum AttestError {
    #[error("The settlement is `committed` or `not_applied`.")]
    UnknownSettlement,
    #[error("Say what you checked: an attestation needs a note.")]
    EmptyNote,
    #[error("The note is longer than {MAX_NOTE_CHARS} characters.")]
    NoteTooLong,
    #[error("No invocation {0} in this journal.")]
    UnknownInvocation(String),
    #[error("This invocation's outcome is not an unsettled unknown; nothing was recorded.")]
    NotUnsettled,
    /// The record could not be read.
    #[error("The journal could not be read: {0}")]
    Unreadable(JournalError),
    /// The journal refused the RECONCILED event.
    #[error("The attestation was not recorded: {0}")]
    Refused(JournalError),
}

impl AttestError {
    /// The attestation field the error is about, when it is about one.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            AttestError::UnknownSettlement => Some("settlement"),
            AttestError::EmptyNote | AttestError::NoteTooLong => Some("note"),
            AttestError::UnknownInvocation(_) => Some("invocation_id"),
            AttestError::NotUnsettled | AttestError::Unreadable(_) | AttestError::Refused(_) => {
                None
            }
        }
    }
}

/// Records an operator's attestation of an unsettled unknown outcome. The original
/// attempt is never rewritten: a RECONCILED event (`operator_attested`, who, the trimmed
/// note) is appended. The settlement and note are checked before the record is read, and
/// nothing is appended unless every check passes.
pub fn attest(journal: &Journal, attestation: &Attestation<'_>) -> Result<Appended, AttestError> {
    let settlement =
        parse_settlement(attestation.settlement).ok_or(AttestError::UnknownSettlement)?;
    let note = attestation.note.trim();
    if note.is_empty() {
        return Err(AttestError::EmptyNote);
    }
    if note.chars().count() > MAX_NOTE_CHARS {
        return Err(AttestError::NoteTooLong);
    }
    let p = match journal.projection(attestation.invocation_id) {
        Ok(p) => p,
        Err(JournalError::UnknownInvocation(id)) => {
            return Err(AttestError::UnknownInvocation(id));
        }
        Err(e) => return Err(AttestError::Unreadable(e)),
    };
    if !is_unsettled(&p) {
        return Err(AttestError::NotUnsettled);
    }
    let rec =
        Recorder::resume(journal, attestation.invocation_id).map_err(AttestError::Unreadable)?;
    rec.reconcile(
        ConfidenceSource::OperatorAttested,
        settlement,
        attestation.by,
        note,
        None,
    )
    .map_err(AttestError::Refused)
}
