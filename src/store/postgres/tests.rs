//! Tests of the PostgreSQL store as a fleet holds it: leases, heartbeats, exclusive
//! holds, a dispatcher that lost its lease (each backend's common contract is the
//! conformance suite's).

use std::time::{Duration, Instant};

use super::test_server;
use crate::store::fixtures;
use crate::store::{Coordination, Dispatch, EventLog, Upkeep};

/// Two stores on one new database, as two relays of a fleet hold it.
pub(super) async fn two_relays(
    prefix: &'static str,
) -> (super::PostgresStore, super::PostgresStore) {
    let url = tokio::task::spawn_blocking(move || {
        test_server::shared().database(&test_server::unique_database(prefix))
    })
    .await
    .unwrap();
    (fixtures::postgres(&url).await, fixtures::postgres(&url).await)
}

/// Runs `sql` on the database of `store` (the test's hand on the tables).
async fn sql(store: &super::PostgresStore, sql: &str) {
    store.client().await.unwrap().batch_execute(sql).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_relay_leads_a_task_and_another_takes_over_when_its_lease_runs_out() {
    let (a, b) = two_relays("lead").await;
    assert!(a.lead("retention").await.unwrap());
    assert!(a.lead("retention").await.unwrap(), "a leader stays leader");
    assert!(!b.lead("retention").await.unwrap(), "two leaders");
    assert!(b.lead("reconciler").await.unwrap(), "tasks are led independently");
    // The holder renews its lease: past the lease's first term, it still leads.
    tokio::time::sleep(super::lead::TTL + Duration::from_secs(2)).await;
    assert!(!b.lead("retention").await.unwrap(), "a lease ran out while renewed");
    assert!(a.lead("retention").await.unwrap());
    // Its lease runs out on the database's clock (the holder cut off: no renewal
    // arrives): the other relay takes it at its next ask, and the old holder learns
    // it at its next renewal. The row's holder is renamed too: a cut-off holder's
    // renewals cannot arrive, but this one's, in this process, could land between
    // the update and the ask (it did, on a loaded machine).
    sql(
        &a,
        "UPDATE leases SET expires_us = 0, holder = holder || '-cut-off' WHERE task = 'retention'",
    )
    .await;
    assert!(b.lead("retention").await.unwrap(), "nobody took over the lead");
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.lead("retention").await.unwrap() {
        assert!(Instant::now() < deadline, "the old holder still believes it leads");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A relay that closes hands its leases over at once.
    assert!(!a.lead("reconciler").await.unwrap());
    b.close().await.unwrap();
    assert!(a.lead("reconciler").await.unwrap(), "a closed relay kept its lease");
}

/// A relay that lost the dispatch lease dispatches nothing, even from a batch it
/// read while it led: the new leader dispatches (one order per resource).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_lost_the_dispatch_lease_dispatches_nothing() {
    use crate::store::fixtures::{plan, received};
    use crate::store::{DispatchVerdict, DISPATCH_LEAD};
    let (a, b) = two_relays("lead").await;
    let id = a.append(received("demo", "ActionCreated", 100, "{}")).await.unwrap();
    assert!(a.lead(DISPATCH_LEAD).await.unwrap());
    sql(&a, "UPDATE leases SET expires_us = 0 WHERE task = 'dispatch'").await;
    assert!(b.lead(DISPATCH_LEAD).await.unwrap());
    // a still believes it leads (until its next renewal), and tries.
    let out = a.dispatch(vec![plan(id, 1, &["x"])], 200).await.unwrap();
    assert!(matches!(out[..], [DispatchVerdict::Gone]), "{out:?}");
    let out = b.dispatch(vec![plan(id, 1, &["x"])], 200).await.unwrap();
    assert!(matches!(out[..], [DispatchVerdict::Dispatched { .. }]), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_rank_the_live_relays_in_the_order_they_joined() {
    let (a, b) = two_relays("lead").await;
    let live = Duration::from_millis(1500);
    let fleet = |rank, size| Some((rank, size));
    let beat = |store: &super::PostgresStore, owner: &'static str| {
        let store = store.clone();
        async move {
            let f = store.heartbeat(owner, live).await.unwrap().unwrap();
            // The database's clock comes with the fleet (this machine's, here).
            let here = crate::clock::unix_micros(std::time::SystemTime::now());
            assert!(f.store_us.abs_diff(here) < 5_000_000, "{} vs {here}", f.store_us);
            Some((f.rank, f.size))
        }
    };
    assert_eq!(beat(&a, "relay-a").await, fleet(0, 1));
    assert_eq!(beat(&b, "relay-b").await, fleet(1, 2));
    assert_eq!(beat(&a, "relay-a").await, fleet(0, 2), "ranks stay");
    // relay-a stops announcing itself: once it is older than `live`, b is alone.
    tokio::time::sleep(live + Duration::from_millis(300)).await;
    assert_eq!(beat(&b, "relay-b").await, fleet(0, 1));
    // It comes back: it joins again, behind b.
    assert_eq!(beat(&a, "relay-a").await, fleet(1, 2));
    assert_eq!(beat(&b, "relay-b").await, fleet(0, 2));
}

/// Of relays joining at once, at most one finds itself alone: the others would
/// otherwise all take the whole of the limits (`fleet::settled`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_joining_at_once_never_both_find_themselves_alone() {
    let (a, b) = two_relays("join").await;
    const AT_ONCE: usize = 6;
    // Short-lived, so that each round is a fleet of its own.
    let live = Duration::from_millis(300);
    for round in 0..10 {
        let beats = (0..AT_ONCE).map(|k| {
            let store = if k % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                let owner = format!("relay-{round}-{k}");
                store.heartbeat(&owner, live).await.unwrap().unwrap().size
            })
        });
        let mut sizes = Vec::new();
        for beat in beats.collect::<Vec<_>>() {
            sizes.push(beat.await.unwrap());
        }
        let alone = sizes.iter().filter(|s| **s == 1).count();
        assert!(alone <= 1, "round {round}: {alone} relays found themselves alone: {sizes:?}");
        assert!(sizes.contains(&AT_ONCE), "round {round}: the last to read sees all: {sizes:?}");
        tokio::time::sleep(live + Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_hold_makes_other_relays_wait() {
    let (a, b) = two_relays("lead").await;
    let held = a.exclusive("reconciler").await.unwrap();
    let waiter = tokio::spawn(async move {
        let _hold = b.exclusive("reconciler").await.unwrap();
        Instant::now()
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished(), "two relays held the task at once");
    let released = Instant::now();
    drop(held);
    let got = tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap();
    assert!(got >= released);
}
