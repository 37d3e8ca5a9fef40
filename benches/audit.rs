//! Audit benchmark, release build: how long `GET /admin/audit` (the last 24 hours)
//! takes with many events stored (issue 24's target: within 1 s at 1,000,000).
//!
//! The relay (test config: sled, durable) gets `BENCH_EVENTS` callbacks (default
//! 1,000,000) from 64 connections, over 10 event names, one in five a second copy of
//! the one before (a duplicate); `crm` takes every event and delivers to a sink
//! answering 200, `erp` takes half of them through a filter and is paused (its
//! deliveries wait). The audit is read every 2 s while the callbacks arrive (the store
//! busy), then `BENCH_ROUNDS` times once they are all stored (default 9); each read is
//! timed from a client on the same host, and the last one must balance and count every
//! callback. Medians and maxima are reported.
//!
//! The read costs what the counters cost (hours × names × destinations), not what the
//! events do: the callbacks of this run fall in one or two hours, where a day of them
//! falls in 24, so the rows read here are about a tenth of a real day's (each a few
//! microseconds of the read). There is no baseline: builds before this one have no
//! audit.
//!
//! Run: `cargo bench --bench audit` (env: BENCH_ROUNDS, BENCH_EVENTS).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::env_or;
use common::sink::Sink;
use serde_json::{json, Value};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CONNECTIONS: u64 = 64;
/// Ten of the upstream's event names (destinations route known names only).
const NAMES: [&str; 10] = [
    "ActionCreated",
    "ActionUpdated",
    "ActionDocumentCreated",
    "ActionParticipantAdded",
    "DataCollectionRecordUpdated",
    "FileNoteCreated",
    "StepChanged",
    "TaskCreated",
    "TaskUpdated",
    "TimeEntryCreated",
];

/// The callback numbered `n`: every fifth repeats the one before (a copy).
fn callback(n: u64) -> (String, String) {
    let k = if n % 5 == 4 { n - 1 } else { n };
    let name = NAMES[(k % NAMES.len() as u64) as usize].to_owned();
    let body = json!({
        "data": {"type": "actions", "id": k.to_string(), "attributes": {
            "name": format!("Smith v Jones ({k})"), "status": if k % 2 == 0 { "Open" } else { "Closed" }
        }}
    })
    .to_string();
    (name, body)
}

/// Sends callbacks `0..n` from 64 connections.
async fn send_all(relay: &common::Relay, n: u64) {
    let client = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
    let next = Arc::new(AtomicU64::new(0));
    let base = relay.hook_url(None);
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let (client, next, base) = (client.clone(), next.clone(), base.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    let (name, body) = callback(i);
                    let r = client
                        .post(format!("{base}/{name}"))
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await
                        .expect("callback");
                    assert_eq!(r.status(), 200);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

/// One timed read of the audit of the last day: (ms, the report).
async fn read(http: &reqwest::Client, base: &str) -> (f64, Value) {
    let t = Instant::now();
    let r = http.get(format!("{base}/admin/audit")).bearer_auth(common::ADMIN_TOKEN).send();
    let r = r.await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    (t.elapsed().as_secs_f64() * 1000.0, v)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

fn main() {
    let rounds: usize = env_or("BENCH_ROUNDS", 9);
    let n: u64 = env_or("BENCH_EVENTS", 1_000_000);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let sink = Sink::start().await;
        let dir = tempfile::tempdir().unwrap();
        let tail = format!(
            "\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n\n[[destinations]]\nname = \"erp\"\nurl = \"{}\"\nfilter = '.body.data.attributes.status == \"Open\"'\n",
            sink.url(),
            sink.url()
        );
        let config = common::config_with(&dir.path().join("data"), "", &tail)
            .replace("level = \"info\"", "level = \"hookrelay=info,actix_server=warn\"");
        let relay = common::Relay::start_full(common::binary(), dir.path(), &config, &[]).await;
        let (status, _) = relay.admin_post("/admin/destinations/erp/pause", None).await;
        assert_eq!(status, 200);
        let base = format!("http://{}", relay.admin);
        let http = reqwest::Client::new();

        // Read every 2 s while the callbacks arrive.
        let busy = {
            let (http, base) = (http.clone(), base.clone());
            let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let stop = done.clone();
            let task = tokio::spawn(async move {
                let mut times = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    times.push(read(&http, &base).await.0);
                }
                times
            });
            (done, task)
        };
        let started = Instant::now();
        send_all(&relay, n).await;
        let took = started.elapsed().as_secs_f64();
        busy.0.store(true, Ordering::Relaxed);
        let during = busy.1.await.unwrap();
        eprintln!("{n} callbacks stored in {took:.1} s ({:.0}/s)", n as f64 / took);

        // Wait for dispatch to take everything from the inbox.
        let deadline = Instant::now() + Duration::from_secs(1800);
        loop {
            let (_, v) = read(&http, &base).await;
            let waiting: i64 = v["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["waiting"].as_i64().unwrap())
                .sum();
            if waiting == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "the inbox never emptied: {v:#}");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let mut after = Vec::new();
        let mut last = Value::Null;
        for _ in 0..rounds {
            let (ms, v) = read(&http, &base).await;
            after.push(ms);
            last = v;
        }
        assert_eq!(last["balanced"], true, "{last:#}");
        let received: i64 =
            last["events"].as_array().unwrap().iter().map(|e| e["received"].as_i64().unwrap()).sum();
        let duplicates: i64 = last["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["duplicate"].as_i64().unwrap())
            .sum();
        assert_eq!(received, n as i64, "every callback counted");
        assert_eq!(duplicates, (n / 5) as i64, "every copy counted");
        let routed: i64 = last["destinations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["routed"].as_i64().unwrap())
            .sum();
        assert_eq!(routed, (n - n / 5) as i64 * 2, "each original routed to both destinations");
        let rows = last["events"].as_array().unwrap().len()
            + last["destinations"].as_array().unwrap().len();
        println!("\n{n} events stored ({rows} rows in the report), medians and maxima:\n");
        println!("| GET /admin/audit (last 24 h) | reads | median (ms) | max (ms) |");
        println!("|---|---:|---:|---:|");
        println!(
            "| while the callbacks arrive ({:.0}/s) | {} | {:.1} | {:.1} |",
            n as f64 / took,
            during.len(),
            median(during.clone()),
            max(&during)
        );
        println!(
            "| once all {n} are stored | {} | {:.1} | {:.1} |",
            after.len(),
            median(after.clone()),
            max(&after)
        );
    });
}
