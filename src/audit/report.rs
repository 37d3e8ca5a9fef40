//! The audit's report, pure: a ledger reading's balance (its two equations,
//! `store/lifecycle/balance.rs`) in the API's words, with the window's times.

use crate::api::{AuditReport, DestinationAudit, EventAudit};
use crate::store::lifecycle::balance::{balance, destination_imbalance};
use crate::store::lifecycle::ledger::HOUR_US;
use crate::store::LedgerReading;
use crate::timefmt::format_admin_us;

/// `report` as a holder who `sees` only some destinations reads it: the others'
/// rows and imbalances left out (their events' rows stay: a viewer sees every
/// event).
pub(crate) fn scoped(report: &mut AuditReport, sees: impl Fn(&str) -> bool) {
    report.destinations.retain(|d| sees(&d.destination));
    report.imbalances.retain(|line| !about_another(line, &sees));
    report.balanced = report.imbalances.is_empty();
}

/// Whether the imbalance `line` is about a destination `sees` leaves out.
fn about_another(line: &str, sees: &impl Fn(&str) -> bool) -> bool {
    let prefix = destination_imbalance("");
    line.strip_prefix(&prefix)
        .and_then(|rest| rest.split_once(": routed "))
        .is_some_and(|(name, _)| !sees(name))
}

/// The window `from_hour..to_hour` of `reading` as the report says it; only the events
/// of `source` when one is given (destinations are counted over every source).
pub(crate) fn report(
    reading: &LedgerReading,
    from_hour: u64,
    to_hour: u64,
    source: Option<&str>,
) -> AuditReport {
    let b = balance(reading, from_hour, to_hour, source);
    let events = b
        .events
        .into_iter()
        .map(|((source, event), e)| EventAudit {
            source,
            event,
            received: e.received,
            rejected: e.rejected,
            unrouted: e.unrouted,
            duplicate: e.duplicate,
            routed: e.routed,
            waiting: e.waiting,
            balanced: e.balanced(),
            triggered: e.triggered,
            not_received: e.triggered.map(|t| t - e.received),
        })
        .collect();
    let destinations = b
        .destinations
        .into_iter()
        .map(|(destination, d)| DestinationAudit {
            destination,
            balanced: d.balanced(),
            routed: d.routed,
            delivered: d.delivered,
            filtered: d.filtered,
            superseded: d.superseded,
            dead: d.dead,
            discarded: d.discarded,
            pending: d.pending,
            retrying: d.retrying,
            held: d.held,
        })
        .collect();
    let at = |hour: u64| format_admin_us(hour * HOUR_US);
    let start_hour = crate::store::lifecycle::ledger::hour_of(reading.start);
    AuditReport {
        since: at(from_hour),
        until: at(to_hour),
        accounted_from: (reading.start.raw() > from_hour * HOUR_US && start_hour < to_hour)
            .then(|| format_admin_us(reading.start.raw())),
        balanced: b.imbalances.is_empty(),
        imbalances: b.imbalances,
        events,
        destinations,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::ledger::{Count, LedgerEdits, LedgerKey};
    use crate::store::DeliveryState;
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
        // A holder scoped to crm reads it whole; one scoped to erp reads neither crm's
        // row nor its imbalance (the events' rows stay), and a balance of what it sees.
        let mut crm = report(&reading(&counts), 10, 12, None);
        scoped(&mut crm, |d| d == "crm");
        assert_eq!((crm.destinations.len(), crm.imbalances.len(), crm.balanced), (1, 1, false));
        let mut erp = report(&reading(&counts), 10, 12, None);
        scoped(&mut erp, |d| d == "erp");
        assert!(erp.destinations.is_empty() && erp.imbalances.is_empty() && erp.balanced);
        assert_eq!(erp.events.len(), 1);
    }

    #[test]
    fn an_event_missing_from_its_outcomes_unbalances_its_row() {
        let ev = |c| LedgerKey::event(10, "demo", "TaskCreated", c);
        let r = report(&reading(&[(ev(Count::Received), 2), (ev(Count::Routed), 1)]), 0, 100, None);
        assert!(!r.balanced);
        assert!(r.imbalances[0].starts_with("demo/TaskCreated: received 2"), "{:?}", r.imbalances);
    }
}
