//! The benchmarks' open-loop load: callbacks sent at a fixed rate whatever the answers
//! (a closed loop slows down with the relay and hides its tail), spread over one or
//! more relays, and the latencies they saw: the ack (from the scheduled send to the
//! answer) and end to end (from the scheduled send to the sink's receipt, `arrivals`).

use std::time::{Duration, Instant};

use super::arrivals::Arrivals;
use super::stats::{percentile, percentile_ms};

/// The `n`th callback, about resource `n % resources` (about 1 KB).
pub fn body(n: u64, resources: u64) -> String {
    serde_json::json!({
        "data": {"type": "actions", "id": (n % resources).to_string(),
                 "attributes": {"name": "Smith v Jones", "seq": n, "notes": "x".repeat(600)}},
        "meta": {"debug": {"resthook": {"id": "46", "trigger_count": n, "event_name": "ActionUpdated"}}}
    })
    .to_string()
}

/// One acknowledged callback: the `webhook-id` its delivery to `dest` carries, when it
/// was due to be sent, when its sending began and when its answer came.
pub struct Sent {
    pub id: String,
    pub due: Instant,
    /// When the load generator began to send it: after `due` by the timer's and the
    /// scheduler's lateness, which every latency measured from `due` includes.
    pub began: Instant,
    pub acked: Instant,
}

/// An open-loop run's callbacks and its start.
pub struct Offered {
    pub sent: Vec<Sent>,
    pub offered: u64,
    pub start: Instant,
}

/// Offers `rate` callbacks a second for `secs` to `urls` in turn (bodies `base..`, over
/// `resources` resources); returns once every answer is in.
pub async fn offer(
    urls: &[String],
    dest: &str,
    rate: u64,
    secs: u64,
    resources: u64,
    base: u64,
) -> Offered {
    let client = reqwest::Client::builder().pool_max_idle_per_host(256).build().unwrap();
    let interval = Duration::from_nanos(1_000_000_000 / rate);
    let start = Instant::now() + Duration::from_millis(100);
    let (urls, dest) = (urls.to_vec(), dest.to_owned());
    // The sends are paced by a thread of their own, which sleeps to each one's due
    // time (the kernel's timers: tens of µs late) and hands it to the runtime. Paced
    // by tokio's timer (a millisecond's granularity), each send began 0.7-1.6 ms late
    // at the median, and every latency counted from the due time carried that.
    let runtime = tokio::runtime::Handle::current();
    let pacer = std::thread::spawn(move || {
        let mut tasks = Vec::new();
        for i in 0..rate * secs {
            let due = start + interval * i as u32;
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let (client, url, dest) =
                (client.clone(), urls[i as usize % urls.len()].clone(), dest.clone());
            let n = base + i;
            tasks.push(runtime.spawn(async move {
                let began = Instant::now();
                let r = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body(n, resources))
                    .send()
                    .await
                    .ok()?;
                let acked = Instant::now();
                // A relay answers with the event's id; a server that is not one (the
                // HTTP floor) with none: its answers count for the ack alone.
                let v: Option<serde_json::Value> = r.json().await.ok();
                let id = v.as_ref().and_then(|v| Some(format!("evt_{}_{dest}", v["id"].as_str()?)));
                Some(Sent { id: id.unwrap_or_default(), due, began, acked })
            }));
        }
        tasks
    });
    let tasks = tokio::task::spawn_blocking(move || pacer.join().unwrap()).await.unwrap();
    let mut sent = Vec::new();
    for t in tasks {
        if let Some(x) = t.await.unwrap() {
            sent.push(x);
        }
    }
    Offered { sent, offered: rate * secs, start }
}

/// Waits until every sent callback has arrived at the sink, or `within` has passed.
pub async fn await_arrivals(arrivals: &Arrivals, offered: &Offered, within: Duration) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let all = {
            let seen = arrivals.lock().unwrap();
            offered.sent.iter().all(|s| seen.contains_key(&s.id))
        };
        if all {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A run's latencies in ms: ack and end to end p50/p99/p99.9, and the share of the
/// offered callbacks delivered.
#[derive(Clone, Copy, Default)]
pub struct Latencies {
    pub ack: [f64; 3],
    pub e2e: [f64; 3],
    pub delivered: f64,
    /// The load generator's own lateness (from the scheduled send to the start of the
    /// sending), p50/p99/p99.9: part of every ack and end to end figure.
    pub late: [f64; 3],
}

impl Latencies {
    /// What `offered` saw, its deliveries as `arrivals` has them.
    pub fn of(offered: &Offered, arrivals: &Arrivals) -> Latencies {
        let mut ack: Vec<Duration> =
            offered.sent.iter().map(|s| s.acked.saturating_duration_since(s.due)).collect();
        let e2e: Vec<Duration> =
            end_to_end(offered, arrivals).into_iter().map(|(d, _)| d).collect();
        ack.sort();
        let mut late: Vec<Duration> =
            offered.sent.iter().map(|s| s.began.saturating_duration_since(s.due)).collect();
        late.sort();
        let q = |v: &[Duration]| {
            [percentile_ms(v, 0.5), percentile_ms(v, 0.99), percentile_ms(v, 0.999)]
        };
        Latencies {
            ack: q(&ack),
            e2e: q(&e2e),
            delivered: e2e.len() as f64 / offered.offered.max(1) as f64,
            late: q(&late),
        }
    }
}

/// Each delivered callback's time end to end (from its scheduled send to the sink's
/// receipt), shortest first.
fn end_to_end<'a>(offered: &'a Offered, arrivals: &Arrivals) -> Vec<(Duration, &'a Sent)> {
    let seen = arrivals.lock().unwrap();
    let mut e2e: Vec<(Duration, &Sent)> = offered
        .sent
        .iter()
        .filter_map(|s| seen.get(&s.id).map(|t| (t.saturating_duration_since(s.due), s)))
        .collect();
    e2e.sort_by_key(|(d, _)| *d);
    e2e
}

/// Where a run's slowest callbacks (end to end beyond its p99) fell: per second of the
/// run, how many, and how much of their time was the ack's; spread evenly means
/// queueing, a few seconds holding most of them means stalls. One line for a bench's
/// log.
#[allow(dead_code)] // Not every bench that includes the module prints it.
pub fn tail_shape(offered: &Offered, arrivals: &Arrivals) -> String {
    let e2e = end_to_end(offered, arrivals);
    let sorted: Vec<Duration> = e2e.iter().map(|(d, _)| *d).collect();
    let Some(p99) = percentile(&sorted, 0.99) else { return "no deliveries".into() };
    let slow: Vec<&(Duration, &Sent)> = e2e.iter().filter(|(d, _)| *d > p99).collect();
    let mut per_second = std::collections::BTreeMap::<u64, usize>::new();
    let mut acked = Duration::ZERO;
    let mut total = Duration::ZERO;
    for (d, s) in &slow {
        *per_second.entry(s.due.saturating_duration_since(offered.start).as_secs()).or_default() +=
            1;
        acked += s.acked.saturating_duration_since(s.due);
        total += *d;
    }
    let mut busiest: Vec<(u64, usize)> = per_second.into_iter().collect();
    busiest.sort_by_key(|b| std::cmp::Reverse(b.1));
    let seconds = busiest.len();
    // The wall clock of those seconds, to set beside the server's logs.
    let wall_start = std::time::SystemTime::now() - offered.start.elapsed();
    let clock = |s: u64| {
        let t = wall_start + Duration::from_secs(s);
        let secs = t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) % 86_400;
        format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
    };
    let top: Vec<String> =
        busiest.iter().take(6).map(|(s, n)| format!("{s}s ({}): {n}", clock(*s))).collect();
    format!(
        "{} beyond p99 {:.1} ms, in {seconds} seconds of the run (busiest {}, UTC); the ack is {:.0}% of their time",
        slow.len(),
        p99.as_secs_f64() * 1e3,
        top.join(", "),
        100.0 * acked.as_secs_f64() / total.as_secs_f64().max(1e-9)
    )
}

/// A process's user + system CPU time so far, in seconds.
/// The bytes process `pid` has caused to be written to storage so far
/// (`/proc/{pid}/io`, `write_bytes`: what reached the block layer, not what `write`
/// was handed); 0 when it cannot be read.
#[allow(dead_code)] // Not every bench that includes the module reads it.
pub fn written_bytes(pid: i32) -> f64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

pub fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}
