//! A worker as an owner: its stop lets the attempts in flight finish and be recorded,
//! and its run ends only once every task it started has, so that nothing of it still
//! holds the store (the relay closes the store after: `daemon/relay/stop.rs`).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::metrics::Metrics;
use crate::shutdown::StopTrigger;
use crate::store::fixtures::{plan, received};
use crate::store::memory::MemoryStore;
use crate::store::{DeliveryState, SharedStore};

use super::{Destinations, RelayContext};

/// A sink that takes one request and answers it 200 after `slow`; says when the
/// request came.
async fn slow_sink(slow: Duration) -> (u16, tokio::sync::oneshot::Receiver<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the sink");
    let port = listener.local_addr().expect("the sink's address").port();
    let (came, arrived) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.expect("accept");
        let mut buf = vec![0u8; 64 * 1024];
        let mut read = 0;
        // Headers and the body (Content-Length) read whole, or the connection ends.
        loop {
            let n = conn.read(&mut buf[read..]).await.expect("read the request");
            read += n;
            let text = String::from_utf8_lossy(&buf[..read]);
            if n == 0 || text.contains("\r\n\r\n") && text.ends_with('}') {
                break;
            }
        }
        let _ = came.send(());
        tokio::time::sleep(slow).await;
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        let _ = conn.write_all(answer).await;
    });
    (port, arrived)
}

/// The configuration `text`, loaded as the relay loads it (from a file in `dir`).
fn load(dir: &std::path::Path, text: &str) -> crate::config::Config {
    let path = dir.join("hookrelay.toml");
    std::fs::write(&path, text).expect("write the config");
    crate::config::Config::load(&path, &Default::default()).expect("the config")
}

/// Stopped while an attempt is in flight, the worker waits for its answer and its
/// record, and when its run ends the store is held by none of its tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_finishes_its_attempt_and_leaves_nothing_holding_the_store() {
    let (port, arrived) = slow_sink(Duration::from_millis(300)).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "[storage]\ndata_dir = {:?}\n[[sources]]\nname = \"demo\"\ntoken = \
         \"0123456789abcdef0123\"\n[[destinations]]\nname = \"crm\"\nurl = \
         \"http://127.0.0.1:{port}/hooks\"\n",
        dir.path().join("data").display().to_string()
    );
    let config = load(dir.path(), &text);

    let metrics = Arc::new(Metrics::new().expect("metrics"));
    let store: SharedStore = Arc::new(MemoryStore::default());
    let id = store.append(received("demo", "ActionCreated", 1, "{}")).await.expect("append");
    store.dispatch(vec![plan(id, 1, &["crm"])], 1).await.expect("dispatch");
    let client = crate::destinations::client().expect("the HTTP client");
    let destinations =
        Destinations::new(&config, store.clone(), client).await.expect("the destinations");
    let relay = RelayContext {
        owner: "relay-test".into(),
        fleet: Arc::new(crate::fleet::FleetShare::single()),
        space: Arc::new(crate::space::Space::remote(metrics.clone())),
        metrics: metrics.clone(),
        tracer: Arc::new(crate::telemetry::Tracer::silent(
            crate::telemetry::ids::Salt::random(),
            metrics.clone(),
        )),
        shaper: Arc::new(crate::shape::Shaper::new(metrics.clone())),
    };
    let holders = Arc::strong_count(&store);

    let (trigger, stop) = StopTrigger::new();
    let worker = destinations.worker("crm", &relay, stop).expect("the worker of crm");
    let running = tokio::spawn(worker);
    tokio::time::timeout(Duration::from_secs(20), arrived)
        .await
        .expect("the attempt reached the sink within 20 s")
        .expect("the sink saw it");
    trigger.stop();
    tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the worker ended within 20 s of its stop")
        .expect("the worker did not panic");

    assert_eq!(Arc::strong_count(&store), holders, "a task of the worker still holds the store");
    let records = store.deliveries_of(id).await.expect("read the delivery");
    assert!(
        matches!(records[..], [ref r] if r.state == DeliveryState::Delivered),
        "the attempt in flight at the stop was recorded: {records:?}"
    );
}

/// An attempt that panics is taken off the books all the same: its claim's token out
/// of the in-flight set, the count down, and the claim marked for the next look to
/// give back; one that ends by itself marks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicked_attempt_is_taken_off_the_books_and_its_claim_given_back() {
    use std::sync::atomic::Ordering;
    let text = "[storage]\ndata_dir = \"/nonexistent\"\n[[sources]]\nname = \"demo\"\n\
                token = \"0123456789abcdef0123\"\n[[destinations]]\nname = \"crm\"\n\
                url = \"http://127.0.0.1:9/hooks\"\n";
    let dir = tempfile::tempdir().expect("tempdir");
    let config = load(dir.path(), text);
    let client = crate::destinations::client().expect("the HTTP client");
    let state = Arc::new(
        super::DestinationState::new(&config.destinations[0], &config, &client, false)
            .expect("the destination's state"),
    );
    let held = |state: &super::DestinationState, token: u64| {
        crate::lock::lock(&state.in_flight_tokens).contains(&token)
    };

    let books = state.attempt_started(7);
    assert_eq!((state.in_flight(), held(&state, 7)), (1, true));
    let ended = tokio::spawn(async move {
        // Held across an await, as the worker's attempt holds it: in the task's state,
        // not on the stack of the poll that panics.
        let _books = books;
        tokio::task::yield_now().await;
        panic!("a bug in an attempt");
    })
    .await;
    assert!(ended.is_err_and(|e| e.is_panic()), "the attempt's task did not panic");
    assert_eq!((state.in_flight(), held(&state, 7)), (0, false), "still on the books");
    assert!(state.unknown_claims.load(Ordering::SeqCst), "its claim is not given back");

    state.unknown_claims.store(false, Ordering::SeqCst);
    let books = state.attempt_started(8);
    tokio::spawn(async move { drop(books) }).await.expect("an attempt that ends");
    assert_eq!((state.in_flight(), held(&state, 8)), (0, false));
    assert!(!state.unknown_claims.load(Ordering::SeqCst), "a claim given back for nothing");
}
