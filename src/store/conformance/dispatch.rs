//! Conformance of [`Dispatch`](crate::store::Dispatch): dedup, routing and
//! scheduling in one step, the inbox and dedup counts under races, ids after a restart.

use super::*;

pub(super) async fn dispatch_dedups_routes_and_schedules(h: &mut dyn Harness) {
    let store = h.open().await;
    let ids = append_all(
        &store,
        vec![
            received("demo", "ActionCreated", 10 * S, "{}"),
            received("demo", "ActionCreated", 11 * S, "{}"),
            received("demo", "ActionCreated", 700 * S, "{}"),
            received("demo", "ActionCreated", 701 * S, "{}"),
            received("demo", "ActionCreated", 702 * S, "{}"),
        ],
    )
    .await;
    let pending = store.pending(10).await.unwrap();
    assert_eq!(pending.iter().map(|p| p.id).collect::<Vec<_>>(), ids);
    let outcomes = store
        .dispatch(
            vec![
                plan(ids[0], 7, &["a", "b"]),
                plan(ids[1], 7, &["a", "b"]), // same key, in the window: duplicate
                plan(ids[2], 7, &["a"]),      // same key, window over: a new original
                plan(ids[3], 8, &[]),         // nobody wants it
                DispatchPlan { dedup: None, ..plan(ids[4], 7, &["b"]) }, // dedup off
                plan(EventId::new(99), 9, &["a"]), // not in the inbox
            ],
            800 * S,
        )
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        [
            DispatchVerdict::dispatched(2),
            DispatchVerdict::Duplicate { original: ids[0] },
            DispatchVerdict::dispatched(1),
            DispatchVerdict::Unrouted,
            DispatchVerdict::dispatched(1),
            DispatchVerdict::Gone,
        ]
    );
    assert_eq!(inbox_len(&store).await, 0);
    assert_eq!(store.dedup_len().await.unwrap(), 2, "keys 7 and 8 (unrouted events hold theirs)");
    let dup = store.event(ids[1]).await.unwrap().unwrap();
    assert_eq!((dup.meta.status, dup.meta.duplicate_of), (EventStatus::Duplicate, Some(ids[0])));
    assert_eq!(store.body(ids[1]).await.unwrap().unwrap(), b"{}", "duplicates keep their body");
    assert_eq!(store.event(ids[3]).await.unwrap().unwrap().meta.status, EventStatus::Unrouted);
    assert_eq!(store.event(ids[0]).await.unwrap().unwrap().meta.destinations, ["a", "b"]);
    // Dispatching again finds nothing: a second relay or a retry after a crash.
    let again = store.dispatch(vec![plan(ids[0], 7, &["a"])], 800 * S).await.unwrap();
    assert_eq!(again, [DispatchVerdict::Gone]);
    let q = store.queue_stats("a").await.unwrap();
    assert_eq!(q, QueueStats { pending: 2, oldest: Some(ids[0]), ..QueueStats::default() });
    let claims = store.claim_due("a", "r1", 800 * S, LEASE, 10).await.unwrap();
    assert_eq!(claims.iter().map(|c| c.event).collect::<Vec<_>>(), [ids[0], ids[2]]);
    assert!(claims.iter().all(|c| c.record.state == DeliveryState::Pending && c.due_us == 800 * S));
    assert_eq!(store.next_due_after("a", 799 * S).await.unwrap(), Some(800 * S));
    assert_eq!(store.next_due_after("a", 800 * S).await.unwrap(), None);
    // Key 7 (renewed by ids[2]) ends at 1,300 s, key 8 a second later. A store may
    // purge a key up to one window after it ends (the embedded one purges by
    // bucket), never before: key 8 still holds at 1,300 s.
    let purged = store.purge_dedup(1_300 * S, usize::MAX).await.unwrap();
    assert!(purged <= 1, "purged {purged} keys at 1,300 s: a live one went");
    assert_eq!(store.dedup_len().await.unwrap(), 2 - purged as u64);
    let late = append_all(&store, vec![received("demo", "ActionCreated", 1_300 * S, "{}")]).await;
    let verdict = store.dispatch(vec![plan(late[0], 8, &["a"])], 1_300 * S).await.unwrap();
    assert_eq!(verdict, [DispatchVerdict::Duplicate { original: ids[3] }], "key 8 held");
    // A step removes no more than its limit; the steps together remove the rest.
    let mut steps = Vec::new();
    loop {
        let n = store.purge_dedup(1_301 * S + 600 * S, 1).await.unwrap();
        if n == 0 {
            break;
        }
        steps.push(n);
    }
    assert_eq!(steps, vec![1; 2 - purged], "steps of one key");
    assert_eq!(store.dedup_len().await.unwrap(), 0);
    // Five keys whose windows ended long ago, purged two at a time: 2, 2, 1, then none.
    let at = 2_000 * S;
    let more: Vec<_> = (0..5).map(|_| received("demo", "ActionCreated", at, "{}")).collect();
    let ids = append_all(&store, more).await;
    let plans = ids.iter().zip(20u8..).map(|(id, hash)| plan(*id, hash, &["a"])).collect();
    store.dispatch(plans, at).await.unwrap();
    let later = at + 3 * 600 * S;
    let mut steps = Vec::new();
    for _ in 0..4 {
        steps.push(store.purge_dedup(later, 2).await.unwrap());
    }
    assert_eq!(steps, [2, 2, 1, 0], "a step removes no more than its limit");
}

/// The inbox and dedup counts end where the data is when appends and dispatch race:
/// dispatch may take an event before `append` has counted it (a sled count clamped at
/// zero lost that decrement and reported a non-empty inbox for good).
pub(super) async fn counts_survive_concurrent_append_and_dispatch(h: &mut dyn Harness) {
    const WRITERS: u64 = 4;
    const EACH: u64 = 1_000;
    let store = h.open().await;
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (store, done) = (store.clone(), done.clone());
            tokio::spawn(async move {
                for i in 0..EACH {
                    let body = format!("{{\"w\":{w},\"i\":{i}}}");
                    store.append(received("demo", "A", 1_000 + i, &body)).await.unwrap();
                }
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            })
        })
        .collect();
    // Every event its own dedup key (from its id), no destination.
    let planner: crate::store::Planner = Arc::new(|pending: &[PendingEvent]| {
        pending
            .iter()
            .map(|p| DispatchPlan {
                latest: Vec::new(),
                filtered: Vec::new(),
                id: p.id,
                dedup: Some(own_key(p.id)),
                destinations: Vec::new(),
                ordered: Vec::new(),
                resource: None,
            })
            .collect()
    });
    let mut dispatched = 0u64;
    loop {
        let finished = done.load(std::sync::atomic::Ordering::SeqCst) == WRITERS as usize;
        let (pending, _, _) = store.dispatch_next(8, planner.clone(), 2_000).await.unwrap();
        dispatched += pending.len() as u64;
        if finished && pending.is_empty() {
            break;
        }
        if pending.is_empty() {
            tokio::task::yield_now().await;
        }
    }
    for w in writers {
        w.await.unwrap();
    }
    assert_eq!(dispatched, WRITERS * EACH);
    assert_eq!(inbox_len(&store).await, 0, "the inbox is empty and so is its count");
    assert_eq!(store.dedup_len().await.unwrap(), WRITERS * EACH);
    store.close().await.unwrap();
}

/// Retention deleted the newest events, then the relay restarted: an event stored
/// with the same receive time (the clock stood still, or stepped back) is still
/// pending and found by its resource (sled once handed out an id at its dispatch
/// cursor, which left the event undispatched for good; the model test found it).
pub(super) async fn ids_after_pruning_the_newest_and_a_restart_are_dispatched(h: &mut dyn Harness) {
    let store = h.open().await;
    let first = append_all(&store, vec![about(received("demo", "A", S, "{}"), "actions/0")]).await;
    store.dispatch(vec![plan(first[0], 1, &[])], 2 * S).await.unwrap();
    assert_eq!(store.prune(10 * S, 10).await.unwrap(), 1);
    drop(store);
    let store = h.reopen().await;
    let second = append_all(&store, vec![about(received("demo", "A", S, "{}"), "actions/0")]).await;
    let pending = store.pending(10).await.unwrap();
    assert_eq!(pending.iter().map(|p| p.id).collect::<Vec<_>>(), second, "still to dispatch");
    let by_resource =
        EventFilter { resource: Some("actions/0".into()), limit: 10, ..Default::default() };
    let found: Vec<EventId> =
        store.list_events(by_resource).await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(found, second);
    store.close().await.unwrap();
    drop(store);
    // The newest event was a rejected one (it never moves dispatch's cursor), pruned,
    // and the clock stood still: after a restart the audit counts the next event once
    // (sled handed the pruned id out again, below its ledger's append mark, and the
    // new append went uncounted; the model test found it).
    let store = h.reopen().await;
    append_all(&store, vec![rejected(20 * S)]).await;
    drop(store);
    let store = h.reopen().await;
    assert_eq!(store.prune(30 * S, 10).await.unwrap(), 1, "the rejected event goes");
    drop(store);
    let store = h.reopen().await;
    let next = append_all(&store, vec![received("demo", "TaskUpdated", 20 * S, "{}")]).await[0];
    assert!(store.event(next).await.unwrap().is_some());
    drop(store);
    let store = h.reopen().await;
    let ledger = store.ledger(0, 1_000).await.unwrap();
    let received: i64 = ledger
        .counts
        .iter()
        .filter(|(key, _)| {
            key.event == "TaskUpdated"
                && key.count == crate::store::lifecycle::ledger::Count::Received
        })
        .map(|(_, n)| *n)
        .sum();
    assert_eq!(received, 1, "the new event is counted once");
    store.close().await.unwrap();
}

/// A destination whose filter did not match gets a `filtered` delivery with the
/// reason: never scheduled, not in the queue counts or the dead letters, out of the
/// per-resource queue, prunable; a replay makes it pending.
pub(super) async fn filtered_deliveries_are_kept_never_attempted_and_replayable(
    h: &mut dyn Harness,
) {
    let store = h.open().await;
    let ids = append_all(
        &store,
        vec![
            about(received("demo", "ActionUpdated", 10 * S, "{}"), "actions/5"),
            about(received("demo", "ActionUpdated", 11 * S, "{}"), "actions/5"),
        ],
    )
    .await;
    let filtered = |id| DispatchPlan {
        latest: Vec::new(),
        filtered: vec![super::super::FilteredOut {
            destination: "f".into(),
            reason: "the filter gave false".into(),
            error: false,
        }],
        ordered: vec!["f".into()],
        resource: Some([9; 16]),
        ..plan(id, id.raw() as u8, &["a", "f"])
    };
    let outcomes = store.dispatch(vec![filtered(ids[0]), filtered(ids[1])], 20 * S).await.unwrap();
    assert_eq!(outcomes, [DispatchVerdict::dispatched(2), DispatchVerdict::dispatched(2)]);
    for id in &ids {
        let s = states(&store, *id).await;
        assert_eq!(s.get("f"), Some(&DeliveryState::Filtered), "{s:?}");
        assert_eq!(s.get("a"), Some(&DeliveryState::Pending), "{s:?}");
    }
    let deliveries = store.deliveries_of(ids[0]).await.unwrap();
    let f = deliveries.iter().find(|d| d.destination == "f").unwrap();
    assert_eq!(
        (f.reason.as_deref(), f.next_attempt_us, f.total_attempts),
        (Some("the filter gave false"), None, 0)
    );
    assert!(store.claim_due("f", "r1", 100 * S, LEASE, 10).await.unwrap().is_empty());
    assert_eq!(store.queue_stats("f").await.unwrap(), QueueStats::default());
    let dead = DeadLetterFilter { limit: 10, ..Default::default() };
    assert!(store.dead_letters(dead).await.unwrap().is_empty());
    // Delivered to `a`, filtered for `f`: nothing left to do, so it may be pruned.
    for claim in store.claim_due("a", "r1", 20 * S, LEASE, 10).await.unwrap() {
        record(&store, &claim, report(AnswerClass::Success, 20 * S)).await;
    }
    assert_eq!(store.prune(11 * S, 10).await.unwrap(), 1, "the first one");
    // A replay to `f` (its filter asked again by the caller) makes it pending.
    assert_eq!(store.replay(ids[1], vec!["f".into()], 30 * S).await.unwrap(), 1);
    assert_eq!(states(&store, ids[1]).await.get("f"), Some(&DeliveryState::Pending));
    let claims = store.claim_due("f", "r1", 30 * S, LEASE, 10).await.unwrap();
    assert_eq!(claims.iter().map(|c| c.event).collect::<Vec<_>>(), [ids[1]]);
}
