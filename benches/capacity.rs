//! Capacity of the embedded store at a firm's volume: what the relay costs in memory,
//! disk and restart time as its history grows, release build, shipped defaults
//! (durable, 7 days of retention, 64 MiB cache), one destination, on each embedded
//! engine side by side (redb, the default for a new data directory, and sled, which
//! stores from earlier releases keep).
//!
//! Two cases, each filled through the ingress (64 connections, ~750-byte
//! upstream-shaped bodies, each distinct) up to every point of `BENCH_POINTS`:
//! - `kept`: the destination answers 200; every event is delivered and kept for
//!   retention (the steady state of a relay in service);
//! - `backlog`: the destination is paused first; every event waits as a pending
//!   delivery (a consumer down for a long while), dispatched before the point is
//!   measured;
//! - `flood`: as `backlog`, but killed with the flood's undispatched inbox as it stands
//!   (a flood faster than dispatch: the restart counts the inbox too), the inbox at
//!   the kill printed;
//! - `pruned`: as `kept`, with retention by part dropping delivered bodies after 1 s
//!   (`retention.delivered_bodies`, pruned every 10 s; records, deliveries and
//!   attempts kept): the disk a relay holds at steady state when bodies go long
//!   before their records.
//!
//! At each point: the relay's resident memory (RSS) and its high-water mark, the data
//! directory's bytes per event and as a multiple of the body bytes, the p99 of the ack
//! latency (and p99.9, with redb's checkpoints during it: how many, their mean time,
//! and the dedup keys the purge removed meanwhile) under a steady 200 callbacks/s for
//! 10 s (`BENCH_PROBE_SECS`), then a crash (SIGKILL) and the time from the restart to
//! `/readyz` answering 200, with the RSS once ready and 20 s later. The slope per
//! retained event (RSS and disk) is printed between points.
//!
//! Run: `cargo bench --bench capacity` (env: `BENCH_POINTS`, comma-separated, default
//! `1000000`; `BENCH_CASES`, default `kept,backlog` (`flood`, `pruned` on demand); `BENCH_BACKENDS`, default
//! `sled,redb`; `BENCH_PROBE_SECS`, the probe's length, default 10;
//! `BENCH_MEMORY_LIMIT`, bytes: redb's `storage.memory_limit_bytes`, unset by default;
//! `BENCH_CONNECTIONS`, the fill's connections, default 64; `BENCH_DEDUP_WINDOW`,
//! the source's `dedup_window` (10 min by default: a shorter one reaches the steady
//! state of the dedup purge, keys expiring as fast as they come, in a shorter fill);
//! `BENCH_BASELINE`, an older build measured the same way after this one;
//! `BENCH_RESTART_BASELINE`, an older build restarted on the same files at each point,
//! in turn with this one, [`RESTART_ROUNDS`] times each: medians side by side;
//! `BENCH_PROBE_BASELINE`, an older build probed on the same files at each point, in
//! turn with this one after a restart, [`RESTART_ROUNDS`] times each, with
//! `BENCH_PROBE_ENV` and `BENCH_PROBE_BASELINE_ENV` (`KEY=VALUE;...`) in each one's
//! environment: the same build under two settings; `BENCH_FILLED`, the data directory
//! of an earlier fill, probed in place instead of filling one).
//! The restart is timed to `/readyz` and to the inbox and every queue counted
//! (`counting` false in `/admin/destinations` and the inbox gauge present: a large
//! backlog or inbox is counted behind the open).

#[path = "../tests/common/mod.rs"]
mod common;

use common::env_or;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::sink::Sink;
use tokio::sync::Semaphore;

#[path = "capacity/probe.rs"]
mod probe;
use probe::{probe, probe_secs, Probe, PROBE_RATE};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Connections the fill sends from (`BENCH_CONNECTIONS` overrides).
const CONNECTIONS: usize = 64;
/// How long a restart of a large store may take before the bench gives up.
const START_BOUND: Duration = Duration::from_secs(900);

use common::{blocks_under, bytes_under, upstream_body as body};

/// `VmRSS` and `VmHWM` of `pid`, in bytes.
fn rss(pid: i32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Sends callbacks `from..to` from [`CONNECTIONS`] connections (or
/// `BENCH_CONNECTIONS`); returns the body bytes.
async fn fill(relay: &mut common::Relay, from: u64, to: u64) -> u64 {
    let connections: usize = env_or("BENCH_CONNECTIONS", CONNECTIONS);
    let client = reqwest::Client::builder().pool_max_idle_per_host(connections).build().unwrap();
    let url = relay.hook_url(Some("ActionUpdated"));
    let slots = Arc::new(Semaphore::new(connections));
    let mut tasks = tokio::task::JoinSet::new();
    let mut sent = 0;
    for n in from..to {
        let permit = slots.clone().acquire_owned().await.unwrap();
        let (client, url) = (client.clone(), url.clone());
        tasks.spawn(async move {
            let _permit = permit;
            let b = body(n);
            let len = b.len() as u64;
            let r =
                client.post(&url).header("content-type", "application/json").body(b).send().await;
            match r {
                Ok(r) if r.status() == 200 => Ok(len),
                Ok(r) => Err(format!("callback {n}: HTTP {}", r.status())),
                Err(e) => Err(format!("callback {n}: {e}")),
            }
        });
        // Reap as we go: millions of finished tasks would otherwise be held.
        while let Some(done) = tasks.try_join_next() {
            sent += reaped(relay, done);
        }
    }
    while let Some(done) = tasks.join_next().await {
        sent += reaped(relay, done);
    }
    sent
}

/// One callback's bytes; a failed one ends the run with what the relay said last.
fn reaped(
    relay: &mut common::Relay,
    done: Result<Result<u64, String>, tokio::task::JoinError>,
) -> u64 {
    match done {
        Ok(Ok(len)) => len,
        Ok(Err(e)) => {
            let logs = relay.logs();
            let tail: Vec<&str> = logs.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "{e}; the relay exited: {:?}; its last lines:\n{}",
                relay.exited(),
                tail.join("\n")
            )
        }
        Err(e) => panic!("a sender task failed: {e}"),
    }
}

fn config(dir: &Path, sink: &Sink) -> String {
    let window = match std::env::var("BENCH_DEDUP_WINDOW") {
        Ok(window) => format!("dedup_window = {window:?}\n"),
        Err(_) => String::new(),
    };
    let tail = format!("{window}\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n", sink.url());
    common::config_with(&dir.join("data"), "", &tail)
        .replace("level = \"info\"", "level = \"hookrelay=info,actix_server=warn\"")
}

/// Waits until the sink has received `n` deliveries and the relay has nothing left to
/// dispatch or deliver (the kept case). The sink's count, not the relay's counter: the
/// relay restarts at every point, and its counters with it.
async fn delivered(relay: &common::Relay, sink: &Sink, n: u64) {
    loop {
        if sink.count() as u64 >= n {
            let text = relay.metrics().await;
            let inbox = common::metric(&text, "hookrelay_inbox_events", &[]).unwrap_or(1.0);
            let pending = common::metric(
                &text,
                "hookrelay_queue_depth",
                &[("destination", "crm"), ("state", "pending")],
            )
            .unwrap_or(1.0);
            if inbox == 0.0 && pending == 0.0 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// How long after `since` the inbox and every queue are counted (`queue.counting`
/// false or absent: a build that counts before it is ready; the inbox gauge present).
async fn until_counted(relay: &common::Relay, since: Instant) -> Duration {
    loop {
        let (status, v) = relay.admin_get("/admin/destinations").await;
        let counting = v["destinations"]
            .as_array()
            .is_some_and(|d| d.iter().any(|d| d["queue"]["counting"] == true));
        let inbox = common::metric(&relay.metrics().await, "hookrelay_inbox_events", &[]);
        if status == 200 && !counting && inbox.is_some() {
            return since.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Restarts on the same files, this build and `BENCH_RESTART_BASELINE` in turn,
/// [`RESTART_ROUNDS`] each: the median restart to ready and to counted of each.
async fn restart_rounds(
    relay: &mut common::Relay,
    builds: [&str; 2],
    backend: &str,
    case: &str,
    dir: &Path,
    text: &str,
) -> [(Duration, Duration); 2] {
    let mut took: [Vec<(Duration, Duration)>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..RESTART_ROUNDS {
        for (i, bin) in builds.iter().enumerate().rev() {
            relay.kill();
            let started = Instant::now();
            let (again, ready) = start(bin, backend, case, dir, text).await;
            *relay = again;
            took[i].push((ready, until_counted(relay, started).await));
        }
    }
    took.map(|mut t| {
        t.sort();
        t[t.len() / 2]
    })
}

/// Rounds of [`restart_rounds`] and [`probe::probe_rounds`].
const RESTART_ROUNDS: usize = 3;

/// Waits until the relay has dispatched everything (the backlog case: every event a
/// pending delivery, none left in the inbox, as the case means; a flood leaves the
/// dispatch behind, and a restart then reads the inbox left).
async fn dispatched(relay: &common::Relay) {
    loop {
        let text = relay.metrics().await;
        if common::metric(&text, "hookrelay_inbox_events", &[]) == Some(0.0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What one point measured.
struct Point {
    events: u64,
    fill_rate: f64,
    rss: u64,
    hwm: u64,
    /// Bytes on the disk (blocks) and the files' lengths.
    disk: u64,
    length: u64,
    body_bytes: u64,
    probe: Probe,
    restart: Duration,
    /// From the restart to every queue counted.
    counted: Duration,
    rss_ready: u64,
    rss_later: u64,
    /// This build's and the baseline's median restart to ready and to counted, on the
    /// same files (`BENCH_RESTART_BASELINE`).
    rounds: Option<[(Duration, Duration); 2]>,
}

async fn start(
    bin: &str,
    backend: &str,
    case: &str,
    dir: &Path,
    text: &str,
) -> (common::Relay, Duration) {
    start_with(bin, backend, case, dir, text, &[]).await
}

/// [`start`], with `extra` variables in the relay's environment (a probe round's).
async fn start_with(
    bin: &str,
    backend: &str,
    case: &str,
    dir: &Path,
    text: &str,
    extra: &[(String, String)],
) -> (common::Relay, Duration) {
    let started = Instant::now();
    let limit = std::env::var("BENCH_MEMORY_LIMIT").ok().filter(|_| backend == "redb");
    let mut env = vec![("HOOKRELAY__STORAGE__BACKEND", backend)];
    if case == "pruned" {
        // Pruned every 10 s (5 min by default), so that the point sees steady state.
        env.push(("HOOKRELAY__RETENTION__DELIVERED_BODIES", "1s"));
        env.push(("HOOKRELAY__RETENTION__INTERVAL", "10s"));
    }
    if let Some(limit) = &limit {
        env.push(("HOOKRELAY__STORAGE__MEMORY_LIMIT_BYTES", limit.as_str()));
    }
    env.extend(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let relay = common::Relay::start_listening_within(bin, dir, text, &env, START_BOUND).await;
    relay.wait_ready_within(START_BOUND).await;
    (relay, started.elapsed())
}

/// One case on one build, through every point.
async fn case(bin: &str, backend: &str, name: &str, points: &[u64]) -> Vec<Point> {
    let sink = Sink::start_counting().await;
    let dir = tempfile::tempdir().unwrap();
    let filled = std::env::var("BENCH_FILLED").ok();
    if let Some(filled) = &filled {
        // The store of an earlier fill, served in place: no fill, the points' numbers only
        // label the output.
        std::os::unix::fs::symlink(filled, dir.path().join("data")).unwrap();
    }
    let text = config(dir.path(), &sink);
    let (mut relay, _) = start(bin, backend, name, dir.path(), &text).await;
    let backlog = name == "backlog" || name == "flood";
    if backlog {
        assert_eq!(relay.admin_post("/admin/destinations/crm/pause", None).await.0, 200);
    }
    let (mut stored, mut body_bytes) = (0u64, 0u64);
    // A filled store's earlier probes used the first numbers: new ones, or the window
    // would deduplicate them.
    let mut sent_probe = match filled {
        Some(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.as_secs() * 1_000_000),
        None => 0,
    };
    let mut out = Vec::new();
    for &point in points {
        let fill_from = stored;
        let started = Instant::now();
        if filled.is_none() {
            body_bytes += fill(&mut relay, 1_000_000_000 + stored, 1_000_000_000 + point).await;
        }
        stored = point;
        if filled.is_some() {
            // Nothing sent: nothing to wait for.
        } else if name == "flood" {
            // Killed with the inbox as it stands (below).
        } else if backlog {
            dispatched(&relay).await;
        } else {
            delivered(&relay, &sink, stored + sent_probe).await;
        }
        let fill_rate = (point - fill_from) as f64 / started.elapsed().as_secs_f64();
        // Let the engine's flusher and the relay settle before reading the memory.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (rss_now, hwm) = rss(relay.pid());
        let data = dir.path().join("data");
        let (disk, length) = (blocks_under(&data), bytes_under(&data));
        let probe = probe(&relay, 2_000_000_000 + sent_probe).await;
        sent_probe += PROBE_RATE * probe_secs();
        if let Ok(baseline) = std::env::var("BENCH_PROBE_BASELINE") {
            let builds = [bin, baseline.as_str()];
            let at = (backend, name, point);
            probe::probe_rounds(&mut relay, builds, at, dir.path(), &text, &mut sent_probe).await;
        }
        if name == "flood" {
            let inbox = common::metric(&relay.metrics().await, "hookrelay_inbox_events", &[]);
            eprintln!("{backend} {name} at {point}: inbox {inbox:?} undispatched at the kill");
        }
        relay.kill();
        let restarted = Instant::now();
        let (again, restart) = start(bin, backend, name, dir.path(), &text).await;
        relay = again;
        let rss_ready = rss(relay.pid()).0;
        let counted = until_counted(&relay, restarted).await;
        tokio::time::sleep(Duration::from_secs(20)).await;
        let rss_later = rss(relay.pid()).0;
        let rounds = match std::env::var("BENCH_RESTART_BASELINE") {
            Ok(baseline) => Some(
                restart_rounds(&mut relay, [bin, &baseline], backend, name, dir.path(), &text)
                    .await,
            ),
            Err(_) => None,
        };
        let p = Point {
            events: point,
            fill_rate,
            rss: rss_now,
            hwm,
            disk,
            length,
            body_bytes,
            probe,
            restart,
            counted,
            rss_ready,
            rss_later,
            rounds,
        };
        eprintln!(
            "{backend} {name} at {point}: filled at {:.0}/s, RSS {} MB (peak {}), disk {} MB ({:.2}x the bodies; files {} MB long), \
             {}, restart to ready {:.1} s (counted {:.1} s), RSS {} MB once ready, {} MB 20 s later{}",
            p.fill_rate,
            p.rss >> 20,
            p.hwm >> 20,
            p.disk >> 20,
            p.disk as f64 / p.body_bytes as f64,
            p.length >> 20,
            p.probe.summary(),
            p.restart.as_secs_f64(),
            p.counted.as_secs_f64(),
            p.rss_ready >> 20,
            p.rss_later >> 20,
            p.rounds.map_or(String::new(), |[this, base]| format!(
                "; restarts on these files, medians of {RESTART_ROUNDS} interleaved: this build ready {:.1} s, counted {:.1} s; \
                 baseline ready {:.1} s, counted {:.1} s",
                this.0.as_secs_f64(),
                this.1.as_secs_f64(),
                base.0.as_secs_f64(),
                base.1.as_secs_f64()
            ))
        );
        out.push(p);
    }
    out
}

fn main() {
    let points: Vec<u64> = env_or("BENCH_POINTS", "1000000".to_owned())
        .split(',')
        .map(|p| p.trim().parse().expect("BENCH_POINTS: numbers, comma-separated"))
        .collect();
    let cases: Vec<String> = env_or("BENCH_CASES", "kept,backlog".to_owned())
        .split(',')
        .map(|c| c.trim().to_owned())
        .collect();
    let backends: Vec<String> = env_or("BENCH_BACKENDS", "sled,redb".to_owned())
        .split(',')
        .map(|c| c.trim().to_owned())
        .collect();
    let mut builds = vec![("this build".to_owned(), common::binary().to_owned())];
    if let Ok(bin) = std::env::var("BENCH_BASELINE") {
        builds.push(("baseline".to_owned(), bin));
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut rows = Vec::new();
        for (label, bin) in &builds {
            for backend in &backends {
                assert!(backend == "sled" || backend == "redb", "BENCH_BACKENDS: sled, redb");
                for name in &cases {
                    assert!(
                        ["kept", "backlog", "flood", "pruned"].contains(&name.as_str()),
                        "BENCH_CASES: kept, backlog, flood, pruned"
                    );
                    let points = case(bin, backend, name, &points).await;
                    rows.push((format!("{label} | {backend}"), name.clone(), points));
                }
            }
        }
        println!(
            "\nshipped defaults (durable), bodies ~{} B, {} connections; data dir: bytes on the disk:\n",
            body(1).len(),
            env_or("BENCH_CONNECTIONS", CONNECTIONS)
        );
        println!("| build | backend | case | events | fill (events/s) | RSS (peak) | data dir | disk / bodies | p99 ack at {PROBE_RATE}/s (p99.9; checkpoints during it, mean; dedup keys purged) | restart to ready (counted) | RSS once ready, +20 s |");
        println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (label, name, points) in &rows {
            for p in points {
                println!(
                    "| {label} | {name} | {} | {:.0} | {} MB ({} MB) | {} MB | {:.2}x | {:.1} ms ({:.1} ms; {}, {:.1} ms; {}) | {:.1} s ({:.1} s) | {} MB, {} MB |",
                    p.events,
                    p.fill_rate,
                    p.rss >> 20,
                    p.hwm >> 20,
                    p.disk >> 20,
                    p.disk as f64 / p.body_bytes as f64,
                    p.probe.ack_p99.as_secs_f64() * 1e3,
                    p.probe.ack_p999.as_secs_f64() * 1e3,
                    p.probe.checkpoints,
                    p.probe.checkpoint_ms,
                    p.probe.purged.map_or("?".to_owned(), |n| n.to_string()),
                    p.restart.as_secs_f64(),
                    p.counted.as_secs_f64(),
                    p.rss_ready >> 20,
                    p.rss_later >> 20
                );
            }
            for pair in points.windows(2) {
                let (a, b) = (&pair[0], &pair[1]);
                let n = (b.events - a.events) as f64;
                println!(
                    "| {label} | {name} | slope {}→{} | | {:.0} B/event | | {:.0} B/event | | {:.2} s per million | |",
                    a.events,
                    b.events,
                    (b.rss as f64 - a.rss as f64) / n,
                    (b.disk as f64 - a.disk as f64) / n,
                    (b.restart.as_secs_f64() - a.restart.as_secs_f64()) / n * 1e6
                );
            }
        }
    });
}
