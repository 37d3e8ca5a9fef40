//! A relay whose machine clock is off from the database's: not ready while it is off
//! by more than the bound (2 s), with the reason and the skew on `/metrics`; its ids
//! held to the database's clock; ready again, and everything delivered, once the
//! clock is set right.

use std::time::{Duration, Instant};

use super::{body, config, wait_delivered};
use crate::common;
use common::pg::PgServer;
use common::sink::Sink;
use common::Relay;

/// `/readyz`: its status and text.
async fn readyz(relay: &Relay) -> (u16, String) {
    let r = relay.client.get(format!("http://{}/readyz", relay.admin)).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Waits until `/readyz` answers `status` (at most `within`); returns its text.
async fn readyz_becomes(relay: &Relay, status: u16, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let (now, text) = readyz(relay).await;
        if now == status {
            return text;
        }
        assert!(Instant::now() < deadline, "/readyz still {now} after {within:?}: {text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Posts the callbacks `ns` (each taken, whatever the clock) and notes them in `acked`.
async fn post(relay: &Relay, ns: std::ops::Range<u64>, acked: &mut Vec<(String, String)>) {
    for n in ns {
        let r = relay.callback(Some("ActionCreated"), "application/json", body(n)).await;
        assert_eq!(r.status(), 200, "a callback is taken whatever the clock");
        acked.push((String::new(), body(n)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_clock_is_off_from_the_databases_is_not_ready_says_why_and_recovers() {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let url = server.database("clock");
    let sink = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let offset = dir.path().join("faketime");
    std::fs::write(&offset, "+0\n").unwrap();
    let env = common::faketime_env(offset.to_str().unwrap());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let relay = Relay::start_env(dir.path(), &config(dir.path(), &url, &sink), &env).await;
    let mut acked = Vec::new();
    post(&relay, 0..5, &mut acked).await;

    // The machine's clock jumps 90 s ahead: not ready within a few heartbeats, saying
    // why and what to do; the gauge shows the skew.
    std::fs::write(&offset, "+90s\n").unwrap();
    let why = readyz_becomes(&relay, 503, Duration::from_secs(15)).await;
    assert!(why.contains("ahead of the database") && why.contains("time synchronisation"), "{why}");
    let skew = common::metric(&relay.metrics().await, "hookrelay_clock_skew_seconds", &[]);
    assert!(skew.is_some_and(|s| (85.0..95.0).contains(&s)), "{skew:?}");
    // Callbacks sent to it meanwhile are still stored, with ids on the database's clock.
    post(&relay, 5..10, &mut acked).await;
    let here =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros()
            as u64;
    for id in relay.all_event_ids().await {
        let us = u64::from_str_radix(&id, 16).unwrap_or_else(|_| panic!("id {id}"));
        assert!(
            us < here + 10_000_000,
            "id {id} is {} s ahead of the database",
            (us - here) / 1_000_000
        );
    }

    // Set right: ready again within a few heartbeats, and everything is delivered.
    std::fs::write(&offset, "+0\n").unwrap();
    readyz_becomes(&relay, 200, Duration::from_secs(15)).await;
    wait_delivered(&sink, &acked, Duration::from_secs(15), "callbacks").await;
    let skew = common::metric(&relay.metrics().await, "hookrelay_clock_skew_seconds", &[]);
    assert!(skew.is_some_and(|s| s.abs() < 2.0), "{skew:?}");
    let logs = relay.logs();
    assert!(logs.contains("clock is within the bound of the database's again"), "{logs}");
    assert!(!logs.contains(url.trim_start_matches("postgres://")), "the URL was logged");
}
