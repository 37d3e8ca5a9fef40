//! Delivery claims of a store that one process owns (sled, memory): held in that
//! process's memory, because a claim only has to outlive its attempt, and a restart
//! ends every attempt (so every claim) anyway. A shared database keeps them in a
//! table instead; the promise is the same: one owner at a time, with a lease.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::EventId;
use crate::lock::lock;

/// A claim as the table holds it.
#[derive(Clone, Debug)]
struct Held {
    token: u64,
    expires_us: u64,
}

/// Claims by (destination, event).
#[derive(Default)]
pub(crate) struct ClaimTable {
    held: Mutex<HashMap<(String, EventId), Held>>,
    next_token: AtomicU64,
}

impl ClaimTable {
    /// Claims the delivery unless someone holds an unexpired claim; returns its token.
    pub(crate) fn try_claim(
        &self,
        dest: &str,
        event: EventId,
        now_us: u64,
        expires_us: u64,
    ) -> Option<u64> {
        let mut held = lock(&self.held);
        let key = (dest.to_owned(), event);
        if held.get(&key).is_some_and(|h| h.expires_us > now_us) {
            return None;
        }
        let token = self.next_token.fetch_add(1, Ordering::Relaxed) + 1;
        held.insert(key, Held { token, expires_us });
        Some(token)
    }

    /// Whether the delivery is claimed by anyone at `now_us`.
    pub(crate) fn is_claimed(&self, dest: &str, event: EventId, now_us: u64) -> bool {
        lock(&self.held).get(&(dest.to_owned(), event)).is_some_and(|h| h.expires_us > now_us)
    }

    /// Whether `token` still holds the claim (expired or not, nobody took it over).
    pub(crate) fn holds(&self, dest: &str, event: EventId, token: u64) -> bool {
        lock(&self.held).get(&(dest.to_owned(), event)).is_some_and(|h| h.token == token)
    }

    /// Ends the claim `token`, if it still holds it.
    pub(crate) fn release(&self, dest: &str, event: EventId, token: u64) {
        let mut held = lock(&self.held);
        let key = (dest.to_owned(), event);
        if held.get(&key).is_some_and(|h| h.token == token) {
            held.remove(&key);
        }
    }

    /// Ends every claim on `dest` whose token is not in `keep`; returns how many.
    pub(crate) fn release_except(&self, dest: &str, keep: &[u64]) -> usize {
        let mut held = lock(&self.held);
        let before = held.len();
        held.retain(|(d, _), h| d != dest || keep.contains(&h.token));
        before - held.len()
    }

    /// Forgets every claim (a restart, in tests).
    #[cfg(test)]
    pub(crate) fn clear(&self) {
        lock(&self.held).clear();
    }
}
