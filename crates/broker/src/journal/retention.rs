//! Retention of stored results: the live policy the writer applies every
//! [`PRUNE_INTERVAL`] (and once when it is set), a batch of expiries per transaction.
//!
//! Must never: delete an event; only result rows expire, each with a RESULT_EXPIRED.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::results;
use super::store::{JournalError, RetentionSource};
use super::writer::{Job, Journal, WriterState, job};
use crate::config::RetentionPolicy;

/// How often the writer applies the result retention policy (also once at open).
pub const PRUNE_INTERVAL: Duration = Duration::from_secs(60);

impl Journal {
    /// Sets where the writer reads the retention policy of stored results, and applies
    /// it once now. Returns how many results expired in this first pass.
    pub fn set_result_retention(&self, source: RetentionSource) -> Result<usize, JournalError> {
        let policy = source();
        if let Ok(mut slot) = self.inner.result_retention.lock() {
            *slot = Some(source);
        }
        self.prune_results(policy)
    }

    /// Applies `policy` to the stored results now: RESULT_EXPIRED for each result
    /// removed, oldest first. Only result rows are deleted; events never are.
    pub fn prune_results(&self, policy: RetentionPolicy) -> Result<usize, JournalError> {
        let mut total = 0;
        loop {
            let n = self.write(false, move |ctx| results::prune_step(ctx, policy))?;
            total += n;
            if n < results::PRUNE_BATCH {
                return Ok(total);
            }
        }
    }
}

impl WriterState {
    pub(super) fn retention_source(&self) -> Option<RetentionSource> {
        self.result_retention.lock().ok()?.clone()
    }

    pub(super) fn prune_due_in(&self) -> Duration {
        self.next_prune.saturating_duration_since(Instant::now())
    }

    /// Applies the result retention policy when its interval has passed: batches of
    /// expiries, each its own transaction, until nothing more is due.
    pub(super) fn prune_when_due(&mut self) {
        if Instant::now() < self.next_prune {
            return;
        }
        self.next_prune = Instant::now() + PRUNE_INTERVAL;
        let Some(source) = self.retention_source() else {
            return;
        };
        let policy = source();
        loop {
            let (tx, rx) = mpsc::sync_channel(1);
            let run = job(
                move |ctx| results::prune_step(ctx, policy),
                move |result| {
                    let _ = tx.send(result);
                },
            );
            self.run_batch(vec![Job {
                durable: false,
                run,
            }]);
            // A failed pass is tried again at the next interval.
            match rx.try_recv() {
                Ok(Ok(n)) if n == results::PRUNE_BATCH => continue,
                _ => break,
            }
        }
    }
}
