//! Conformance of [`Upkeep`](crate::store::Upkeep): the store answers, reports the
//! room it takes, and closing it leaves every acknowledged event on disk.

use super::*;

pub(super) async fn it_answers_reports_its_size_and_closes_durably(h: &mut dyn Harness) {
    let store = h.open().await;
    store.ping().await.unwrap();
    // Random text: a compressing backend cannot make it much smaller.
    let body: String = std::iter::repeat_with(fastrand::alphanumeric).take(4_096).collect();
    let events = (0..64).map(|i| received("demo", "A", S + i, &body)).collect();
    let ids = append_all(&store, events).await;
    let size = store.size_on_disk().await.unwrap();
    if h.on_disk() {
        assert!(
            size >= 32 * 4_096,
            "64 random bodies of 4 KiB take at least half that: {size} bytes"
        );
    } else {
        assert_eq!(size, 0, "a store in memory takes nothing on disk");
    }
    store.close().await.unwrap();
    drop(store);
    let store = h.reopen().await;
    store.ping().await.unwrap();
    for id in [ids[0], ids[63]] {
        assert_eq!(store.body(id).await.unwrap().map(|b| b.len()), Some(4_096));
    }
    store.close().await.unwrap();
}
