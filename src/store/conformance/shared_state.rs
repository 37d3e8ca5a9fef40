//! Conformance of [`SharedState`](crate::store::SharedState): the hook lifecycle's
//! small map, durable when a write returns, scanned by prefix.

use super::*;

pub(super) async fn upstream_state_is_durable_and_scanned_by_prefix(h: &mut dyn Harness) {
    let store = h.open().await;
    store.upstream_put("oauth/demo/alice", Some(b"t1".to_vec())).await.unwrap();
    store.upstream_put("oauth/demo/alice", Some(b"t2".to_vec())).await.unwrap();
    store.upstream_put("gap/demo/alice/A", Some(b"g".to_vec())).await.unwrap();
    store.upstream_put("gap/demo/alice/B", Some(b"h".to_vec())).await.unwrap();
    store.upstream_put("gap/demo/alice/B", None).await.unwrap();
    store.upstream_put("gap/demo/never", None).await.unwrap(); // removing nothing is fine
    store.upstream_put("gap/other/bob/A", Some(b"o".to_vec())).await.unwrap();
    drop(store);
    let store = h.reopen().await;
    assert_eq!(
        store.upstream_get("oauth/demo/alice").await.unwrap().as_deref(),
        Some(&b"t2"[..]),
        "the last write wins, and survives a restart"
    );
    assert_eq!(store.upstream_get("nope").await.unwrap(), None);
    let gaps = store.upstream_scan("gap/demo/").await.unwrap();
    assert_eq!(gaps, [("gap/demo/alice/A".to_owned(), b"g".to_vec())]);
    assert_eq!(store.upstream_scan("gap/").await.unwrap().len(), 2);
    assert!(store.upstream_scan("zzz").await.unwrap().is_empty());
    store.close().await.unwrap();
}
