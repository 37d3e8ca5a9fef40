//! The silent-loss detector: calls the upstream counted on this relay's hooks
//! (`triggeredCount`) against callbacks the relay stored, per source and event.
//!
//! Counting starts when the relay first sees a hook (or creates it, from 0) and
//! restarts when a hook goes away: a re-created hook's lost window is reported by its
//! `HookGap` event instead. Several accounts' hooks for one event point at the same URL,
//! so the comparison is per (source, event), summed over accounts.

use std::collections::HashMap;

#[derive(Default)]
struct Group {
    /// Callbacks stored for the event when counting (re)started.
    received_base: u64,
    /// (account, hook id) -> (triggeredCount when counting started, latest seen).
    hooks: HashMap<(String, String), (u64, u64)>,
}

impl Group {
    fn restart(&mut self, received: u64) {
        self.received_base = received;
        for (base, last) in self.hooks.values_mut() {
            *base = *last;
        }
    }

    fn missing(&self, received: u64) -> i64 {
        let triggered: u64 =
            self.hooks.values().map(|(base, last)| last.saturating_sub(*base)).sum();
        let received = received.saturating_sub(self.received_base);
        (triggered as i64 - received as i64).max(0)
    }
}

/// Every (source, event) being compared.
#[derive(Default)]
pub(crate) struct Tracker {
    groups: HashMap<(String, String), Group>,
}

impl Tracker {
    /// Records `account`'s hooks for (source, event) as listed now, as (id, triggeredCount),
    /// with `received` the callbacks stored for it so far; returns the missing count, and
    /// the calls counted on those hooks since they were last seen (for the audit ledger:
    /// a hook seen for the first time adds nothing, one the relay created counts from 0).
    pub(crate) fn observe(
        &mut self,
        source: &str,
        event: &str,
        account: &str,
        hooks: &[(String, u64)],
        received: u64,
    ) -> (i64, u64) {
        let group = self.group(source, event, received);
        let before = group.hooks.len();
        group.hooks.retain(|(acc, id), _| acc != account || hooks.iter().any(|(h, _)| h == id));
        let gone = group.hooks.len() != before;
        let mut grown = 0;
        for (id, count) in hooks {
            let entry =
                group.hooks.entry((account.to_owned(), id.clone())).or_insert((*count, *count));
            grown += count.saturating_sub(entry.1);
            entry.1 = (*count).max(entry.0);
        }
        if gone {
            group.restart(received);
        }
        (group.missing(received), grown)
    }

    /// A hook the relay just created: every call on it counts, from 0.
    pub(crate) fn created(
        &mut self,
        source: &str,
        event: &str,
        account: &str,
        id: &str,
        received: u64,
    ) {
        let group = self.group(source, event, received);
        group.hooks.insert((account.to_owned(), id.to_owned()), (0, 0));
    }

    fn group(&mut self, source: &str, event: &str, received: u64) -> &mut Group {
        self.groups
            .entry((source.to_owned(), event.to_owned()))
            .or_insert_with(|| Group { received_base: received, hooks: HashMap::new() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hooks(list: &[(&str, u64)]) -> Vec<(String, u64)> {
        list.iter().map(|(id, c)| ((*id).to_owned(), *c)).collect()
    }

    #[test]
    fn counts_calls_the_relay_did_not_receive() {
        let mut t = Tracker::default();
        // Existing hooks with history: counting starts now.
        assert_eq!(t.observe("s", "E", "alice", &hooks(&[("1", 10)]), 100), (0, 0));
        assert_eq!(t.observe("s", "E", "bob", &hooks(&[("2", 4)]), 100), (0, 0));
        // Each occurrence reaches both hooks: 2 calls, 2 callbacks.
        assert_eq!(t.observe("s", "E", "alice", &hooks(&[("1", 11)]), 102), (0, 1));
        assert_eq!(t.observe("s", "E", "bob", &hooks(&[("2", 5)]), 102), (0, 1));
        // One call lost.
        assert_eq!(t.observe("s", "E", "alice", &hooks(&[("1", 12)]), 103), (0, 1));
        assert_eq!(t.observe("s", "E", "bob", &hooks(&[("2", 6)]), 103), (1, 1));
    }

    #[test]
    fn created_hooks_count_from_zero_and_recreation_restarts() {
        let mut t = Tracker::default();
        t.created("s", "E", "alice", "1", 50);
        assert_eq!(t.observe("s", "E", "alice", &hooks(&[("1", 3)]), 52), (1, 3));
        // Hook 1 was disabled and re-created as 2: the gap event covers hook 1's loss.
        t.created("s", "E", "alice", "2", 52);
        assert_eq!(t.observe("s", "E", "alice", &hooks(&[("2", 0)]), 52), (0, 0));
        assert_eq!(t.observe("s", "E", "alice", &hooks(&[("2", 2)]), 54), (0, 2));
        assert_eq!(t.observe("s", "E", "alice", &hooks(&[("2", 4)]), 55), (1, 2));
    }
}
