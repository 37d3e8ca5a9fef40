//! Conformance of [`Audit`](crate::store::Audit): the ledger counts every callback
//! through dedup, routing, filters, attempts, replays, discards and retention, reads
//! the inbox as `waiting`, and survives a restart.

use super::*;
use crate::store::lifecycle::balance::{balance, Balance, DestinationRow, EventRow};
use crate::store::FilteredOut;

/// The ledger's balance over `from_hour..to_hour`.
async fn audit_of(store: &SharedStore, from_hour: u64, to_hour: u64) -> Balance {
    let reading = store.ledger(from_hour, to_hour).await.unwrap();
    balance(&reading, from_hour, to_hour, None)
}

/// The balance of every hour up to 1,000 (the scenarios' times are seconds from 0).
async fn audit(store: &SharedStore) -> Balance {
    audit_of(store, 0, 1_000).await
}

fn row<'a>(r: &'a Balance, source: &str, event: &str) -> &'a EventRow {
    r.events
        .get(&(source.to_owned(), event.to_owned()))
        .unwrap_or_else(|| panic!("no row for {source}/{event} in {r:#?}"))
}

fn dest<'a>(r: &'a Balance, name: &str) -> &'a DestinationRow {
    r.destinations.get(name).unwrap_or_else(|| panic!("no row for destination {name} in {r:#?}"))
}

/// (received, rejected, unrouted, duplicate, routed, waiting).
fn counts(e: &EventRow) -> [i64; 6] {
    [e.received, e.rejected, e.unrouted, e.duplicate, e.routed, e.waiting]
}

/// (routed, delivered, filtered, dead, discarded, pending).
fn states(d: &DestinationRow) -> [i64; 6] {
    [d.routed, d.delivered, d.filtered, d.dead, d.discarded, d.pending]
}

pub(super) async fn every_callback_is_accounted_for(h: &mut dyn Harness) {
    let store = h.open().await;
    let ids = append_all(
        &store,
        vec![
            received("demo", "ActionCreated", 10 * S, "{}"),
            received("demo", "ActionCreated", 11 * S, "{}"), // a copy of the first
            received("demo", "TaskUpdated", 12 * S, "{}"),   // nobody wants it
            rejected(13 * S),
            received("demo", "ActionCreated", 14 * S, "{}"), // stays in the inbox
        ],
    )
    .await;
    let r = audit(&store).await;
    assert!(r.imbalances.is_empty(), "{:?}", r.imbalances);
    assert_eq!(counts(row(&r, "demo", "ActionCreated")), [3, 0, 0, 0, 0, 3], "all waiting");
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
    assert!(r.imbalances.is_empty(), "{:?}", r.imbalances);
    assert_eq!(counts(row(&r, "demo", "ActionCreated")), [3, 0, 0, 1, 1, 1]);
    assert_eq!(counts(row(&r, "demo", "TaskUpdated")), [1, 0, 1, 0, 0, 0]);
    assert_eq!(states(dest(&r, "crm")), [1, 0, 0, 0, 0, 1]);
    assert_eq!(states(dest(&r, "web")), [1, 0, 1, 0, 0, 0]);

    // crm delivers; web is replayed past its filter, fails for good, is discarded.
    let claim = store.claim_due("crm", "r1", 20 * S, LEASE, 10).await.unwrap().remove(0);
    record(&store, &claim, report(AnswerClass::Success, 21 * S)).await;
    assert_eq!(store.replay(ids[0], vec!["web".into()], 22 * S).await.unwrap(), 1);
    let r = audit(&store).await;
    assert!(r.imbalances.is_empty(), "{:?}", r.imbalances);
    assert_eq!(states(dest(&r, "crm")), [1, 1, 0, 0, 0, 0]);
    assert_eq!(states(dest(&r, "web")), [1, 0, 0, 0, 0, 1], "replayed: pending");
    let claim = store.claim_due("web", "r1", 22 * S, LEASE, 10).await.unwrap().remove(0);
    record(&store, &claim, report(AnswerClass::Permanent, 23 * S)).await;
    assert_eq!(states(dest(&audit(&store).await, "web")), [1, 0, 0, 1, 0, 0]);
    assert!(store.discard(ids[0], "web").await.unwrap());
    // A replay to a destination the event never went to routes it there.
    assert_eq!(store.replay(ids[2], vec!["crm".into()], 24 * S).await.unwrap(), 1);
    store.add_triggered(0, "demo", "ActionCreated", 4).await.unwrap();
    let r = audit(&store).await;
    assert!(r.imbalances.is_empty(), "{:?}", r.imbalances);
    assert_eq!(states(dest(&r, "web")), [1, 0, 0, 0, 1, 0]);
    assert_eq!(states(dest(&r, "crm")), [2, 1, 0, 0, 0, 1]);
    let a = row(&r, "demo", "ActionCreated");
    assert_eq!((a.triggered, a.triggered.map(|t| t - a.received)), (Some(4), Some(1)));
    assert_eq!(row(&r, "demo", "TaskUpdated").triggered, None, "no account: no comparison");

    // Retention deletes finished events, never their history; a restart keeps it.
    assert!(store.prune(100 * S, 100).await.unwrap() >= 1);
    drop(store);
    let store = h.reopen().await;
    let after = audit(&store).await;
    assert_eq!(after.events.len(), r.events.len());
    assert_eq!(
        counts(row(&after, "demo", "ActionCreated")),
        counts(row(&r, "demo", "ActionCreated"))
    );
    assert_eq!(states(dest(&after, "crm")), states(dest(&r, "crm")));
    assert_eq!(states(dest(&after, "web")), states(dest(&r, "web")));
    assert!(after.imbalances.is_empty(), "{:?}", after.imbalances);
    // Other hours hold nothing.
    let later = audit_of(&store, 1_000, 2_000).await;
    assert!(later.events.is_empty() && later.destinations.is_empty());
}

pub(super) async fn the_ledger_keeps_hours_for_their_retention_and_one_row_for_unknown_names(
    h: &mut dyn Harness,
) {
    let store = h.open().await;
    const HOUR: u64 = 3_600 * S;
    let mut events = vec![received("demo", "ActionCreated", 10 * S, "{}")];
    // A caller inventing names: 50 names, one row.
    events.extend((0..50).map(|i| received("demo", &format!("Invented{i}"), (11 + i) * S, "{}")));
    events.push(received("demo", "ActionCreated", 2 * HOUR + S, "{}"));
    let ids = append_all(&store, events).await;
    let r = audit(&store).await;
    assert!(r.imbalances.is_empty(), "{:?}", r.imbalances);
    assert_eq!(counts(row(&r, "demo", "other")), [50, 0, 0, 0, 0, 50], "one bucket");
    assert!(r.events.keys().all(|(_, e)| !e.starts_with("Invented")), "{:#?}", r.events);
    assert_eq!(r.events.len(), 2, "ActionCreated and other: {:#?}", r.events);
    // Leaving the inbox moves the bucket's counts, never a row per name.
    let plans = ids.iter().enumerate().map(|(i, id)| plan(*id, i as u8, &[])).collect();
    store.dispatch(plans, 3 * HOUR).await.unwrap();
    let r = audit(&store).await;
    assert!(r.imbalances.is_empty(), "{:?}", r.imbalances);
    assert_eq!(counts(row(&r, "demo", "other")), [50, 0, 50, 0, 0, 0]);

    // Hours before hour 1 go, a chunk at a time; hour 2 stays.
    let mut chunks = 0;
    loop {
        let n = store.prune_ledger(1, 1).await.unwrap();
        assert!(n <= 1, "at most the limit: {n}");
        if n == 0 {
            break;
        }
        chunks += 1;
        assert!(chunks < 1_000, "pruning does not end");
    }
    assert!(chunks >= 2, "hour 0 held at least two rows: {chunks}");
    assert_eq!(store.prune_ledger(1, 100).await.unwrap(), 0, "nothing left to prune");
    let gone = audit_of(&store, 0, 1).await;
    assert!(gone.events.is_empty() && gone.destinations.is_empty(), "{gone:#?}");
    drop(store);
    let store = h.reopen().await;
    let gone = audit_of(&store, 0, 1).await;
    assert!(gone.events.is_empty(), "pruned for good: {gone:#?}");
    let kept = audit_of(&store, 2, 3).await;
    assert_eq!(counts(row(&kept, "demo", "ActionCreated")), [1, 0, 1, 0, 0, 0]);
    assert!(kept.imbalances.is_empty(), "{:?}", kept.imbalances);
}
