//! The check after every step: everything the store shows matches the model.

use super::*;

/// How many checks found a queue count still going behind a reopen (and held it to
/// a lower bound): the tests that slow the count down assert they raced with it.
pub(in crate::store::conformance) static SEEN_COUNTING: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// The same for the inbox's count.
pub(in crate::store::conformance) static SEEN_INBOX_COUNTING: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Whether `store` shows exactly the model `m` (a failed check panics in a task of
/// its own, whose panic message is only noise here).
pub(super) async fn shows(store: &SharedStore, m: &Model) -> bool {
    let (store, m) = (store.clone(), m.clone());
    tokio::spawn(async move { verify(&store, &m).await }).await.is_ok()
}

/// Everything the store shows matches the model.
pub(super) async fn verify(store: &SharedStore, m: &Model) {
    let inbox = m.events.values().filter(|s| **s == EventStatus::Received).count() as u64;
    let got = store.inbox().await.unwrap();
    let inbox_counting = got.counting;
    if got.counting {
        SEEN_INBOX_COUNTING.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Counted behind a reopen, not done yet: a lower bound (as the queues below).
        assert!(got.events <= inbox, "inbox while counting: {got:?}, at most {inbox}");
    } else {
        assert_eq!(got.events, inbox, "inbox");
    }
    let listed =
        store.list_events(EventFilter { limit: 100_000, ..Default::default() }).await.unwrap();
    let shown: BTreeMap<EventId, EventStatus> =
        listed.iter().map(|r| (r.id, r.meta.status)).collect();
    assert_eq!(shown, m.events, "events");
    // By resource: every received event of the occurrence's resource, newest first,
    // whether still in the inbox or dispatched.
    for occurrence in 0..RESOURCES {
        let resource = resource_of(occurrence);
        let filter =
            EventFilter { resource: Some(resource.clone()), limit: 100_000, ..Default::default() };
        let got: Vec<EventId> =
            store.list_events(filter).await.unwrap().into_iter().map(|r| r.id).collect();
        let want: Vec<EventId> = m
            .events
            .iter()
            .rev()
            .filter(|(id, status)| {
                **status != EventStatus::Rejected && resource_of(m.occurrence[*id]) == resource
            })
            .map(|(id, _)| *id)
            .collect();
        assert_eq!(got, want, "events about {resource}");
    }
    for id in m.events.keys() {
        let got: BTreeMap<String, (DeliveryState, Option<u64>)> = store
            .deliveries_of(*id)
            .await
            .unwrap()
            .into_iter()
            .map(|d| (d.destination, (d.state, d.next_attempt_us)))
            .collect();
        let want: BTreeMap<String, (DeliveryState, Option<u64>)> = m
            .deliveries
            .iter()
            .filter(|((e, _), _)| e == id)
            .map(|((_, d), x)| (d.clone(), (x.state, x.due)))
            .collect();
        assert_eq!(got, want, "deliveries of {id}");
    }
    for dest in DESTS {
        let count = |s: DeliveryState| {
            m.deliveries.iter().filter(|((_, d), x)| d == dest && x.state == s).count() as u64
        };
        let oldest = m
            .deliveries
            .iter()
            .filter(|((_, d), x)| d == dest && x.state.is_scheduled())
            .map(|((id, _), _)| *id)
            .min()
            .map(QueueStats::second_of);
        let want = QueueStats {
            pending: count(DeliveryState::Pending),
            held: count(DeliveryState::Held),
            retrying: count(DeliveryState::Retrying),
            dead: count(DeliveryState::Dead),
            oldest,
            counting: false,
        };
        let got = store.queue_stats(dest).await.unwrap();
        if got.counting {
            SEEN_COUNTING.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // Counted behind a reopen, not done yet: a lower bound (checked exactly by
            // a later verify, and the last one waits for it).
            let (have, truth) = (
                [got.pending, got.held, got.retrying, got.dead],
                [want.pending, want.held, want.retrying, want.dead],
            );
            assert!(
                have.iter().zip(truth).all(|(h, t)| *h <= t),
                "queue of {dest} while counting: {got:?}, at most {want:?}"
            );
        } else {
            assert_eq!(got, want, "queue of {dest}");
        }
    }
    let dead: BTreeSet<(EventId, String)> = store
        .dead_letters(DeadLetterFilter { limit: 100_000, ..Default::default() })
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.event, d.destination))
        .collect();
    let want: BTreeSet<(EventId, String)> = m
        .deliveries
        .iter()
        .filter(|(_, x)| x.state == DeliveryState::Dead)
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(dead, want, "dead letters");
    assert_eq!(store.paused().await.unwrap(), m.paused.iter().cloned().collect(), "paused");
    // The audit: both equations hold, and what it counts is what happened. Not while
    // the inbox is counted behind a reopen: the audit would wait for it, and the next
    // operations would not race with the count (`recount::tests` checks the wait; the
    // last check waits for the count).
    if inbox_counting {
        return;
    }
    let reading = store.ledger(0, 1_000).await.unwrap();
    let audit = crate::store::lifecycle::balance::balance(&reading, 0, 1_000, None);
    assert!(audit.imbalances.is_empty(), "audit: {:?}", audit.imbalances);
    let sum = |f: fn(&crate::store::lifecycle::balance::EventRow) -> i64| {
        audit.events.values().map(f).sum::<i64>()
    };
    assert_eq!(sum(|e| e.received), m.appended, "audit: received");
    assert_eq!(sum(|e| e.rejected), m.rejected, "audit: rejected");
    assert_eq!(sum(|e| e.waiting), inbox as i64, "audit: waiting");
    for dest in DESTS {
        let row = audit.destinations.get(dest);
        let got = row.map_or([0; 4], |d| [d.pending, d.retrying, d.held, d.dead]);
        let count = |s: DeliveryState| {
            m.deliveries.iter().filter(|((_, d), x)| d == dest && x.state == s).count() as i64
        };
        let want = [
            DeliveryState::Pending,
            DeliveryState::Retrying,
            DeliveryState::Held,
            DeliveryState::Dead,
        ]
        .map(count);
        assert_eq!(got, want, "audit of {dest}: pending, retrying, held, dead");
    }
}
