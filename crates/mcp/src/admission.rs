//! How many agent connections the broker holds, in all and per OS user, so that one
//! user's flood cannot take the descriptors and memory every other user's calls need
//! (issue 26: 1,000 concurrent bridges exhausted the daemon's descriptors and other users'
//! calls failed as VAULT_LOCKED or CONNECTION_REFUSED).
//!
//! When all slots are taken the broker stops accepting: new connections wait in the
//! kernel's backlog and, once it is full, are refused, which the bridge reports to its
//! agent as BROKER_UNAVAILABLE (backoff). A user past its own cap is closed at once; the
//! cap is below the total, so one user alone never fills it.
//!
//! The same slots, keyed by source address instead of user, cap the peering port's
//! connections ([`crate::peering`]).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

use postern_broker::platform::UserId;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Agent connections the broker holds at once.
pub const MAX_CONNECTIONS: usize = 512;
/// Agent connections one OS user may hold at once.
pub const MAX_PER_USER: usize = 64;
/// Descriptors kept free for the journal, the keychain and outgoing connections when the
/// process may not open many.
const RESERVED_DESCRIPTORS: usize = 256;

/// The broker's connection slots, counted in all and per `K` (an OS user for agent
/// connections; a source address for the peering port). A connection is never admitted
/// past either cap, and its slot and count are never kept after it ends.
pub struct Admission<K: Eq + Hash = UserId> {
    slots: Arc<Semaphore>,
    per_key: Mutex<HashMap<K, usize>>,
    max_per_key: usize,
}

/// One admitted connection; its slot and its key's count are given back when dropped.
pub struct Admitted<K: Eq + Hash = UserId> {
    _slot: OwnedSemaphorePermit,
    key: K,
    admission: Arc<Admission<K>>,
}

impl<K: Eq + Hash> Drop for Admitted<K> {
    fn drop(&mut self) {
        let mut counts = self
            .admission
            .per_key
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = counts.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

impl Admission<UserId> {
    /// The caps for a process that may hold `descriptors` open: [`MAX_CONNECTIONS`] and
    /// [`MAX_PER_USER`], lowered so that every connection's descriptor and the reserve
    /// fit.
    pub fn for_descriptors(descriptors: Option<u64>) -> Arc<Admission> {
        let room = descriptors
            .and_then(|d| usize::try_from(d).ok())
            .map_or(MAX_CONNECTIONS, |d| {
                d.saturating_sub(RESERVED_DESCRIPTORS) / 2
            })
            .clamp(8, MAX_CONNECTIONS);
        Admission::new(room, MAX_PER_USER.min(room / 2).max(1))
    }
}

impl<K: Eq + Hash + Clone> Admission<K> {
    /// `total` slots, at most `per_key` of them held by one key.
    pub fn new(total: usize, per_key: usize) -> Arc<Admission<K>> {
        Arc::new(Admission {
            slots: Arc::new(Semaphore::new(total)),
            per_key: Mutex::new(HashMap::new()),
            max_per_key: per_key,
        })
    }

    /// Waits for a free slot: while none is free the caller does not accept.
    pub async fn slot(self: &Arc<Self>) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().acquire_owned().await.ok()
    }

    /// A free slot now, or `None` when every slot is taken (never waits).
    pub fn try_slot(self: &Arc<Self>) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// Admits a connection of `key` on `slot`; `None` when that key holds its cap (the
    /// slot is then free again at once).
    pub fn admit(self: &Arc<Self>, slot: OwnedSemaphorePermit, key: &K) -> Option<Admitted<K>> {
        let mut counts = self.per_key.lock().unwrap_or_else(PoisonError::into_inner);
        let held = counts.entry(key.clone()).or_insert(0);
        if *held >= self.max_per_key {
            if *held == 0 {
                counts.remove(key);
            }
            return None;
        }
        *held += 1;
        Some(Admitted {
            _slot: slot,
            key: key.clone(),
            admission: self.clone(),
        })
    }

    /// The most connections one key may hold.
    pub fn max_per_key(&self) -> usize {
        self.max_per_key
    }

    /// Free slots right now.
    pub fn free(&self) -> usize {
        self.slots.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Regression: issue 26 (item 4).
    #[tokio::test]
    async fn one_user_cannot_take_every_slot_and_slots_come_back() {
        let admission = Admission::new(4, 2);
        let flooder = UserId::Uid(1001);
        let other = UserId::Uid(1002);
        let a = admission
            .admit(admission.slot().await.unwrap(), &flooder)
            .unwrap();
        let b = admission
            .admit(admission.slot().await.unwrap(), &flooder)
            .unwrap();
        // Past its cap the flooder is refused and its slot is free again at once.
        assert!(
            admission
                .admit(admission.slot().await.unwrap(), &flooder)
                .is_none()
        );
        assert_eq!(admission.free(), 2);
        let c = admission
            .admit(admission.slot().await.unwrap(), &other)
            .unwrap();
        let d = admission
            .admit(admission.slot().await.unwrap(), &other)
            .unwrap();
        assert_eq!(admission.free(), 0);
        // Full: the next slot waits until a connection ends.
        let waiting = tokio::spawn({
            let admission = admission.clone();
            async move { admission.slot().await.is_some() }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(a);
        assert!(waiting.await.unwrap());
        drop((b, c, d));
        assert_eq!(admission.free(), 4);
        assert!(
            admission
                .admit(admission.slot().await.unwrap(), &flooder)
                .is_some()
        );
    }

    #[test]
    fn a_low_descriptor_limit_lowers_the_caps_and_keeps_a_reserve() {
        let low = Admission::for_descriptors(Some(1024));
        assert_eq!(low.free(), (1024 - RESERVED_DESCRIPTORS) / 2);
        assert_eq!(low.max_per_key(), MAX_PER_USER);
        let high = Admission::for_descriptors(Some(65_536));
        assert_eq!(high.free(), MAX_CONNECTIONS);
        let tiny = Admission::for_descriptors(Some(100));
        assert_eq!(tiny.free(), 8);
        assert_eq!(tiny.max_per_key(), 4);
    }
}
