//! Conformance of [`Coordination`](crate::store::Coordination) for one relay, the case
//! every backend has: it leads every task, holds are granted, and it is the whole
//! fleet (a store one process owns says so with `None`). What two relays on one
//! database see of each other is checked on PostgreSQL itself (`postgres/mod.rs`,
//! `postgres/listen.rs`) and in the model test's fleet run.

use super::*;

pub(super) async fn a_sole_relay_leads_and_is_the_whole_fleet(h: &mut dyn Harness) {
    let store = h.open().await;
    for task in [crate::store::DISPATCH_LEAD, "retention", "reconcile"] {
        assert!(store.lead(task).await.unwrap(), "a sole relay leads {task}");
        assert!(store.lead(task).await.unwrap(), "and keeps leading it at its next ask");
    }
    {
        let _held = store.exclusive("sync").await.unwrap();
    }
    // The hold was given back with its guard: it is granted again at once.
    let again = tokio::time::timeout(Duration::from_secs(10), store.exclusive("sync")).await;
    assert!(matches!(again, Ok(Ok(_))), "a hold given back is granted again");
    let before = crate::clock::unix_micros(std::time::SystemTime::now());
    match store.heartbeat("relay-a", Duration::from_secs(10)).await.unwrap() {
        None => {} // one process owns the store: it is the whole fleet
        Some(fleet) => {
            assert_eq!((fleet.rank, fleet.size), (0, 1), "alone, it is the fleet: {fleet:?}");
            let skew = fleet.store_us.abs_diff(before);
            assert!(skew < 60 * S, "the store's clock is given (off by {skew} µs here)");
            let again = store.heartbeat("relay-a", Duration::from_secs(10)).await.unwrap();
            assert_eq!(again.map(|f| (f.rank, f.size)), Some((0, 1)), "one relay, announced twice");
        }
    }
    store.close().await.unwrap();
}
