//! Conformance of [`Journal`](crate::store::Journal): entries durable when written,
//! read newest first, filtered by who, action and time, paged by place, shared by
//! every relay on the store, and pruned by age.

use super::*;
use crate::store::lifecycle::Managed;
use crate::store::{JournalEntry, JournalFilter, QueueChange};

/// An entry at `at_us` by `who` doing `action`.
fn entry(at_us: u64, tie: u64, who: &str, action: &str) -> JournalEntry {
    JournalEntry {
        at_us,
        tie,
        who: who.into(),
        from: Some("127.0.0.1".into()),
        action: action.into(),
        target: r#"{"destination":"crm"}"#.into(),
        count: 3,
        result: "ok".into(),
    }
}

/// The places of what `filter` reads.
async fn read(store: &SharedStore, filter: JournalFilter) -> Vec<(u64, u64)> {
    store.journal_list(filter).await.unwrap().iter().map(|e| (e.at_us, e.tie)).collect()
}

pub(super) async fn the_journal_keeps_every_change_newest_first(h: &mut dyn Harness) {
    let store = h.open().await;
    let all = JournalFilter { limit: 100, ..Default::default() };
    assert!(store.journal_list(all.clone()).await.unwrap().is_empty());
    // Written out of order, and two in the same microsecond: both kept.
    for e in [
        entry(20 * S, 1, "alice", "replay"),
        entry(10 * S, 5, "bob", "pause"),
        entry(30 * S, 9, "alice", "discard"),
        entry(20 * S, 7, "bob", "replay"),
        entry(40 * S, 2, "carol", "sign_in_failed"),
    ] {
        store.journal_append(e).await.unwrap();
    }
    drop(store);
    let store = h.reopen().await;
    let first = store.journal_list(all.clone()).await.unwrap();
    assert_eq!(first.len(), 5);
    assert_eq!(first[1], entry(30 * S, 9, "alice", "discard"), "every field survives");
    assert_eq!(
        read(&store, all.clone()).await,
        [(40 * S, 2), (30 * S, 9), (20 * S, 7), (20 * S, 1), (10 * S, 5)]
    );
    // By who, by action, since a time, and both.
    let who = |w: &str| JournalFilter { who: Some(w.into()), ..all.clone() };
    assert_eq!(read(&store, who("alice")).await, [(30 * S, 9), (20 * S, 1)]);
    let replays = JournalFilter { action: Some("replay".into()), ..all.clone() };
    assert_eq!(read(&store, replays).await, [(20 * S, 7), (20 * S, 1)]);
    let since = JournalFilter { since_us: Some(20 * S), ..all.clone() };
    assert_eq!(read(&store, since).await.len(), 4);
    let bob_replays = JournalFilter { action: Some("replay".into()), ..who("bob") };
    assert_eq!(read(&store, bob_replays).await, [(20 * S, 7)]);
    // Pages: two at a time, each after the last one's place, none lost or repeated.
    let mut pages = Vec::new();
    let mut before = None;
    loop {
        let page = read(&store, JournalFilter { before, limit: 2, ..all.clone() }).await;
        let Some(last) = page.last().copied() else { break };
        pages.extend(page);
        before = Some(last);
    }
    assert_eq!(pages, read(&store, all.clone()).await);
    // Pruned by age: what is older goes, what is not stays.
    assert_eq!(store.journal_prune(20 * S).await.unwrap(), 1);
    assert_eq!(store.journal_prune(20 * S).await.unwrap(), 0);
    assert_eq!(read(&store, all.clone()).await.last(), Some(&(20 * S, 1)));
    // A second relay on the same store reads the same journal, and adds to it.
    if let Some(other) = h.second().await {
        other.journal_append(entry(50 * S, 3, "dave", "resume")).await.unwrap();
        assert_eq!(read(&other, all.clone()).await.len(), 5);
        assert_eq!(read(&store, all.clone()).await.first(), Some(&(50 * S, 3)));
    }
    store.close().await.unwrap();
}

/// Makes `store`'s deliveries to `dest` dead (one permanent answer each).
async fn kill(store: &SharedStore, dest: &str) {
    for claim in store.claim_due(dest, "r1", S, LEASE, 10).await.unwrap() {
        record(store, &claim, report(AnswerClass::Permanent, S)).await;
        assert_eq!(states(store, claim.event).await[dest], DeliveryState::Dead);
    }
}

pub(super) async fn an_admins_change_is_journalled_with_it(h: &mut dyn Harness) {
    let store = h.open().await;
    let ids =
        append_all(&store, vec![received("demo", "A", S, "{}"), received("demo", "B", S, "{}")])
            .await;
    for (hash, id) in (1..).zip(&ids) {
        store.dispatch(vec![plan(*id, hash, &["a", "b"])], S).await.unwrap();
    }
    kill(&store, "a").await;
    let draft = |action: &str| JournalEntry { count: 0, ..entry(50 * S, 1, "ops", action) };
    // A dead letter's replay takes only those still dead: `(ids[1], b)` is pending,
    // and the entry counts what was changed, not what was named.
    let named = vec![(ids[0], "a".to_owned()), (ids[1], "b".to_owned())];
    let replay = QueueChange::Deliveries { each: named, how: Managed::ReplayDead, now_us: 2 * S };
    assert_eq!(store.change(replay, Some(draft("replay"))).await.unwrap(), 1);
    assert_eq!(states(&store, ids[0]).await["a"], DeliveryState::Pending);
    assert_eq!(states(&store, ids[1]).await["b"], DeliveryState::Pending);
    // A discard and a pause, each with its entry; one more change unjournalled.
    let discard = QueueChange::Deliveries {
        each: vec![(ids[1], "a".to_owned()), (ids[0], "b".to_owned())],
        how: Managed::Discard,
        now_us: 3 * S,
    };
    let at = |e: JournalEntry, at_us| JournalEntry { at_us, ..e };
    assert_eq!(store.change(discard, Some(at(draft("discard"), 51 * S))).await.unwrap(), 1);
    let pause = QueueChange::Pause { destination: "b".into(), paused: true };
    assert_eq!(store.change(pause, Some(at(draft("pause"), 52 * S))).await.unwrap(), 1);
    store.set_paused("a", true).await.unwrap();
    // All durable when they return: even a crash that loses unflushed writes keeps
    // each change with its entry.
    drop(store);
    let store = h.crash().await;
    assert_eq!(states(&store, ids[1]).await["a"], DeliveryState::Discarded);
    assert_eq!(store.paused().await.unwrap(), ["a".to_owned(), "b".to_owned()].into());
    let all = JournalFilter { limit: 10, ..Default::default() };
    let kept: Vec<(String, u64)> =
        store.journal_list(all).await.unwrap().into_iter().map(|e| (e.action, e.count)).collect();
    assert_eq!(
        kept,
        [("pause".to_owned(), 1), ("discard".to_owned(), 1), ("replay".to_owned(), 1)],
        "one entry per journalled change, with what it changed; none for the unjournalled one"
    );
    store.close().await.unwrap();
}
