//! The ledger's two equations over a window, pure: for each source and event name,
//! `received = rejected + unrouted + duplicate + routed + waiting`; for each
//! destination, `routed` = the sum of its deliveries' states. They are the ledger's
//! invariants, so they live beside it: the audit (`src/audit/`) turns a [`Balance`]
//! into its report, and the conformance suite checks every backend against them.

use std::collections::BTreeMap;

use super::ledger::Count;
use crate::store::{DeliveryState, LedgerReading};

/// One source and event name's counters over the window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EventRow {
    pub(crate) received: i64,
    pub(crate) rejected: i64,
    pub(crate) unrouted: i64,
    pub(crate) duplicate: i64,
    pub(crate) routed: i64,
    pub(crate) waiting: i64,
    /// Calls the upstream counted on its hooks, when a reconcile saw them.
    pub(crate) triggered: Option<i64>,
}

impl EventRow {
    /// Every callback received is accounted for once, and no counter is negative.
    pub(crate) fn balanced(&self) -> bool {
        let parts = [self.rejected, self.unrouted, self.duplicate, self.routed, self.waiting];
        self.received == parts.iter().sum::<i64>()
            && self.received >= 0
            && parts.iter().all(|n| *n >= 0)
    }
}

/// One destination's counters over the window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DestinationRow {
    pub(crate) routed: i64,
    pub(crate) delivered: i64,
    pub(crate) filtered: i64,
    pub(crate) superseded: i64,
    pub(crate) dead: i64,
    pub(crate) discarded: i64,
    pub(crate) pending: i64,
    pub(crate) retrying: i64,
    pub(crate) held: i64,
}

impl DestinationRow {
    /// The states, in the equation's order: delivered, filtered, superseded, dead,
    /// discarded, pending, retrying, held.
    pub(crate) fn states(&self) -> [i64; 8] {
        [
            self.delivered,
            self.filtered,
            self.superseded,
            self.dead,
            self.discarded,
            self.pending,
            self.retrying,
            self.held,
        ]
    }

    /// Every delivery routed is in exactly one state, and no counter is negative.
    pub(crate) fn balanced(&self) -> bool {
        let states = self.states();
        self.routed == states.iter().sum::<i64>()
            && self.routed >= 0
            && states.iter().all(|n| *n >= 0)
    }
}

/// A window's counters summed by row, with the equations that do not hold, said.
#[derive(Debug, Clone, Default)]
pub(crate) struct Balance {
    /// By (source, event name).
    pub(crate) events: BTreeMap<(String, String), EventRow>,
    /// By destination.
    pub(crate) destinations: BTreeMap<String, DestinationRow>,
    /// Each equation that does not hold, in words with its figures.
    pub(crate) imbalances: Vec<String>,
}

/// How an imbalance of the destination `name` begins (a scoped holder's report
/// leaves out those of other destinations by it).
pub(crate) fn destination_imbalance(name: &str) -> String {
    format!("destination {name}")
}

/// The hours `from_hour..to_hour` of `reading`, summed; only the events of `source`
/// when one is given (destinations are counted over every source).
pub(crate) fn balance(
    reading: &LedgerReading,
    from_hour: u64,
    to_hour: u64,
    source: Option<&str>,
) -> Balance {
    let mut b = Balance::default();
    for (key, n) in &reading.counts {
        if !(from_hour..to_hour).contains(&key.hour) {
            continue;
        }
        if key.destination.is_empty() {
            if source.is_some_and(|s| s != key.source) {
                continue;
            }
            let row = b.events.entry((key.source.clone(), key.event.clone())).or_default();
            match key.count {
                Count::Received => row.received += n,
                Count::Rejected => row.rejected += n,
                Count::Unrouted => row.unrouted += n,
                Count::Duplicate => row.duplicate += n,
                Count::Routed => row.routed += n,
                Count::Waiting => row.waiting += n,
                Count::Triggered => *row.triggered.get_or_insert(0) += n,
                Count::State(_) => {}
            }
        } else {
            let row = b.destinations.entry(key.destination.clone()).or_default();
            let slot = match key.count {
                Count::Routed => &mut row.routed,
                Count::State(DeliveryState::Delivered) => &mut row.delivered,
                Count::State(DeliveryState::Filtered) => &mut row.filtered,
                Count::State(DeliveryState::Superseded) => &mut row.superseded,
                Count::State(DeliveryState::Dead) => &mut row.dead,
                Count::State(DeliveryState::Discarded) => &mut row.discarded,
                Count::State(DeliveryState::Pending) => &mut row.pending,
                Count::State(DeliveryState::Retrying) => &mut row.retrying,
                Count::State(DeliveryState::Held) => &mut row.held,
                _ => continue,
            };
            *slot += n;
        }
    }
    for ((source, event), e) in &b.events {
        if !e.balanced() {
            let accounted = e.rejected + e.unrouted + e.duplicate + e.routed + e.waiting;
            b.imbalances.push(format!(
                "{source}/{event}: received {} but rejected + unrouted + duplicate + routed + \
                 waiting = {accounted} ({} + {} + {} + {} + {})",
                e.received, e.rejected, e.unrouted, e.duplicate, e.routed, e.waiting
            ));
        }
    }
    for (name, d) in &b.destinations {
        if !d.balanced() {
            let states = d.states();
            let accounted: i64 = states.iter().sum();
            b.imbalances.push(format!(
                "{}: routed {} but delivered + filtered + superseded + dead + \
                 discarded + pending + retrying + held = {accounted} {states:?}",
                destination_imbalance(name),
                d.routed
            ));
        }
    }
    b
}
