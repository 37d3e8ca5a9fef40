//! Ingest benchmark: concurrent 1 KiB JSON callbacks over loopback against
//!   - a bare actix-web handler that reads the body and answers 200 (the ceiling),
//!   - the release `hookrelay` in `durable` mode (ack after group fsync) on its
//!     default engine (redb for a new data directory), and on sled,
//!   - the release `hookrelay` in `buffered` mode.
//!
//! Two measurements per target: closed-loop throughput with 64 connections, and ack
//! latency at a fixed offered rate of 2,000 requests/s (open loop: latency counts from
//! the scheduled send time, so queueing is not hidden). Targets are measured in
//! interleaved rounds and medians reported, because this machine is shared and noisy.
//!
//! Run: `cargo bench --bench ingest` (env: BENCH_ROUNDS, BENCH_SECS; BENCH_BASELINE=path
//! of another hookrelay build adds its durable mode, measured in the same rounds;
//! BENCH_COMPRESSED=1 adds this build with `storage.compression = true`; BENCH_ONLY=text
//! keeps the targets whose name holds it; BENCH_LOGS=path writes each relay's log to
//! path.N at the end).

#[path = "../tests/common/mod.rs"]
mod common;

use common::env_or;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpResponse, HttpServer};
use tokio::sync::Semaphore;

/// Same allocator as the relay binary, so that the bare ceiling is a fair one.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CONNECTIONS: usize = 64;
const RATE: u64 = 2_000;
const BARE_ENV: &str = "HOOKRELAY_BENCH_BARE_SERVER";

fn main() {
    if std::env::var_os(BARE_ENV).is_some() {
        bare_server();
        return;
    }
    common::write_back_dirty_pages();
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let secs: u64 = env_or("BENCH_SECS", 4);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(run(rounds, Duration::from_secs(secs)));
}

/// The ceiling: same framework, same worker count, same body read, no storage.
fn bare_server() {
    actix_web::rt::System::new().block_on(async {
        let server = HttpServer::new(|| {
            App::new().route(
                "/hooks/{source}/{token}/{event}",
                web::post().to(|body: web::Bytes| async move {
                    HttpResponse::Ok().json(serde_json::json!({ "size": body.len() }))
                }),
            )
        })
        .workers(2)
        .bind("127.0.0.1:0")
        .unwrap();
        println!("{}", server.addrs()[0]);
        server.run().await.unwrap();
    });
}

struct Target {
    name: &'static str,
    url: String,
    /// The relay, for its metrics (none for the bare server).
    relay: Option<std::sync::Arc<common::Relay>>,
    _guard: Box<dyn std::any::Any>,
}

async fn start_bare() -> Target {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .env(BARE_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr: SocketAddr = line.trim().parse().unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    Target {
        name: "bare actix-web (no store)",
        url: format!("http://{addr}/hooks/demo/x/ActionUpdated"),
        relay: None,
        _guard: Box::new(Kill(child)),
    }
}

async fn start_relay(name: &'static str, durability: &str) -> Target {
    start_relay_binary(name, common::binary(), durability).await
}

async fn start_relay_binary(name: &'static str, bin: &str, durability: &str) -> Target {
    start_relay_with(name, bin, &format!("durability = \"{durability}\"")).await
}

/// A relay whose `[storage]` section starts with `storage` (TOML lines).
async fn start_relay_with(name: &'static str, bin: &str, storage: &str) -> Target {
    let dir = tempfile::tempdir().unwrap();
    let text = common::config(&dir.path().join("data"), "")
        .replace("[storage]", &format!("[storage]\n{storage}"))
        .replace("level = \"info\"", "level = \"hookrelay=info,actix_server=warn\"");
    let relay = std::sync::Arc::new(common::Relay::start_binary(bin, dir.path(), &text).await);
    Target {
        name,
        url: relay.hook_url(Some("ActionUpdated")),
        relay: Some(relay.clone()),
        _guard: Box::new((relay, dir)),
    }
}

/// A realistic callback body of about 1 KiB.
fn body() -> bytes::Bytes {
    let text = "x".repeat(725);
    let v = serde_json::json!({
        "jsonapi": {"version": "1.0"},
        "data": {"type": "actions", "id": "5", "attributes": {"name": "Smith v Jones", "status": "Active", "notes": text}},
        "meta": {"debug": {"time": "2026-06-12 13:23:35 +1200", "resthook": {"id": "46", "trigger_count": 1,
            "event_name": "ActionUpdated", "resource_type": "actions", "resource_id": "5"}}}
    });
    let s = serde_json::to_vec(&v).unwrap();
    assert!((1000..=1100).contains(&s.len()), "{}", s.len());
    s.into()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(CONNECTIONS).build().unwrap()
}

struct Sample {
    /// Every acknowledged request, the warm-up included (for CPU per callback).
    acked: usize,
    throughput: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: usize,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// 64 connections, each sending as fast as answers come back.
async fn closed_loop(url: &str, secs: Duration) -> Sample {
    let client = client();
    let body = body();
    let start = Instant::now() + Duration::from_millis(500); // warm-up before counting
    let end = start + secs;
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let (client, body, url) = (client.clone(), body.clone(), url.to_owned());
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut errors, mut acked) = (Vec::new(), 0, 0usize);
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let ok = match client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                {
                    Ok(r) => r.status() == 200 && r.bytes().await.is_ok(),
                    Err(_) => false,
                };
                acked += usize::from(ok);
                if t0 >= start {
                    if ok {
                        lat.push(t0.elapsed())
                    } else {
                        errors += 1
                    }
                }
            }
            (lat, errors, acked)
        }));
    }
    let (mut all, mut errors, mut acked) = (Vec::new(), 0, 0);
    for t in tasks {
        let (lat, e, a) = t.await.unwrap();
        all.extend(lat);
        errors += e;
        acked += a;
    }
    all.sort();
    Sample {
        acked,
        throughput: all.len() as f64 / secs.as_secs_f64(),
        p50_ms: percentile(&all, 0.5),
        p99_ms: percentile(&all, 0.99),
        errors,
    }
}

/// A request every 1/RATE s, whatever the answers do; at most 64 connections.
async fn fixed_rate(url: &str, secs: Duration) -> Sample {
    let client = client();
    let body = body();
    let slots = Arc::new(Semaphore::new(CONNECTIONS));
    let n = RATE * secs.as_secs();
    let interval = Duration::from_nanos(1_000_000_000 / RATE);
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let mut tasks = Vec::with_capacity(n as usize);
    for i in 0..n {
        let due = start + interval * i as u32;
        tokio::time::sleep_until(due).await;
        let (client, body, url, slots) =
            (client.clone(), body.clone(), url.to_owned(), slots.clone());
        tasks.push(tokio::spawn(async move {
            let _slot = slots.acquire_owned().await.unwrap();
            let ok = match client
                .post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
            {
                Ok(r) => r.status() == 200 && r.bytes().await.is_ok(),
                Err(_) => false,
            };
            ok.then(|| due.elapsed())
        }));
    }
    let (mut all, mut errors) = (Vec::new(), 0);
    for t in tasks {
        match t.await.unwrap() {
            Some(l) => all.push(l),
            None => errors += 1,
        }
    }
    all.sort();
    Sample {
        acked: all.len(),
        throughput: all.len() as f64 / secs.as_secs_f64(),
        p50_ms: percentile(&all, 0.5),
        p99_ms: percentile(&all, 0.99),
        errors,
    }
}

/// CPU time (user + system, all threads) `pid` has used, from /proc.
fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command name in parentheses: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Waits until the relay has dispatched everything it acknowledged (its inbox is
/// empty), so that the CPU measured covers each callback's whole path. The gauge is
/// watched while it moves; once it stands still above zero, the events themselves
/// are asked (builds before 2026-11-22 could leave their inbox gauge above zero for
/// good after a race between ingest and dispatch).
async fn drained(relay: &common::Relay) {
    let (mut last, mut still) = (f64::NAN, 0);
    for _ in 0..3000 {
        let m = relay.metrics().await;
        let inbox = common::metric(&m, "hookrelay_inbox_events", &[]).unwrap_or(f64::NAN);
        if inbox == 0.0 {
            return;
        }
        still = if inbox == last { still + 1 } else { 0 };
        last = inbox;
        if still >= 25 {
            let (_, page) = relay.admin_get("/admin/events?status=received&limit=1").await;
            if page["events"].as_array().is_some_and(Vec::is_empty) {
                return;
            }
            still = 0;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

async fn run(rounds: usize, secs: Duration) {
    let mut targets = vec![
        start_bare().await,
        start_relay("hookrelay durable", "durable").await,
        start_relay_with(
            "hookrelay durable, sled",
            common::binary(),
            "backend = \"sled\"\ndurability = \"durable\"",
        )
        .await,
        start_relay("hookrelay buffered", "buffered").await,
    ];
    // BENCH_COMPRESSED=1: this build, durable, with `storage.compression = true`.
    if std::env::var_os("BENCH_COMPRESSED").is_some() {
        let storage = "durability = \"durable\"\ncompression = true";
        targets.push(
            start_relay_with("hookrelay durable, compressed", common::binary(), storage).await,
        );
    }
    // BENCH_BASELINE=/path/to/an/older/hookrelay: its durable mode side by side, to
    // tell a regression from a noisy machine.
    if let Ok(bin) = std::env::var("BENCH_BASELINE") {
        let bin: &'static str = Box::leak(bin.into_boxed_str());
        targets.push(start_relay_binary("baseline build, durable", bin, "durable").await);
    }
    // BENCH_ONLY=sled: only the targets whose name holds it.
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        targets.retain(|t| t.name.contains(&only));
    }
    let mut results: Vec<Vec<(Sample, Sample)>> = targets.iter().map(|_| Vec::new()).collect();
    // CPU µs per callback of each relay, per round: steadier than throughput on a
    // shared machine, since it does not depend on who else had the cores.
    let mut cpu: Vec<Vec<f64>> = targets.iter().map(|_| Vec::new()).collect();
    // What each relay had left to dispatch when the load stopped, and the CPU µs per
    // callback it spent while the load ran: a relay that dispatches less during the
    // load leaves the cores to the ack path and catches up afterwards.
    let mut backlog: Vec<Vec<f64>> = targets.iter().map(|_| Vec::new()).collect();
    let mut cpu_load: Vec<Vec<f64>> = targets.iter().map(|_| Vec::new()).collect();
    // Callbacks acknowledged *and dispatched* per second: from the start of the load
    // until the inbox is empty again. Work a relay puts off until after the load
    // counts here, not in the closed-loop throughput.
    let mut pipeline: Vec<Vec<f64>> = targets.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        // Each round starts with another target, so no build always follows the same
        // one (the bare server's 70k requests/s leave the machine busier than others).
        let order: Vec<usize> = (0..targets.len()).map(|k| (k + round) % targets.len()).collect();
        for i in order {
            let t = &targets[i];
            let cpu0 = t.relay.as_ref().map(|r| cpu_seconds(r.pid()));
            let began = Instant::now();
            let c = closed_loop(&t.url, secs).await;
            if let (Some(relay), Some(cpu0)) = (&t.relay, cpu0) {
                let during = cpu_seconds(relay.pid()) - cpu0;
                cpu_load[i].push(1e6 * during / c.acked.max(1) as f64);
                let m = relay.metrics().await;
                let left = common::metric(&m, "hookrelay_inbox_events", &[]).unwrap_or(f64::NAN);
                backlog[i].push(left);
                drained(relay).await;
                pipeline[i].push(c.acked as f64 / began.elapsed().as_secs_f64());
                let us = 1e6 * (cpu_seconds(relay.pid()) - cpu0) / c.acked.max(1) as f64;
                cpu[i].push(us);
            }
            let f = fixed_rate(&t.url, secs).await;
            eprintln!(
                "round {}: {:<28} {:>9.0} req/s (p50 {:.2} ms, p99 {:.2} ms, {} errors) | at {RATE}/s: p50 {:.2} ms, p99 {:.2} ms, {} errors",
                round + 1, t.name, c.throughput, c.p50_ms, c.p99_ms, c.errors, f.p50_ms, f.p99_ms, f.errors
            );
            results[i].push((c, f));
        }
    }
    // The bare server's throughput, NaN (shown as —) when BENCH_ONLY left it out.
    let bare_tp = targets
        .iter()
        .zip(&results)
        .find(|(t, _)| t.relay.is_none())
        .map_or(f64::NAN, |(_, r)| median(r.iter().map(|(c, _)| c.throughput).collect()));
    println!("\nmedians of {rounds} interleaved rounds, {}s each, {CONNECTIONS} connections, 1 KiB JSON bodies:\n", secs.as_secs());
    println!("| target | throughput (req/s) | vs bare | closed-loop p50 / p99 (ms) | p50 / p99 at {RATE} req/s (ms) | errors |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (t, r) in targets.iter().zip(&results) {
        let tp = median(r.iter().map(|(c, _)| c.throughput).collect());
        println!(
            "| {} | {:.0} | {} | {:.2} / {:.2} | {:.2} / {:.2} | {} |",
            t.name,
            tp,
            if bare_tp.is_nan() {
                "—".to_owned()
            } else {
                format!("{:.0}%", 100.0 * tp / bare_tp)
            },
            median(r.iter().map(|(c, _)| c.p50_ms).collect()),
            median(r.iter().map(|(c, _)| c.p99_ms).collect()),
            median(r.iter().map(|(_, f)| f.p50_ms).collect()),
            median(r.iter().map(|(_, f)| f.p99_ms).collect()),
            r.iter().map(|(c, f)| c.errors + f.errors).sum::<usize>(),
        );
    }
    // How each relay grouped its commits: the mean group size and store time per group
    // (from its own histograms), which explain most differences in throughput.
    println!(
        "\n| relay | commit groups | mean callbacks per group | mean store time per group (ms) | CPU per callback, ack to dispatch (µs, median; per round) | CPU per callback during the load (µs) | inbox left at the end of the load | acknowledged and dispatched per second |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (i, (t, cpu)) in targets.iter().zip(&cpu).enumerate() {
        let Some(relay) = &t.relay else { continue };
        let text = relay.metrics().await;
        let get = |name: &str| common::metric(&text, name, &[]).unwrap_or(f64::NAN);
        let groups = get("hookrelay_store_commit_batch_size_count");
        let rounds: Vec<String> = cpu.iter().map(|c| format!("{c:.0}")).collect();
        println!(
            "| {} | {:.0} | {:.1} | {:.2} | {:.0} ({}) | {:.0} | {:.0} | {:.0} |",
            t.name,
            groups,
            get("hookrelay_store_commit_batch_size_sum") / groups,
            1000.0 * get("hookrelay_store_commit_duration_seconds_sum")
                / get("hookrelay_store_commit_duration_seconds_count"),
            median(cpu.clone()),
            rounds.join(", "),
            median(cpu_load[i].clone()),
            median(backlog[i].clone()),
            median(pipeline[i].clone()),
        );
        if let Ok(path) = std::env::var("BENCH_LOGS") {
            let _ = std::fs::write(format!("{path}.{i}"), relay.logs());
        }
    }
}
