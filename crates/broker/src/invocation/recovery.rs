//! Crash recovery: at startup, every invocation a crash left without a terminal record
//! is closed with a FAILED record that says what its evidence proves: `unknown` after
//! dispatch (the remote may have acted), `not_attempted` before (nothing was sent).
//!
//! Must never: close an invocation as not_attempted once it dispatched.

use crate::contract::{Code, Outcome, Retry};
use crate::journal::events::EventBody;
use crate::journal::{Journal, JournalError};

impl Journal {
    /// Closes every interrupted invocation with a FAILED record that says what the
    /// evidence proves: unknown after dispatch, not_attempted before. Run at startup.
    pub fn recover_interrupted(&self) -> Result<Vec<String>, JournalError> {
        let now = self.now_ms();
        let mut closed = Vec::new();
        for p in self.interrupted()? {
            let (code, retry, message) = if p.attempt.dispatched {
                (
                    Code::RemoteOutcomeUnknown,
                    p.retry(now),
                    "The broker stopped after dispatch and before a complete response; the remote may have acted.",
                )
            } else {
                (
                    Code::BrokerInterrupted,
                    Retry::Backoff,
                    "The broker stopped before dispatch; nothing was sent.",
                )
            };
            let outcome = if p.attempt.dispatched {
                Outcome::Unknown
            } else {
                Outcome::NotAttempted
            };
            let body = EventBody::Failed {
                phase: p.phase,
                outcome,
                retry,
                code,
                message: message.to_string(),
                field: None,
            };
            self.append(&p.invocation_id, body)?;
            closed.push(p.invocation_id);
        }
        Ok(closed)
    }
}
