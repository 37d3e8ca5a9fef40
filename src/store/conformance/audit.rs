//! Conformance of [`Audit`](crate::store::Audit): the ledger counts every callback
//! through dedup, routing, filters, attempts, replays, discards and retention, reads
//! the inbox as `waiting`, and survives a restart.

use super::*;
use crate::api::{AuditReport, DestinationAudit, EventAudit};
use crate::store::FilteredOut;

/// The audit of every hour up to 1,000 (the scenarios' times are seconds from 0).
async fn audit(store: &SharedStore) -> AuditReport {
    crate::audit::read(store, 0, 1_000, None).await.unwrap()
}

fn row<'a>(r: &'a AuditReport, source: &str, event: &str) -> &'a EventAudit {
    r.events
        .iter()
        .find(|e| e.source == source && e.event == event)
        .unwrap_or_else(|| panic!("no row for {source}/{event} in {r:#?}"))
}

fn dest<'a>(r: &'a AuditReport, name: &str) -> &'a DestinationAudit {
    r.destinations
        .iter()
        .find(|d| d.destination == name)
        .unwrap_or_else(|| panic!("no row for destination {name} in {r:#?}"))
}

/// (received, rejected, unrouted, duplicate, routed, waiting).
fn counts(e: &EventAudit) -> [i64; 6] {
    [e.received, e.rejected, e.unrouted, e.duplicate, e.routed, e.waiting]
}

/// (routed, delivered, filtered, dead, discarded, pending).
fn states(d: &DestinationAudit) -> [i64; 6] {
    [d.routed, d.delivered, d.filtered, d.dead, d.discarded, d.pending]
}

pub(super) async fn every_callback_is_accounted_for(h: &mut dyn Harness) {
    let store = h.open().await;
    let ids = append_all(
        &store,
        vec![
            received("demo", "A", 10 * S, "{}"),
            received("demo", "A", 11 * S, "{}"), // a copy of the first
            received("demo", "B", 12 * S, "{}"), // nobody wants it
            rejected(13 * S),
            received("demo", "A", 14 * S, "{}"), // stays in the inbox
        ],
    )
    .await;
    let r = audit(&store).await;
    assert!(r.balanced, "{:?}", r.imbalances);
    assert_eq!(counts(row(&r, "demo", "A")), [3, 0, 0, 0, 0, 3], "all waiting");
    assert_eq!(counts(row(&r, "demo", "TaskCreated")), [1, 1, 0, 0, 0, 0]);
    let mut first = plan(ids[0], 1, &["crm", "web"]);
    first.filtered =
        vec![FilteredOut { destination: "web".into(), reason: "no match".into(), error: false }];
    let outcomes = store
        .dispatch(vec![first, plan(ids[1], 1, &["crm", "web"]), plan(ids[2], 2, &[])], 20 * S)
        .await
        .unwrap();
    assert_eq!(outcomes[1], DispatchVerdict::Duplicate { original: ids[0] });
    let r = audit(&store).await;
    assert!(r.balanced, "{:?}", r.imbalances);
    assert_eq!(counts(row(&r, "demo", "A")), [3, 0, 0, 1, 1, 1]);
    assert_eq!(counts(row(&r, "demo", "B")), [1, 0, 1, 0, 0, 0]);
    assert_eq!(states(dest(&r, "crm")), [1, 0, 0, 0, 0, 1]);
    assert_eq!(states(dest(&r, "web")), [1, 0, 1, 0, 0, 0]);

    // crm delivers; web is replayed past its filter, fails for good, is discarded.
    let claim = store.claim_due("crm", "r1", 20 * S, LEASE, 10).await.unwrap().remove(0);
    record(&store, &claim, report(AnswerClass::Success, 21 * S)).await;
    assert_eq!(store.replay(ids[0], vec!["web".into()], 22 * S).await.unwrap(), 1);
    let r = audit(&store).await;
    assert!(r.balanced, "{:?}", r.imbalances);
    assert_eq!(states(dest(&r, "crm")), [1, 1, 0, 0, 0, 0]);
    assert_eq!(states(dest(&r, "web")), [1, 0, 0, 0, 0, 1], "replayed: pending");
    let claim = store.claim_due("web", "r1", 22 * S, LEASE, 10).await.unwrap().remove(0);
    record(&store, &claim, report(AnswerClass::Permanent, 23 * S)).await;
    assert_eq!(states(dest(&audit(&store).await, "web")), [1, 0, 0, 1, 0, 0]);
    assert!(store.discard(ids[0], "web").await.unwrap());
    // A replay to a destination the event never went to routes it there.
    assert_eq!(store.replay(ids[2], vec!["crm".into()], 24 * S).await.unwrap(), 1);
    store.add_triggered(0, "demo", "A", 4).await.unwrap();
    let r = audit(&store).await;
    assert!(r.balanced, "{:?}", r.imbalances);
    assert_eq!(states(dest(&r, "web")), [1, 0, 0, 0, 1, 0]);
    assert_eq!(states(dest(&r, "crm")), [2, 1, 0, 0, 0, 1]);
    let a = row(&r, "demo", "A");
    assert_eq!((a.triggered, a.not_received), (Some(4), Some(1)));
    assert_eq!(row(&r, "demo", "B").triggered, None, "no account: no comparison");

    // Retention deletes finished events, never their history; a restart keeps it.
    assert!(store.prune(100 * S, 100).await.unwrap() >= 1);
    drop(store);
    let store = h.reopen().await;
    let after = audit(&store).await;
    assert_eq!(after.events.len(), r.events.len());
    assert_eq!(counts(row(&after, "demo", "A")), counts(row(&r, "demo", "A")));
    assert_eq!(states(dest(&after, "crm")), states(dest(&r, "crm")));
    assert_eq!(states(dest(&after, "web")), states(dest(&r, "web")));
    assert!(after.balanced, "{:?}", after.imbalances);
    // Other hours hold nothing.
    let later = crate::audit::read(&store, 1_000, 2_000, None).await.unwrap();
    assert!(later.events.is_empty() && later.destinations.is_empty());
}
