//! The hook lifecycle's metrics: hooks by status, triggered counts, transitions, and the
//! missing-callbacks comparison, kept per account from one pass to the next.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::missing::Tracker;
use super::model::Hook;
use super::AccountId;
use crate::event_names;
use crate::internal_events::{HookTransition, InternalEvent};
use crate::lock::lock;
use crate::metrics::Metrics;

/// Per event: summed triggeredCount, latest trigger, and (hook id, triggeredCount).
type EventTotals = (u64, Option<SystemTime>, Vec<(String, u64)>);

pub(super) struct Gauges {
    pub(super) metrics: Arc<Metrics>,
    missing: Mutex<Tracker>,
    /// Label sets of `hookrelay_upstream_hooks` set by the last pass, per account.
    shown_labels: Mutex<HashMap<AccountId, HashSet<(String, String)>>>,
    /// Per source, the callbacks every relay sharing the store stored, by event, as
    /// last read from the store; absent for a store one process owns (its own
    /// counter is the whole count).
    fleet_received: Mutex<HashMap<String, HashMap<String, u64>>>,
}

impl Gauges {
    /// Creates the counters of every account at 0, so that `increase()` sees their first
    /// rise (a series born at 1 shows no increase at all).
    pub(super) fn new(metrics: Arc<Metrics>, accounts: &[(AccountId, Vec<String>)]) -> Self {
        for (id, events) in accounts {
            let (source, account) = (id.source.as_str(), id.account.as_str());
            for outcome in ["success", "failure"] {
                let labels = [source, account, outcome];
                metrics.upstream.token_refreshes.with_label_values(&labels).inc_by(0);
            }
            for event in events {
                let event = event_names::metric_label(event);
                for (from, to) in
                    [("none", "Active"), ("Active", "Disabled"), ("Disabled", "Active")]
                {
                    let labels = [source, account, event, from, to];
                    metrics.upstream.transitions.with_label_values(&labels).inc_by(0);
                }
            }
        }
        Self {
            metrics,
            missing: Mutex::new(Tracker::default()),
            shown_labels: Mutex::default(),
            fleet_received: Mutex::default(),
        }
    }

    /// The fleet's callbacks stored for `source`, by event (read from the store before
    /// a pass): the comparison then counts every relay's, not this one's alone.
    pub(super) fn set_fleet_received(&self, source: &str, counts: HashMap<String, u64>) {
        lock(&self.fleet_received).insert(source.to_owned(), counts);
    }

    pub(super) fn transition(&self, id: &AccountId, event: &str, from: &str, to: &str) {
        HookTransition { account: id, event, from, to }.emit(&self.metrics);
    }

    /// Callbacks stored for (source, event) so far: by the whole fleet when the store
    /// is shared, else by this relay.
    fn received(&self, source: &str, event: &str) -> u64 {
        if let Some(counts) = lock(&self.fleet_received).get(source) {
            return counts.get(event).copied().unwrap_or(0);
        }
        let labels = [source, event_names::metric_label(event)];
        self.metrics.store.events_stored.with_label_values(&labels).get()
    }

    /// A hook the relay just created: its calls count from 0.
    pub(super) fn track_created(&self, id: &AccountId, event: &str, hook_id: &str) {
        let received = self.received(&id.source, event);
        lock(&self.missing).created(&id.source, event, &id.account, hook_id, received);
    }

    /// Gauges and counters from an account's hooks as they are after a pass. Returns,
    /// per event, the calls the upstream counted on them since the last pass (for the
    /// audit ledger's `triggered`).
    pub(super) fn update(
        &self,
        id: &AccountId,
        events: &[String],
        ours: &[Hook],
    ) -> Vec<(String, u64)> {
        let mut calls = Vec::new();
        let m = &self.metrics.upstream;
        let mut counts: HashMap<(String, String), i64> = HashMap::new();
        for event in events {
            for status in ["Active", "Disabled"] {
                counts.insert((event_names::metric_label(event).to_owned(), status.to_owned()), 0);
            }
        }
        for h in ours {
            let status = match h.status.as_str() {
                s @ ("Active" | "Disabled" | "Deleted") => s,
                _ => "other",
            };
            *counts
                .entry((event_names::metric_label(&h.event_name).to_owned(), status.to_owned()))
                .or_default() += 1;
        }
        {
            let mut shown = lock(&self.shown_labels);
            let previous = shown.entry(id.clone()).or_default();
            for (event, status) in previous.iter() {
                if !counts.contains_key(&(event.clone(), status.clone())) {
                    let _ = m.hooks.remove_label_values(&[&id.source, &id.account, event, status]);
                }
            }
            for ((event, status), n) in &counts {
                m.hooks.with_label_values(&[&id.source, &id.account, event, status]).set(*n);
            }
            *previous = counts.keys().cloned().collect();
        }

        let mut by_event: HashMap<&str, EventTotals> = HashMap::new();
        for h in ours {
            let e = by_event.entry(h.event_name.as_str()).or_default();
            e.0 += h.triggered_count;
            e.1 = e.1.max(h.last_triggered);
            e.2.push((h.id.clone(), h.triggered_count));
        }
        for event in events {
            by_event.entry(event.as_str()).or_default();
        }
        for (event, (triggered, last, hooks)) in by_event {
            let label = event_names::metric_label(event);
            let labels = [id.source.as_str(), id.account.as_str(), label];
            let counter = m.triggered.with_label_values(&labels);
            let current = counter.get();
            if triggered >= current {
                counter.inc_by(triggered - current);
            } else {
                // A re-created hook starts from 0: a counter reset, as Prometheus expects.
                let _ = m.triggered.remove_label_values(&labels);
                m.triggered.with_label_values(&labels).inc_by(triggered);
            }
            if let Some(last) = last {
                let secs = last
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0);
                m.last_triggered.with_label_values(&labels).set(secs);
            }
            if !event_names::KNOWN.contains(&event) {
                continue; // not ours to compare: an unknown name in someone's hook
            }
            let received = self.received(&id.source, event);
            let (missing, grown) =
                lock(&self.missing).observe(&id.source, event, &id.account, &hooks, received);
            m.callbacks_missing.with_label_values(&[id.source.as_str(), label]).set(missing);
            if grown > 0 {
                calls.push((event.to_owned(), grown));
            }
        }
        calls
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Alone, a relay compares with its own count; on a shared store, with the fleet's
    /// (an event no relay stored counts 0, not this relay's).
    #[test]
    fn the_fleet_count_replaces_the_relays_own() {
        let metrics = Arc::new(Metrics::new().unwrap());
        metrics.store.events_stored.with_label_values(&["demo", "ActionCreated"]).inc_by(2);
        let gauges = Gauges::new(metrics, &[]);
        assert_eq!(gauges.received("demo", "ActionCreated"), 2);
        let fleet = HashMap::from([("ActionCreated".to_owned(), 7)]);
        gauges.set_fleet_received("demo", fleet);
        assert_eq!(gauges.received("demo", "ActionCreated"), 7);
        assert_eq!(gauges.received("demo", "TaskCreated"), 0);
        assert_eq!(gauges.received("other", "ActionCreated"), 0, "another source: its own count");
    }
}
