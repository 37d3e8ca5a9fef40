//! The ingress against a store that fails: a real listener on loopback, a real client.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::{Durability, Secret};
use crate::store::{
    CommitterOptions, EventFilter, EventId, EventRecord, EventStore, NewEvent, StoreError,
};

/// A store whose writes always fail, as on a full disk.
#[derive(Default)]
struct FailingStore {
    appends: AtomicUsize,
}

impl EventStore for FailingStore {
    fn append(&self, _: &[(EventId, &NewEvent)]) -> Result<(), StoreError> {
        self.appends.fetch_add(1, Ordering::SeqCst);
        Err(StoreError::Injected("no space left on device"))
    }
    fn flush(&self) -> Result<(), StoreError> {
        Err(StoreError::Injected("no space left on device"))
    }
    fn last_event_id(&self) -> Result<Option<EventId>, StoreError> {
        Ok(None)
    }
    fn event(&self, _: EventId) -> Result<Option<EventRecord>, StoreError> {
        Ok(None)
    }
    fn body(&self, _: EventId) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(None)
    }
    fn list_events(&self, _: &EventFilter) -> Result<Vec<EventRecord>, StoreError> {
        Ok(Vec::new())
    }
    fn inbox_len(&self) -> usize {
        0
    }
    fn size_on_disk(&self) -> Result<u64, StoreError> {
        Ok(0)
    }
}

const TOKEN: &str = "test-token-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_closes_the_connection_without_any_status() {
    let store = Arc::new(FailingStore::default());
    let metrics = Arc::new(Metrics::new().unwrap());
    let opts = CommitterOptions { durability: Durability::Durable, max_batch: 8, committed: None };
    let (committer, _task) = Committer::start(store.clone(), opts, metrics.clone()).unwrap();
    let sources = [SourceConfig {
        name: "demo".into(),
        resolved_token: Some(Secret::new(TOKEN)),
        ..Default::default()
    }];
    let state = IngressState::new(&sources, committer, metrics.clone(), 1024);
    let listen = "127.0.0.1:0".parse().unwrap();
    let (server, addrs) = server(listen, 1, Duration::from_secs(1), state).unwrap();
    let handle = server.handle();
    tokio::spawn(server);

    let client = reqwest::Client::new();
    let url = format!("http://{}/hooks/demo/{TOKEN}/ActionCreated", addrs[0]);
    let result = client.post(&url).body("{\"data\":{}}").send().await;
    let err = result.expect_err("a store failure must not produce an HTTP answer");
    assert!(err.status().is_none(), "{err:?}");
    assert_eq!(store.appends.load(Ordering::SeqCst), 1);
    let text = metrics.render();
    assert!(
        text.contains(
            "hookrelay_ingress_requests_total{outcome=\"store_failed\",source=\"demo\"} 1"
        ),
        "{text}"
    );
    assert!(text.contains("hookrelay_store_commit_failures_total 1"), "{text}");

    // The listener itself is unharmed: the next request is served (here: refused).
    let wrong = format!("http://{}/hooks/demo/not-the-token", addrs[0]);
    assert_eq!(client.post(&wrong).send().await.unwrap().status(), 404);
    handle.stop(false).await;
}
