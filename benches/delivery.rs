//! Delivery benchmark, release build, durable state, loopback:
//!   - drain: N events stored while the destination is paused, then resumed; how fast
//!     do deliveries reach a sink that answers 200 at once (deliveries/s)?
//!   - end to end: callbacks at a fixed offered rate (1,000 and 5,000 events/s, open
//!     loop); latency from sending the callback to the sink receiving the delivery.
//!
//! Medians over rounds, because the 2-core machine is shared and noisy.
//!
//! Run: `cargo bench --bench delivery` (env: BENCH_ROUNDS, BENCH_SECS, BENCH_DRAIN).

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use tokio::sync::Semaphore;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CONNECTIONS: usize = 64;
const CONCURRENCY: usize = 32;

type Arrivals = Arc<Mutex<HashMap<String, Instant>>>;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A sink on its own thread: notes when each `webhook-id` arrives, answers 200.
fn start_sink(arrivals: Arrivals) -> std::net::SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let data = web::Data::new(arrivals);
            let server = HttpServer::new(move || {
                App::new().app_data(data.clone()).default_service(web::to(
                    |req: HttpRequest, _body: web::Bytes, seen: web::Data<Arrivals>| async move {
                        let now = Instant::now();
                        if let Some(id) =
                            req.headers().get("webhook-id").and_then(|v| v.to_str().ok())
                        {
                            seen.lock().unwrap().entry(id.to_owned()).or_insert(now);
                        }
                        HttpResponse::Ok().finish()
                    },
                ))
            })
            .workers(1)
            .bind("127.0.0.1:0")
            .unwrap();
            tx.send(server.addrs()[0]).unwrap();
            server.run().await.unwrap();
        });
    });
    rx.recv().unwrap()
}

fn body(n: u64) -> String {
    let pad = "x".repeat(600);
    serde_json::json!({
        "jsonapi": {"version": "1.0"},
        "data": {"type": "actions", "id": n.to_string(), "attributes": {"name": "Smith v Jones", "notes": pad}},
        "meta": {"debug": {"resthook": {"id": "46", "trigger_count": n, "event_name": "ActionUpdated"}}}
    })
    .to_string()
}

/// Sends one callback; returns the relay's event id and when the request started.
async fn send(client: &reqwest::Client, url: &str, n: u64) -> Option<(String, Instant)> {
    let t0 = Instant::now();
    let r = client
        .post(url)
        .header("content-type", "application/json")
        .body(body(n))
        .send()
        .await
        .ok()?;
    let v: serde_json::Value = r.json().await.ok()?;
    Some((format!("evt_{}_sink", v["id"].as_str()?), t0))
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
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

/// Stores `n` events with the destination paused, resumes it, times the drain.
async fn drain(relay: &common::Relay, arrivals: &Arrivals, n: u64, base: u64) -> f64 {
    assert_eq!(relay.admin_post("/admin/destinations/sink/pause", None).await.0, 200);
    let client = reqwest::Client::builder().pool_max_idle_per_host(CONNECTIONS).build().unwrap();
    let url = relay.hook_url(Some("ActionUpdated"));
    let slots = Arc::new(Semaphore::new(CONNECTIONS));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (client, url, slots) = (client.clone(), url.clone(), slots.clone());
        tasks.push(tokio::spawn(async move {
            let _s = slots.acquire_owned().await.unwrap();
            send(&client, &url, base + i).await
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
    assert_eq!(relay.admin_post("/admin/destinations/sink/resume", None).await.0, 200);
    assert!(wait_all(arrivals, &ids, Duration::from_secs(300)).await, "drain incomplete");
    n as f64 / started.elapsed().as_secs_f64()
}

/// Offers `rate` callbacks per second for `secs`; returns (p50, p99, delivered share).
async fn end_to_end(
    relay: &common::Relay,
    arrivals: &Arrivals,
    rate: u64,
    secs: u64,
    base: u64,
) -> (f64, f64, f64) {
    let client = reqwest::Client::builder().pool_max_idle_per_host(CONNECTIONS).build().unwrap();
    let url = relay.hook_url(Some("ActionUpdated"));
    let slots = Arc::new(Semaphore::new(CONNECTIONS));
    let interval = Duration::from_nanos(1_000_000_000 / rate);
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let mut tasks = Vec::new();
    for i in 0..rate * secs {
        let due = start + interval * i as u32;
        tokio::time::sleep_until(due).await;
        let (client, url, slots) = (client.clone(), url.clone(), slots.clone());
        tasks.push(tokio::spawn(async move {
            let _s = slots.acquire_owned().await.unwrap();
            let (id, _) = send(&client, &url, base + i).await?;
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
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let arrivals: Arrivals = Arc::default();
        let sink = start_sink(arrivals.clone());
        let dir = tempfile::tempdir().unwrap();
        let tail = format!(
            "\n[[destinations]]\nname = \"sink\"\nurl = \"http://{sink}/in\"\nmax_concurrency = {CONCURRENCY}\n"
        );
        let text = common::config_with(&dir.path().join("data"), "", &tail)
            .replace("level = \"info\"", "level = \"hookrelay=info,actix_server=warn\"");
        let relay = common::Relay::start(dir.path(), &text).await;
        let (mut drains, mut e1k, mut e5k) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let base = 10_000_000 * (round as u64 + 1);
            // Distinct records every run: identical bodies would be deduplicated.
            let d = drain(&relay, &arrivals, drain_n, base + 9_000_000).await;
            let a = end_to_end(&relay, &arrivals, 1_000, secs, base).await;
            let b = end_to_end(&relay, &arrivals, 5_000, secs, base + 5_000_000).await;
            eprintln!(
                "round {}: drain {d:.0} deliveries/s | 1,000/s: p50 {:.2} ms, p99 {:.2} ms, {:.1}% delivered | 5,000/s: p50 {:.2} ms, p99 {:.2} ms, {:.1}% delivered",
                round + 1, a.0, a.1, a.2 * 100.0, b.0, b.1, b.2 * 100.0
            );
            drains.push(d);
            e1k.push(a);
            e5k.push(b);
        }
        println!("\nmedians of {rounds} rounds (drain of {drain_n} events; {secs}s at each rate; max_concurrency {CONCURRENCY}; durable):\n");
        println!("| measurement | value |");
        println!("|---|---:|");
        println!("| drain throughput (deliveries/s) | {:.0} |", median(drains));
        for (rate, r) in [("1,000", &e1k), ("5,000", &e5k)] {
            println!("| end-to-end p50 / p99 at {rate} events/s (ms) | {:.2} / {:.2} |",
                median(r.iter().map(|x| x.0).collect()), median(r.iter().map(|x| x.1).collect()));
            println!("| delivered within the run at {rate} events/s | {:.1}% |", 100.0 * median(r.iter().map(|x| x.2).collect()));
        }
    });
}
