//! The PostgreSQL backend through the real binary: relays on one database (Debian's
//! `postgresql`, started by the harness; no skip), the URL never shown, callbacks
//! spread over two relays delivered once each, two users' copies arriving at
//! different relays delivered once, and a pause made on one relay reaching the other.

mod common;

use std::time::Duration;

use common::pg::PgServer;
use common::sink::Sink;
use common::Relay;

/// A relay config on `url` with one destination to `sink`.
fn config(dir: &std::path::Path, url: &str, sink: &Sink) -> String {
    let tail = format!("\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n", sink.url());
    common::config_with(&dir.join("data"), "", &tail)
        .replace("[storage]", "[storage]\nbackend = \"postgres\"")
        + &format!("\n[storage.postgres]\nurl = \"{url}\"\n")
}

fn body(n: u64) -> String {
    format!(r#"{{"data":{{"id":"{n}","name":"Smith v Jones"}},"meta":{{"hook":"{}"}}}}"#, n * 7)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_one_database_deliver_each_occurrence_once() {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let url = server.database("fleet");
    let sink = Sink::start().await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Relay::start(dir_a.path(), &config(dir_a.path(), &url, &sink)).await;
    let b = Relay::start(dir_b.path(), &config(dir_b.path(), &url, &sink)).await;

    // The URL is a secret: not in the logs.
    let password_free = url.replace("postgres://", "");
    for relay in [&a, &b] {
        assert!(!relay.logs().contains(&password_free), "the database URL was logged");
    }

    // 40 distinct events, alternately to each relay.
    for n in 0..40u64 {
        let relay = if n % 2 == 0 { &a } else { &b };
        let r = relay.callback(Some("ActionCreated"), "application/json", body(n)).await;
        assert_eq!(r.status(), 200);
    }
    // Two users' copies of one occurrence (same `data`, other `meta`), one per relay.
    let copy =
        |hook: &str| format!(r#"{{"data":{{"id":"copy","x":1}},"meta":{{"hook":"{hook}"}}}}"#);
    assert_eq!(
        a.callback(Some("ActionCreated"), "application/json", copy("u1")).await.status(),
        200
    );
    assert_eq!(
        b.callback(Some("ActionCreated"), "application/json", copy("u2")).await.status(),
        200
    );

    let got = sink.wait_for(41, Duration::from_secs(60)).await;
    // Nothing more arrives: each occurrence once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got_all = sink.received();
    assert_eq!(got_all.len(), 41, "deliveries: {}", got_all.len());
    let mut ids: Vec<&str> = got.iter().filter_map(|r| r.header("webhook-id")).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 41, "each delivery has its own webhook-id");
    let copies =
        got_all.iter().filter(|r| String::from_utf8_lossy(&r.body).contains("\"copy\"")).count();
    assert_eq!(copies, 1, "two users' copies at two relays are one occurrence");

    // Both relays list the same events (the fleet's state from any relay).
    let (ids_a, ids_b) = (a.all_event_ids().await, b.all_event_ids().await);
    assert_eq!(ids_a.len(), 42);
    assert_eq!(ids_a, ids_b);

    // A pause made on one relay holds deliveries on the other within a second or so.
    assert_eq!(a.admin_post("/admin/destinations/crm/pause", None).await.0, 200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        b.callback(Some("ActionCreated"), "application/json", body(1000)).await.status(),
        200
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sink.count(), 41, "paused through relay a, relay b still delivered");
    assert_eq!(b.admin_post("/admin/destinations/crm/resume", None).await.0, 200);
    sink.wait_for(42, Duration::from_secs(30)).await;
}

#[test]
fn check_config_masks_the_database_url() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookrelay.toml");
    std::fs::write(
        &path,
        "[storage]\nbackend = \"postgres\"\n[storage.postgres]\nurl = \"postgres://relay:s3cret-pw@db.example:5432/hooks\"\n\
         [[sources]]\nname = \"demo\"\ntoken = \"source-token-0123456789abcdef\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(common::binary())
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("backend = \"postgres\""), "{text}");
    assert!(!text.contains("s3cret-pw"), "the URL's password was printed:\n{text}");

    // A missing URL is a clear error naming the key.
    std::fs::write(&path, "[storage]\nbackend = \"postgres\"\n").unwrap();
    let out = std::process::Command::new(common::binary())
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("storage.postgres.url: missing"), "{err}");
}

/// PostgreSQL stopped under load and started again: no callback gets a non-200 answer
/// (those that cannot be stored are closed unanswered), `/readyz` says why while it is
/// down, ingest resumes by itself, and every acknowledged callback is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_refuses_nothing_with_an_error_and_loses_nothing() {
    use std::sync::{Arc, Mutex};
    let server = Arc::new(tokio::task::spawn_blocking(PgServer::start).await.unwrap());
    let url = server.database("outage");
    let sink = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let relay = Relay::start(dir.path(), &config(dir.path(), &url, &sink)).await;

    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let clients: Vec<_> = (0..4u64)
        .map(|k| {
            let (client, url, acked, stopped) = (
                client.clone(),
                relay.hook_url(Some("ActionCreated")),
                acked.clone(),
                stopped.clone(),
            );
            tokio::spawn(async move {
                for n in 0.. {
                    if *stopped.borrow() {
                        return;
                    }
                    let marker = format!("outage-{k}-{n}");
                    let body = format!(r#"{{"data":{{"id":"{marker}"}}}}"#);
                    match client.post(&url).body(body).send().await {
                        Ok(r) => {
                            assert_eq!(r.status(), 200, "a valid callback got {}", r.status());
                            acked.lock().unwrap().push(marker);
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_secs(1)).await;
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.stop()).await.unwrap();
    let before_outage = acked.lock().unwrap().len();
    // Unready, saying why, while the database is down.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let reason = loop {
        let r = reqwest::get(format!("http://{}/readyz", relay.admin)).await.unwrap();
        if r.status() == 503 {
            break r.text().await.unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "still ready with the database down");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(reason.contains("database is unreachable"), "{reason}");
    assert!(!reason.contains(&url), "the URL is a secret: {reason}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.start_again()).await.unwrap();

    // Ready again by itself, and callbacks acknowledged again.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = reqwest::get(format!("http://{}/readyz", relay.admin)).await.unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not ready again after the database came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resumed_from = acked.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.send_replace(true);
    for c in clients {
        c.await.expect("a client saw a non-200 answer");
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        before_outage > 0 && acked.len() > resumed_from,
        "ingest resumed: {before_outage} / {resumed_from} / {}",
        acked.len()
    );

    // Every acknowledged callback is delivered.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let got: std::collections::HashSet<String> =
            sink.received().iter().map(|r| String::from_utf8_lossy(&r.body).into_owned()).collect();
        let missing: Vec<&String> =
            acked.iter().filter(|m| !got.iter().any(|b| b.contains(&format!("\"{m}\"")))).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {} acknowledged callbacks never delivered, e.g. {:?}",
            missing.len(),
            acked.len(),
            &missing[..missing.len().min(3)]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
