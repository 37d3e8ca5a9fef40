//! The audit's arithmetic, pure: a ledger reading to the report with its equations.

use std::collections::BTreeMap;

use crate::api::{AuditReport, DestinationAudit, EventAudit};
use crate::store::lifecycle::ledger::{Count, HOUR_US};
use crate::store::{DeliveryState, LedgerReading};
use crate::timefmt::format_admin_us;

/// The window `from_hour..to_hour` of `reading` as the report says it; only the events
/// of `source` when one is given (destinations are counted over every source).
pub(crate) fn report(
    reading: &LedgerReading,
    from_hour: u64,
    to_hour: u64,
    source: Option<&str>,
) -> AuditReport {
    let mut events: BTreeMap<(String, String), EventAudit> = BTreeMap::new();
    let mut destinations: BTreeMap<String, DestinationAudit> = BTreeMap::new();
    for (key, n) in &reading.counts {
        if !(from_hour..to_hour).contains(&key.hour) {
            continue;
        }
        if key.destination.is_empty() {
            if source.is_some_and(|s| s != key.source) {
                continue;
            }
            let row = events.entry((key.source.clone(), key.event.clone())).or_insert_with(|| {
                EventAudit {
                    source: key.source.clone(),
                    event: key.event.clone(),
                    ..EventAudit::default()
                }
            });
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
            let row = destinations.entry(key.destination.clone()).or_insert_with(|| {
                DestinationAudit { destination: key.destination.clone(), ..Default::default() }
            });
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
    let mut imbalances = Vec::new();
    let events: Vec<EventAudit> = events
        .into_values()
        .map(|mut e| {
            let accounted = e.rejected + e.unrouted + e.duplicate + e.routed + e.waiting;
            let parts = [e.received, e.rejected, e.unrouted, e.duplicate, e.routed, e.waiting];
            e.balanced = e.received == accounted && parts.iter().all(|n| *n >= 0);
            if !e.balanced {
                imbalances.push(format!(
                    "{}/{}: received {} but rejected + unrouted + duplicate + routed + waiting = {} \
                     ({} + {} + {} + {} + {})",
                    e.source,
                    e.event,
                    e.received,
                    accounted,
                    e.rejected,
                    e.unrouted,
                    e.duplicate,
                    e.routed,
                    e.waiting
                ));
            }
            e.not_received = e.triggered.map(|t| t - e.received);
            e
        })
        .collect();
    let destinations: Vec<DestinationAudit> = destinations
        .into_values()
        .map(|mut d| {
            let states = d.states();
            let accounted: i64 = states.iter().sum();
            d.balanced = d.routed == accounted && states.iter().all(|n| *n >= 0) && d.routed >= 0;
            if !d.balanced {
                imbalances.push(format!(
                    "destination {}: routed {} but delivered + filtered + superseded + dead + \
                     discarded + pending + retrying + held = {accounted} {states:?}",
                    d.destination, d.routed
                ));
            }
            d
        })
        .collect();
    let at = |hour: u64| format_admin_us(hour * HOUR_US);
    let start_hour = crate::store::lifecycle::ledger::hour_of(reading.start);
    AuditReport {
        since: at(from_hour),
        until: at(to_hour),
        accounted_from: (reading.start.raw() > from_hour * HOUR_US && start_hour < to_hour)
            .then(|| format_admin_us(reading.start.raw())),
        balanced: imbalances.is_empty(),
        imbalances,
        events,
        destinations,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::ledger::{LedgerEdits, LedgerKey};
    use crate::store::EventId;

    fn reading(counts: &[(LedgerKey, i64)]) -> LedgerReading {
        LedgerReading {
            counts: counts.iter().cloned().collect::<LedgerEdits>(),
            start: EventId::new(0),
        }
    }

    #[test]
    fn a_balanced_ledger_balances_and_a_lost_delivery_does_not() {
        let ev = |c| LedgerKey::event(10, "demo", "ActionUpdated", c);
        let dl = |c| LedgerKey::delivery(10, "crm", c);
        let mut counts = vec![
            (ev(Count::Received), 10),
            (ev(Count::Rejected), 1),
            (ev(Count::Duplicate), 3),
            (ev(Count::Routed), 5),
            (ev(Count::Waiting), 1),
            (ev(Count::Triggered), 11),
            (dl(Count::Routed), 6),
            (dl(Count::State(DeliveryState::Delivered)), 4),
            (dl(Count::State(DeliveryState::Dead)), 1),
            (dl(Count::State(DeliveryState::Filtered)), 1),
            // Another hour: outside the window.
            (LedgerKey::delivery(12, "crm", Count::Routed), 99),
        ];
        let r = report(&reading(&counts), 10, 12, None);
        assert!(r.balanced, "{:?}", r.imbalances);
        assert_eq!(r.events[0].not_received, Some(1));
        assert_eq!(r.destinations[0].routed, 6);
        assert_eq!(
            (r.since.as_str(), r.until.as_str()),
            ("1970-01-01T10:00:00.000000Z", "1970-01-01T12:00:00.000000Z")
        );
        // A delivery that vanished from the states: the equation fails, and says so.
        counts[7].1 = 3;
        let r = report(&reading(&counts), 10, 12, None);
        assert!(!r.balanced);
        assert!(r.imbalances[0].contains("destination crm: routed 6"), "{:?}", r.imbalances);
        // Another source only: the event rows go, the destinations stay.
        let r = report(&reading(&counts), 10, 12, Some("other"));
        assert!(r.events.is_empty());
        assert_eq!(r.destinations.len(), 1);
    }

    #[test]
    fn an_event_missing_from_its_outcomes_unbalances_its_row() {
        let ev = |c| LedgerKey::event(10, "demo", "TaskCreated", c);
        let r = report(&reading(&[(ev(Count::Received), 2), (ev(Count::Routed), 1)]), 0, 100, None);
        assert!(!r.balanced);
        assert!(r.imbalances[0].starts_with("demo/TaskCreated: received 2"), "{:?}", r.imbalances);
    }
}
