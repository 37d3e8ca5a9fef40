//! The capacity bench's probe: callbacks at a steady rate, timed to their ack, with
//! what redb's checkpoints did meanwhile; and rounds of it on the same files, two builds
//! or two settings in turn.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{body, common, start_with, RESTART_ROUNDS};
use common::env_or;

/// The steady load the ack latency is measured under.
pub(crate) const PROBE_RATE: u64 = 200;
const PROBE_SECS: u64 = 10;

/// The probe's length in seconds: [`PROBE_SECS`], or `BENCH_PROBE_SECS` (a minute holds
/// one pass of the dedup purge for certain).
pub(crate) fn probe_secs() -> u64 {
    env_or("BENCH_PROBE_SECS", PROBE_SECS)
}

/// What the probe saw: the p99 and p99.9 ack latency, and redb's checkpoints during it
/// (how many, and their mean time: the time each held the writers, acks included).
pub(crate) struct Probe {
    pub(crate) ack_p99: Duration,
    pub(crate) ack_p999: Duration,
    pub(crate) checkpoints: f64,
    pub(crate) checkpoint_ms: f64,
    /// Expired dedup keys the purge removed during it (`None`: a build without the
    /// counter).
    pub(crate) purged: Option<f64>,
    /// Bytes the checkpoint thread handed to the kernel during it, per checkpoint:
    /// redb's pages left in its write buffer for the checkpoint to write, under the
    /// writer lock; and the bytes every other thread wrote (the redo log, and pages
    /// redb's buffer evicted early), per callback.
    pub(crate) checkpoint_bytes: f64,
    pub(crate) other_bytes: f64,
}

/// Bytes written through `write`-family calls (`wchar`) by the threads of `pid` named
/// `name`, and by all the others: from `/proc/{pid}/task/*/io`.
fn written_by(pid: i32, name: &str) -> (u64, u64) {
    let (mut named, mut others) = (0, 0);
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return (0, 0) };
    for task in tasks.flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        let io = std::fs::read_to_string(path.join("io")).unwrap_or_default();
        let wchar = io
            .lines()
            .find_map(|l| l.strip_prefix("wchar:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if comm.trim() == name {
            named += wchar;
        } else {
            others += wchar;
        }
    }
    (named, others)
}

/// Dedup keys purged so far, from `/metrics`.
async fn purged(relay: &common::Relay) -> Option<f64> {
    common::metric(&relay.metrics().await, "hookrelay_dedup_keys_purged_total", &[])
}

/// redb's checkpoints so far and their total time (s), from `/metrics`.
async fn checkpoints(relay: &common::Relay) -> (f64, f64) {
    common::histogram(&relay.metrics().await, "hookrelay_store_checkpoint_duration_seconds")
}

/// Callbacks `from..` sent at [`PROBE_RATE`] for [`PROBE_SECS`]: what [`Probe`] says.
pub(crate) async fn probe(relay: &common::Relay, from: u64) -> Probe {
    let (count0, sum0) = checkpoints(relay).await;
    let purged0 = purged(relay).await;
    let written0 = written_by(relay.pid(), "redb-checkpoint");
    let client = reqwest::Client::new();
    let url = relay.hook_url(Some("ActionUpdated"));
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / PROBE_RATE));
    let mut tasks = tokio::task::JoinSet::new();
    for n in from..from + PROBE_RATE * probe_secs() {
        tick.tick().await;
        let (client, url) = (client.clone(), url.clone());
        tasks.spawn(async move {
            let started = Instant::now();
            let r = client
                .post(&url)
                .header("content-type", "application/json")
                .body(body(n))
                .send()
                .await;
            assert_eq!(r.expect("callback").status(), 200);
            started.elapsed()
        });
    }
    let mut took: Vec<Duration> = Vec::new();
    while let Some(t) = tasks.join_next().await {
        took.push(t.unwrap());
    }
    took.sort();
    let (count1, sum1) = checkpoints(relay).await;
    let purged = purged(relay).await.zip(purged0).map(|(after, before)| after - before);
    let made = count1 - count0;
    let written1 = written_by(relay.pid(), "redb-checkpoint");
    let sent = (PROBE_RATE * probe_secs()) as f64;
    Probe {
        ack_p99: took[took.len() * 99 / 100],
        ack_p999: took[took.len() * 999 / 1000],
        checkpoints: made,
        checkpoint_ms: if made > 0.0 { (sum1 - sum0) / made * 1e3 } else { 0.0 },
        purged,
        checkpoint_bytes: if made > 0.0 {
            written1.0.saturating_sub(written0.0) as f64 / made
        } else {
            0.0
        },
        other_bytes: written1.1.saturating_sub(written0.1) as f64 / sent,
    }
}

/// Probes on the same files, this build and `BENCH_PROBE_BASELINE` in turn,
/// [`RESTART_ROUNDS`] each, each started anew and given [`PROBE_SETTLE`] before its
/// probe: whether a difference in the tail is the files the fill left or the build
/// serving them. Prints every round and the medians; leaves `relay` the last started.
pub(crate) async fn probe_rounds(
    relay: &mut common::Relay,
    builds: [&str; 2],
    (backend, case, point): (&str, &str, u64),
    dir: &Path,
    text: &str,
    sent_probe: &mut u64,
) {
    let mut seen: [Vec<Probe>; 2] = [Vec::new(), Vec::new()];
    for round in 0..RESTART_ROUNDS {
        for (i, bin) in builds.iter().enumerate().rev() {
            relay.kill();
            let extra = probe_env(["BENCH_PROBE_ENV", "BENCH_PROBE_BASELINE_ENV"][i]);
            *relay = start_with(bin, backend, case, dir, text, &extra).await.0;
            tokio::time::sleep(PROBE_SETTLE).await;
            let p = probe(relay, 2_000_000_000 + *sent_probe).await;
            *sent_probe += PROBE_RATE * probe_secs();
            eprintln!(
                "{backend} {case} at {point}, probe round {round}, {}: p99 ack {:.1} ms (p99.9 {:.1}); \
                 {} checkpoints of {:.1} ms writing {:.0} KiB each; {:.0} B per callback by other threads",
                ["this build", "baseline"][i],
                p.ack_p99.as_secs_f64() * 1e3,
                p.ack_p999.as_secs_f64() * 1e3,
                p.checkpoints,
                p.checkpoint_ms,
                p.checkpoint_bytes / 1024.0,
                p.other_bytes,
            );
            seen[i].push(p);
        }
    }
    for (i, mut probes) in seen.into_iter().enumerate() {
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let mut p99: Vec<f64> = probes.iter().map(|p| p.ack_p99.as_secs_f64() * 1e3).collect();
        let mut ms: Vec<f64> = probes.iter().map(|p| p.checkpoint_ms).collect();
        let mut kib: Vec<f64> = probes.iter().map(|p| p.checkpoint_bytes / 1024.0).collect();
        let mut count: Vec<f64> = probes.iter_mut().map(|p| p.checkpoints).collect();
        eprintln!(
            "{backend} {case} at {point}, {} on the same files, medians of {RESTART_ROUNDS}: p99 ack {:.1} ms, \
             {} checkpoints of {:.1} ms writing {:.0} KiB each",
            ["this build", "baseline"][i],
            median(&mut p99),
            median(&mut count),
            median(&mut ms),
            median(&mut kib),
        );
    }
}

/// The variables of `name` (`KEY=VALUE;KEY=VALUE`), for one side of [`probe_rounds`]:
/// the same build probed under two settings.
fn probe_env(name: &str) -> Vec<(String, String)> {
    let text = std::env::var(name).unwrap_or_default();
    text.split(';')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').expect("BENCH_PROBE_ENV: KEY=VALUE;KEY=VALUE");
            (k.trim().to_owned(), v.trim().to_owned())
        })
        .collect()
}

/// How long a relay of [`probe_rounds`] runs before its probe: the restart's own work
/// (counting the queues, the first checkpoint) out of it.
const PROBE_SETTLE: Duration = Duration::from_secs(20);
