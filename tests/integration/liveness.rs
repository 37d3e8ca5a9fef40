//! Liveness with shipped defaults: after a consumer outage longer than a claim's lease
//! (`timeout` + 60 s), everything queued is delivered within a stated bound of the
//! consumer's recovery, and the circuit is closed again. The outage that wedged a
//! destination until a restart (issue 20): nothing lost, nothing delivered, nothing
//! alerted. A real relay process, a real sink, real sled files.

use crate::common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::sink::{Mode, Sink};
use common::Relay;
use serde_json::json;

/// How long after the consumer's recovery everything due must have been delivered:
/// one probe interval (30 s by default) and one short backoff step.
const RECOVERED_WITHIN: Duration = Duration::from_secs(45);

/// Sends `n` distinct callbacks (distinct records: no duplicates among them).
async fn send(relay: &Relay, from: usize, n: usize) {
    for i in from..from + n {
        let body = json!({"data": {"type": "actions", "id": i.to_string()}}).to_string();
        let r = relay.callback(Some("ActionCreated"), "application/json", body).await;
        assert_eq!(r.status(), 200);
    }
}

/// Waits until the sink has answered 200 to `n` distinct webhook-ids since `since`;
/// returns how long that took.
async fn delivered_since(sink: &Sink, since: Instant, n: usize, within: Duration) -> Duration {
    loop {
        let ids: HashSet<String> = sink
            .received()
            .iter()
            .filter(|r| r.at >= since)
            .filter_map(|r| r.header("webhook-id").map(str::to_owned))
            .collect();
        if ids.len() >= n {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < within,
            "{} of {n} delivered {within:?} after the consumer recovered",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn destination(relay: &Relay) -> serde_json::Value {
    let (status, v) = relay.admin_get("/admin/destinations").await;
    assert_eq!(status, 200, "{v}");
    v["destinations"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_recovers_from_outages_longer_than_a_lease_with_shipped_defaults() {
    let sink = Sink::start().await;
    sink.set_mode(Mode::Status(503));
    let dir = tempfile::tempdir().unwrap();
    // Shipped [delivery] defaults: timeout 15 s (lease 75 s), circuit after 5
    // failures, probes from 1 s doubling to 30 s, backoff from 1 s.
    let tail = format!("\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n", sink.url());
    let relay =
        Relay::start(dir.path(), &common::config_with(&dir.path().join("data"), "", &tail)).await;

    // 503 for 100 s, longer than the 75 s lease, with 300 callbacks queued.
    send(&relay, 0, 300).await;
    tokio::time::sleep(Duration::from_secs(100)).await;
    let during = sink.count();
    assert!(during < 60, "the circuit kept the outage to a few probes: {during} requests");
    assert_eq!(destination(&relay).await["circuit"], "open", "probing, not half-open for good");
    let recovered = Instant::now();
    sink.set_mode(Mode::Ok);
    let took = delivered_since(&sink, recovered, 300, RECOVERED_WITHIN).await;
    eprintln!("503 for 100 s: 300 delivered {took:?} after recovery");
    // The sink has answered every delivery; the relay records each outcome after the
    // answer (a shared fsync), so the queue is empty a moment later, not at once.
    let d = relay
        .admin_until("/admin/destinations", Duration::from_secs(5), |v| {
            let d = &v["destinations"][0];
            d["circuit"] == "closed" && d["queue"]["pending"] == 0 && d["queue"]["retrying"] == 0
        })
        .await;
    let queue = &d["destinations"][0]["queue"];
    assert_eq!((queue["pending"].as_u64(), queue["retrying"].as_u64()), (Some(0), Some(0)), "{d}");

    // Connections refused for 20 s, with 100 more queued.
    let addr = sink.stop().await;
    send(&relay, 300, 100).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    // The instant taken before the sink starts: a request it answers as it starts (a
    // probe due that moment) counts. Taken after, such a request fell before it, was
    // never counted, and was never sent again: 99 of 100 for good (seen once in CI).
    let recovered = Instant::now();
    let sink = Sink::start_on(addr).await;
    let took = delivered_since(&sink, recovered, 100, RECOVERED_WITHIN).await;
    eprintln!("refused for 20 s: 100 delivered {took:?} after recovery");
    let d = destination(&relay).await;
    assert_eq!(d["circuit"], "closed", "{d}");
    assert_eq!(d["stalled"], false, "{d}");

    // Progress came from the worker itself, not from the watchdog restarting it.
    let metrics = relay.metrics().await;
    assert_eq!(
        common::metric(
            &metrics,
            "hookrelay_destination_worker_restarts_total",
            &[("destination", "crm")]
        ),
        Some(0.0),
    );
    assert_eq!(
        common::metric(&metrics, "hookrelay_destination_stalled", &[("destination", "crm")]),
        Some(0.0)
    );
}

use common::LIBFAKETIME;

/// The machine's wall clock steps back an hour (an NTP correction, `date -s`) while
/// deliveries wait for their retries, then forward two: no retry is held for the hour,
/// and everything is delivered within 15 s of the consumer's recovery.
/// The relay's clock is the wall clock read once at start, advanced by the monotonic
/// clock (`src/clock.rs`); before it, a retry scheduled on the old clock waited out the
/// hour. The fleet case (the database's clock) is `tests/integration/postgres/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_stepped_back_an_hour_holds_no_retry() {
    assert!(
        std::path::Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} missing: apt-get install libfaketime (scripts/test.sh does)"
    );
    let sink = Sink::start().await;
    sink.set_mode(Mode::Status(503));
    let dir = tempfile::tempdir().unwrap();
    let offset = dir.path().join("faketime");
    std::fs::write(&offset, "+0\n").unwrap();
    let tail = format!(
        "\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n\
         [delivery]\ncircuit_probe_interval = \"1s\"\n\
         [delivery.retry]\ninitial_backoff = \"500ms\"\nmax_backoff = \"2s\"\n",
        sink.url()
    );
    let text = common::config_with(&dir.path().join("data"), "", &tail);
    let offset_s = offset.to_str().unwrap().to_owned();
    let relay = Relay::start_env(
        dir.path(),
        &text,
        &[
            ("LD_PRELOAD", LIBFAKETIME),
            ("FAKETIME_TIMESTAMP_FILE", &offset_s),
            ("FAKETIME_NO_CACHE", "1"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    )
    .await;
    send(&relay, 0, 20).await;
    // Every delivery failed at least once: each waits for a retry on the relay's clock.
    sink.wait_for(20, Duration::from_secs(30)).await;
    std::fs::write(&offset, "-3600s\n").unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    send(&relay, 20, 10).await;
    let recovered = Instant::now();
    sink.set_mode(Mode::Ok);
    let took = delivered_since(&sink, recovered, 30, Duration::from_secs(15)).await;
    eprintln!("delivered {took:?} after the consumer recovered, the clock an hour back");
    // Forward two hours: new callbacks flow, nothing is left retrying, the circuit is
    // closed.
    std::fs::write(&offset, "+3600s\n").unwrap();
    let since = Instant::now();
    send(&relay, 30, 10).await;
    delivered_since(&sink, since, 10, Duration::from_secs(15)).await;
    let d = destination(&relay).await;
    assert_eq!(d["queue"]["retrying"], 0, "{d}");
    assert_eq!(d["circuit"], "closed", "{d}");
}
