//! Runaway benchmark, release build, shipped defaults, loopback: what programs that
//! never end cost everything else (issue 40). Two relays of this build, each with five
//! plain destinations (no program), `f` with a filter and `t` with a transform, all
//! taking every event, delivering to one sink:
//!   - calm: the filter and the transform end on every body;
//!   - runaway: the same programs loop for ever (`last(range(1e18))`) on the bodies
//!     marked `"loop": true`, and 100 previews of a program that loops for ever are sent
//!     during the run.
//!
//! Each round starts both relays afresh (a program disabled in one round would not loop
//! in the next), then, one relay at a time: the threads and RSS of the relay and its
//! shaping processes, settled; an open loop of `BENCH_RATE` callbacks/s for
//! `BENCH_SECS` seconds, 100 of them marked (so the filter and the transform are asked
//! 100 times each to loop); the plain destinations' delivery rate (their deliveries over
//! the time from the first callback to their last delivery), the lag of their last
//! delivery behind the last callback; then, once the previews have answered and 5 s
//! passed, the threads and RSS again.
//!
//! Run: `cargo bench --bench runaway` (env: BENCH_ROUNDS, BENCH_RATE, BENCH_SECS,
//! BENCH_BASELINE for the calm relay on an older build).

#[path = "../tests/common/mod.rs"]
mod common;

use common::env_or;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PLAIN: usize = 5;
const MARKED: u64 = 100;
const PREVIEWS: usize = 100;
const LOOP: &str = "last(range(1e18))";

/// Deliveries per destination (the path's last segment), and when the last plain one came.
#[derive(Default)]
struct Tally {
    plain: AtomicU64,
    last_plain: Mutex<Option<Instant>>,
    other: Mutex<HashMap<String, u64>>,
}

fn start_sink(tally: Arc<Tally>) -> std::net::SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let data = web::Data::new(tally);
            let server = HttpServer::new(move || {
                App::new().app_data(data.clone()).default_service(web::to(
                    |req: HttpRequest, _body: web::Bytes, t: web::Data<Arc<Tally>>| async move {
                        let name = req.path().trim_start_matches('/').to_owned();
                        if name.starts_with('p') {
                            t.plain.fetch_add(1, Ordering::Relaxed);
                            *t.last_plain.lock().unwrap() = Some(Instant::now());
                        } else {
                            *t.other.lock().unwrap().entry(name).or_default() += 1;
                        }
                        HttpResponse::Ok().finish()
                    },
                ))
            })
            .workers(2)
            .bind("127.0.0.1:0")
            .unwrap();
            tx.send(server.addrs()[0]).unwrap();
            server.run().await.unwrap();
        });
    });
    rx.recv().unwrap()
}

fn body(n: u64, marked: bool) -> String {
    serde_json::json!({
        "data": {"type": "actions", "id": n.to_string(), "loop": marked,
                 "attributes": {"name": "Smith v Jones", "notes": "x".repeat(600)}},
        "meta": {"debug": {"resthook": {"id": "46", "trigger_count": n}}}
    })
    .to_string()
}

/// The pids of `pid`'s children (its shaping processes).
fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            out.extend(text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
    }
    out
}

fn status_field(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// (the relay's threads, its shaping processes, RSS of all in MiB).
fn footprint(pid: i32) -> (u64, usize, f64) {
    let kids = children(pid);
    let rss_kb: u64 =
        std::iter::once(pid).chain(kids.iter().copied()).map(|p| status_field(p, "VmRSS:")).sum();
    (status_field(pid, "Threads:"), kids.len(), rss_kb as f64 / 1024.0)
}

struct Contender {
    label: String,
    relay: common::Relay,
    tally: Arc<Tally>,
    runaway: bool,
    _dir: tempfile::TempDir,
}

async fn contender(label: &str, bin: &str, runaway: bool) -> Contender {
    let tally = Arc::new(Tally::default());
    let sink = start_sink(tally.clone());
    let dir = tempfile::tempdir().unwrap();
    let (filter, transform) = if runaway {
        (
            format!("if .body.data.loop then {LOOP} else true end"),
            format!("if .body.data.loop then {LOOP} else . end"),
        )
    } else {
        (
            "if .body.data.loop then true else true end".to_owned(),
            "if .body.data.loop then . else . end".to_owned(),
        )
    };
    let mut tail = String::new();
    for i in 0..PLAIN {
        tail.push_str(&format!(
            "\n[[destinations]]\nname = \"p{i}\"\nurl = \"http://{sink}/p{i}\"\n"
        ));
    }
    tail.push_str(&format!(
        "\n[[destinations]]\nname = \"f\"\nurl = \"http://{sink}/f\"\nfilter = '{filter}'\n"
    ));
    tail.push_str(&format!(
        "\n[[destinations]]\nname = \"t\"\nurl = \"http://{sink}/t\"\ntransform = '{transform}'\n"
    ));
    let text = common::config_with(&dir.path().join("data"), "", &tail)
        .replace("level = \"info\"", "level = \"hookrelay=info,actix_server=warn\"");
    let relay = common::Relay::start_binary(bin, dir.path(), &text).await;
    Contender { label: label.to_owned(), relay, tally, runaway, _dir: dir }
}

/// One measured run: (plain deliveries/s, lag of the last plain delivery, footprint
/// before, footprint after).
async fn run(
    c: &Contender,
    rate: u64,
    secs: u64,
) -> (f64, Duration, (u64, usize, f64), (u64, usize, f64)) {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = footprint(c.relay.pid());
    let client = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
    let url = c.relay.hook_url(Some("ActionUpdated"));
    // One stored event for the previews to try programs on.
    let first = client
        .post(&url)
        .header("content-type", "application/json")
        .body(body(0, false))
        .send()
        .await
        .unwrap();
    let id = first.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let n = rate * secs;
    let every = (n / MARKED).max(1);
    let expected = (n + 1) * PLAIN as u64;
    let t0 = Instant::now();
    // The previews, spread over the run, 10 at a time.
    let previews = {
        let (client, admin) = (client.clone(), c.relay.admin);
        let program = if c.runaway { LOOP } else { "." };
        let id = id.clone();
        tokio::spawn(async move {
            let slots = Arc::new(tokio::sync::Semaphore::new(10));
            let mut tasks = Vec::new();
            for _ in 0..PREVIEWS {
                let (client, id, slots) = (client.clone(), id.clone(), slots.clone());
                tasks.push(tokio::spawn(async move {
                    let _s = slots.acquire_owned().await.unwrap();
                    client
                        .post(format!("http://{admin}/admin/destinations/f/preview"))
                        .bearer_auth(common::ADMIN_TOKEN)
                        .json(&serde_json::json!({"event": id, "filter": program}))
                        .send()
                        .await
                        .map(|r| r.status().as_u16())
                        .unwrap_or(0)
                }));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let mut statuses = HashMap::new();
            for t in tasks {
                *statuses.entry(t.await.unwrap()).or_insert(0) += 1;
            }
            statuses
        })
    };
    let mut sends = Vec::with_capacity(n as usize);
    let gap = Duration::from_secs_f64(1.0 / rate as f64);
    for i in 1..=n {
        let due = t0 + gap * (i as u32);
        tokio::time::sleep_until(due.into()).await;
        let (client, url) = (client.clone(), url.clone());
        sends.push(tokio::spawn(async move {
            let r = client
                .post(&url)
                .header("content-type", "application/json")
                .body(body(i, i % every == 0))
                .send()
                .await;
            assert_eq!(r.map(|r| r.status().as_u16()).ok(), Some(200));
        }));
    }
    for s in sends {
        s.await.unwrap();
    }
    let last_sent = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(600);
    while c.tally.plain.load(Ordering::Relaxed) < expected {
        assert!(Instant::now() < deadline, "{}: plain deliveries incomplete", c.label);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let last = c.tally.last_plain.lock().unwrap().unwrap_or_else(Instant::now);
    let plain_rate = n as f64 / (last - t0).as_secs_f64();
    let lag = last.saturating_duration_since(last_sent);
    let statuses = previews.await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = footprint(c.relay.pid());
    eprintln!(
        "  {}: previews answered {statuses:?}; f and t got {:?}",
        c.label,
        c.tally.other.lock().unwrap()
    );
    (plain_rate, lag, before, after)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let rate: u64 = env_or("BENCH_RATE", 400);
    let secs: u64 = env_or("BENCH_SECS", 15);
    let baseline = std::env::var("BENCH_BASELINE").ok();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut labels = vec!["calm (programs that end)".to_owned(), "runaway (100 loops each of filter, transform, preview)".to_owned()];
        if baseline.is_some() {
            labels.push("baseline build, calm".to_owned());
        }
        let mut rates = vec![Vec::new(); labels.len()];
        let mut lags = vec![Vec::new(); labels.len()];
        let mut feet = vec![Vec::new(); labels.len()];
        for round in 0..rounds {
            for (i, label) in labels.iter().enumerate() {
                let bin = if i == 2 { baseline.as_deref().unwrap_or(common::binary()) } else { common::binary() };
                let c = contender(label, bin, i == 1).await;
                let (r, lag, before, after) = run(&c, rate, secs).await;
                eprintln!(
                    "round {}: {label}: {r:.0} plain events/s, last {lag:?} after the last callback; threads {} -> {}, shaping processes {} -> {}, RSS {:.0} -> {:.0} MiB",
                    round + 1, before.0, after.0, before.1, after.1, before.2, after.2
                );
                rates[i].push(r);
                lags[i].push(lag.as_secs_f64() * 1000.0);
                feet[i].push((before, after));
                let mut relay = c.relay;
                relay.signal(libc::SIGTERM);
                relay.wait_exit(Duration::from_secs(30));
            }
        }
        let calm = median(rates[0].clone());
        println!("\nmedians of {rounds} interleaved rounds, {rate} callbacks/s for {secs} s, each to {PLAIN} plain destinations, a filtered one and a transformed one:\n");
        println!("| relay | plain deliveries (events/s) | vs calm | last plain delivery after the last callback (ms) | threads before → after | shaping processes before → after | RSS before → after (MiB) |");
        println!("|---|---:|---:|---:|---|---|---|");
        for (i, label) in labels.iter().enumerate() {
            let f = &feet[i];
            let th: Vec<String> = f.iter().map(|(b, a)| format!("{}→{}", b.0, a.0)).collect();
            let pr: Vec<String> = f.iter().map(|(b, a)| format!("{}→{}", b.1, a.1)).collect();
            let rs: Vec<String> = f.iter().map(|(b, a)| format!("{:.0}→{:.0}", b.2, a.2)).collect();
            let r = median(rates[i].clone());
            println!("| {label} | {r:.0} | {:+.1}% | {:.0} | {} | {} | {} |", (r / calm - 1.0) * 100.0, median(lags[i].clone()), th.join(", "), pr.join(", "), rs.join(", "));
        }
    });
}
