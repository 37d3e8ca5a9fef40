//! Liveness with shipped defaults: after a consumer outage longer than a claim's lease
//! (`timeout` + 60 s), everything queued is delivered within a stated bound of the
//! consumer's recovery, and the circuit is closed again. The outage that wedged a
//! destination until a restart (issue 20): nothing lost, nothing delivered, nothing
//! alerted. A real relay process, a real sink, real sled files.

mod common;

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
    let d = relay
        .admin_until("/admin/destinations", Duration::from_secs(5), |v| {
            v["destinations"][0]["circuit"] == "closed"
        })
        .await;
    let queue = &d["destinations"][0]["queue"];
    assert_eq!((queue["pending"].as_u64(), queue["retrying"].as_u64()), (Some(0), Some(0)), "{d}");

    // Connections refused for 20 s, with 100 more queued.
    let addr = sink.stop().await;
    send(&relay, 300, 100).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let sink = Sink::start_on(addr).await;
    let recovered = Instant::now();
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
