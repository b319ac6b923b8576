//! A count of bytes many holders share, so that what untrusted peers make the broker hold
//! in memory (unfinished request lines, command output) is bounded in total, not only per
//! holder (issue 26: 300 connections each holding an unfinished 15 MiB line took the
//! daemon to 4.8 GB; four SSH calls held 1 GB of output).

use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes held against a fixed maximum. Holders take before they hold and give back what
/// they took when they let go; a holder that cannot take drops what it was given.
pub struct ByteBudget {
    held: AtomicUsize,
    max: usize,
}

impl ByteBudget {
    pub const fn new(max: usize) -> Self {
        ByteBudget {
            held: AtomicUsize::new(0),
            max,
        }
    }

    /// Takes up to `want` bytes; returns how many were granted.
    pub fn take_up_to(&self, want: usize) -> usize {
        let mut granted = 0;
        let _ = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                granted = want.min(self.max.saturating_sub(held));
                Some(held + granted)
            });
        granted
    }

    /// Takes exactly `want` bytes, or nothing; whether it took them.
    pub fn take(&self, want: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(want).filter(|total| *total <= self.max)
            })
            .is_ok()
    }

    /// Gives back `n` bytes taken before.
    pub fn give_back(&self, n: usize) {
        let _ = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(n))
            });
    }

    /// Bytes held right now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::ByteBudget;

    #[test]
    fn holders_share_the_maximum_and_get_it_back() {
        let budget = ByteBudget::new(10);
        assert_eq!(budget.take_up_to(8), 8);
        assert_eq!(budget.take_up_to(8), 2);
        assert!(!budget.take(1));
        budget.give_back(8);
        assert!(budget.take(8));
        assert!(!budget.take(1));
        budget.give_back(10);
        assert_eq!(budget.held(), 0);
    }
}
