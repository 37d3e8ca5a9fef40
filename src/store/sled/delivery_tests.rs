//! Store-level tests of dispatch and delivery, on real sled files.

use std::collections::HashSet;

use super::testutil::{event, open};
use super::SledStore;
use crate::store::{
    DeadLetterFilter, DedupKey, DeliveryState, DeliveryStore, DispatchOutcome, DispatchPlan,
    DispatchStore, EventId, EventStatus, EventStore, QueueStats, Scheduled,
};

const S: u64 = 1_000_000;

fn plan(id: u64, hash: u8, dests: &[&str]) -> DispatchPlan {
    DispatchPlan {
        id: EventId::new(id),
        dedup: Some(DedupKey { hash: [hash; 16], window_us: 600 * S }),
        destinations: dests.iter().map(|d| d.to_string()).collect(),
        ordered: Vec::new(),
        resource: None,
    }
}

/// Appends received events with the given ids and receive times.
fn ingest(store: &SledStore, events: &[(u64, u64)]) {
    let mut evs = Vec::new();
    for (_, at) in events {
        let mut e = event("demo", "ActionCreated", EventStatus::Received, Some("{}"));
        e.meta.received_at_us = *at;
        evs.push(e);
    }
    let batch: Vec<(EventId, &_)> =
        events.iter().zip(&evs).map(|((id, _), e)| (EventId::new(*id), e)).collect();
    store.append(&batch).unwrap();
}

#[test]
fn dispatch_dedups_within_the_window_and_schedules_deliveries() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    ingest(&store, &[(1, 10 * S), (2, 11 * S), (3, 700 * S), (4, 12 * S), (5, 13 * S)]);
    assert_eq!(store.inbox_len(), 5);
    assert_eq!(store.pending(10).unwrap().len(), 5);
    let outcomes = store
        .dispatch(
            &[
                plan(1, 7, &["a", "b"]),
                plan(2, 7, &["a", "b"]), // same key, in the window: duplicate
                plan(3, 7, &["a"]),      // same key, window over: new original
                plan(4, 8, &[]),         // nobody wants it
                DispatchPlan { dedup: None, ..plan(5, 7, &["b"]) }, // dedup off
                plan(99, 9, &["a"]),     // not in the inbox
            ],
            20 * S,
        )
        .unwrap();
    assert_eq!(
        outcomes,
        [
            DispatchOutcome::Dispatched(2),
            DispatchOutcome::Duplicate { original: EventId::new(1) },
            DispatchOutcome::Dispatched(1),
            DispatchOutcome::Unrouted,
            DispatchOutcome::Dispatched(1),
            DispatchOutcome::Gone,
        ]
    );
    assert_eq!(store.inbox_len(), 0);
    assert_eq!(store.dedup_len(), 2);
    let dup = store.event(EventId::new(2)).unwrap().unwrap();
    assert_eq!(
        (dup.meta.status, dup.meta.duplicate_of),
        (EventStatus::Duplicate, Some(EventId::new(1)))
    );
    assert_eq!(store.body(EventId::new(2)).unwrap().unwrap(), b"{}", "duplicates keep their body");
    assert_eq!(store.event(EventId::new(4)).unwrap().unwrap().meta.status, EventStatus::Unrouted);
    assert_eq!(store.event(EventId::new(1)).unwrap().unwrap().meta.destinations, ["a", "b"]);

    let due = store.due("a", 20 * S, 10).unwrap();
    assert_eq!(due.iter().map(|d| d.event.raw()).collect::<Vec<_>>(), [1, 3]);
    assert!(store.due("a", 19 * S, 10).unwrap().is_empty(), "not due before now");
    assert_eq!(store.due("b", 20 * S, 1).unwrap().len(), 1, "limit");
    assert_eq!(
        store.queue_stats("a").unwrap(),
        QueueStats { pending: 2, held: 0, retrying: 0, dead: 0, oldest: Some(EventId::new(1)) }
    );

    // Keys expire: the purge removes the ones whose window has ended.
    assert_eq!(store.purge_dedup(700 * S).unwrap(), 1);
    assert_eq!(store.dedup_len(), 1);
}

#[test]
fn attempts_move_schedule_entries_and_dead_letters_then_replay_and_prune() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    ingest(&store, &[(1, S), (2, 2 * S), (3, 3 * S)]);
    store.dispatch(&[plan(1, 1, &["a"]), plan(2, 2, &["a"]), plan(3, 3, &[])], 10 * S).unwrap();
    let first = Scheduled { due_us: 10 * S, event: EventId::new(1) };
    let second = Scheduled { due_us: 10 * S, event: EventId::new(2) };

    // Event 1: fails once (retry at 15 s), then succeeds.
    let mut r1 = store.delivery(EventId::new(1), "a").unwrap().unwrap();
    r1.state = DeliveryState::Retrying;
    r1.next_attempt_us = Some(15 * S);
    store.record_attempt(first, &r1).unwrap();
    assert_eq!(store.next_due_after("a", 10 * S).unwrap(), Some(15 * S));
    assert_eq!(store.queue_stats("a").unwrap().retrying, 1);
    r1.state = DeliveryState::Delivered;
    r1.next_attempt_us = None;
    store.record_attempt(Scheduled { due_us: 15 * S, event: EventId::new(1) }, &r1).unwrap();

    // Event 2: dead.
    let mut r2 = store.delivery(EventId::new(2), "a").unwrap().unwrap();
    r2.state = DeliveryState::Dead;
    r2.next_attempt_us = None;
    store.record_attempt(second, &r2).unwrap();
    assert!(store.due("a", u64::MAX - 1, 10).unwrap().is_empty());
    let dead = store.dead_letters(&DeadLetterFilter { limit: 10, ..Default::default() }).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].event, EventId::new(2));
    let none = DeadLetterFilter { source: Some("other".into()), limit: 10, ..Default::default() };
    assert!(store.dead_letters(&none).unwrap().is_empty());
    assert_eq!(store.queue_stats("a").unwrap().dead, 1);

    // Retention: 1 (delivered) and 3 (unrouted) go; 2 (dead) stays.
    assert_eq!(store.prune(100 * S, 100).unwrap(), 2);
    assert!(store.event(EventId::new(1)).unwrap().is_none());
    assert!(store.deliveries_of(EventId::new(1)).unwrap().is_empty());
    assert!(store.body(EventId::new(3)).unwrap().is_none());
    assert!(store.event(EventId::new(2)).unwrap().is_some());
    assert_eq!(store.prune(100 * S, 100).unwrap(), 0);

    // Replay: back in the schedule, out of the dead letters, a new round.
    assert_eq!(store.replay(EventId::new(2), &["a".into()], 200 * S).unwrap(), 1);
    assert!(store
        .dead_letters(&DeadLetterFilter { limit: 10, ..Default::default() })
        .unwrap()
        .is_empty());
    let r = store.delivery(EventId::new(2), "a").unwrap().unwrap();
    assert_eq!(
        (r.state, r.next_attempt_us, r.round_started_us),
        (DeliveryState::Pending, Some(200 * S), 200 * S)
    );
    assert_eq!(
        store.due("a", 200 * S, 10).unwrap(),
        [Scheduled { due_us: 200 * S, event: EventId::new(2) }]
    );
    // Replaying again replaces the entry instead of adding one.
    store.replay(EventId::new(2), &["a".into()], 201 * S).unwrap();
    assert_eq!(store.due("a", 300 * S, 10).unwrap().len(), 1);
}

/// Three events about one record and one about another, to an ordered destination.
#[test]
fn per_resource_queues_hold_later_deliveries_until_the_head_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    ingest(&store, &[(1, S), (2, 2 * S), (3, 3 * S), (4, 4 * S)]);
    let ordered = |id: u64, resource: u8| DispatchPlan {
        dedup: None,
        ordered: vec!["a".into()],
        resource: Some([resource; 16]),
        ..plan(id, 0, &["a"])
    };
    store.dispatch(&[ordered(1, 7), ordered(2, 7), ordered(3, 8), ordered(4, 7)], 10 * S).unwrap();
    let due: Vec<u64> = store.due("a", 10 * S, 10).unwrap().iter().map(|d| d.event.raw()).collect();
    assert_eq!(due, [1, 3], "only each record's head is scheduled");
    assert_eq!(store.delivery(EventId::new(2), "a").unwrap().unwrap().state, DeliveryState::Held);
    assert_eq!(store.queue_stats("a").unwrap().held, 2);
    // Replaying a held delivery does not jump the queue.
    assert_eq!(store.replay(EventId::new(4), &["a".into()], 10 * S).unwrap(), 0);

    // The head fails and retries: the others of its record stay held.
    let mut r1 = store.delivery(EventId::new(1), "a").unwrap().unwrap();
    let stale = r1.clone(); // as read before its attempt
    r1.state = DeliveryState::Retrying;
    r1.next_attempt_us = Some(20 * S);
    store.record_attempt(Scheduled { due_us: 10 * S, event: EventId::new(1) }, &r1).unwrap();
    assert_eq!(store.delivery(EventId::new(2), "a").unwrap().unwrap().state, DeliveryState::Held);

    // It succeeds; its in-memory copy predates the link to event 2, which survives.
    let mut done = stale;
    done.state = DeliveryState::Delivered;
    done.next_attempt_us = None;
    store.record_attempt(Scheduled { due_us: 20 * S, event: EventId::new(1) }, &done).unwrap();
    let r2 = store.delivery(EventId::new(2), "a").unwrap().unwrap();
    assert_eq!(r2.state, DeliveryState::Pending);
    let due: Vec<u64> =
        store.due("a", u64::MAX - 1, 10).unwrap().iter().map(|d| d.event.raw()).collect();
    assert_eq!(due, [3, 2]);

    // Event 2 goes dead: event 4 gets its turn all the same.
    let mut r2 = r2;
    r2.state = DeliveryState::Dead;
    r2.next_attempt_us = None;
    let due2 = store.due("a", u64::MAX - 1, 10).unwrap()[1];
    store.record_attempt(due2, &r2).unwrap();
    assert_eq!(
        store.delivery(EventId::new(4), "a").unwrap().unwrap().state,
        DeliveryState::Pending
    );
    assert_eq!(store.queue_stats("a").unwrap().held, 0);
}

#[test]
fn pauses_persist() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        store.set_paused("a", true).unwrap();
        store.set_paused("b", true).unwrap();
        store.set_paused("b", false).unwrap();
    }
    let store = open(dir.path());
    assert_eq!(store.paused().unwrap(), HashSet::from(["a".to_owned()]));
}

#[test]
fn a_deleted_dead_letter_is_discarded_and_its_event_can_be_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    ingest(&store, &[(1, S)]);
    store.dispatch(&[plan(1, 1, &["a"])], 10 * S).unwrap();
    assert!(!store.discard(EventId::new(1), "a").unwrap(), "only dead letters can be deleted");
    let mut r = store.delivery(EventId::new(1), "a").unwrap().unwrap();
    r.state = DeliveryState::Dead;
    r.next_attempt_us = None;
    store.record_attempt(Scheduled { due_us: 10 * S, event: EventId::new(1) }, &r).unwrap();
    assert_eq!(store.prune(100 * S, 10).unwrap(), 0, "dead letters keep their event");
    assert!(store.discard(EventId::new(1), "a").unwrap());
    assert!(store
        .dead_letters(&DeadLetterFilter { limit: 10, ..Default::default() })
        .unwrap()
        .is_empty());
    assert_eq!(
        store.delivery(EventId::new(1), "a").unwrap().unwrap().state,
        DeliveryState::Discarded
    );
    assert_eq!(store.prune(100 * S, 10).unwrap(), 1);
    assert!(store.event(EventId::new(1)).unwrap().is_none());
}

/// Readers never miss an event that dispatch is moving from `inbox` to `events`.
#[test]
fn listings_and_lookups_see_every_event_while_dispatch_moves_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(open(dir.path()));
    let all: Vec<(u64, u64)> = (1..=3000).map(|i| (i, i * S)).collect();
    for chunk in all.chunks(500) {
        ingest(&store, chunk);
    }
    let mover = {
        let store = store.clone();
        std::thread::spawn(move || {
            for ids in (1..=3000u64).collect::<Vec<_>>().chunks(32) {
                let plans: Vec<DispatchPlan> = ids
                    .iter()
                    .map(|id| DispatchPlan { dedup: None, ..plan(*id, 0, &[]) })
                    .collect();
                store.dispatch(&plans, 10 * S).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        })
    };
    let filter = crate::store::EventFilter { limit: 5000, ..Default::default() };
    let mut rounds = 0;
    while !mover.is_finished() || rounds == 0 {
        let listed = store.list_events(&filter).unwrap();
        assert_eq!(listed.len(), 3000, "a listing missed events (round {rounds})");
        assert!(listed.windows(2).all(|w| w[0].id > w[1].id));
        for id in [1u64, 1500, 3000] {
            assert!(store.event(EventId::new(id)).unwrap().is_some(), "event {id} missed");
            assert!(store.body(EventId::new(id)).unwrap().is_some(), "body {id} missed");
        }
        rounds += 1;
    }
    mover.join().unwrap();
    assert_eq!(store.inbox_len(), 0);
    assert!(rounds > 1, "the listing should have overlapped the moves");
}
