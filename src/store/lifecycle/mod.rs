//! The life of events and deliveries, as pure code: the one place its rules are written.
//!
//! Every rule that moves an event or a delivery on — the dedup verdict, fan-out and
//! per-resource ordering at dispatch, an attempt's answer to the next state, replay,
//! discard, what retention may delete — is a function here. Each takes the clock as a
//! parameter, reads the current state through [`View`] (the backend answers from its
//! own tables, inside whatever makes its decision atomic), and writes only into a
//! [`Staged`] set of [`Changes`]. The backend then applies those changes in one atomic
//! write. No function here does I/O, reads a clock or draws a random number, so a
//! reader holds each state machine in one view and the property tests in `tests.rs`
//! check its invariants without any backend.
//!
//! Indexes (schedule, dead letters, queue counts) are not written here: each backend
//! derives them from a delivery's state before and after (see [`DeliveryChange`]),
//! so an index entry without its record cannot be written by any rule.

mod attempt;
mod backoff;
pub(crate) mod balance;
mod dispatch;
pub(crate) mod ledger;
mod manage;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

#[cfg(test)]
pub(crate) use attempt::record_attempt;
pub(crate) use attempt::{record_attempts, AnswerClass, AttemptReport, AttemptVerdict};
pub(crate) use dispatch::dispatch;
#[cfg(test)]
pub(crate) use manage::{discard, replay};
pub(crate) use manage::{drop_body_if_settled, manage, prunable, prune, Managed};

use super::{DeliveryRecord, EventId, EventMeta, StoreError};

/// A dedup key's holder: the first event of an occurrence and the end of its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DedupEntry {
    pub(crate) original: EventId,
    pub(crate) until_us: u64,
}

/// The queue of one record's deliveries to one ordered destination: only `head` is
/// scheduled; the others are `held` and linked by `next_in_order`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Queue {
    pub(crate) head: EventId,
    pub(crate) tail: EventId,
    pub(crate) len: u64,
}

/// The reads the rules need. A backend answers them from the state the changes will
/// be applied to, and keeps that state from moving until they are (a lock, a
/// transaction with row locks).
pub(crate) trait View {
    fn dedup(&self, hash: &[u8; 16]) -> Result<Option<DedupEntry>, StoreError>;
    fn delivery(&self, event: EventId, dest: &str) -> Result<Option<DeliveryRecord>, StoreError>;
    fn queue(&self, dest: &str, resource: &[u8; 16]) -> Result<Option<Queue>, StoreError>;
    /// The final record of an event (not one still in the inbox).
    fn event(&self, id: EventId) -> Result<Option<EventMeta>, StoreError>;
    /// Every delivery of an event, one per destination, in destination order. Asked
    /// only of an event settling after its body's retention passed
    /// ([`drop_body_if_settled`]): rare, so a backend may fetch it apart.
    fn deliveries_of(&self, event: EventId) -> Result<Vec<DeliveryRecord>, StoreError>;
    /// Whether a worker holds a claim on the delivery at `now_us` (its attempt may be
    /// in flight). The backend keeps it from changing until the changes are applied.
    fn claimed(&self, event: EventId, dest: &str, now_us: u64) -> Result<bool, StoreError>;
}

/// A delivery record before and after the change (`None`: absent). The backend
/// writes `after` and edits its indexes as [`DeliveryChange::index_edits`] says.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DeliveryChange {
    pub(crate) before: Option<DeliveryRecord>,
    pub(crate) after: Option<DeliveryRecord>,
}

/// What a delivery's change does to the indexes kept beside the records (the
/// schedule, the dead letters): a scheduled delivery has exactly one schedule entry,
/// at its due time, a dead one one dead-letter entry, and nothing else has either.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct IndexEdits {
    /// The schedule entry to remove: `before`'s due time.
    pub(crate) unschedule: Option<u64>,
    /// The schedule entry to add: `after`'s due time.
    pub(crate) schedule: Option<u64>,
    /// `Some(true)`: the delivery became dead (add its dead-letter entry);
    /// `Some(false)`: it is dead no more (remove it); `None`: no change.
    pub(crate) dead: Option<bool>,
}

impl DeliveryChange {
    /// The one derivation of the index edits from the change: every backend that
    /// keeps indexes applies it, and so does the lifecycle's test model.
    pub(crate) fn index_edits(&self) -> IndexEdits {
        let due = |r: &Option<DeliveryRecord>| r.as_ref().and_then(schedule_entry);
        let dead = |r: &Option<DeliveryRecord>| {
            r.as_ref().is_some_and(|r| r.state == crate::store::DeliveryState::Dead)
        };
        let (was, is) = (dead(&self.before), dead(&self.after));
        IndexEdits {
            unschedule: due(&self.before),
            schedule: due(&self.after),
            dead: (was != is).then_some(is),
        }
    }
}

/// Everything one decision writes; applied atomically by the backend.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Changes {
    /// Events leaving the inbox with their final record; the body moves with them.
    pub(crate) dispatched: BTreeMap<EventId, EventMeta>,
    /// Dedup keys to set.
    pub(crate) dedup: BTreeMap<[u8; 16], DedupEntry>,
    /// Delivery records to write (`after: Some`) or delete (`after: None`).
    pub(crate) deliveries: BTreeMap<(EventId, String), DeliveryChange>,
    /// Ordering queues to set or remove.
    pub(crate) queues: BTreeMap<(String, [u8; 16]), Option<Queue>>,
    /// Events to delete, with their bodies (their deliveries are in `deliveries`),
    /// and the record each is indexed under, whose entry goes with it.
    pub(crate) pruned: Vec<(EventId, Option<String>)>,
    /// Events whose body goes, their record, deliveries and attempts kept
    /// (`retention.delivered_bodies`, at settlement: [`drop_body_if_settled`]).
    pub(crate) bodies_dropped: BTreeSet<EventId>,
}

impl Changes {
    pub(crate) fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The destinations with a delivery these changes make due now (new, replayed, or
    /// released from its resource's queue: pending, and not pending before), each
    /// once, sorted: whom to wake, and whose next delivery waits for this write.
    pub(crate) fn made_due(&self) -> Vec<&str> {
        let is_pending = |r: &Option<DeliveryRecord>| {
            r.as_ref().is_some_and(|r| r.state == crate::store::DeliveryState::Pending)
        };
        let mut dests: Vec<&str> = self
            .deliveries
            .iter()
            .filter(|(_, c)| is_pending(&c.after) && !is_pending(&c.before))
            .map(|((_, dest), _)| dest.as_str())
            .collect();
        dests.sort_unstable();
        dests.dedup();
        dests
    }
}

/// A [`View`] with the changes staged so far laid over it: a batch of decisions sees
/// its own earlier writes (two copies of one occurrence in one dispatch batch).
pub(crate) struct Staged<'a, V: View + ?Sized> {
    base: &'a V,
    pub(crate) changes: Changes,
}

impl<'a, V: View + ?Sized> Staged<'a, V> {
    pub(crate) fn new(base: &'a V) -> Self {
        Self { base, changes: Changes::default() }
    }

    /// The staged changes, to apply.
    pub(crate) fn into_changes(self) -> Changes {
        self.changes
    }

    fn put_delivery(&mut self, record: DeliveryRecord) -> Result<(), StoreError> {
        self.set_delivery(record.event, &record.destination.clone(), Some(record))
    }

    fn set_delivery(
        &mut self,
        event: EventId,
        dest: &str,
        after: Option<DeliveryRecord>,
    ) -> Result<(), StoreError> {
        let key = (event, dest.to_owned());
        if let Some(change) = self.changes.deliveries.get_mut(&key) {
            change.after = after;
            return Ok(());
        }
        let before = self.base.delivery(event, dest)?;
        self.changes.deliveries.insert(key, DeliveryChange { before, after });
        Ok(())
    }
}

impl<V: View + ?Sized> View for Staged<'_, V> {
    fn dedup(&self, hash: &[u8; 16]) -> Result<Option<DedupEntry>, StoreError> {
        match self.changes.dedup.get(hash) {
            Some(e) => Ok(Some(*e)),
            None => self.base.dedup(hash),
        }
    }

    fn delivery(&self, event: EventId, dest: &str) -> Result<Option<DeliveryRecord>, StoreError> {
        match self.changes.deliveries.get(&(event, dest.to_owned())) {
            Some(change) => Ok(change.after.clone()),
            None => self.base.delivery(event, dest),
        }
    }

    fn queue(&self, dest: &str, resource: &[u8; 16]) -> Result<Option<Queue>, StoreError> {
        match self.changes.queues.get(&(dest.to_owned(), *resource)) {
            Some(q) => Ok(*q),
            None => self.base.queue(dest, resource),
        }
    }

    fn claimed(&self, event: EventId, dest: &str, now_us: u64) -> Result<bool, StoreError> {
        self.base.claimed(event, dest, now_us)
    }

    fn event(&self, id: EventId) -> Result<Option<EventMeta>, StoreError> {
        if self.changes.pruned.iter().any(|(pruned, _)| *pruned == id) {
            return Ok(None);
        }
        match self.changes.dispatched.get(&id) {
            Some(meta) => Ok(Some(meta.clone())),
            None => self.base.event(id),
        }
    }

    fn deliveries_of(&self, event: EventId) -> Result<Vec<DeliveryRecord>, StoreError> {
        let mut all: BTreeMap<String, DeliveryRecord> = self
            .base
            .deliveries_of(event)?
            .into_iter()
            .map(|d| (d.destination.clone(), d))
            .collect();
        let staged =
            (event, String::new())..(EventId::new(event.raw().saturating_add(1)), String::new());
        for ((_, dest), change) in self.changes.deliveries.range(staged) {
            match &change.after {
                Some(record) => all.insert(dest.clone(), record.clone()),
                None => all.remove(dest),
            };
        }
        Ok(all.into_values().collect())
    }
}

/// Whether a delivery in this state has a schedule entry (at `next_attempt_us`).
pub(crate) fn schedule_entry(record: &DeliveryRecord) -> Option<u64> {
    record.next_attempt_us.filter(|_| record.state.is_scheduled())
}
