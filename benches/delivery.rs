//! Delivery benchmark, release build, durable state, loopback:
//!   - drain: N events stored while the destination is paused, then resumed; how fast
//!     do deliveries reach a sink that answers 200 at once (deliveries/s)? Measured
//!     with the shipped default `max_concurrency` (8) and with 32, for this build and,
//!     with `BENCH_BASELINE=path/to/older/hookrelay`, for that build too, all in
//!     interleaved rounds (one relay per contender, each with its own destination).
//!   - end to end (this build, default settings): callbacks at a fixed offered rate
//!     (1,000 and 5,000 events/s, open loop); latency from sending the callback to the
//!     sink receiving the delivery.
//!
//! Medians over rounds, because the 2-core machine is shared and noisy.
//!
//! Run: `cargo bench --bench delivery` (env: BENCH_ROUNDS, BENCH_SECS, BENCH_DRAIN,
//! BENCH_BASELINE).

#[path = "../tests/common/mod.rs"]
mod common;

use common::arrivals::{start_sink, Arrivals, Contender};
use common::env_or;
use common::stats::{median, percentile_ms as percentile};

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CONNECTIONS: usize = 64;
/// The shipped default of `delivery.max_concurrency`, and a tuned value.
const DEFAULT_CONCURRENCY: usize = 8;
const TUNED_CONCURRENCY: usize = 32;

fn body(n: u64) -> String {
    let pad = "x".repeat(600);
    serde_json::json!({
        "jsonapi": {"version": "1.0"},
        "data": {"type": "actions", "id": n.to_string(), "attributes": {"name": "Smith v Jones", "notes": pad}},
        "meta": {"debug": {"resthook": {"id": "46", "trigger_count": n, "event_name": "ActionUpdated"}}}
    })
    .to_string()
}

/// Sends one callback; returns the `webhook-id` of its delivery to `dest` and when the
/// request started.
async fn send(
    client: &reqwest::Client,
    url: &str,
    dest: &str,
    n: u64,
) -> Option<(String, Instant)> {
    let t0 = Instant::now();
    let r = client
        .post(url)
        .header("content-type", "application/json")
        .body(body(n))
        .send()
        .await
        .ok()?;
    let v: serde_json::Value = r.json().await.ok()?;
    Some((format!("evt_{}_{dest}", v["id"].as_str()?), t0))
}

async fn wait_all(arrivals: &Arrivals, ids: &[String], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        {
            let seen = arrivals.lock().unwrap();
            if ids.iter().all(|id| seen.contains_key(id)) {
                return true;
            }
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Starts `bin` with one destination to the sink at `max_concurrency`.
async fn contender(
    label: &str,
    bin: &str,
    sink: std::net::SocketAddr,
    concurrency: usize,
    dest: &str,
) -> Contender {
    let concurrency = if concurrency == DEFAULT_CONCURRENCY {
        String::new() // the shipped default, not set
    } else {
        format!("max_concurrency = {concurrency}\n")
    };
    Contender::start(label, bin, sink, dest, &concurrency).await
}

/// Stores `n` events with the destination paused, resumes it, times the drain.
async fn drain(c: &Contender, arrivals: &Arrivals, n: u64, base: u64) -> f64 {
    let (relay, dest) = (&c.relay, c.dest.as_str());
    let pause = format!("/admin/destinations/{dest}/pause");
    assert_eq!(relay.admin_post(&pause, None).await.0, 200);
    let client = reqwest::Client::builder().pool_max_idle_per_host(CONNECTIONS).build().unwrap();
    let url = relay.hook_url(Some("ActionUpdated"));
    let slots = Arc::new(Semaphore::new(CONNECTIONS));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (client, url, slots, dest) =
            (client.clone(), url.clone(), slots.clone(), dest.to_owned());
        tasks.push(tokio::spawn(async move {
            let _s = slots.acquire_owned().await.unwrap();
            send(&client, &url, &dest, base + i).await
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap().expect("callback stored").0);
    }
    // Let dispatch finish creating the deliveries before the clock starts.
    relay
        .admin_until("/admin/destinations", Duration::from_secs(120), |v| {
            v["destinations"][0]["queue"]["pending"].as_u64() == Some(n)
        })
        .await;
    let started = Instant::now();
    let resume = format!("/admin/destinations/{dest}/resume");
    assert_eq!(relay.admin_post(&resume, None).await.0, 200);
    assert!(wait_all(arrivals, &ids, Duration::from_secs(300)).await, "drain incomplete");
    n as f64 / started.elapsed().as_secs_f64()
}

/// Offers `rate` callbacks per second for `secs`; returns (p50, p99, delivered share).
async fn end_to_end(
    c: &Contender,
    arrivals: &Arrivals,
    rate: u64,
    secs: u64,
    base: u64,
) -> (f64, f64, f64) {
    let client = reqwest::Client::builder().pool_max_idle_per_host(CONNECTIONS).build().unwrap();
    let url = c.relay.hook_url(Some("ActionUpdated"));
    let slots = Arc::new(Semaphore::new(CONNECTIONS));
    let interval = Duration::from_nanos(1_000_000_000 / rate);
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let mut tasks = Vec::new();
    for i in 0..rate * secs {
        let due = start + interval * i as u32;
        tokio::time::sleep_until(due).await;
        let (client, url, slots, dest) =
            (client.clone(), url.clone(), slots.clone(), c.dest.clone());
        tasks.push(tokio::spawn(async move {
            let _s = slots.acquire_owned().await.unwrap();
            let (id, _) = send(&client, &url, &dest, base + i).await?;
            Some((id, due.into_std()))
        }));
    }
    let mut sent = Vec::new();
    for t in tasks {
        if let Some(x) = t.await.unwrap() {
            sent.push(x);
        }
    }
    let ids: Vec<String> = sent.iter().map(|(id, _)| id.clone()).collect();
    wait_all(arrivals, &ids, Duration::from_secs(60)).await;
    let seen = arrivals.lock().unwrap();
    let mut lat: Vec<Duration> = sent
        .iter()
        .filter_map(|(id, t0)| seen.get(id).map(|t| t.saturating_duration_since(*t0)))
        .collect();
    lat.sort();
    let share = lat.len() as f64 / (rate * secs) as f64;
    (percentile(&lat, 0.5), percentile(&lat, 0.99), share)
}

fn main() {
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let secs: u64 = env_or("BENCH_SECS", 5);
    let drain_n: u64 = env_or("BENCH_DRAIN", 20_000);
    let baseline = std::env::var("BENCH_BASELINE").ok();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let arrivals: Arrivals = Arc::default();
        let sink = start_sink(arrivals.clone());
        let mut contenders = vec![
            contender("this build, max_concurrency 8 (default)", common::binary(), sink, DEFAULT_CONCURRENCY, "new8").await,
            contender("this build, max_concurrency 32", common::binary(), sink, TUNED_CONCURRENCY, "new32").await,
        ];
        if let Some(bin) = &baseline {
            contenders.push(contender("baseline, max_concurrency 8 (default)", bin, sink, DEFAULT_CONCURRENCY, "base8").await);
            contenders.push(contender("baseline, max_concurrency 32", bin, sink, TUNED_CONCURRENCY, "base32").await);
        }
        let mut drains: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
        let (mut e1k, mut e5k) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let base = 10_000_000 * (round as u64 + 1);
            // Distinct records every run: identical bodies would be deduplicated.
            for (i, c) in contenders.iter().enumerate() {
                let d = drain(c, &arrivals, drain_n, base + 1_000_000 * (i as u64 + 1)).await;
                eprintln!("round {}: {}: drain {d:.0} deliveries/s", round + 1, c.label);
                drains[i].push(d);
            }
            let a = end_to_end(&contenders[0], &arrivals, 1_000, secs, base + 7_000_000).await;
            let b = end_to_end(&contenders[0], &arrivals, 5_000, secs, base + 8_000_000).await;
            eprintln!(
                "round {}: 1,000/s: p50 {:.2} ms, p99 {:.2} ms, {:.1}% delivered | 5,000/s: p50 {:.2} ms, p99 {:.2} ms, {:.1}% delivered",
                round + 1, a.0, a.1, a.2 * 100.0, b.0, b.1, b.2 * 100.0
            );
            e1k.push(a);
            e5k.push(b);
        }
        println!("\nmedians of {rounds} interleaved rounds (drain of {drain_n} events; durable; one destination answering 200 at once):\n");
        println!("| relay | drain (deliveries/s) | per round |");
        println!("|---|---:|---|");
        for (c, d) in contenders.iter().zip(&drains) {
            let per: Vec<String> = d.iter().map(|x| format!("{x:.0}")).collect();
            println!("| {} | {:.0} | {} |", c.label, median(d.clone()), per.join(", "));
        }
        println!("\nthis build, default settings, {secs}s at each offered rate:\n");
        println!("| measurement | value |");
        println!("|---|---:|");
        for (rate, r) in [("1,000", &e1k), ("5,000", &e5k)] {
            println!("| end-to-end p50 / p99 at {rate} events/s (ms) | {:.2} / {:.2} |",
                median(r.iter().map(|x| x.0).collect()), median(r.iter().map(|x| x.1).collect()));
            println!("| delivered within the run at {rate} events/s | {:.1}% |", 100.0 * median(r.iter().map(|x| x.2).collect()));
        }
    });
}
