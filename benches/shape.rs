//! Shape benchmark, release build, shipped defaults, loopback: what filters and
//! transforms cost. Three relays of this build, each with 10 destinations to one sink:
//!   - plain: no filter, no transform;
//!   - filters: each destination with a filter that matches (`docs/transforms`-like);
//!   - shaped: each with that filter and the flatten transform (`docs/transforms/flatten.jq`);
//!
//! and, with `BENCH_BASELINE=path/to/older/hookrelay`, the plain config on that build.
//! In interleaved rounds, each relay takes N callbacks (64 connections, closed loop)
//! and delivers all 10 × N; the time from the first callback to the last delivery
//! gives events/s, and the relay's CPU time (/proc) per event gives what a filter
//! evaluation and a transform cost.
//!
//! Run: `cargo bench --bench shape` (env: BENCH_ROUNDS, BENCH_EVENTS, BENCH_BASELINE).

#[path = "../tests/common/mod.rs"]
mod common;

use common::env_or;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpResponse, HttpServer};
use tokio::sync::Semaphore;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CONNECTIONS: usize = 64;
const DESTINATIONS: usize = 10;
const FILTER: &str =
    r#".body.data.type == "actions" and (.body.data.attributes.name | length) > 0"#;

/// A sink on its own thread that counts what it receives and answers 200.
fn start_sink(count: Arc<AtomicU64>) -> std::net::SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let data = web::Data::new(count);
            let server = HttpServer::new(move || {
                App::new().app_data(data.clone()).default_service(web::to(
                    |_body: web::Bytes, n: web::Data<Arc<AtomicU64>>| async move {
                        n.fetch_add(1, Ordering::Relaxed);
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

/// The relay's CPU time so far (user + system), from /proc.
fn cpu(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime and stime are 14 and 15.
    let rest = stat.rsplit(')').next().unwrap_or("");
    // (field 3, the state, is index 0 here).
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    let ticks = field(11) + field(12);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_micros(ticks * 1_000_000 / hz)
}

struct Contender {
    label: &'static str,
    relay: common::Relay,
    sink: Arc<AtomicU64>,
    _dir: tempfile::TempDir,
}

async fn contender(label: &'static str, bin: &str, filter: bool, transform: bool) -> Contender {
    let count = Arc::new(AtomicU64::new(0));
    let sink = start_sink(count.clone());
    let dir = tempfile::tempdir().unwrap();
    let flatten = include_str!("../docs/transforms/flatten.jq");
    let mut tail = String::new();
    for i in 0..DESTINATIONS {
        tail.push_str(&format!(
            "\n[[destinations]]\nname = \"d{i}\"\nurl = \"http://{sink}/in\"\n"
        ));
        if filter {
            tail.push_str(&format!("filter = '{FILTER}'\n"));
        }
        if transform {
            tail.push_str(&format!("transform = '''\n{flatten}'''\n"));
        }
    }
    let text = common::config_with(&dir.path().join("data"), "", &tail)
        .replace("level = \"info\"", "level = \"hookrelay=info,actix_server=warn\"");
    let relay = common::Relay::start_binary(bin, dir.path(), &text).await;
    Contender { label, relay, sink: count, _dir: dir }
}

/// Sends `n` callbacks and waits for all `10 × n` deliveries: (events/s, CPU per event).
async fn run(c: &Contender, n: u64, base: u64) -> (f64, Duration) {
    let client = reqwest::Client::builder().pool_max_idle_per_host(CONNECTIONS).build().unwrap();
    let url = c.relay.hook_url(Some("ActionUpdated"));
    let slots = Arc::new(Semaphore::new(CONNECTIONS));
    let expected = c.sink.load(Ordering::Relaxed) + n * DESTINATIONS as u64;
    let (cpu0, t0) = (cpu(c.relay.pid()), Instant::now());
    let mut tasks = Vec::new();
    for i in 0..n {
        let (client, url, slots) = (client.clone(), url.clone(), slots.clone());
        tasks.push(tokio::spawn(async move {
            let _s = slots.acquire_owned().await.unwrap();
            let r = client
                .post(&url)
                .header("content-type", "application/json")
                .body(body(base + i))
                .send()
                .await;
            assert_eq!(r.map(|r| r.status().as_u16()).ok(), Some(200));
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while c.sink.load(Ordering::Relaxed) < expected {
        assert!(Instant::now() < deadline, "{}: deliveries incomplete", c.label);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = t0.elapsed();
    (n as f64 / took.as_secs_f64(), (cpu(c.relay.pid()) - cpu0) / n as u32)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let events: u64 = env_or("BENCH_EVENTS", 3_000);
    let baseline = std::env::var("BENCH_BASELINE").ok();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut contenders = vec![
            contender("plain (no filter, no transform)", common::binary(), false, false).await,
            contender("a filter on each", common::binary(), true, false).await,
            contender("a filter and a transform on each", common::binary(), true, true).await,
        ];
        if let Some(bin) = &baseline {
            contenders.push(contender("baseline build, plain", bin, false, false).await);
        }
        let mut rates = vec![Vec::new(); contenders.len()];
        let mut cpus = vec![Vec::new(); contenders.len()];
        for round in 0..rounds {
            for (i, c) in contenders.iter().enumerate() {
                let base = 10_000_000 * (round as u64 + 1) + 1_000_000 * i as u64;
                let (rate, per) = run(c, events, base).await;
                eprintln!("round {}: {}: {rate:.0} events/s, {:.0} µs CPU per event", round + 1, c.label, per.as_secs_f64() * 1e6);
                rates[i].push(rate);
                cpus[i].push(per.as_secs_f64() * 1e6);
            }
        }
        let plain = median(rates[0].clone());
        let plain_cpu = median(cpus[0].clone());
        println!("\nmedians of {rounds} interleaved rounds of {events} callbacks, each delivered to {DESTINATIONS} destinations (durable, shipped defaults):\n");
        println!("| relay | events/s (all delivered) | vs plain | CPU per event (µs) | per round (events/s) |");
        println!("|---|---:|---:|---:|---|");
        for (i, c) in contenders.iter().enumerate() {
            let (r, cp) = (median(rates[i].clone()), median(cpus[i].clone()));
            let per: Vec<String> = rates[i].iter().map(|x| format!("{x:.0}")).collect();
            println!("| {} | {r:.0} | {:+.1}% | {cp:.0} | {} |", c.label, (r / plain - 1.0) * 100.0, per.join(", "));
        }
        let filters = median(cpus[1].clone());
        let shaped = median(cpus[2].clone());
        println!("\nCPU per filter evaluation: {:.1} µs; per transform: {:.1} µs (differences of CPU per event, over {DESTINATIONS} destinations)",
            (filters - plain_cpu) / DESTINATIONS as f64, (shaped - filters) / DESTINATIONS as f64);
    });
}
