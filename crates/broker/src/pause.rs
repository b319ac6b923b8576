//! The operator's pause of agent calls. While paused, an agent starts nothing new: a
//! call that would run an invocation (a request, a retry, a job poll) is refused with
//! AGENTS_PAUSED before anything is recorded or sent. What is already running finishes
//! (stopping it mid-flight would only turn outcomes into `unknown`), approvals already
//! pending can still be answered, and agents may still read their own records.
//!
//! Refused rather than held: a held call keeps the agent's client waiting on a timeout
//! it does not know, and a call that outlives its client's patience is cancelled, which
//! is worse evidence than a clear "not attempted, try later".
//!
//! Only the operator side changes it (the console's `pause_agents` / `resume_agents`,
//! over Tauri IPC or the operator socket); the MCP server only reads it, and a peer
//! broker's call is answered `unavailable` while it holds. Each change is recorded in
//! the journal (AGENT_PAUSE, with the operator) and a restart opens in the state last
//! recorded.

use tokio::sync::watch;

use crate::contract::{Code, ErrorBody, Outcome, Phase, Retry};

/// Whether agent calls are paused; cheap to read, and watchable (the tray follows it).
#[derive(Debug)]
pub struct AgentPause {
    state: watch::Sender<bool>,
    /// Held while a change is recorded, so records and states change in one order.
    changing: std::sync::Mutex<()>,
}

impl Default for AgentPause {
    fn default() -> Self {
        AgentPause::new(false)
    }
}

impl AgentPause {
    /// Starts `paused` (what the journal last recorded).
    pub fn new(paused: bool) -> Self {
        AgentPause {
            state: watch::Sender::new(paused),
            changing: std::sync::Mutex::new(()),
        }
    }

    pub fn is_paused(&self) -> bool {
        *self.state.borrow()
    }

    /// Sets the state; returns whether it changed.
    pub fn set(&self, paused: bool) -> bool {
        self.state.send_if_modified(|state| {
            let changed = *state != paused;
            *state = paused;
            changed
        })
    }

    /// Changes the state to `paused` and has `record` record the change; returns
    /// whether it changed. A pause holds even if it cannot be recorded (stopping agents
    /// must not depend on the disk); a resume happens only once it is recorded.
    pub fn set_recorded<E>(
        &self,
        paused: bool,
        record: impl FnOnce(bool) -> Result<(), E>,
    ) -> Result<bool, E> {
        let _changing = self
            .changing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.is_paused() == paused {
            return Ok(false);
        }
        if paused {
            self.set(true);
            record(true)?;
        } else {
            record(false)?;
            self.set(false);
        }
        Ok(true)
    }

    /// Follows the state (the first value is the current one).
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.state.subscribe()
    }

    /// What a refused agent call answers: nothing was recorded or sent.
    pub fn refusal() -> ErrorBody {
        ErrorBody {
            code: Code::AgentsPaused,
            phase: Phase::Validation,
            outcome: Outcome::NotAttempted,
            retry: Retry::Backoff,
            message: "The operator paused agent calls; nothing was recorded or sent. Try \
                      again later: the pause lasts until the operator resumes agents."
                .to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_is_seen_by_watchers_and_reports_only_real_changes() {
        let pause = AgentPause::default();
        let mut watcher = pause.subscribe();
        assert!(!pause.is_paused());
        assert!(pause.set(true));
        assert!(!pause.set(true), "pausing twice changes nothing");
        assert!(pause.is_paused());
        assert!(watcher.has_changed().unwrap_or(false));
        assert!(*watcher.borrow_and_update());
        assert!(pause.set(false));
        assert!(!pause.is_paused());
    }

    #[test]
    fn a_pause_holds_when_it_cannot_be_recorded_and_a_resume_needs_its_record() {
        let pause = AgentPause::default();
        let mut recorded = Vec::new();
        assert_eq!(
            pause.set_recorded(true, |p| {
                recorded.push(p);
                Ok::<_, ()>(())
            }),
            Ok(true)
        );
        assert_eq!(
            pause.set_recorded(true, |_| Err(())),
            Ok(false),
            "no change, no record"
        );
        assert_eq!(
            pause.set_recorded(false, |_| Err("disk full")),
            Err("disk full")
        );
        assert!(pause.is_paused(), "an unrecorded resume does not resume");
        assert_eq!(
            pause.set_recorded(false, |p| {
                recorded.push(p);
                Ok::<_, ()>(())
            }),
            Ok(true)
        );
        assert!(!pause.is_paused());
        assert_eq!(
            pause.set_recorded(true, |_| Err("disk full")),
            Err("disk full")
        );
        assert!(
            pause.is_paused(),
            "a pause holds although its record failed"
        );
        assert_eq!(recorded, [true, false]);
    }

    #[test]
    fn the_refusal_says_nothing_was_attempted() {
        let refusal = AgentPause::refusal();
        assert_eq!(refusal.code, Code::AgentsPaused);
        assert_eq!(refusal.outcome, Outcome::NotAttempted);
        assert_eq!(refusal.retry, Retry::Backoff);
        assert_eq!(refusal.code.spec().outcome, Some(Outcome::NotAttempted));
    }
}
