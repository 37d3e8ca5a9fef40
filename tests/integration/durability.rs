//! Nothing acknowledged is lost: SIGKILL in the middle of concurrent callbacks, then a
//! restart on the same store files (the default engine: redb and its redo log).

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Relay;
use serde_json::Value;

const SENDERS: usize = 32;
const KILL_AFTER_ACKS: usize = 400;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_acknowledged_callback_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let text = common::config(&dir.path().join("data"), "");
    let relay = Relay::start(dir.path(), &text).await;

    let acked: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let non_200 = Arc::new(AtomicUsize::new(0));
    let url = relay.hook_url(Some("TimeEntryUpdated"));
    let mut senders = Vec::new();
    for _ in 0..SENDERS {
        let (acked, next, failed, non_200, url) =
            (acked.clone(), next.clone(), failed.clone(), non_200.clone(), url.clone());
        let client = reqwest::Client::new();
        senders.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                let body =
                    format!(r#"{{"data":{{"type":"timeentries","id":"{n}"}},"marker":{n}}}"#);
                match client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                {
                    Ok(r) if r.status() == 200 => {
                        let v: Value = match r.json().await {
                            Ok(v) => v,
                            Err(_) => {
                                // Killed between the status line and the body: not an ack.
                                failed.fetch_add(1, Ordering::SeqCst);
                                return;
                            }
                        };
                        let id = v["id"].as_str().unwrap().to_owned();
                        acked.lock().unwrap().insert(id, n);
                    }
                    Ok(_) => {
                        non_200.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => {
                        failed.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                }
            }
        }));
    }
    while acked.lock().unwrap().len() < KILL_AFTER_ACKS {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    relay.signal(libc::SIGKILL);
    for s in senders {
        s.await.unwrap();
    }
    drop(relay);

    let acked = acked.lock().unwrap().clone();
    assert_eq!(non_200.load(Ordering::SeqCst), 0, "the ingress must never answer non-200");
    assert!(failed.load(Ordering::SeqCst) > 0, "the kill should have caught requests in flight");

    let relay = Relay::start(dir.path(), &text).await;
    let stored: std::collections::HashSet<String> =
        relay.all_event_ids().await.into_iter().collect();
    let lost: Vec<&String> = acked.keys().filter(|id| !stored.contains(*id)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged callbacks lost: {lost:?}",
        lost.len(),
        acked.len()
    );
    // And each is stored with its own body.
    for (id, n) in &acked {
        let (status, e) = relay.admin_get(&format!("/admin/events/{id}")).await;
        assert_eq!(status, 200);
        let body: Value = serde_json::from_str(e["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["marker"], *n, "event {id}");
        assert_eq!(e["event"], "TimeEntryUpdated");
    }
}

/// On redb, writes reach the database file at checkpoints: they run (the metric
/// counts them), and the redo log's file is recycled (its next records written over
/// the old from the start, the file keeping its 1 MiB zero-filled ahead); a SIGKILL
/// right after more callbacks (in the log only, over the old records) loses none of
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_checkpoints_recycle_the_redo_log_and_a_kill_after_them_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let text = common::config(&data, "");
    let relay = Relay::start(dir.path(), &text).await;
    let body = |n: usize| format!(r#"{{"data":{{"type":"actions","id":"{n}"}}}}"#);
    let mut ids = Vec::new();
    for n in 0..50 {
        let r = relay.callback(Some("ActionCreated"), "application/json", body(n)).await;
        assert_eq!(r.status(), 200);
        ids.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned());
    }
    let log = data.join("redo.log");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = relay.metrics().await;
        let checkpoints =
            common::metric(&text, "hookrelay_store_checkpoint_duration_seconds_count", &[])
                .unwrap_or(0.0);
        let len = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        if checkpoints >= 1.0 && len == 1 << 20 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "20 s after the callbacks: {checkpoints} checkpoints, the redo log {len} bytes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // More callbacks, then the kill before a checkpoint can take them (500 ms apart):
    // they are in the redo log only, and applied again at the next open.
    for n in 50..60 {
        let r = relay.callback(Some("ActionCreated"), "application/json", body(n)).await;
        assert_eq!(r.status(), 200);
        ids.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned());
    }
    relay.signal(libc::SIGKILL);
    drop(relay);
    let relay = Relay::start(dir.path(), &text).await;
    let stored: std::collections::HashSet<String> =
        relay.all_event_ids().await.into_iter().collect();
    let lost: Vec<&String> = ids.iter().filter(|id| !stored.contains(*id)).collect();
    assert!(lost.is_empty(), "{} of {} lost: {lost:?}", lost.len(), ids.len());
}
