//! Conformance of [`DeliveryQueue`](crate::store::DeliveryQueue): claims and
//! leases, attempts, retries and dead letters, replay and discard, per-resource order,
//! open destinations, pauses.

use super::*;

pub(super) async fn claims_are_leased_and_checked(h: &mut dyn Harness) {
    let store = h.open().await;
    let id = append_all(&store, vec![received("demo", "ActionCreated", S, "{}")]).await[0];
    store.dispatch(vec![plan(id, 1, &["a"])], 2 * S).await.unwrap();
    let first = store.claim_due("a", "r1", 2 * S, LEASE, 5).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].owner, "r1");
    // What the attempt sends comes with the claim.
    assert_eq!(first[0].meta.as_ref().map(|m| m.event.as_str()), Some("ActionCreated"));
    assert_eq!(first[0].body.as_deref(), Some(&b"{}"[..]));
    assert!(
        store.claim_due("a", "r2", 3 * S, LEASE, 5).await.unwrap().is_empty(),
        "a delivery is never claimed twice within its lease"
    );
    // r1 stalls past its lease: r2 takes the delivery over, the same one (so the
    // same webhook-id), and r1's late record is refused.
    let later = 2 * S + 61 * S;
    let second = store.claim_due("a", "r2", later, LEASE, 5).await.unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!((second[0].event, second[0].destination.as_str()), (id, "a"));
    assert_ne!(second[0].token, first[0].token);
    let lost = record(&store, &first[0], report(AnswerClass::Success, later)).await;
    assert_eq!(lost, AttemptWrite::ClaimLost);
    assert_eq!(states(&store, id).await["a"], DeliveryState::Pending, "nothing written");
    // Released: due again at once, for anyone.
    store.release(&second[0]).await.unwrap();
    let third = store.claim_due("a", "r3", later, LEASE, 5).await.unwrap();
    assert_eq!(third.len(), 1);
    let done = record(&store, &third[0], report(AnswerClass::Success, later)).await;
    assert_eq!(done, AttemptWrite::Done(AttemptVerdict::Success));
    assert_eq!(states(&store, id).await["a"], DeliveryState::Delivered);
    assert!(store.claim_due("a", "r1", later + 100 * S, LEASE, 5).await.unwrap().is_empty());
    assert_eq!(store.queue_stats("a").await.unwrap(), QueueStats::default());
}

/// Claims whose claiming call's answer was lost (a timeout after the store had taken
/// them) are given back by their owner, all but those it still holds: due again at
/// once, for anyone; another owner's claims and another destination's stay.
pub(super) async fn claims_nobody_holds_are_given_back(h: &mut dyn Harness) {
    let store = h.open().await;
    let ids = append_all(
        &store,
        (1..=3).map(|i| received("demo", "ActionCreated", i * S, "{}")).collect(),
    )
    .await;
    let plans = ids.iter().enumerate().map(|(i, id)| plan(*id, i as u8 + 1, &["a", "b"])).collect();
    store.dispatch(plans, 4 * S).await.unwrap();
    let held = store.claim_due("a", "r1", 5 * S, LEASE, 2).await.unwrap();
    assert_eq!(held.len(), 2);
    let other = store.claim_due("b", "r1", 5 * S, LEASE, 1).await.unwrap();
    assert_eq!(other.len(), 1);
    // r1's worker for "a" holds only the first of its two claims (the answer of the
    // call that took the second was lost).
    let n = store.release_unknown("a", "r1", &[held[0].token]).await.unwrap();
    assert_eq!(n, 1);
    let again = store.claim_due("a", "r2", 5 * S, LEASE, 5).await.unwrap();
    let events: Vec<EventId> = again.iter().map(|c| c.event).collect();
    assert_eq!(
        events,
        vec![held[1].event, ids[2]],
        "the lost claim is due again, not the held one"
    );
    assert_eq!(
        store.claim_due("b", "r2", 5 * S, LEASE, 5).await.unwrap().len(),
        2,
        "another destination's claim stays"
    );
    // The held claim still records.
    let done = record(&store, &held[0], report(AnswerClass::Success, 5 * S)).await;
    assert_eq!(done, AttemptWrite::Done(AttemptVerdict::Success));
}

/// A delivery that becomes due *before* the ones claimed last (dispatched by a relay
/// whose clock is behind; a lease that expired) is still claimed, within a bound: a
/// backend that reads its schedule from where it last stopped must come back for it.
pub(super) async fn an_earlier_due_delivery_is_still_claimed(h: &mut dyn Harness) {
    let store = h.open().await;
    let ids = append_all(
        &store,
        vec![received("demo", "A", S, "{}"), received("demo", "A", S + 1, "{}")],
    )
    .await;
    store.dispatch(vec![plan(ids[0], 1, &["a"])], 10 * S).await.unwrap();
    assert_eq!(store.claim_due("a", "r1", 10 * S, LEASE, 5).await.unwrap().len(), 1);
    // The same again from the floor: nothing more is due.
    assert!(store.claim_due("a", "r1", 10 * S, LEASE, 5).await.unwrap().is_empty());
    store.dispatch(vec![plan(ids[1], 2, &["a"])], 5 * S).await.unwrap();
    let started = std::time::Instant::now();
    loop {
        let claims = store.claim_due("a", "r1", 10 * S, LEASE, 5).await.unwrap();
        if let [claim] = claims.as_slice() {
            assert_eq!(claim.event, ids[1]);
            break;
        }
        assert!(claims.is_empty(), "{claims:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the earlier-due delivery is never claimed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    store.close().await.unwrap();
}

pub(super) async fn attempts_are_recorded_in_batches(h: &mut dyn Harness) {
    let store = h.open().await;
    let events: Vec<NewEvent> =
        (1..=4).map(|i| received("demo", "ActionUpdated", i * S, "{}")).collect();
    let ids = append_all(&store, events).await;
    let plans = ids
        .iter()
        .enumerate()
        .map(|(i, id)| DispatchPlan {
            // ids[0] and ids[1] are one resource, in order; ids[2] and ids[3] free.
            ordered: vec!["a".into()],
            resource: (i < 2).then_some([3; 16]),
            ..plan(*id, i as u8, &["a"])
        })
        .collect();
    store.dispatch(plans, 5 * S).await.unwrap();
    let claims = store.claim_due("a", "r1", 5 * S, LEASE, 10).await.unwrap();
    assert_eq!(claims.iter().map(|c| c.event).collect::<Vec<_>>(), [ids[0], ids[2], ids[3]]);
    // ids[3]'s claim is lost to r2 before the batch is recorded.
    store.release(&claims[2]).await.unwrap();
    let taken = store.claim_due("a", "r2", 5 * S, LEASE, 10).await.unwrap();
    assert_eq!(taken.len(), 1);
    let batch = vec![
        (claims[0].clone(), report(AnswerClass::Success, 6 * S)),
        (claims[1].clone(), report(AnswerClass::Retry { retry_after: None }, 6 * S)),
        (claims[2].clone(), report(AnswerClass::Success, 6 * S)),
    ];
    let out = store.record_attempts(batch, &policy(), None).await.unwrap().writes;
    assert_eq!(
        out,
        [
            AttemptWrite::Done(AttemptVerdict::Success),
            AttemptWrite::Done(AttemptVerdict::Retry),
            AttemptWrite::ClaimLost
        ]
    );
    // The head's success handed the turn to ids[1] in the same write.
    let next = store.claim_due("a", "r1", 6 * S + 1_000, LEASE, 10).await.unwrap();
    assert_eq!(next.iter().map(|c| c.event).collect::<Vec<_>>(), [ids[1]]);
    let q = store.queue_stats("a").await.unwrap();
    assert_eq!((q.pending, q.retrying, q.held), (2, 1, 0));
    assert_eq!(
        store.record_attempts(Vec::new(), &policy(), None).await.unwrap(),
        crate::store::Recorded::default()
    );
}

pub(super) async fn attempts_retry_die_replay_and_discard(h: &mut dyn Harness) {
    let store = h.open().await;
    let id = append_all(&store, vec![received("demo", "ActionCreated", S, "{}")]).await[0];
    store.dispatch(vec![plan(id, 1, &["a", "b"])], S).await.unwrap();
    let mut now = S;
    for attempt in 1..=3 {
        let claims = store.claim_due("a", "r1", now, LEASE, 5).await.unwrap();
        assert_eq!(claims.len(), 1, "attempt {attempt}");
        let r =
            record(&store, &claims[0], report(AnswerClass::Retry { retry_after: None }, now)).await;
        let q = store.queue_stats("a").await.unwrap();
        if attempt < 3 {
            assert_eq!(r, AttemptWrite::Done(AttemptVerdict::Retry));
            // The retry is persisted: not due before its time, due at it.
            let next = now + 1_000 + S;
            assert!(store.claim_due("a", "r1", next - 1, LEASE, 5).await.unwrap().is_empty());
            assert_eq!(store.next_due_after("a", now).await.unwrap(), Some(next));
            // A claim says it too, read in the same call.
            let (claims, after) =
                store.claim_due_and_next("a", "r1", next - 1, LEASE, 5).await.unwrap();
            assert!(claims.is_empty());
            assert_eq!(after, Some(next));
            assert_eq!((q.pending, q.retrying, q.dead), (0, 1, 0));
            now = next;
        } else {
            assert_eq!(r, AttemptWrite::Done(AttemptVerdict::Dead));
            assert_eq!((q.pending, q.retrying, q.dead), (0, 0, 1));
        }
    }
    let dead =
        store.dead_letters(DeadLetterFilter { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(
        dead.iter().map(|d| (d.event, d.destination.as_str())).collect::<Vec<_>>(),
        [(id, "a")]
    );
    assert_eq!(dead[0].total_attempts, 3);
    // Each attempt keeps the start of its own answer; the last is the record's.
    let answers: Vec<_> = dead[0].attempts.iter().map(|a| a.answer.clone()).collect();
    let at: Vec<_> =
        dead[0].attempts.iter().map(|a| Some(format!("answer at {}", a.at_us))).collect();
    assert_eq!(answers, at);
    assert_eq!(dead[0].last_response, Some(format!("answer at {now}")));
    let only_b =
        DeadLetterFilter { destination: Some("b".into()), limit: 10, ..Default::default() };
    assert!(store.dead_letters(only_b).await.unwrap().is_empty());
    let wrong_source =
        DeadLetterFilter { source: Some("other".into()), limit: 10, ..Default::default() };
    assert!(store.dead_letters(wrong_source).await.unwrap().is_empty());
    // By the event's receive time: `since` keeps it from its own id on, `after` below.
    let window = |since: u64, after: Option<EventId>| DeadLetterFilter {
        since: Some(EventId::new(since)),
        after,
        limit: 10,
        ..Default::default()
    };
    assert_eq!(store.dead_letters(window(id.raw(), None)).await.unwrap().len(), 1);
    assert!(store.dead_letters(window(id.raw() + 1, None)).await.unwrap().is_empty());
    assert!(store.dead_letters(window(0, Some(id))).await.unwrap().is_empty());
    // Replayed: pending, due now, a new round; out of the dead letters.
    now += 10 * S;
    assert_eq!(store.replay(id, vec!["a".into()], now).await.unwrap(), 1);
    let rec =
        store.deliveries_of(id).await.unwrap().into_iter().find(|d| d.destination == "a").unwrap();
    assert_eq!(
        (rec.state, rec.next_attempt_us, rec.round_attempts, rec.total_attempts),
        (DeliveryState::Pending, Some(now), 0, 3)
    );
    assert_eq!(store.queue_stats("a").await.unwrap().dead, 0);
    // Dead again (permanent), then discarded: never retried, kept in the history.
    let claims = store.claim_due("a", "r1", now, LEASE, 5).await.unwrap();
    let r = record(&store, &claims[0], report(AnswerClass::Permanent, now)).await;
    assert_eq!(r, AttemptWrite::Done(AttemptVerdict::Failed));
    assert!(store.discard(id, "a").await.unwrap());
    assert!(!store.discard(id, "a").await.unwrap(), "only a dead letter can be discarded");
    assert_eq!(states(&store, id).await["a"], DeliveryState::Discarded);
    assert_eq!(store.queue_stats("a").await.unwrap(), QueueStats::default());
    // Replay to a destination the event was never routed to creates the delivery.
    assert_eq!(store.replay(id, vec!["c".into()], now).await.unwrap(), 1);
    assert_eq!(states(&store, id).await["c"], DeliveryState::Pending);
    // Nothing to replay for an unknown event.
    assert_eq!(store.replay(EventId::new(3), vec!["a".into()], now).await.unwrap(), 0);
    // A stale claim: replayed while in flight, the late answer is not recorded.
    let claims = store.claim_due("c", "r1", now, LEASE, 5).await.unwrap();
    store.replay(id, vec!["c".into()], now + 5).await.unwrap();
    let r = record(&store, &claims[0], report(AnswerClass::Success, now)).await;
    assert_eq!(r, AttemptWrite::Stale);
    assert_eq!(states(&store, id).await["c"], DeliveryState::Pending);
    // Counts survive a restart.
    let before: Vec<QueueStats> =
        futures_util::future::join_all(["a", "b", "c"].map(|d| store.queue_stats(d)))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    drop(store);
    let store = h.reopen().await;
    let after: Vec<QueueStats> =
        futures_util::future::join_all(["a", "b", "c"].map(|d| store.queue_stats(d)))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    assert_eq!(before, after);
}

pub(super) async fn per_resource_order(h: &mut dyn Harness) {
    let store = h.open().await;
    let events: Vec<NewEvent> =
        (1..=3).map(|i| received("demo", "ActionUpdated", i * S, "{}")).collect();
    let ids = append_all(&store, events).await;
    let plans = ids
        .iter()
        .map(|id| DispatchPlan {
            ordered: vec!["o".into()],
            resource: Some([4; 16]),
            ..plan(*id, id.raw() as u8, &["o", "free"])
        })
        .collect();
    store.dispatch(plans, 5 * S).await.unwrap();
    let q = store.queue_stats("o").await.unwrap();
    assert_eq!((q.pending, q.held), (1, 2));
    assert_eq!(
        store.queue_stats("free").await.unwrap().pending,
        3,
        "unordered destinations are not held"
    );
    let mut now = 5 * S;
    for (i, id) in ids.iter().enumerate() {
        let claims = store.claim_due("o", "r1", now, LEASE, 10).await.unwrap();
        assert_eq!(
            claims.iter().map(|c| c.event).collect::<Vec<_>>(),
            [*id],
            "only the head, in order"
        );
        // The head dies: the turn passes on all the same.
        let outcome = if i == 1 { AnswerClass::Permanent } else { AnswerClass::Success };
        record(&store, &claims[0], report(outcome, now)).await;
        now += S;
    }
    let q = store.queue_stats("o").await.unwrap();
    assert_eq!((q.pending, q.held, q.dead), (0, 0, 1));
    // A replay of the dead one is delivered on its own (its turn has passed).
    assert_eq!(store.replay(ids[1], vec!["o".into()], now).await.unwrap(), 1);
    let claims = store.claim_due("o", "r1", now, LEASE, 10).await.unwrap();
    assert_eq!(claims.len(), 1);
    record(&store, &claims[0], report(AnswerClass::Success, now)).await;
    // A new event of the same resource starts a new queue.
    let id = append_all(&store, vec![received("demo", "ActionUpdated", now, "{}")]).await[0];
    let p =
        DispatchPlan { ordered: vec!["o".into()], resource: Some([4; 16]), ..plan(id, 99, &["o"]) };
    store.dispatch(vec![p], now).await.unwrap();
    assert_eq!(store.claim_due("o", "r1", now, LEASE, 10).await.unwrap().len(), 1);
}

/// `ordering = "latest"`: a newer update of a resource supersedes the waiting ones,
/// and the head too unless a worker holds a claim on it; a claimed head keeps its turn
/// and the newest waits behind it. Superseded deliveries are final and prunable.
pub(super) async fn latest_only(h: &mut dyn Harness) {
    let store = h.open().await;
    let events: Vec<NewEvent> = (1..=5)
        .map(|i| received("demo", "ActionUpdated", i * S, &format!("{{\"n\":{i}}}")))
        .collect();
    let ids = append_all(&store, events).await;
    let plan_of = |i: usize| DispatchPlan {
        ordered: vec!["l".into()],
        latest: vec!["l".into()],
        resource: Some([7; 16]),
        ..plan(ids[i], 50 + i as u8, &["l", "free"])
    };
    // Three updates, dispatched one after another: only the newest is due.
    let mut superseded = Vec::new();
    for i in 0..3 {
        let out = store.dispatch(vec![plan_of(i)], 10 * S).await.unwrap();
        let [DispatchVerdict::Dispatched { deliveries: 2, superseded: s }] = &out[..] else {
            panic!("{out:?}")
        };
        superseded.push(s.len());
    }
    assert_eq!(superseded, [0, 1, 1], "each newer one supersedes the one before");
    let state = |i: usize| {
        let store = store.clone();
        let id = ids[i];
        async move { states(&store, id).await.get("l").copied() }
    };
    assert_eq!(
        (state(0).await, state(1).await, state(2).await),
        (
            Some(DeliveryState::Superseded),
            Some(DeliveryState::Superseded),
            Some(DeliveryState::Pending)
        )
    );
    let first = store.deliveries_of(ids[0]).await.unwrap();
    let reason = first.iter().find(|d| d.destination == "l").and_then(|d| d.reason.clone());
    assert_eq!(
        reason,
        Some(format!("superseded by event {}, a newer update of the same resource", ids[1]))
    );
    assert_eq!(store.queue_stats("free").await.unwrap().pending, 3, "other destinations get all");
    let q = store.queue_stats("l").await.unwrap();
    assert_eq!((q.pending, q.held), (1, 0));
    // The head claimed (its attempt may be in flight): the next waits behind it, and a
    // newer one takes the waiting one's place.
    let claims = store.claim_due("l", "r1", 10 * S, LEASE, 10).await.unwrap();
    assert_eq!(claims.iter().map(|c| c.event).collect::<Vec<_>>(), [ids[2]]);
    store.dispatch(vec![plan_of(3)], 11 * S).await.unwrap();
    assert_eq!(
        (state(2).await, state(3).await),
        (Some(DeliveryState::Pending), Some(DeliveryState::Held))
    );
    store.dispatch(vec![plan_of(4)], 12 * S).await.unwrap();
    assert_eq!(
        (state(3).await, state(4).await),
        (Some(DeliveryState::Superseded), Some(DeliveryState::Held))
    );
    // The head delivered: the newest is due, and then nothing is left.
    record(&store, &claims[0], report(AnswerClass::Success, 12 * S)).await;
    let claims = store.claim_due("l", "r1", 13 * S, LEASE, 10).await.unwrap();
    assert_eq!(claims.iter().map(|c| c.event).collect::<Vec<_>>(), [ids[4]]);
    record(&store, &claims[0], report(AnswerClass::Success, 13 * S)).await;
    assert_eq!(store.queue_stats("l").await.unwrap(), QueueStats::default());
    for claim in store.claim_due("free", "r1", 14 * S, LEASE, 10).await.unwrap() {
        record(&store, &claim, report(AnswerClass::Success, 14 * S)).await;
    }
    assert_eq!(store.prune(20 * S, 100).await.unwrap(), 5, "superseded ones are finished");
}

/// Destinations with deliveries still to make are listed (retention retires those of a
/// destination removed from the config); one whose deliveries all ended is not, and
/// the list survives a reopen.
pub(super) async fn open_destinations_are_listed(h: &mut dyn Harness) {
    let store = h.open().await;
    assert!(store.open_destinations().await.unwrap().is_empty());
    let ids = append_all(
        &store,
        vec![
            received("demo", "ActionCreated", S, "{}"),
            received("demo", "ActionCreated", 2 * S, "{\"b\":1}"),
        ],
    )
    .await;
    store
        .dispatch(vec![plan(ids[0], 1, &["b", "a"]), plan(ids[1], 2, &["c"])], 3 * S)
        .await
        .unwrap();
    assert_eq!(store.open_destinations().await.unwrap(), ["a", "b", "c"]);
    // `c` retrying still counts; `a` delivered does not; `b` dead does not.
    for (dest, outcome) in [
        ("a", AnswerClass::Success),
        ("b", AnswerClass::Permanent),
        ("c", AnswerClass::Retry { retry_after: None }),
    ] {
        let claims = store.claim_due(dest, "r1", 3 * S, LEASE, 5).await.unwrap();
        assert_eq!(claims.len(), 1, "{dest}");
        record(&store, &claims[0], report(outcome, 3 * S)).await;
    }
    assert_eq!(store.open_destinations().await.unwrap(), ["c"]);
    drop(store);
    let store = h.reopen().await;
    assert_eq!(store.open_destinations().await.unwrap(), ["c"]);
}

/// Pauses are shared state of the queue: set and cleared, and still set after a restart.
pub(super) async fn pauses_are_durable(h: &mut dyn Harness) {
    let store = h.open().await;
    store.set_paused("a", true).await.unwrap();
    store.set_paused("b", true).await.unwrap();
    store.set_paused("b", false).await.unwrap();
    assert_eq!(store.paused().await.unwrap(), ["a".to_owned()].into());
    drop(store);
    let store = h.reopen().await;
    assert_eq!(store.paused().await.unwrap(), ["a".to_owned()].into());
    store.set_paused("a", false).await.unwrap();
    assert!(store.paused().await.unwrap().is_empty());
    store.close().await.unwrap();
}
