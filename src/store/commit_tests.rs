//! The group committer: groups shared, quiet groups, riders, failures and a stuck write.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::*;
use crate::store::{EventMeta, Writers};

/// Counts groups, stored events and groups that left events waiting.
#[derive(Default)]
struct Seen {
    groups: Mutex<Vec<(usize, bool)>>,
    stored: AtomicUsize,
    waiting: AtomicUsize,
}

impl StoreObserver for Seen {
    fn group(&self, size: usize, _took: Duration, ok: bool) {
        self.groups.lock().unwrap().push((size, ok));
    }
    fn stored(&self, _meta: &EventMeta) {
        self.stored.fetch_add(1, Ordering::SeqCst);
    }
    fn failed(&self, _reason: &str) {}
    fn trouble(&self, _: crate::store::Trouble, _: &str, _: &dyn std::fmt::Display) {}
    fn waiting(&self) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
    }
}

fn healthy() -> Arc<Health> {
    Health::new(
        "test",
        Duration::from_secs(60),
        Writers::OneAtATime,
        Arc::new(crate::store::NoObserver),
    )
}

fn event() -> NewEvent {
    crate::store::fixtures::received("demo", "ActionCreated", 5, "")
}

/// A write that takes a while, like an fsync, and numbers the events.
fn slow_write(written: Arc<AtomicUsize>) -> WriteGroup {
    Box::new(move |events: &[NewEvent], _quiet, _: Vec<NoRider>| {
        std::thread::sleep(Duration::from_millis(20));
        let first = written.fetch_add(events.len(), Ordering::SeqCst) as u64;
        Ok(Written::waiting(
            (0..events.len() as u64).map(|i| EventId::new(first + i + 1)).collect(),
        ))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submits_share_groups() {
    let written = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Seen::default());
    let (committer, _thread) =
        Committer::start("test", slow_write(written.clone()), 512, seen.clone(), healthy())
            .unwrap();
    let submits: Vec<_> = (0..64)
        .map(|_| {
            let c = committer.clone();
            tokio::spawn(async move { c.submit(event()).await })
        })
        .collect();
    let mut ids = Vec::new();
    for s in submits {
        ids.push(s.await.unwrap().unwrap());
    }
    ids.sort();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "each waiter got its own id");
    assert_eq!(written.load(Ordering::SeqCst), 64);
    assert_eq!(seen.stored.load(Ordering::SeqCst), 64);
    let groups = seen.groups.lock().unwrap().clone();
    assert!(groups.len() < 16, "64 concurrent events took {} groups", groups.len());
    committer.close().await;
    assert!(committer.submit(event()).await.is_err(), "closed");
}

/// A write is told its group is quiet only when the group is small and no
/// callback waits behind it (a lone callback is); a group it does not dispatch
/// itself wakes the dispatcher, one it dispatched does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_may_dispatch_only_small_groups_with_nothing_queued_behind() {
    let seen = Arc::new(Seen::default());
    // Each group's size and whether it was quiet.
    let told: Arc<Mutex<Vec<(usize, bool)>>> = Arc::default();
    let (log, written) = (told.clone(), Arc::new(AtomicUsize::new(0)));
    let mut slow = slow_write(written);
    let write: WriteGroup = Box::new(move |events: &[NewEvent], quiet, riders| {
        let mut told = log.lock().unwrap();
        told.push((events.len(), quiet));
        let mut group = slow(events, quiet, riders)?;
        // Dispatches every other quiet group itself.
        group.waiting = !quiet || told.iter().filter(|(_, q)| *q).count() % 2 == 0;
        Ok(group)
    });
    let (committer, _thread) =
        Committer::start("test", write, 512, seen.clone(), healthy()).unwrap();
    // One alone, nothing behind it.
    committer.submit(event()).await.unwrap();
    // Then 64 at once: groups larger than the bound, and callbacks queued behind.
    let submits: Vec<_> = (0..64)
        .map(|_| {
            let c = committer.clone();
            tokio::spawn(async move { c.submit(event()).await })
        })
        .collect();
    for s in submits {
        s.await.unwrap().unwrap();
    }
    committer.close().await;
    let told = told.lock().unwrap().clone();
    assert_eq!(told.first(), Some(&(1, true)), "a lone callback is quiet: {told:?}");
    assert!(told.iter().all(|(size, quiet)| !quiet || *size <= QUIET_GROUP_MAX), "{told:?}");
    assert!(told.iter().any(|(size, quiet)| *size > QUIET_GROUP_MAX && !quiet), "{told:?}");
    let quiet = told.iter().filter(|(_, q)| *q).count();
    let dispatched = quiet.div_ceil(2);
    assert_eq!(
        seen.waiting.load(Ordering::SeqCst),
        told.len() - dispatched,
        "only the groups the write dispatched itself leave the dispatcher asleep: {told:?}"
    );
}

/// A rider of the tests: answered with the size of the group it was written with.
type Told = oneshot::Sender<usize>;

/// A write that answers each rider with its group's size, after a sync's time.
fn answering_write() -> WriteGroup<Told> {
    let mut next = 0u64;
    Box::new(move |events: &[NewEvent], _quiet, riders: Vec<Told>| {
        std::thread::sleep(Duration::from_micros(300));
        for rider in riders {
            let _ = rider.send(events.len());
        }
        let ids = events.iter().map(|_| {
            next += 1;
            EventId::new(next)
        });
        Ok(Written::waiting(ids.collect()))
    })
}

/// A rider with no group in sight is written alone, without waiting; riders that
/// come between groups arriving at a steady rhythm ride the next group's write,
/// and wake the committer only when it did not come in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rider_rides_the_next_group_when_one_is_expected_and_goes_alone_otherwise() {
    let (committer, thread) =
        Committer::start("test", answering_write(), 64, Arc::new(Seen::default()), healthy())
            .unwrap();
    let ride = |committer: &Committer<Told>| {
        let (tx, rx) = oneshot::channel();
        let committer = committer.clone();
        async move { committer.ride(tx, rx).await.unwrap() }
    };
    let started = std::time::Instant::now();
    assert_eq!(ride(&committer).await, 0, "no group ever came: written alone");
    assert!(started.elapsed() < Duration::from_secs(2));
    // Groups every 2 ms, and a rider right after each: the next group is
    // expected well within the linger.
    let mut shared = 0;
    let rounds = 40;
    for _ in 0..rounds {
        committer.submit(event()).await.unwrap();
        let rider = tokio::spawn(ride(&committer));
        tokio::time::sleep(Duration::from_millis(2)).await;
        committer.submit(event()).await.unwrap();
        if rider.await.unwrap() > 0 {
            shared += 1;
        }
    }
    assert!(shared >= rounds / 2, "only {shared} of {rounds} riders rode a group");
    // A group expected that does not come: the rider is written alone, once its
    // linger is over.
    committer.submit(event()).await.unwrap();
    let started = std::time::Instant::now();
    assert_eq!(ride(&committer).await, 0, "no group came: written alone");
    assert!(started.elapsed() < Duration::from_secs(2));
    // The groups stopped long ago: a rider no longer waits for one.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(ride(&committer).await, 0, "the groups stopped: written alone");
    // A rider waiting at the close is written by it; later ones are refused.
    let (tx, rx) = oneshot::channel();
    lock(&committer.shared.riders).as_mut().unwrap().push(tx);
    committer.close().await;
    assert_eq!(rx.await, Ok(0), "a rider waiting at the close");
    let (tx, rx) = oneshot::channel();
    assert!(committer.ride(tx, rx).await.is_err(), "closed");
    thread.join().unwrap();
}

#[tokio::test]
async fn a_failed_write_fails_every_waiter_of_its_group() {
    let seen = Arc::new(Seen::default());
    let write: WriteGroup = Box::new(|_: &[NewEvent], _, _| Err(StoreError::Injected("disk full")));
    let (committer, _thread) = Committer::start("test", write, 8, seen.clone(), healthy()).unwrap();
    let err = committer.submit(event()).await.unwrap_err();
    assert!(err.to_string().contains("disk full"), "{err}");
    assert_eq!(*seen.groups.lock().unwrap(), [(1, false)]);
    assert_eq!(seen.stored.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_never_returns_fails_its_callers_within_the_bound() {
    let health = Health::new(
        "test",
        Duration::from_millis(300),
        Writers::OneAtATime,
        Arc::new(crate::store::NoObserver),
    );
    let _watchdog = Health::start_watchdog(&health).unwrap();
    let guard = health.clone();
    // Blocks like sled's flush on a full tmpfs did: for ever.
    let write: WriteGroup = Box::new(move |_: &[NewEvent], _, _| {
        guard.write(StoreError::is_engine_failure, || {
            std::thread::park();
            Ok(Written::waiting(Vec::new()))
        })
    });
    let (committer, _thread) =
        Committer::start("test", write, 8, Arc::new(Seen::default()), health.clone()).unwrap();
    let started = std::time::Instant::now();
    let err = committer.submit(event()).await.unwrap_err();
    assert!(matches!(err, StoreError::Failed(_)), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    // Later callers are refused at once, without queueing behind the stuck group.
    let started = std::time::Instant::now();
    assert!(matches!(committer.submit(event()).await, Err(StoreError::Failed(_))));
    assert!(started.elapsed() < Duration::from_millis(100));
}
