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

/// From one read of `/metrics`: redb's checkpoints so far, their total time (s), and
/// the dedup keys purged so far (`None`: a build without the counter).
async fn counters(relay: &common::Relay) -> (f64, f64, Option<f64>) {
    let text = relay.metrics().await;
    let (count, sum) = common::histogram(&text, "hookrelay_store_checkpoint_duration_seconds");
    (count, sum, common::metric(&text, "hookrelay_dedup_keys_purged_total", &[]))
}

impl Probe {
    /// What it saw, as the bench prints it.
    pub(crate) fn summary(&self) -> String {
        format!(
            "p99 ack {:.1} ms (p99.9 {:.1} ms; {} checkpoints of {:.1} ms writing {:.0} KiB each, \
             {:.0} B written per callback by other threads, and {} dedup keys purged during it)",
            self.ack_p99.as_secs_f64() * 1e3,
            self.ack_p999.as_secs_f64() * 1e3,
            self.checkpoints,
            self.checkpoint_ms,
            self.checkpoint_bytes / 1024.0,
            self.other_bytes,
            self.purged.map_or("?".to_owned(), |n| n.to_string()),
        )
    }
}

/// Callbacks `from..` sent at [`PROBE_RATE`] for [`PROBE_SECS`]: what [`Probe`] says.
pub(crate) async fn probe(relay: &common::Relay, from: u64) -> Probe {
    let (count0, sum0, purged0) = counters(relay).await;
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
    let (count1, sum1, purged1) = counters(relay).await;
    let written1 = written_by(relay.pid(), "redb-checkpoint");
    let made = count1 - count0;
    let per_checkpoint = |total: f64| if made > 0.0 { total / made } else { 0.0 };
    let sent = (PROBE_RATE * probe_secs()) as f64;
    Probe {
        ack_p99: took[took.len() * 99 / 100],
        ack_p999: took[took.len() * 999 / 1000],
        checkpoints: made,
        checkpoint_ms: per_checkpoint((sum1 - sum0) * 1e3),
        purged: purged1.zip(purged0).map(|(after, before)| after - before),
        checkpoint_bytes: per_checkpoint(written1.0.saturating_sub(written0.0) as f64),
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
            let (label, env) = SIDES[i];
            relay.kill();
            *relay = start_with(bin, backend, case, dir, text, &probe_env(env)).await.0;
            tokio::time::sleep(PROBE_SETTLE).await;
            let p = probe(relay, 2_000_000_000 + *sent_probe).await;
            *sent_probe += PROBE_RATE * probe_secs();
            eprintln!("{backend} {case} at {point}, probe round {round}, {label}: {}", p.summary());
            seen[i].push(p);
        }
    }
    for ((label, _), probes) in SIDES.iter().zip(&seen) {
        let median = |of: fn(&Probe) -> f64| {
            let mut v: Vec<f64> = probes.iter().map(of).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        eprintln!(
            "{backend} {case} at {point}, {label} on the same files, medians of {RESTART_ROUNDS}: \
             p99 ack {:.1} ms, {} checkpoints of {:.1} ms writing {:.0} KiB each",
            median(|p| p.ack_p99.as_secs_f64() * 1e3),
            median(|p| p.checkpoints),
            median(|p| p.checkpoint_ms),
            median(|p| p.checkpoint_bytes / 1024.0),
        );
    }
}

/// The two sides of [`probe_rounds`]: how each is labelled, and the variable holding
/// its environment.
const SIDES: [(&str, &str); 2] =
    [("this build", "BENCH_PROBE_ENV"), ("baseline", "BENCH_PROBE_BASELINE_ENV")];

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
