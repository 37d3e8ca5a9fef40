//! The count behind the open on both engines: what it says meanwhile, who waits for
//! it, and a close that stops it.

use std::time::{Duration, Instant};

use super::super::testutil;
use super::super::{keys, Engine, SCHEDULED_PENDING};
use super::Pace;
use crate::store::{DeliveryQueue, EventId, Upkeep};

/// A store in `dir` whose schedule holds `n` pending deliveries to `a`, written
/// into the index directly (the count reads only the indexes).
fn queued(engine: Engine, dir: &std::path::Path, n: u64) {
    let store = testutil::open_on(engine, dir);
    for i in 1..=n {
        let key = keys::schedule("a", 5_000_000, EventId::new(i * 1_000_000));
        store.inner.schedule.insert(key, [SCHEDULED_PENDING]).unwrap();
    }
    store.inner.db.flush().unwrap();
    drop(store);
}

/// Slow enough that the test sees the count going: one entry every 20 ms.
const SLOW: Pace = Pace { chunk: 1, pause: Duration::from_millis(20) };

/// While the count goes the queue says so and its numbers are a lower bound;
/// retention's question waits for the end and gets the whole answer; the counts end
/// exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_is_counted_behind_the_open_and_says_so_meanwhile() {
    for engine in [Engine::Sled, Engine::Redb] {
        let dir = tempfile::tempdir().unwrap();
        queued(engine, dir.path(), 40);
        let store = testutil::open_paced(engine, dir.path(), SLOW);
        let early = store.queue_stats("a").await.unwrap();
        assert!(early.counting && early.pending < 40, "{engine:?}: {early:?}");
        assert_eq!(store.open_destinations().await.unwrap(), ["a"], "{engine:?}");
        let done = store.queue_stats("a").await.unwrap();
        assert_eq!((done.counting, done.pending), (false, 40), "{engine:?}");
    }
}

/// The inbox is counted behind the open too: meanwhile it says so, with a lower
/// bound; events dispatched before the count reads them leave it once (not counted,
/// and not taken off); the audit waits for the count and balances; the counts end
/// exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_is_counted_behind_the_open_and_the_audit_waits_for_it() {
    use crate::store::fixtures::{plan, received};
    use crate::store::{EventLog, SharedStore};
    for engine in [Engine::Sled, Engine::Redb] {
        let dir = tempfile::tempdir().unwrap();
        let store = testutil::open_on(engine, dir.path());
        for i in 1..=40 {
            store.append(received("demo", "A", i * 1_000_000, "{}")).await.unwrap();
        }
        store.close().await.unwrap();
        drop(store);
        let store: SharedStore =
            std::sync::Arc::new(testutil::open_paced(engine, dir.path(), SLOW));
        let early = store.inbox().await.unwrap();
        assert!(early.counting && early.events < 40, "{engine:?}: {early:?}");
        // The last ten, which the count has not read yet, dispatched (unrouted).
        let pending = store.pending(40).await.unwrap();
        assert_eq!(pending.len(), 40, "{engine:?}");
        let plans = pending[30..].iter().map(|p| plan(p.id, 1, &[])).collect();
        store.dispatch(plans, 50_000_000).await.unwrap();
        let reading = store.ledger(0, 1_000).await.unwrap();
        let audit = crate::store::lifecycle::balance::balance(&reading, 0, 1_000, None);
        assert!(audit.imbalances.is_empty(), "{engine:?}: {:?}", audit.imbalances);
        let waiting: i64 = audit.events.values().map(|e| e.waiting).sum();
        let received: i64 = audit.events.values().map(|e| e.received).sum();
        assert_eq!((received, waiting), (40, 30), "{engine:?}");
        let done = store.inbox().await.unwrap();
        assert_eq!((done.counting, done.events), (false, 30), "{engine:?}");
    }
}

/// A close stops the count and frees whoever waits for it (a stop must not wait
/// for a large backlog to be counted); the next open counts it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_stops_the_count_and_the_next_open_counts_again() {
    for engine in [Engine::Sled, Engine::Redb] {
        let dir = tempfile::tempdir().unwrap();
        queued(engine, dir.path(), 500);
        let store = std::sync::Arc::new(testutil::open_paced(engine, dir.path(), SLOW));
        let waiting = tokio::spawn({
            let store = store.clone();
            async move { store.open_destinations().await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "{engine:?}: answered before the count ended");
        let closed = Instant::now();
        store.close().await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        let err = answer.expect("still waiting after the close").unwrap().unwrap_err();
        assert!(err.to_string().contains("closed before its queues were counted"), "{err}");
        assert!(closed.elapsed() < Duration::from_secs(2), "{engine:?}: {:?}", closed.elapsed());
        drop(store);
        let again = testutil::open_on(engine, dir.path());
        let q = again.queue_stats("a").await.unwrap();
        assert_eq!((q.counting, q.pending), (false, 500), "{engine:?}");
    }
}
