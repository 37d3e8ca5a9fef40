//! Queue counts kept current from delivery changes, for a backend that one process
//! owns: a scrape or an admin listing reads them instead of scanning the schedule and
//! the dead letters. Counted again from the stored indexes at open (the embedded
//! store's behind the open: `embedded/recount/`).

use std::collections::{BTreeMap, HashMap};

use super::{DeliveryRecord, DeliveryState, EventId, QueueStats};

#[derive(Default, Clone, Debug)]
struct Counts {
    pending: u64,
    retrying: u64,
    held: u64,
    dead: u64,
    /// Deliveries scheduled, by the second of their event's id (see
    /// [`QueueStats::second_of`]): the oldest is the first key. Bounded by the seconds
    /// a backlog spans, not by its size.
    scheduled: BTreeMap<u64, u64>,
}

impl Counts {
    fn schedule(&mut self, event: EventId) {
        *self.scheduled.entry(QueueStats::second_of(event).raw() / 1_000_000).or_default() += 1;
    }

    fn unschedule(&mut self, event: EventId) {
        let second = QueueStats::second_of(event).raw() / 1_000_000;
        if let Some(n) = self.scheduled.get_mut(&second) {
            *n -= 1;
            if *n == 0 {
                self.scheduled.remove(&second);
            }
        }
    }
}

/// Per destination.
#[derive(Clone, Default, Debug)]
pub(crate) struct QueueCounts {
    by_dest: HashMap<String, Counts>,
}

impl QueueCounts {
    /// Moves the counts from `before` to `after` (either absent).
    pub(crate) fn apply(
        &mut self,
        before: Option<&DeliveryRecord>,
        after: Option<&DeliveryRecord>,
    ) {
        if let Some(r) = before {
            self.count(r, false);
        }
        if let Some(r) = after {
            self.count(r, true);
        }
    }

    fn count(&mut self, r: &DeliveryRecord, add: bool) {
        let c = self.by_dest.entry(r.destination.clone()).or_default();
        let n = match r.state {
            DeliveryState::Pending => &mut c.pending,
            DeliveryState::Retrying => &mut c.retrying,
            DeliveryState::Held => &mut c.held,
            DeliveryState::Dead => &mut c.dead,
            DeliveryState::Delivered
            | DeliveryState::Discarded
            | DeliveryState::Filtered
            | DeliveryState::Superseded => return,
        };
        *n = if add { *n + 1 } else { n.saturating_sub(1) };
        if r.state.is_scheduled() {
            if add {
                c.schedule(r.event);
            } else {
                c.unschedule(r.event);
            }
        }
    }

    /// Counts one delivery a backend found in its index after open (without its record).
    pub(crate) fn restore(&mut self, dest: &str, event: EventId, state: DeliveryState) {
        // Looked up before an owned name is made: millions of calls, a few names.
        if !self.by_dest.contains_key(dest) {
            self.by_dest.insert(dest.to_owned(), Counts::default());
        }
        let Some(c) = self.by_dest.get_mut(dest) else { return };
        match state {
            DeliveryState::Pending => c.pending += 1,
            DeliveryState::Retrying => c.retrying += 1,
            DeliveryState::Held => c.held += 1,
            DeliveryState::Dead => c.dead += 1,
            DeliveryState::Delivered
            | DeliveryState::Discarded
            | DeliveryState::Filtered
            | DeliveryState::Superseded => {}
        }
        if state.is_scheduled() {
            c.schedule(event);
        }
    }

    /// Adds `other`'s counts to these (a chunk of a count, counted apart).
    pub(crate) fn merge(&mut self, other: QueueCounts) {
        for (dest, o) in other.by_dest {
            let c = self.by_dest.entry(dest).or_default();
            c.pending += o.pending;
            c.retrying += o.retrying;
            c.held += o.held;
            c.dead += o.dead;
            for (second, n) in o.scheduled {
                *c.scheduled.entry(second).or_default() += n;
            }
        }
    }

    /// Destinations with a delivery still to make (pending, retrying or held).
    pub(crate) fn open_destinations(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .by_dest
            .iter()
            .filter(|(_, c)| c.pending + c.retrying + c.held > 0)
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        names
    }

    pub(crate) fn stats(&self, dest: &str) -> QueueStats {
        self.by_dest.get(dest).map_or_else(QueueStats::default, |c| QueueStats {
            pending: c.pending,
            held: c.held,
            retrying: c.retrying,
            dead: c.dead,
            oldest: c.scheduled.first_key_value().map(|(s, _)| EventId::new(s * 1_000_000)),
            counting: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backlog of many deliveries costs one entry per second it spans, and the oldest
    /// follows the deliveries that leave the queue.
    #[test]
    fn a_backlog_costs_one_entry_per_second_and_the_oldest_follows_it() {
        let mut q = QueueCounts::default();
        // 100,000 deliveries received over 10 s, from second 1,000.
        let ids: Vec<EventId> =
            (0..100_000u64).map(|n| EventId::new(1_000_000_000 + n * 100)).collect();
        for id in &ids {
            q.restore("crm", *id, DeliveryState::Pending);
        }
        assert_eq!(q.by_dest["crm"].scheduled.len(), 10, "one entry per second");
        let stats = q.stats("crm");
        assert_eq!((stats.pending, stats.oldest), (100_000, Some(EventId::new(1_000_000_000))));
        // The first second's deliveries are made: the oldest is the next second.
        let pending = |id| DeliveryRecord::new(id, "crm", 2_000_000_000);
        for id in ids.iter().take(10_000) {
            let before = pending(*id);
            let after = DeliveryRecord { state: DeliveryState::Delivered, ..before.clone() };
            q.apply(Some(&before), Some(&after));
        }
        let stats = q.stats("crm");
        assert_eq!((stats.pending, stats.oldest), (90_000, Some(EventId::new(1_001_000_000))));
        assert_eq!(q.by_dest["crm"].scheduled.len(), 9);
    }
}
