//! Conformance scenarios of events: ids, listing, bodies, restarts, the inbox and
//! dedup counts under races, search by record.

use super::*;

pub(super) async fn ids_listing_bodies_and_reopen(h: &mut dyn Harness) {
    let store = h.open().await;
    let ids = append_all(
        &store,
        vec![
            received("demo", "ActionCreated", 5_000, "{\"a\":1}"),
            rejected(4_000), // the clock stepped back: ids still increase
            received("other", "ActionCreated", 6_000, ""),
        ],
    )
    .await;
    assert_eq!(ids.len(), 3);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert_eq!(ids[0], EventId::new(5_000), "ids start from the receive time");
    assert_eq!(store.inbox_len().await.unwrap(), 2, "rejected events never enter the inbox");
    let all = store.list_events(EventFilter { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(all.iter().map(|r| r.id).collect::<Vec<_>>(), [ids[2], ids[1], ids[0]]);
    let page = EventFilter { limit: 1, after: Some(ids[2]), ..Default::default() };
    assert_eq!(store.list_events(page).await.unwrap()[0].id, ids[1]);
    let filter = EventFilter {
        source: Some("demo".into()),
        status: Some(EventStatus::Received),
        limit: 10,
        ..Default::default()
    };
    assert_eq!(
        store.list_events(filter).await.unwrap().iter().map(|r| r.id).collect::<Vec<_>>(),
        [ids[0]]
    );
    assert_eq!(store.body(ids[0]).await.unwrap().unwrap(), b"{\"a\":1}");
    assert_eq!(store.body(ids[1]).await.unwrap(), None);
    assert_eq!(store.body(ids[2]).await.unwrap().unwrap(), b"");
    assert_eq!(store.event(EventId::new(1)).await.unwrap(), None);
    let rej = store.event(ids[1]).await.unwrap().unwrap();
    assert_eq!(
        (rej.meta.status, rej.meta.reason.as_deref()),
        (EventStatus::Rejected, Some("too large"))
    );
    drop(store);
    let store = h.reopen().await;
    assert_eq!(store.inbox_len().await.unwrap(), 2);
    let next = append_all(&store, vec![received("demo", "ActionCreated", 1, "{}")]).await;
    assert!(next[0] > ids[2], "ids keep increasing across a restart");
}

pub(super) async fn concurrent_appends_get_unique_ids(h: &mut dyn Harness) {
    let store = h.open().await;
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.append(received("demo", "A", 7, "{}")).await })
        })
        .collect();
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap().unwrap());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 64, "every append got its own id");
    assert_eq!(store.inbox_len().await.unwrap(), 64, "and every acknowledged one is stored");
    store.close().await.unwrap();
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
    let planner: crate::store::Planner = Arc::new(|p: &PendingEvent| {
        let mut hash = [0u8; 16];
        hash[..8].copy_from_slice(&p.id.raw().to_be_bytes());
        DispatchPlan {
            id: p.id,
            dedup: Some(DedupKey { hash, window_us: 600 * S }),
            destinations: Vec::new(),
            ordered: Vec::new(),
            resource: None,
        }
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
    assert_eq!(store.inbox_len().await.unwrap(), 0, "the inbox is empty and so is its count");
    assert_eq!(store.dedup_len().await.unwrap(), WRITERS * EACH);
    store.close().await.unwrap();
}

/// Listing by record: found in the inbox and after dispatch, filtered and paged like
/// any listing, gone with its event, and the same after a restart.
pub(super) async fn events_are_found_by_record(h: &mut dyn Harness) {
    let store = h.open().await;
    let ids = append_all(
        &store,
        vec![
            about(received("demo", "ActionCreated", S, "{}"), "actions/5"),
            about(received("demo", "ActionCreated", S + 1, "{}"), "actions/6"),
            received("demo", "ActionCreated", S + 2, "{}"),
            about(received("other", "ActionUpdated", S + 3, "{}"), "actions/5"),
            about(received("demo", "ActionUpdated", S + 4, "{}"), "actions/5"),
        ],
    )
    .await;
    let by = |record: &str, f: EventFilter| EventFilter { record: Some(record.into()), ..f };
    let all = || EventFilter { limit: 10, ..Default::default() };
    let found = |store: SharedStore, f: EventFilter| async move {
        store.list_events(f).await.unwrap().into_iter().map(|r| r.id).collect::<Vec<_>>()
    };
    assert_eq!(found(store.clone(), by("actions/5", all())).await, [ids[4], ids[3], ids[0]]);
    // Two still in the inbox, three dispatched: one listing.
    store
        .dispatch(
            vec![plan(ids[0], 1, &["crm"]), plan(ids[2], 2, &[]), plan(ids[3], 3, &[])],
            2 * S,
        )
        .await
        .unwrap();
    assert_eq!(found(store.clone(), by("actions/5", all())).await, [ids[4], ids[3], ids[0]]);
    let events = store.list_events(by("actions/5", all())).await.unwrap();
    assert_eq!(events[2].meta.record.as_deref(), Some("actions/5"));
    assert_eq!(events[2].meta.status, EventStatus::Dispatched);
    assert_eq!(found(store.clone(), by("actions/6", all())).await, [ids[1]]);
    assert!(found(store.clone(), by("actions/7", all())).await.is_empty());
    assert!(found(store.clone(), by("actions", all())).await.is_empty(), "no prefix match");
    let demo = EventFilter { source: Some("demo".into()), ..all() };
    assert_eq!(found(store.clone(), by("actions/5", demo)).await, [ids[4], ids[0]]);
    let unrouted = EventFilter { status: Some(EventStatus::Unrouted), ..all() };
    assert_eq!(found(store.clone(), by("actions/5", unrouted)).await, [ids[3]]);
    let page = EventFilter { limit: 2, ..all() };
    assert_eq!(found(store.clone(), by("actions/5", page)).await, [ids[4], ids[3]]);
    let next = EventFilter { limit: 2, after: Some(ids[3]), ..all() };
    assert_eq!(found(store.clone(), by("actions/5", next)).await, [ids[0]]);
    // The unrouted event is pruned, and leaves the index with it.
    assert_eq!(store.prune(10 * S, 100).await.unwrap(), 2, "the unrouted ones");
    assert_eq!(found(store.clone(), by("actions/5", all())).await, [ids[4], ids[0]]);
    drop(store);
    let store = h.reopen().await;
    assert_eq!(found(store.clone(), by("actions/5", all())).await, [ids[4], ids[0]]);
    store.close().await.unwrap();
}

/// Retention deleted the newest events, then the relay restarted: an event stored
/// with the same receive time (the clock stood still, or stepped back) is still
/// pending and found by its record (sled once handed out an id at its dispatch
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
    let by_record =
        EventFilter { record: Some("actions/0".into()), limit: 10, ..Default::default() };
    let found: Vec<EventId> =
        store.list_events(by_record).await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(found, second);
    store.close().await.unwrap();
}
