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
//! over Tauri IPC or the operator socket); the MCP server only reads it.

use tokio::sync::watch;

use crate::contract::{Code, ErrorBody, Outcome, Phase, Retry};

/// Whether agent calls are paused; cheap to read, and watchable (the tray follows it).
#[derive(Debug)]
pub struct AgentPause {
    state: watch::Sender<bool>,
}

impl Default for AgentPause {
    fn default() -> Self {
        AgentPause {
            state: watch::Sender::new(false),
        }
    }
}

impl AgentPause {
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
    fn the_refusal_says_nothing_was_attempted() {
        let refusal = AgentPause::refusal();
        assert_eq!(refusal.code, Code::AgentsPaused);
        assert_eq!(refusal.outcome, Outcome::NotAttempted);
        assert_eq!(refusal.retry, Retry::Backoff);
        assert_eq!(refusal.code.spec().outcome, Some(Outcome::NotAttempted));
    }
}
