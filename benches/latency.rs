//! Latency at a gentle, steady rate (issue 44), release build, shipped defaults:
//! callbacks offered open loop at a fixed rate (200/s by default) over 50 resources,
//! to relays whose one destination is a sink on loopback answering 200 at once, with
//! `ordering = "none"` and with `ordering = "per-resource"`, side by side in
//! interleaved rounds (and, with `BENCH_BASELINE=path/to/older/hookrelay`, that build
//! the same two ways). Per contender: the ack's p50/p99/p99.9 (from the scheduled send
//! to the answer) and end to end (from the scheduled send to the sink's receipt).
//! Medians over rounds: the 2-core machine is shared and noisy.
//!
//! Each round also times the two floors under the ack at the same rate: the disk alone
//! (a 1 KiB append and its `fdatasync`, as the redo log makes an ack durable) and the
//! HTTP alone (the same callbacks, from the same client, to an actix-web server that
//! answers 200 at once: the bench's sink).
//!
//! Also per contender: the relay's CPU per callback, its group commits per callback and
//! their mean time (from its `/metrics`), when the acks over 50 ms were sent (a
//! stall shows as one cluster), and where the slowest 1% end to end fell.
//!
//! Run: `cargo bench --bench latency` (env: BENCH_ROUNDS (3), BENCH_SECS (20),
//! BENCH_RATE (200), BENCH_RESOURCES (50), BENCH_BASELINE; BENCH_STORAGE=`[storage]` lines
//! for one more contender of this build, `ordering = "none"`; BENCH_ONLY=text keeps the
//! contenders whose label holds it; BENCH_LOGS=path writes each relay's log to
//! path.{destination}).

#[path = "../tests/common/mod.rs"]
mod common;

use common::arrivals::{start_sink, Arrivals, Contender};
use common::env_or;
use common::open_loop::{await_arrivals, cpu_seconds, offer, tail_shape, written_bytes, Latencies};
use common::stats::median;

use std::sync::Arc;
use std::time::Duration;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

async fn contender(
    label: &str,
    bin: &str,
    sink: std::net::SocketAddr,
    ordering: &str,
    dest: &str,
) -> Contender {
    let ordering = match ordering {
        "none" => String::new(), // the shipped default, not set
        other => format!("ordering = \"{other}\"\n"),
    };
    Contender::start(label, bin, sink, dest, &ordering).await
}

/// One run's latencies, in ms: ack p50/p99/p99.9, end to end p50/p99/p99.9, and the
/// share delivered within 30 s of the last send; where the time went: the relay's CPU
/// per callback (µs), its group commits per callback and their mean time (ms).
#[derive(Clone, Copy, Default)]
struct Run {
    seen: Latencies,
    cpu_us: f64,
    commits: f64,
    commit_ms: f64,
    /// Bytes the relay wrote to the disk per callback (KiB).
    written_kib: f64,
    /// redb's checkpoints per second of the run, and their mean time (ms): the time a
    /// checkpoint holds the writers, acks included.
    checkpoints_per_s: f64,
    checkpoint_ms: f64,
}

/// The relay's group commits and redb checkpoints so far, each with their total time
/// (s), from one `/metrics` read: `(commits, commit_s, checkpoints, checkpoint_s)`.
async fn commits(relay: &common::Relay) -> (f64, f64, f64, f64) {
    let text = relay.metrics().await;
    let (commits, commit_s) = common::histogram(&text, "hookrelay_store_commit_duration_seconds");
    let (checkpoints, checkpoint_s) =
        common::histogram(&text, "hookrelay_store_checkpoint_duration_seconds");
    (commits, commit_s, checkpoints, checkpoint_s)
}

/// Offers `rate` callbacks a second for `secs` over `resources` resources.
async fn run(
    c: &Contender,
    arrivals: &Arrivals,
    rate: u64,
    secs: u64,
    resources: u64,
    base: u64,
) -> Run {
    let url = c.relay.hook_url(Some("ActionUpdated"));
    let cpu0 = cpu_seconds(c.relay.pid());
    let written0 = written_bytes(c.relay.pid());
    let (commits0, commit_s0, checkpoints0, checkpoint_s0) = commits(&c.relay).await;
    let offered = offer(&[url], &c.dest, rate, secs, resources, base).await;
    await_arrivals(arrivals, &offered, Duration::from_secs(30)).await;
    let n = offered.sent.len().max(1) as f64;
    let cpu_us = (cpu_seconds(c.relay.pid()) - cpu0) * 1e6 / n;
    let written_kib = (written_bytes(c.relay.pid()) - written0) / 1024.0 / n;
    let (commits1, commit_s1, checkpoints1, checkpoint_s1) = commits(&c.relay).await;
    let (commits, commit_s) = (commits1 - commits0, commit_s1 - commit_s0);
    let (checkpoints, checkpoint_s) = (checkpoints1 - checkpoints0, checkpoint_s1 - checkpoint_s0);
    // When the slowest acks came, from the run's start: a stall shows as a cluster.
    let mut slow: Vec<(Duration, Duration)> = offered
        .sent
        .iter()
        .map(|s| {
            (
                s.acked.saturating_duration_since(s.due),
                s.due.saturating_duration_since(offered.start),
            )
        })
        .filter(|(took, _)| *took > Duration::from_millis(50))
        .collect();
    slow.sort();
    if let (Some(first), Some(last)) =
        (slow.iter().map(|s| s.1).min(), slow.iter().map(|s| s.1).max())
    {
        eprintln!(
            "  {}: {} acks over 50 ms, sent from {:.2} s to {:.2} s into the run, the slowest {:.0} ms",
            c.label, slow.len(), first.as_secs_f64(), last.as_secs_f64(),
            slow.last().map_or(0.0, |s| s.0.as_secs_f64() * 1000.0)
        );
    }
    let mut seconds: Vec<u64> = slow.iter().map(|s| s.1.as_secs()).collect();
    seconds.sort();
    seconds.dedup();
    if !seconds.is_empty() {
        eprintln!("  slow acks in seconds {seconds:?} of the run");
    }
    eprintln!("  {} end to end: {}", c.label, tail_shape(&offered, arrivals));
    Run {
        seen: Latencies::of(&offered, arrivals),
        cpu_us,
        commits: commits / n,
        commit_ms: mean_ms(commit_s, commits),
        written_kib,
        checkpoints_per_s: checkpoints / secs as f64,
        checkpoint_ms: mean_ms(checkpoint_s, checkpoints),
    }
}

/// The mean in ms of `count` things that took `total_s` seconds together; NaN for none.
fn mean_ms(total_s: f64, count: f64) -> f64 {
    if count > 0.0 {
        total_s * 1000.0 / count
    } else {
        f64::NAN
    }
}

/// The floor a durable ack stands on: `rate` appends of `size` bytes a second for
/// `secs`, each followed by its own `fdatasync`, to a file on the filesystem the
/// relays' data directories are on, as the redo log writes (growing, emptied every
/// half second). Returns the p50/p99/p99.9 (ms) of one append and sync.
fn disk_alone(rate: u64, secs: u64, size: usize) -> [f64; 3] {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(dir.path().join("floor.log"))
        .unwrap();
    let record = vec![0x5a_u8; size];
    let start = std::time::Instant::now();
    let (mut at, mut emptied) = (0_u64, start);
    let mut took = Vec::new();
    for n in 0..rate * secs {
        let due = start + Duration::from_micros(n * 1_000_000 / rate);
        if let Some(wait) = due.checked_duration_since(std::time::Instant::now()) {
            std::thread::sleep(wait);
        }
        let t = std::time::Instant::now();
        file.write_all_at(&record, at).unwrap();
        file.sync_data().unwrap();
        took.push(t.elapsed());
        at += size as u64;
        if emptied.elapsed() >= Duration::from_millis(500) {
            file.set_len(0).unwrap();
            (at, emptied) = (0, std::time::Instant::now());
        }
    }
    took.sort();
    [0.5, 0.99, 0.999].map(|p| common::stats::percentile_ms(&took, p))
}

fn main() {
    common::write_back_dirty_pages();
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let secs: u64 = env_or("BENCH_SECS", 20);
    let rate: u64 = env_or("BENCH_RATE", 200);
    let resources: u64 = env_or("BENCH_RESOURCES", 50);
    let baseline = std::env::var("BENCH_BASELINE").ok();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let arrivals: Arrivals = Arc::default();
        let sink = start_sink(arrivals.clone());
        let mut contenders = vec![
            contender("this build, ordering none", common::binary(), sink, "none", "new_none").await,
            contender("this build, ordering per-resource", common::binary(), sink, "per-resource", "new_ordered").await,
        ];
        // BENCH_STORAGE='flush_interval = "5s"': this build with those `[storage]`
        // settings too, side by side with the shipped defaults.
        if let Ok(storage) = std::env::var("BENCH_STORAGE") {
            let label = format!("this build, {storage}, ordering none");
            let c = Contender::start_with_storage(&label, common::binary(), sink, "var_none", "", &storage);
            contenders.push(c.await);
        }
        if let Some(bin) = &baseline {
            contenders.push(contender("baseline, ordering none", bin, sink, "none", "base_none").await);
            contenders.push(contender("baseline, ordering per-resource", bin, sink, "per-resource", "base_ordered").await);
        }
        // BENCH_ONLY=per-resource: only the contenders whose label holds it.
        if let Ok(only) = std::env::var("BENCH_ONLY") {
            contenders.retain(|c| c.label.contains(&only));
        }
        let mut runs: Vec<Vec<Run>> = vec![Vec::new(); contenders.len()];
        // Per round, p50/p99/p99.9 (ms): the disk alone, the HTTP alone, the load
        // generator's lateness in the HTTP alone.
        let mut floors: Vec<[f64; 3]> = Vec::new();
        let (mut https, mut lates) = (floors.clone(), floors.clone());
        for round in 0..rounds {
            // The disk alone at the same rate, in each round beside the relays: the
            // part of an ack's tail that is the disk's own.
            let floor = tokio::task::spawn_blocking(move || disk_alone(rate, secs.min(10), 1024));
            let floor = floor.await.unwrap();
            eprintln!(
                "round {}: the disk alone, 1 KiB append + fdatasync at {rate}/s: p50/p99/p99.9 {:.2}/{:.2}/{:.2} ms",
                round + 1, floor[0], floor[1], floor[2]
            );
            floors.push(floor);
            // The HTTP alone: the same client and callbacks, to the sink, which stores
            // nothing and answers at once (no `webhook-id`: it counts no arrival).
            let url = format!("http://{sink}/http-alone");
            let base = 10_000_000 * (round as u64 + 1);
            let offered = offer(&[url], "", rate, secs.min(10), resources, base).await;
            let seen = Latencies::of(&offered, &arrivals);
            let (http, late) = (seen.ack, seen.late);
            eprintln!(
                "round {}: the HTTP alone at {rate}/s: ack p50/p99/p99.9 {:.2}/{:.2}/{:.2} ms, of which the load generator's own lateness {:.2}/{:.2}/{:.2} ms",
                round + 1, http[0], http[1], http[2], late[0], late[1], late[2]
            );
            https.push(http);
            lates.push(late);
            for (i, c) in contenders.iter().enumerate() {
                // Distinct bodies every run: identical ones would be deduplicated.
                let base = 10_000_000 * (round as u64 + 1) + 1_000_000 * (i as u64 + 1);
                let r = run(c, &arrivals, rate, secs, resources, base).await;
                eprintln!(
                    "round {}: {}: ack p50/p99/p99.9 {:.2}/{:.2}/{:.2} ms, e2e {:.2}/{:.2}/{:.2} ms, {:.1}% delivered, CPU {:.0} µs/callback, {:.2} commits/callback of {:.2} ms, {:.1} KiB written/callback, {:.2} checkpoints/s of {:.2} ms, the load generator late p50/p99 {:.2}/{:.2} ms",
                    round + 1, c.label, r.seen.ack[0], r.seen.ack[1], r.seen.ack[2], r.seen.e2e[0], r.seen.e2e[1], r.seen.e2e[2], r.seen.delivered * 100.0, r.cpu_us, r.commits, r.commit_ms, r.written_kib, r.checkpoints_per_s, r.checkpoint_ms, r.seen.late[0], r.seen.late[1]
                );
                runs[i].push(r);
                if let Ok(path) = std::env::var("BENCH_LOGS") {
                    let _ = std::fs::write(format!("{path}.{}", c.dest), c.relay.logs());
                }
            }
        }
        println!("\nmedians of {rounds} interleaved rounds; {rate} callbacks/s open loop for {secs} s over {resources} resources; one destination answering 200 at once:\n");
        println!("| relay | ack p50 / p99 / p99.9 (ms) | end to end p50 / p99 / p99.9 (ms) | delivered | CPU per callback (µs) | ingress commits per callback | commit time (ms) | disk writes per callback (KiB) | checkpoints per s, mean (ms) |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        let floor = |i: usize| median(floors.iter().map(|f| f[i]).collect());
        println!(
            "| the disk alone: 1 KiB append + `fdatasync` at the same rate | {:.2} / {:.2} / {:.2} | | | | | | | |",
            floor(0), floor(1), floor(2)
        );
        let http = |i: usize| median(https.iter().map(|f| f[i]).collect());
        println!(
            "| the HTTP alone: the same callbacks to a server answering 200 at once | {:.2} / {:.2} / {:.2} | | | | | | | |",
            http(0), http(1), http(2)
        );
        let late = |i: usize| median(lates.iter().map(|f| f[i]).collect());
        println!(
            "| of which the load generator's lateness (scheduled send to the send's start) | {:.2} / {:.2} / {:.2} | | | | | | | |",
            late(0), late(1), late(2)
        );
        for (c, r) in contenders.iter().zip(&runs) {
            let m = |f: &dyn Fn(&Run) -> f64| median(r.iter().map(f).collect());
            println!(
                "| {} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} / {:.2} | {:.1}% | {:.0} | {:.2} | {:.2} | {:.1} | {:.2}, {:.2} |",
                c.label,
                m(&|x| x.seen.ack[0]), m(&|x| x.seen.ack[1]), m(&|x| x.seen.ack[2]),
                m(&|x| x.seen.e2e[0]), m(&|x| x.seen.e2e[1]), m(&|x| x.seen.e2e[2]),
                100.0 * m(&|x| x.seen.delivered),
                m(&|x| x.cpu_us), m(&|x| x.commits), m(&|x| x.commit_ms), m(&|x| x.written_kib),
                m(&|x| x.checkpoints_per_s), m(&|x| x.checkpoint_ms)
            );
        }
    });
}
