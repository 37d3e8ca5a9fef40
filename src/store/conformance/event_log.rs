//! Conformance of [`EventLog`](crate::store::EventLog): ids, listing, bodies,
//! restarts, search by resource, retention.

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
    assert_eq!(inbox_len(&store).await, 2, "rejected events never enter the inbox");
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
    assert_eq!(inbox_len(&store).await, 2);
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
    assert_eq!(inbox_len(&store).await, 64, "and every acknowledged one is stored");
    store.close().await.unwrap();
}

/// Listing by resource: found in the inbox and after dispatch, filtered and paged like
/// any listing, gone with its event, and the same after a restart.
pub(super) async fn events_are_found_by_resource(h: &mut dyn Harness) {
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
    let by = |resource: &str, f: EventFilter| EventFilter { resource: Some(resource.into()), ..f };
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
    assert_eq!(events[2].meta.resource.as_deref(), Some("actions/5"));
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

/// Listing by receive time: `since` (inclusive) and `after` (exclusive) bound the
/// window, with or without a resource, in the inbox and once dispatched.
pub(super) async fn events_are_listed_within_a_time_window(h: &mut dyn Harness) {
    let store = h.open().await;
    let ids = append_all(
        &store,
        (0..6).map(|i| about(received("demo", "A", S + i * 10, "{}"), "actions/5")).collect(),
    )
    .await;
    store.dispatch(vec![plan(ids[1], 1, &[]), plan(ids[2], 2, &[])], 2 * S).await.unwrap();
    let window = |since: usize, before: usize, resource: Option<&str>| EventFilter {
        since: Some(ids[since]),
        after: Some(ids[before]),
        resource: resource.map(str::to_owned),
        limit: 10,
        ..Default::default()
    };
    for resource in [None, Some("actions/5")] {
        let got = store.list_events(window(1, 4, resource)).await.unwrap();
        let got: Vec<EventId> = got.into_iter().map(|r| r.id).collect();
        assert_eq!(got, [ids[3], ids[2], ids[1]], "{resource:?}");
        let only_since = EventFilter { after: None, ..window(4, 0, resource) };
        let got = store.list_events(only_since).await.unwrap();
        assert_eq!(got.into_iter().map(|r| r.id).collect::<Vec<_>>(), [ids[5], ids[4]]);
        let empty = store.list_events(window(3, 3, resource)).await.unwrap();
        assert!(empty.is_empty(), "{resource:?}: an empty window");
    }
    store.close().await.unwrap();
}

pub(super) async fn prune_keeps_what_is_not_finished(h: &mut dyn Harness) {
    let store = h.open().await;
    let ids = append_all(
        &store,
        vec![
            received("demo", "A", S, "{}"),
            received("demo", "A", S + 1, "{}"),
            received("demo", "A", S + 2, "{}"),
            rejected(S + 3),
            received("demo", "A", S + 4, "{}"), // stays in the inbox
        ],
    )
    .await;
    store
        .dispatch(
            vec![plan(ids[0], 1, &["a"]), plan(ids[1], 2, &["a"]), plan(ids[2], 3, &[])],
            2 * S,
        )
        .await
        .unwrap();
    // ids[0] delivered; ids[1] dead.
    for (outcome, _) in [(AnswerClass::Success, ids[0]), (AnswerClass::Permanent, ids[1])] {
        let claims = store.claim_due("a", "r1", 2 * S, LEASE, 1).await.unwrap();
        record(&store, &claims[0], report(outcome, 2 * S)).await;
    }
    assert_eq!(store.prune(S, 100).await.unwrap(), 0, "nothing received before the cutoff");
    assert_eq!(store.prune(10 * S, 100).await.unwrap(), 3, "delivered, unrouted, rejected");
    assert_eq!(store.event(ids[0]).await.unwrap(), None);
    assert_eq!(store.body(ids[0]).await.unwrap(), None);
    assert!(store.deliveries_of(ids[0]).await.unwrap().is_empty(), "with its deliveries");
    assert!(store.event(ids[1]).await.unwrap().is_some(), "a dead letter keeps its event");
    assert!(store.event(ids[4]).await.unwrap().is_some(), "the inbox is never pruned");
    // Replayed and delivered: then it goes, and the limit holds.
    store.replay(ids[1], vec!["a".into()], 3 * S).await.unwrap();
    assert_eq!(store.prune(10 * S, 100).await.unwrap(), 0, "a scheduled delivery keeps its event");
    let claims = store.claim_due("a", "r1", 3 * S, LEASE, 1).await.unwrap();
    record(&store, &claims[0], report(AnswerClass::Success, 3 * S)).await;
    assert_eq!(store.prune(10 * S, 0).await.unwrap(), 0);
    assert_eq!(store.prune(10 * S, 100).await.unwrap(), 1);
    assert_eq!(
        store.claim_due("a", "r1", 100 * S, LEASE, 10).await.unwrap().len(),
        0,
        "no orphan schedule entry"
    );
}

/// Retention by part: a settled event loses its body and keeps everything else (its
/// record, deliveries and attempts, search by resource); one still owed an attempt, a
/// dead letter, the inbox and what was received after the cutoff keep theirs; a call
/// looks only after its cursor.
pub(super) async fn bodies_of_settled_events_go_and_their_records_stay(h: &mut dyn Harness) {
    let store = h.open().await;
    let first = r#"{"data":{"type":"actions","id":"9"}}"#;
    let mut about = received("demo", "A", S, first);
    about.meta.resource = Some("actions/9".into());
    let ids = append_all(
        &store,
        vec![
            about,
            received("demo", "A", S + 1, "{\"b\":2}"),
            received("demo", "A", S + 2, "{\"c\":3}"),
            received("demo", "A", S + 3, "{\"d\":4}"), // unrouted
            received("demo", "A", 20 * S, "{}"),       // after the cutoff
            received("demo", "A", S + 5, "{}"),        // stays in the inbox
        ],
    )
    .await;
    store
        .dispatch(
            vec![
                plan(ids[0], 1, &["a"]),
                plan(ids[1], 2, &["a"]),
                plan(ids[2], 3, &["a"]),
                plan(ids[3], 4, &[]),
                plan(ids[4], 5, &["a"]),
            ],
            2 * S,
        )
        .await
        .unwrap();
    // ids[0] delivered, ids[1] dead, ids[2] still owed an attempt.
    for outcome in [AnswerClass::Success, AnswerClass::Permanent] {
        let claims = store.claim_due("a", "r1", 2 * S, LEASE, 1).await.unwrap();
        record(&store, &claims[0], report(outcome, 2 * S)).await;
    }
    let (gone, last) = store.prune_bodies(EventId::new(0), 10 * S, 100).await.unwrap();
    assert_eq!(gone, 2, "the delivered and the unrouted event's bodies");
    assert_eq!(last, Some(ids[3]), "the last event before the cutoff looked at");
    assert_eq!(store.body(ids[0]).await.unwrap(), None);
    assert_eq!(store.body(ids[3]).await.unwrap(), None);
    assert_eq!(store.body(ids[1]).await.unwrap().unwrap(), b"{\"b\":2}", "a dead letter's stays");
    assert_eq!(store.body(ids[2]).await.unwrap().unwrap(), b"{\"c\":3}", "owed an attempt");
    assert_eq!(store.body(ids[4]).await.unwrap().unwrap(), b"{}", "after the cutoff");
    assert_eq!(store.body(ids[5]).await.unwrap().unwrap(), b"{}", "in the inbox");
    // The rest of the delivered event stays: its record, its attempts, the search.
    let kept = store.event(ids[0]).await.unwrap().unwrap();
    assert_eq!((kept.meta.status, kept.meta.size), (EventStatus::Dispatched, first.len() as u64));
    let deliveries = store.deliveries_of(ids[0]).await.unwrap();
    assert_eq!(deliveries[0].state, DeliveryState::Delivered);
    assert_eq!(deliveries[0].attempts.len(), 1);
    let by_resource =
        EventFilter { resource: Some("actions/9".into()), limit: 10, ..Default::default() };
    assert_eq!(store.list_events(by_resource).await.unwrap()[0].id, ids[0]);
    // From the cursor on, nothing is looked at twice; a limit is kept.
    assert_eq!(store.prune_bodies(ids[3], 10 * S, 100).await.unwrap(), (0, None));
    let (_, last) = store.prune_bodies(EventId::new(0), 10 * S, 1).await.unwrap();
    assert_eq!(last, Some(ids[0]), "one looked at");
    drop(store);
    // After a restart, still gone; retention then deletes the rest as before.
    let store = h.reopen().await;
    assert_eq!(store.body(ids[0]).await.unwrap(), None);
    assert!(store.event(ids[0]).await.unwrap().is_some());
    assert_eq!(store.prune(10 * S, 100).await.unwrap(), 2, "the delivered and the unrouted");
}

/// Retention by part at settlement: an event the retention pass went past while it
/// was owed (a consumer down longer than the body's retention) loses its body when
/// the attempt that settles it is recorded after the cutoff, in the same write; one
/// still owed to another destination, a dead letter, one received after the cutoff
/// and one recorded without a cutoff keep theirs, and the record stays whole.
pub(super) async fn an_event_settled_past_its_bodys_retention_loses_it_as_it_is_recorded(
    h: &mut dyn Harness,
) {
    let store = h.open().await;
    let ids = append_all(
        &store,
        vec![
            received("demo", "A", S, "{\"a\":1}"), // to a and b, settled last
            received("demo", "A", S + 1, "{\"b\":2}"), // dead
            received("demo", "A", S + 2, "{\"c\":3}"), // recorded without a cutoff
            received("demo", "A", 20 * S, "{\"d\":4}"), // after the cutoff
        ],
    )
    .await;
    let plans = vec![
        plan(ids[0], 1, &["a", "b"]),
        plan(ids[1], 2, &["a"]),
        plan(ids[2], 3, &["a"]),
        plan(ids[3], 4, &["a"]),
    ];
    store.dispatch(plans, 2 * S).await.unwrap();
    // The pass goes by while everything is owed: no body goes, its cursor moves on.
    let (gone, last) = store.prune_bodies(EventId::new(0), 10 * S, 100).await.unwrap();
    assert_eq!((gone, last), (0, Some(ids[2])));

    let cutoff = Some(10 * S);
    let mut claims = store.claim_due("a", "r1", 20 * S, LEASE, 10).await.unwrap();
    claims.extend(store.claim_due("b", "r1", 20 * S, LEASE, 10).await.unwrap());
    let claim = |id: EventId, dest: &str| {
        claims.iter().find(|c| c.event == id && c.destination == dest).unwrap().clone()
    };
    // Each recorded alone; the count of bodies it dropped is what the metrics get.
    let record = |claim, class, cutoff, dropped: usize| {
        let store = store.clone();
        async move {
            let attempts = vec![(claim, report(class, 20 * S))];
            let r = store.record_attempts(attempts, &policy(), cutoff).await.unwrap();
            assert!(matches!(r.writes[..], [AttemptWrite::Done(_)]));
            assert_eq!(r.bodies_dropped, dropped);
        }
    };
    record(claim(ids[0], "a"), AnswerClass::Success, cutoff, 0).await;
    assert!(store.body(ids[0]).await.unwrap().is_some(), "still owed to b");
    record(claim(ids[0], "b"), AnswerClass::Success, cutoff, 1).await;
    assert_eq!(store.body(ids[0]).await.unwrap(), None, "settled past its retention");
    record(claim(ids[1], "a"), AnswerClass::Permanent, cutoff, 0).await;
    assert_eq!(store.body(ids[1]).await.unwrap().unwrap(), b"{\"b\":2}", "a dead letter's stays");
    record(claim(ids[2], "a"), AnswerClass::Success, None, 0).await;
    assert_eq!(store.body(ids[2]).await.unwrap().unwrap(), b"{\"c\":3}", "no retention by part");
    record(claim(ids[3], "a"), AnswerClass::Success, cutoff, 0).await;
    assert_eq!(store.body(ids[3]).await.unwrap().unwrap(), b"{\"d\":4}", "after the cutoff");
    // The rest of the settled event stays, and stays so after a restart.
    drop(store);
    let store = h.reopen().await;
    assert_eq!(store.body(ids[0]).await.unwrap(), None);
    let kept = store.event(ids[0]).await.unwrap().unwrap();
    assert_eq!(kept.meta.status, EventStatus::Dispatched);
    let deliveries = store.deliveries_of(ids[0]).await.unwrap();
    assert_eq!(deliveries.len(), 2);
    assert!(deliveries
        .iter()
        .all(|d| d.state == DeliveryState::Delivered && d.attempts.len() == 1));
    // Retention deletes it whole later, as any settled event.
    assert!(store.prune(10 * S, 100).await.unwrap() >= 1);
    assert!(store.event(ids[0]).await.unwrap().is_none());
}

/// The retention race: a replay committed between retention's decision and its delete
/// left a schedule entry without a delivery record, retried every second forever.
/// Prune and replay run concurrently here; afterwards every event is either gone
/// whole or has its replayed delivery, and every due entry has its record.
pub(super) async fn prune_and_replay_race_leaves_no_orphan(h: &mut dyn Harness) {
    let store = h.open().await;
    let n = 200u64;
    let events: Vec<NewEvent> = (0..n).map(|i| received("demo", "A", S + i, "{}")).collect();
    let ids = append_all(&store, events).await;
    let plans = ids
        .iter()
        .map(|id| plan(*id, (id.raw() % 250) as u8, &["a"]))
        .map(|p| DispatchPlan { dedup: None, ..p })
        .collect();
    store.dispatch(plans, 2 * S).await.unwrap();
    loop {
        let claims = store.claim_due("a", "r1", 2 * S, LEASE, 64).await.unwrap();
        if claims.is_empty() {
            break;
        }
        let batch = claims.into_iter().map(|c| (c, report(AnswerClass::Success, 2 * S))).collect();
        store.record_attempts(batch, &policy(), None).await.unwrap();
    }
    let pruner = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut pruned = 0;
            for _ in 0..50 {
                pruned += store.prune(10 * S + n, 5).await.unwrap();
                tokio::task::yield_now().await;
            }
            pruned
        })
    };
    let replayer = {
        let (store, ids) = (store.clone(), ids.clone());
        tokio::spawn(async move {
            let mut replayed = 0;
            for id in ids.iter().rev() {
                replayed += store.replay(*id, vec!["a".into()], 3 * S).await.unwrap();
                tokio::task::yield_now().await;
            }
            replayed
        })
    };
    let (pruned, replayed) = (pruner.await.unwrap(), replayer.await.unwrap());
    assert_eq!(pruned + replayed, n as usize, "each event was pruned or replayed, not both");
    let mut pending = 0;
    for id in &ids {
        let event = store.event(*id).await.unwrap();
        let deliveries = store.deliveries_of(*id).await.unwrap();
        match event {
            None => assert!(deliveries.is_empty(), "a pruned event took its deliveries"),
            Some(_) => {
                assert_eq!(deliveries.len(), 1);
                assert_eq!(deliveries[0].state, DeliveryState::Pending);
                pending += 1;
            }
        }
    }
    assert_eq!(pending, replayed);
    assert_eq!(store.queue_stats("a").await.unwrap().pending, replayed as u64);
    let due = store.claim_due("a", "r1", 4 * S, LEASE, 10_000).await.unwrap();
    assert_eq!(due.len(), replayed, "every due entry has its record, and no entry is orphaned");
}
