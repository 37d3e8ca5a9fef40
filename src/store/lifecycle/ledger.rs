//! The audit ledger's counters, and the one derivation of their edits from what the
//! relay writes: every backend adds these edits in the write that makes the change
//! (the append's, or the transaction applying a rule's [`Changes`]), so a count can
//! only move with the state it counts.
//!
//! Counts are kept per hour of receive time (the bucket of the event's id: an id is
//! its receive time in µs): an event received at 10:15 and delivered at 14:00 moves
//! from `pending` to `delivered` in the 10:00 bucket. Nothing leaves the ledger
//! when retention deletes events and deliveries: whole hours go only once older than
//! `retention.audit` (`Audit::prune_ledger`).

use std::collections::BTreeMap;

use super::Changes;
use crate::store::{DeliveryState, EventId, EventMeta, EventStatus};

/// One hour, in µs: the width of a bucket.
pub(crate) const HOUR_US: u64 = 3_600_000_000;

/// The bucket (hours since the Unix epoch) of an event received as `id`.
pub(crate) fn hour_of(id: EventId) -> u64 {
    id.raw() / HOUR_US
}

/// What one counter counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Count {
    /// Callbacks stored (and acknowledged), whatever became of them; counted at ingest.
    Received,
    /// Acknowledged but not stored (see the event's `reason`); counted at ingest.
    Rejected,
    /// Dispatched to no destination.
    Unrouted,
    /// Another copy of an occurrence already dispatched.
    Duplicate,
    /// For an event: dispatched to at least one destination. For a destination: a
    /// delivery was created (at dispatch, or by a replay to it).
    Routed,
    /// Still in the inbox: not a counter, read from the inbox itself when the ledger
    /// is read, so that `received` is checked against what is really there.
    Waiting,
    /// Calls the upstream counted on its hooks (`triggeredCount`'s growth), seen by a
    /// reconcile in this hour (so: at most one reconcile interval late).
    Triggered,
    /// A destination's deliveries now in this state.
    State(DeliveryState),
}

/// Every delivery state, in the order the ledger shows them.
pub(crate) const STATES: [DeliveryState; 8] = [
    DeliveryState::Delivered,
    DeliveryState::Filtered,
    DeliveryState::Superseded,
    DeliveryState::Dead,
    DeliveryState::Discarded,
    DeliveryState::Pending,
    DeliveryState::Retrying,
    DeliveryState::Held,
];

impl Count {
    /// The name a backend stores, and the API shows.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Received => "received",
            Self::Rejected => "rejected",
            Self::Unrouted => "unrouted",
            Self::Duplicate => "duplicate",
            Self::Routed => "routed",
            Self::Waiting => "waiting",
            Self::Triggered => "triggered",
            Self::State(s) => s.as_str(),
        }
    }

    /// The count named `name` ([`Count::as_str`]).
    pub(crate) fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "received" => Self::Received,
            "rejected" => Self::Rejected,
            "unrouted" => Self::Unrouted,
            "duplicate" => Self::Duplicate,
            "routed" => Self::Routed,
            "waiting" => Self::Waiting,
            "triggered" => Self::Triggered,
            other => Self::State(STATES.into_iter().find(|s| s.as_str() == other)?),
        })
    }
}

/// One counter: an hour, and either a (source, event name) or a destination (the other
/// part empty), and what it counts. The event name is a bucket
/// ([`crate::event_names::metric_label`]): a known name, the relay's own, or `other`
/// for any name the relay does not know, so that callers inventing names cannot grow
/// the ledger by a row per name. A delivery's counter is per destination, not per
/// event name: a delivery's record does not carry its event's name, and reading the
/// event on every attempt to find it would cost the delivery path a read.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct LedgerKey {
    pub(crate) hour: u64,
    pub(crate) source: String,
    pub(crate) event: String,
    pub(crate) destination: String,
    pub(crate) count: Count,
}

impl LedgerKey {
    /// A counter of the events of (`source`, the bucket of `event`).
    pub(crate) fn event(hour: u64, source: &str, event: &str, count: Count) -> Self {
        Self {
            hour,
            source: source.to_owned(),
            event: crate::event_names::metric_label(event).to_owned(),
            destination: String::new(),
            count,
        }
    }

    /// A counter of the deliveries to `destination`.
    pub(crate) fn delivery(hour: u64, destination: &str, count: Count) -> Self {
        Self {
            hour,
            source: String::new(),
            event: String::new(),
            destination: destination.to_owned(),
            count,
        }
    }
}

/// Counter edits: each key and what to add to it (never 0).
pub(crate) type LedgerEdits = BTreeMap<LedgerKey, i64>;

fn add(edits: &mut LedgerEdits, key: LedgerKey, n: i64) {
    use std::collections::btree_map::Entry;
    match edits.entry(key) {
        Entry::Occupied(mut slot) => {
            *slot.get_mut() += n;
            if *slot.get() == 0 {
                slot.remove();
            }
        }
        Entry::Vacant(slot) => {
            if n != 0 {
                slot.insert(n);
            }
        }
    }
}

/// What storing the event `id` at ingest adds: `received`, and `rejected` when it was
/// stored final as rejected. Events below `start` (stored before the ledger began)
/// add nothing.
pub(crate) fn appended(edits: &mut LedgerEdits, id: EventId, meta: &EventMeta, start: EventId) {
    if id < start {
        return;
    }
    let hour = hour_of(id);
    add(edits, LedgerKey::event(hour, &meta.source, &meta.event, Count::Received), 1);
    if meta.status == EventStatus::Rejected {
        add(edits, LedgerKey::event(hour, &meta.source, &meta.event, Count::Rejected), 1);
    }
}

/// The edit adding `n` calls the upstream counted on its hooks for (`source`, `event`)
/// to `hour` (`Audit::add_triggered`, every backend).
pub(crate) fn triggered(hour: u64, source: &str, event: &str, n: u64) -> LedgerEdits {
    let key = LedgerKey::event(hour, source, event, Count::Triggered);
    LedgerEdits::from([(key, i64::try_from(n).unwrap_or(i64::MAX))])
}

/// What applying `changes` moves in the ledger: each event leaving the inbox adds one
/// to its verdict; each delivery created adds one to `routed` and to its state; each
/// delivery changing state moves one from the old state to the new. A deletion
/// (retention) moves nothing. Events below `start` move nothing.
pub(crate) fn edits(changes: &Changes, start: EventId) -> LedgerEdits {
    let mut edits = LedgerEdits::new();
    for (id, meta) in changes.dispatched.range(start..) {
        let count = match meta.status {
            EventStatus::Dispatched => Count::Routed,
            EventStatus::Duplicate => Count::Duplicate,
            EventStatus::Unrouted => Count::Unrouted,
            // Never leaves the inbox so; counted at ingest.
            EventStatus::Received | EventStatus::Rejected => continue,
        };
        add(&mut edits, LedgerKey::event(hour_of(*id), &meta.source, &meta.event, count), 1);
    }
    for ((id, dest), change) in &changes.deliveries {
        if *id < start {
            continue;
        }
        let hour = hour_of(*id);
        match (&change.before, &change.after) {
            (_, None) => {}
            (None, Some(after)) => {
                add(&mut edits, LedgerKey::delivery(hour, dest, Count::Routed), 1);
                add(&mut edits, LedgerKey::delivery(hour, dest, Count::State(after.state)), 1);
            }
            (Some(before), Some(after)) if before.state != after.state => {
                add(&mut edits, LedgerKey::delivery(hour, dest, Count::State(before.state)), -1);
                add(&mut edits, LedgerKey::delivery(hour, dest, Count::State(after.state)), 1);
            }
            (Some(_), Some(_)) => {}
        }
    }
    edits
}

/// Adds `edits` into the counters `into` (counters kept in a map).
pub(crate) fn merge(into: &mut LedgerEdits, edits: &LedgerEdits) {
    for (key, n) in edits {
        add(into, key.clone(), *n);
    }
}

/// The counters of `all` in the hours `from_hour..to_hour`.
pub(crate) fn hours(all: &LedgerEdits, from_hour: u64, to_hour: u64) -> LedgerEdits {
    all.iter()
        .filter(|(k, _)| (from_hour..to_hour).contains(&k.hour))
        .map(|(k, n)| (k.clone(), *n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::DeliveryChange;
    use crate::store::DeliveryRecord;

    #[test]
    fn every_count_has_a_name_that_parses_back() {
        let mut all = vec![
            Count::Received,
            Count::Rejected,
            Count::Unrouted,
            Count::Duplicate,
            Count::Routed,
            Count::Waiting,
            Count::Triggered,
        ];
        all.extend(STATES.map(Count::State));
        for c in all {
            assert_eq!(Count::parse(c.as_str()), Some(c), "{}", c.as_str());
        }
        assert_eq!(Count::parse("nonsense"), None);
    }

    fn delivery(id: u64, state: DeliveryState) -> DeliveryRecord {
        let mut r = DeliveryRecord::new(EventId::new(id), "crm", 0);
        r.state = state;
        r
    }

    #[test]
    fn a_state_change_moves_one_count_and_a_deletion_moves_none() {
        let id = 5 * HOUR_US + 7;
        let mut changes = Changes::default();
        changes.deliveries.insert(
            (EventId::new(id), "crm".into()),
            DeliveryChange {
                before: Some(delivery(id, DeliveryState::Pending)),
                after: Some(delivery(id, DeliveryState::Delivered)),
            },
        );
        changes.deliveries.insert(
            (EventId::new(id + 1), "crm".into()),
            DeliveryChange {
                before: Some(delivery(id + 1, DeliveryState::Delivered)),
                after: None,
            },
        );
        let e = edits(&changes, EventId::new(0));
        let key = |s| LedgerKey::delivery(5, "crm", Count::State(s));
        assert_eq!(e.get(&key(DeliveryState::Pending)), Some(&-1));
        assert_eq!(e.get(&key(DeliveryState::Delivered)), Some(&1));
        assert_eq!(e.len(), 2, "{e:?}");
        // Before the ledger's start: nothing.
        assert!(edits(&changes, EventId::new(id + 10)).is_empty());
    }
}
