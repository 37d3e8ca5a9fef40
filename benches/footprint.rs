//! Disk footprint benchmark, release build, shipped defaults (durable, retention on):
//! N callbacks with realistic JSON bodies (the shape of the upstream's, ~750 bytes)
//! from 64 connections, each delivered once to a sink that answers 200; once every
//! delivery has arrived, the relay is stopped (final flush) and the data directory's
//! bytes are counted, then the store is opened again to count its live data (every
//! key and value: what a perfectly compact engine would keep; the rest is sled's log
//! holding old versions until it cleans a segment). Reported per event and as a
//! multiple of the body bytes, for this
//! build and, with `BENCH_BASELINE=path/to/older/hookrelay`, for that build, in
//! interleaved rounds (medians).
//!
//! Contenders: this build with its defaults, this build with `storage.compression =
//! true`, and the baseline if given.
//!
//! A second phase, `retention`, runs the same load with `retention.delivered = "1s"`
//! in two halves and measures the store after each: with retention running, the store
//! holds only the retention window, so the second half must not grow it by as much
//! as the first.
//!
//! Run: `cargo bench --bench footprint` (env: BENCH_ROUNDS, BENCH_EVENTS,
//! BENCH_BASELINE).

#[path = "../tests/common/mod.rs"]
mod common;

use common::env_or;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::sink::Sink;
use tokio::sync::Semaphore;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CONNECTIONS: usize = 64;

use common::{bytes_under, upstream_body as body};

/// Sends callbacks `from..to` and returns the body bytes sent.
async fn send_all(relay: &common::Relay, from: u64, to: u64) -> u64 {
    let client = reqwest::Client::builder().pool_max_idle_per_host(CONNECTIONS).build().unwrap();
    let url = relay.hook_url(Some("ActionUpdated"));
    let slots = Arc::new(Semaphore::new(CONNECTIONS));
    let mut tasks = Vec::new();
    for n in from..to {
        let (client, url, slots) = (client.clone(), url.clone(), slots.clone());
        tasks.push(tokio::spawn(async move {
            let _s = slots.acquire_owned().await.unwrap();
            let b = body(n);
            let len = b.len() as u64;
            let r =
                client.post(&url).header("content-type", "application/json").body(b).send().await;
            assert_eq!(r.expect("callback").status(), 200);
            len
        }));
    }
    let mut sent = 0;
    for t in tasks {
        sent += t.await.unwrap();
    }
    sent
}

fn config(dir: &Path, sink: &Sink, retention: &str) -> String {
    let tail = format!("\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n", sink.url());
    common::config_with(&dir.join("data"), "", &tail)
        .replace("level = \"info\"", "level = \"hookrelay=info,actix_server=warn\"")
        + retention
}

/// A build, and the environment it runs with.
struct Contender {
    label: String,
    bin: String,
    env: Vec<(&'static str, &'static str)>,
}

async fn start(c: &Contender, dir: &Path, config: &str) -> common::Relay {
    common::Relay::start_full(&c.bin, dir, config, &c.env).await
}

/// The live data of a stopped relay's sled store: the bytes of every key and value in
/// every tree, what a perfectly compact engine would keep.
fn live_bytes(data: &Path) -> u64 {
    // sled's `conf` ends with a binary checksum: read it as lossy text.
    let conf = std::fs::read(data.join("conf")).unwrap();
    let compressed = String::from_utf8_lossy(&conf).contains("use_compression: true");
    let db = sled::Config::new().path(data).use_compression(compressed).open().unwrap();
    let mut total = 0;
    for name in db.tree_names() {
        for item in db.open_tree(&name).unwrap().iter() {
            let (k, v) = item.unwrap();
            total += (k.len() + v.len()) as u64;
        }
    }
    total
}

/// One run of `c`: returns (bytes on disk, live bytes, body bytes).
async fn once(c: &Contender, n: u64) -> (u64, u64, u64) {
    let sink = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut relay = start(c, dir.path(), &config(dir.path(), &sink, "")).await;
    let sent = send_all(&relay, 0, n).await;
    sink.wait_for(n as usize, Duration::from_secs(600)).await;
    // Let the last attempts be recorded before the stop.
    tokio::time::sleep(Duration::from_secs(1)).await;
    relay.signal(libc::SIGTERM);
    assert!(relay.wait_exit(Duration::from_secs(60)).success());
    if let Ok(keep) = std::env::var("BENCH_KEEP") {
        let _ = std::process::Command::new("cp")
            .args(["-r"])
            .arg(dir.path().join("data"))
            .arg(&keep)
            .status();
    }
    let data = dir.path().join("data");
    let disk = bytes_under(&data);
    (disk, live_bytes(&data), sent)
}

/// Retention on: returns the store size after the first and after the second half.
async fn with_retention(c: &Contender, n: u64) -> (u64, u64) {
    let sink = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let retention = "\n[retention]\ndelivered = \"1s\"\ninterval = \"1s\"\n";
    let relay = start(c, dir.path(), &config(dir.path(), &sink, retention)).await;
    let data = dir.path().join("data");
    let mut sizes = Vec::new();
    for half in 0..2u64 {
        send_all(&relay, half * n / 2, (half + 1) * n / 2).await;
        sink.wait_for(((half + 1) * n / 2) as usize, Duration::from_secs(600)).await;
        // Two retention passes after the last delivery.
        tokio::time::sleep(Duration::from_secs(4)).await;
        sizes.push(bytes_under(&data));
    }
    (sizes[0], sizes[1])
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let n: u64 = env_or("BENCH_EVENTS", 50_000);
    let this = common::binary().to_owned();
    let mut contenders = vec![
        Contender { label: "this build (default)".into(), bin: this.clone(), env: vec![] },
        Contender {
            label: "this build, storage.compression = true".into(),
            bin: this,
            env: vec![("HOOKRELAY__STORAGE__COMPRESSION", "true")],
        },
    ];
    if let Ok(bin) = std::env::var("BENCH_BASELINE") {
        contenders.push(Contender { label: "baseline".into(), bin, env: vec![] });
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut ratios = vec![Vec::new(); contenders.len()];
        let mut per_event = vec![Vec::new(); contenders.len()];
        let mut live_ratios = vec![Vec::new(); contenders.len()];
        let mut retained = vec![Vec::new(); contenders.len()];
        for round in 0..rounds {
            for (i, c) in contenders.iter().enumerate() {
                let label = &c.label;
                let (disk, live, bodies) = once(c, n).await;
                let ratio = disk as f64 / bodies as f64;
                eprintln!("round {}: {label}: {disk} bytes on disk for {bodies} body bytes ({ratio:.2}x, {} B/event); live data {live} bytes ({:.2}x)", round + 1, disk / n, live as f64 / bodies as f64);
                ratios[i].push(ratio);
                live_ratios[i].push(live as f64 / bodies as f64);
                per_event[i].push(disk as f64 / n as f64);
                let (first, second) = with_retention(c, n).await;
                eprintln!("round {}: {label}: retention 1s: {first} bytes after the first half, {second} after the second", round + 1);
                retained[i].push((first as f64, second as f64));
            }
        }
        println!("\nmedians of {rounds} interleaved rounds; {n} callbacks (~{} body bytes each), each delivered once; shipped defaults:\n", body(1).len());
        println!("| relay | bytes on disk / body bytes | bytes on disk per event | live data / body bytes | retention 1s: store after n/2, after n (MB) |");
        println!("|---|---:|---:|---:|---:|");
        for (i, Contender { label, .. }) in contenders.iter().enumerate() {
            let first = median(retained[i].iter().map(|r| r.0).collect()) / 1e6;
            let second = median(retained[i].iter().map(|r| r.1).collect()) / 1e6;
            println!("| {label} | {:.2}x | {:.0} | {:.2}x | {first:.1} / {second:.1} |", median(ratios[i].clone()), median(per_event[i].clone()), median(live_ratios[i].clone()));
        }
    });
}
