//! The ingress against a store that fails: a real listener on loopback, a real client.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::Secret;
use crate::store::memory::MemoryStore;

const TOKEN: &str = "test-token-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_closes_the_connection_without_any_status() {
    // A store whose writes fail, as on a full disk.
    let metrics = Arc::new(Metrics::new().unwrap());
    let store = MemoryStore::with_observer(metrics.clone());
    store.fail_appends("no space left on device");
    let sources = [SourceConfig {
        name: "demo".into(),
        resolved_token: Some(Secret::new(TOKEN)),
        ..Default::default()
    }];
    let dir = tempfile::tempdir().unwrap();
    let space = Arc::new(crate::space::Space::new(
        dir.path(),
        0,
        0.0,
        Arc::new(crate::metrics::Metrics::new().unwrap()),
    ));
    let gate = super::Gate::new(&sources, Vec::new(), 1024, std::time::Duration::from_secs(30));
    let state = IngressState::new(
        gate,
        Arc::new(store.clone()),
        metrics.clone(),
        space,
        Arc::new(crate::telemetry::Tracer::silent(
            crate::telemetry::ids::Salt::random(),
            metrics.clone(),
        )),
    );
    let listen = "127.0.0.1:0".parse().unwrap();
    let (server, addrs) = server(
        listen,
        None,
        1,
        Duration::from_secs(1),
        web::Data::new(state),
        |_: &mut web::ServiceConfig| {},
    )
    .unwrap();
    let handle = server.handle();
    tokio::spawn(server);

    let client = reqwest::Client::new();
    let url = format!("http://{}/hooks/demo/{TOKEN}/ActionCreated", addrs[0]);
    let result = client.post(&url).body("{\"data\":{}}").send().await;
    let err = result.expect_err("a store failure must not produce an HTTP answer");
    assert!(err.status().is_none(), "{err:?}");
    assert_eq!(store.failed_appends(), 1);
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
