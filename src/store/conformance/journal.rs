//! Conformance of [`Journal`](crate::store::Journal): entries durable when written,
//! read newest first, filtered by who, action and time, paged by place, shared by
//! every relay on the store, and pruned by age.

use super::*;
use crate::store::{JournalEntry, JournalFilter};

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
