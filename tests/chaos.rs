//! The chaos harness: faults composed at random from a seed, against a real relay
//! process under steady callback load, on sled and on PostgreSQL; then the promises
//! are checked, progress first.
//!
//! Two fault lanes run at once, so faults overlap:
//! - the consumers: 503, connections refused, slower than the timeout, 410 (which
//!   pauses a destination: the harness resumes it, as an operator would), flapping;
//! - the relay and its store: SIGKILL (a supervisor restarts it, as systemd would),
//!   a full disk later freed (sled, on a tmpfs), a PostgreSQL restart or stop.
//!
//! Then every fault is undone and the invariants are checked:
//! - every acknowledged callback is delivered to each destination within
//!   [`DRAIN_BOUND`] of the last fault's end, or dead by policy;
//! - each occurrence (copies from several users) reaches a destination under one
//!   `webhook-id` only;
//! - no `webhook-id` is in flight twice at once;
//! - per-resource order holds on the ordered destination;
//! - no destination is stalled, and every circuit is closed;
//! - no valid callback got an answer other than 200.
//!
//! `cargo test --test chaos` runs the short schedule on every backend, side by side (CI);
//! `cargo test --test chaos -- --seconds 1800 --backend sled --seed 7` a long one.
//! A failing run prints its seed; the same seed replays the same schedule.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::pg::PgServer;
use common::scratch::{fill, Kind, Scratch};
use common::sink::{Mode, Received, Sink};
use common::{binary, Relay};
use serde_json::{json, Value};

/// How long after the last fault ends everything acknowledged must be delivered: a
/// claim lease of a relay killed holding it (`timeout` 2 s + 60 s; on PostgreSQL claims
/// outlive their process, on sled they die with it), then 30 s to drain.
const DRAIN_BOUND: Duration = Duration::from_secs(2 + 60 + 30);
/// Records the callbacks are about: few, so that each has many updates to order.
const RECORDS: u64 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Sled,
    Redb,
    Postgres,
}

impl Backend {
    /// As `storage.backend` and `--backend` name it.
    fn name(self) -> &'static str {
        match self {
            Backend::Sled => "sled",
            Backend::Redb => "redb",
            Backend::Postgres => "postgres",
        }
    }
}

struct Args {
    seed: u64,
    seconds: u64,
    backends: Vec<Backend>,
}

/// `--seed N`, `--seconds N`, `--backend sled|redb|postgres`; `None` when cargo passed a
/// test-name filter that does not name this harness (`cargo test some_test`).
fn args() -> Option<Args> {
    let mut args = Args {
        seed: fastrand::u64(..),
        seconds: 30,
        backends: vec![Backend::Sled, Backend::Redb, Backend::Postgres],
    };
    if let Ok(seed) = std::env::var("CHAOS_SEED") {
        args.seed = seed.parse().expect("CHAOS_SEED is a number");
    }
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seed" => args.seed = it.next().and_then(|v| v.parse().ok()).expect("--seed N"),
            "--seconds" => {
                args.seconds = it.next().and_then(|v| v.parse().ok()).expect("--seconds N")
            }
            "--minutes" => {
                args.seconds =
                    60 * it.next().and_then(|v| v.parse::<u64>().ok()).expect("--minutes N")
            }
            "--backend" => {
                args.backends = match it.next().as_deref() {
                    Some("sled") => vec![Backend::Sled],
                    Some("redb") => vec![Backend::Redb],
                    Some("postgres") => vec![Backend::Postgres],
                    other => panic!("--backend sled|redb|postgres, not {other:?}"),
                }
            }
            // What cargo's own harness would take: ignored.
            a if a.starts_with("--") => {}
            filter if !"chaos".contains(filter) && !filter.contains("chaos") => return None,
            _ => {}
        }
    }
    Some(args)
}

fn main() {
    let Some(args) = args() else {
        println!("chaos: 0 passed, 0 failed (filtered out)");
        return;
    };
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    // The backends' runs go side by side (each its own relay, store, sinks and load):
    // CI waits for the longer of the two, not their sum.
    let (seed, seconds) = (args.seed, args.seconds);
    let runs: Vec<_> = args
        .backends
        .iter()
        .map(|&backend| {
            println!("chaos on {backend:?}: seed {seed}, {seconds} s of faults");
            (backend, rt.spawn(run(backend, seed, seconds)))
        })
        .collect();
    let (mut passed, mut failed) = (0, 0);
    for (backend, run) in runs {
        match rt.block_on(run) {
            Ok(report) => {
                passed += 1;
                println!("chaos on {backend:?}: ok: {report}");
            }
            Err(e) => {
                failed += 1;
                let why = e.try_into_panic().ok().and_then(|p| {
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                });
                println!(
                    "chaos on {backend:?}: FAILED: {}\n  reproduce: cargo test --test chaos -- --seed {seed} --seconds {seconds} --backend {}",
                    why.unwrap_or_default(),
                    backend.name()
                );
            }
        }
    }
    // Tasks a failed run left behind (its supervisor) still hold relays: dropping the
    // runtime cancels them, and each relay is killed as it is dropped. `exit` would
    // skip those destructors and leave the processes running.
    drop(rt);
    println!("chaos: {passed} passed, {failed} failed");
    std::process::exit(i32::from(failed > 0));
}

/// A consumer that can also refuse connections (stopped and started again on the same
/// port), keeping what every incarnation received.
struct Consumer {
    sink: tokio::sync::Mutex<Option<Sink>>,
    addr: SocketAddr,
    /// The sinks stopped for "refused", kept whole: a request a halted sink's worker
    /// was still answering lands in its record after the halt returns (a copy taken
    /// then missed it: 3 callbacks "lost" in a 30-minute run, answered 200 "thanks").
    past: Mutex<Vec<Sink>>,
}

impl Consumer {
    async fn start() -> Arc<Consumer> {
        let sink = Sink::start().await;
        Arc::new(Consumer {
            addr: sink.addr,
            sink: tokio::sync::Mutex::new(Some(sink)),
            past: Mutex::default(),
        })
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    async fn set(&self, mode: Mode) {
        if let Some(s) = self.sink.lock().await.as_ref() {
            s.set_mode(mode);
        }
    }

    async fn refuse(&self) {
        let mut slot = self.sink.lock().await;
        if let Some(s) = slot.take() {
            // Halted, and kept: what it answers while stopping counts too.
            s.halt().await;
            self.past.lock().unwrap().push(s);
        }
    }

    async fn accept(&self) {
        let mut slot = self.sink.lock().await;
        if slot.is_none() {
            *slot = Some(Sink::start_on(self.addr).await);
        }
    }

    async fn received(&self) -> Vec<Received> {
        let mut got: Vec<Received> =
            self.past.lock().unwrap().iter().flat_map(|s| s.received()).collect();
        if let Some(s) = self.sink.lock().await.as_ref() {
            got.extend(s.received());
        }
        got
    }
}

/// The relay under test, restarted by the supervisor whenever it exits.
struct Supervised {
    relay: tokio::sync::Mutex<Relay>,
    hook_url: Mutex<String>,
    admin: Mutex<SocketAddr>,
    dir: std::path::PathBuf,
    config: String,
    restarts: Mutex<u32>,
}

impl Supervised {
    async fn start(dir: std::path::PathBuf, config: String) -> Arc<Supervised> {
        let relay = Relay::start(&dir, &config).await;
        Arc::new(Supervised {
            hook_url: Mutex::new(relay.hook_url(Some("ActionUpdated"))),
            admin: Mutex::new(relay.admin),
            relay: tokio::sync::Mutex::new(relay),
            dir,
            config,
            restarts: Mutex::new(0),
        })
    }

    /// Restarts the relay if it exited (a fail-stop, or our SIGKILL).
    async fn supervise(&self) {
        let mut relay = self.relay.lock().await;
        if relay.exited().is_some() {
            let fresh = Relay::start_listening(binary(), &self.dir, &self.config, &[]).await;
            *self.hook_url.lock().unwrap() = fresh.hook_url(Some("ActionUpdated"));
            *self.admin.lock().unwrap() = fresh.admin;
            *relay = fresh;
            *self.restarts.lock().unwrap() += 1;
        }
    }

    async fn kill(&self) {
        self.relay.lock().await.kill();
    }

    fn admin(&self) -> SocketAddr {
        *self.admin.lock().unwrap()
    }
}

/// What the load saw.
#[derive(Default)]
struct Seen {
    /// Acknowledged callbacks: marker → event id.
    acked: BTreeMap<String, String>,
    /// Answers other than 200 to valid callbacks.
    non_200: Vec<String>,
    sent: u64,
}

/// A callback body: an update of `record`, carrying `marker` in its data (so that
/// every occurrence is distinct), from upstream user `user` (in `meta`, which the
/// copies of one occurrence do not share).
fn body(record: u64, marker: &str, user: u32) -> String {
    json!({"data": {"type": "matters", "id": record.to_string(), "attributes": {"marker": marker}},
           "meta": {"debug": {"resthook": {"id": user.to_string()}}}})
    .to_string()
}

/// One client: posts updates (and now and then a second user's copy) until `until`,
/// retrying a refused callback with the same body as the upstream would.
async fn client(
    k: u32,
    relay: Arc<Supervised>,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<Mutex<bool>>,
    seed: u64,
) {
    let mut rng = fastrand::Rng::with_seed(seed ^ (u64::from(k) << 32));
    let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let mut n = 0u64;
    while !*stop.lock().unwrap() {
        n += 1;
        let marker = format!("m{k}-{n}");
        let record = rng.u64(..RECORDS);
        let copies = if rng.u8(..10) == 0 { 2 } else { 1 };
        for user in 0..copies {
            let text = body(record, &marker, user);
            // Retry until acknowledged: the upstream retries a closed connection.
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let url = relay.hook_url.lock().unwrap().clone();
                seen.lock().unwrap().sent += 1;
                match http
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(text.clone())
                    .send()
                    .await
                {
                    Ok(r) if r.status() == 200 => {
                        let v: Value = r.json().await.unwrap_or_default();
                        let id = v["id"].as_str().unwrap_or_default().to_owned();
                        if user == 0 {
                            seen.lock().unwrap().acked.insert(marker.clone(), id);
                        }
                        break;
                    }
                    Ok(r) => {
                        seen.lock().unwrap().non_200.push(format!("{marker}: {}", r.status()));
                        break;
                    }
                    Err(_) => {
                        assert!(Instant::now() < deadline, "{marker} refused for 120 s");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(20..80))).await;
    }
}

/// What the schedule did.
#[derive(Default, Debug)]
struct Tally(BTreeMap<&'static str, u32>, Vec<(Instant, &'static str)>);

impl Tally {
    fn add(&mut self, kind: &'static str) {
        *self.0.entry(kind).or_default() += 1;
        self.1.push((Instant::now(), kind));
    }

    /// When the relay was killed.
    fn kills(&self) -> Vec<Instant> {
        self.1.iter().filter(|(_, kind)| *kind == "sigkill").map(|(at, _)| *at).collect()
    }

    /// When each fault began, from `start`.
    fn timeline(&self, start: Instant) -> Vec<String> {
        self.1.iter().map(|(at, kind)| format!("{:.1?} {kind}", at.duration_since(start))).collect()
    }
}

async fn resume_all(relay: &Supervised) {
    let http = reqwest::Client::new();
    for name in ["plain", "ordered"] {
        let url = format!("http://{}/admin/destinations/{name}/resume", relay.admin());
        let _ = http.post(url).bearer_auth(common::ADMIN_TOKEN).send().await;
    }
}

/// The consumers' lane: a fault on one or both, then a gap.
async fn consumer_lane(
    seed: u64,
    until: Instant,
    consumers: [Arc<Consumer>; 2],
    relay: Arc<Supervised>,
    tally: Arc<Mutex<Tally>>,
) {
    let mut rng = fastrand::Rng::with_seed(seed.wrapping_mul(31));
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(rng.u64(1_000..4_000))).await;
        let which: Vec<Arc<Consumer>> = match rng.u8(..3) {
            0 => vec![consumers[0].clone()],
            1 => vec![consumers[1].clone()],
            _ => consumers.to_vec(),
        };
        let hold = Duration::from_millis(rng.u64(2_000..10_000));
        let kind = rng.u8(..5);
        let name = ["503", "refused", "slow", "410", "flapping"][usize::from(kind)];
        tally.lock().unwrap().add(name);
        for c in &which {
            match kind {
                0 => c.set(Mode::Status(503)).await,
                1 => c.refuse().await,
                2 => c.set(Mode::Slow(Duration::from_millis(2_500))).await,
                3 => c.set(Mode::Status(410)).await,
                _ => {
                    c.set(Mode::Flap {
                        status: 503,
                        period: Duration::from_millis(1_500),
                        since: Instant::now(),
                    })
                    .await
                }
            }
        }
        tokio::time::sleep(hold).await;
        for c in &which {
            c.accept().await;
            c.set(Mode::Ok).await;
        }
        if kind == 3 {
            // 410 paused the destination: the operator resumes it.
            resume_all(&relay).await;
        }
    }
}

/// The relay's lane: SIGKILL, a full disk (sled), a database restart or stop (PostgreSQL).
async fn relay_lane(
    seed: u64,
    until: Instant,
    backend: Backend,
    relay: Arc<Supervised>,
    disk: Option<std::path::PathBuf>,
    pg: Option<Arc<PgServer>>,
    tally: Arc<Mutex<Tally>>,
) {
    let mut rng = fastrand::Rng::with_seed(seed.wrapping_mul(77));
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(rng.u64(3_000..8_000))).await;
        let hold = Duration::from_millis(rng.u64(1_000..6_000));
        match (rng.u8(..2), backend) {
            (0, _) => {
                relay.kill().await;
                // Noted once the process is gone: nothing it sent is in flight after.
                tally.lock().unwrap().add("sigkill");
            }
            (_, Backend::Sled | Backend::Redb) => {
                tally.lock().unwrap().add("disk full");
                let dir = disk.clone().expect("a disk");
                let filler = dir.join("filler");
                // Fill to below the floor (8 MiB): leave about 4 MiB.
                let free = common::scratch::free_bytes(&dir);
                let mib = (free.saturating_sub(4 << 20) >> 20) as usize;
                tokio::task::spawn_blocking({
                    let filler = filler.clone();
                    move || fill(&filler, mib)
                })
                .await
                .unwrap();
                tokio::time::sleep(hold).await;
                std::fs::remove_file(&filler).unwrap();
            }
            (_, Backend::Postgres) => {
                let pg = pg.clone().expect("a server");
                if rng.bool() {
                    tally.lock().unwrap().add("database restart");
                    tokio::task::spawn_blocking(move || {
                        pg.stop();
                        pg.start_again();
                    })
                    .await
                    .unwrap();
                } else {
                    tally.lock().unwrap().add("database stop");
                    let p = pg.clone();
                    tokio::task::spawn_blocking(move || p.stop()).await.unwrap();
                    tokio::time::sleep(hold).await;
                    tokio::task::spawn_blocking(move || pg.start_again()).await.unwrap();
                }
            }
        }
    }
}

async fn run(backend: Backend, seed: u64, seconds: u64) -> String {
    let plain = Consumer::start().await;
    let ordered = Consumer::start().await;
    let work = tempfile::tempdir().unwrap();
    let (scratch, pg) = match backend {
        Backend::Sled | Backend::Redb => (Some(Scratch::mount(Kind::Tmpfs, 160)), None),
        Backend::Postgres => {
            (None, Some(Arc::new(tokio::task::spawn_blocking(PgServer::start).await.unwrap())))
        }
    };
    let data = scratch.as_ref().map_or(work.path().join("data"), |s| s.path().join("data"));
    let tail = format!(
        "\n[[destinations]]\nname = \"plain\"\nurl = \"{}\"\n\
         \n[[destinations]]\nname = \"ordered\"\nurl = \"{}\"\nordering = \"per-resource\"\n\
         \n[delivery]\ntimeout = \"2s\"\ncircuit_probe_interval = \"2s\"\n\
         [delivery.retry]\ninitial_backoff = \"200ms\"\nmax_backoff = \"2s\"\n",
        plain.url(),
        ordered.url()
    );
    let mut config = common::config_with(&data, "", &tail)
        .replace("[storage]", "[storage]\nmin_free_bytes = 8388608\nmin_free_percent = 0.0");
    if backend == Backend::Redb {
        config = config.replace("[storage]", "[storage]\nbackend = \"redb\"");
    }
    if let Some(pg) = &pg {
        let url = pg.database("chaos");
        config = config.replace("[storage]", "[storage]\nbackend = \"postgres\"")
            + &format!("\n[storage.postgres]\nurl = \"{url}\"\n");
    }
    let relay = Supervised::start(work.path().to_owned(), config).await;
    let started = Instant::now();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(Mutex::new(false));
    let until = Instant::now() + Duration::from_secs(seconds);

    let clients: Vec<_> = (0..4)
        .map(|k| tokio::spawn(client(k, relay.clone(), seen.clone(), stop.clone(), seed)))
        .collect();
    let supervisor = {
        let (relay, stop) = (relay.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                relay.supervise().await;
                if *stop.lock().unwrap() && Instant::now() > until + DRAIN_BOUND * 2 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let lanes = [
        tokio::spawn(consumer_lane(
            seed,
            until,
            [plain.clone(), ordered.clone()],
            relay.clone(),
            tally.clone(),
        )),
        tokio::spawn(relay_lane(
            seed,
            until,
            backend,
            relay.clone(),
            scratch.as_ref().map(|s| s.path().to_owned()),
            pg.clone(),
            tally.clone(),
        )),
    ];
    for lane in lanes {
        lane.await.expect("a fault lane failed");
    }
    // Every fault is undone by its lane; 410s are resumed once more in case a late one
    // paused a destination after its lane's own resume.
    resume_all(&relay).await;
    *stop.lock().unwrap() = true;
    for c in clients {
        c.await.expect("a client failed");
    }
    let faults_end = Instant::now();
    relay.supervise().await;
    resume_all(&relay).await;

    // Progress: everything acknowledged delivered (or dead by policy) within the bound.
    let acked = seen.lock().unwrap().acked.clone();
    assert!(acked.len() > 100, "only {} callbacks acknowledged", acked.len());
    let (mut missing, mut plain_got, mut ordered_got);
    loop {
        plain_got = plain.received().await;
        ordered_got = ordered.received().await;
        let delivered = |got: &[Received]| -> HashSet<String> {
            got.iter().filter(|r| r.status == 200).filter_map(|r| marker_of(&r.body)).collect()
        };
        let (p, o) = (delivered(&plain_got), delivered(&ordered_got));
        missing = acked
            .keys()
            .filter(|m| !p.contains(*m) || !o.contains(*m))
            .cloned()
            .collect::<Vec<_>>();
        if missing.is_empty() || faults_end.elapsed() > DRAIN_BOUND {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        resume_all(&relay).await;
    }
    let drained = faults_end.elapsed();
    // What is still missing must be dead by policy.
    let admin = relay.admin();
    let mut not_dead = Vec::new();
    for m in &missing {
        if !dead_by_policy(admin, &acked[m]).await {
            not_dead.push(m.clone());
        }
    }
    if !not_dead.is_empty() {
        let diagnosis = diagnose(&relay, &acked, &not_dead).await;
        panic!(
            "{} of {} acknowledged callbacks neither delivered to both destinations nor dead {DRAIN_BOUND:?} after the faults ended, e.g. {:?}\n{diagnosis}",
            not_dead.len(),
            acked.len(),
            &not_dead[..not_dead.len().min(5)]
        );
    }

    // Once per occurrence, never twice at once, in order per record.
    for (name, got) in [("plain", &plain_got), ("ordered", &ordered_got)] {
        let mut ids: HashMap<String, HashSet<String>> = HashMap::new();
        for r in got.iter().filter(|r| r.status == 200) {
            if let (Some(m), Some(id)) = (marker_of(&r.body), r.header("webhook-id")) {
                ids.entry(m).or_default().insert(id.to_owned());
            }
        }
        let twice: Vec<_> = ids.iter().filter(|(_, ids)| ids.len() > 1).collect();
        assert!(
            twice.is_empty(),
            "{name}: occurrences delivered under several webhook-ids: {twice:?}"
        );
        let kills = tally.lock().unwrap().kills();
        let doubled = in_flight_twice(got, &kills);
        if !doubled.is_empty() {
            let history: Vec<String> = doubled
                .iter()
                .take(3)
                .map(|id| {
                    let arrivals: Vec<String> = got
                        .iter()
                        .filter(|r| r.header("webhook-id") == Some(id.as_str()))
                        .map(|r| {
                            let answered = r.answered.map(|a| a.duration_since(r.at));
                            format!(
                                "{:.3?} → {} in {answered:.3?}",
                                r.at.duration_since(started),
                                r.status
                            )
                        })
                        .collect();
                    format!("{id}: {arrivals:?}")
                })
                .collect();
            panic!(
                "{name}: webhook-ids in flight twice at once: {doubled:?}\n{history:#?}\nfaults: {:?}",
                tally.lock().unwrap().timeline(started)
            );
        }
    }
    let out_of_order = order_violations(&ordered_got);
    assert!(out_of_order.is_empty(), "per-resource order broken: {out_of_order:?}");
    let non_200 = seen.lock().unwrap().non_200.clone();
    assert!(non_200.is_empty(), "valid callbacks answered non-200: {non_200:?}");

    // No destination left stalled or failing.
    let metrics =
        reqwest::get(format!("http://{admin}/metrics")).await.unwrap().text().await.unwrap();
    for name in ["plain", "ordered"] {
        let labels = [("destination", name)];
        assert_eq!(
            common::metric(&metrics, "hookrelay_destination_stalled", &labels),
            Some(0.0),
            "{name} stalled"
        );
        assert_eq!(
            common::metric(&metrics, "hookrelay_destination_circuit_open", &labels),
            Some(0.0),
            "{name} circuit open"
        );
    }
    let sent = seen.lock().unwrap().sent;
    supervisor.abort();
    let restarts = *relay.restarts.lock().unwrap();
    format!(
        "{} acknowledged ({sent} posts), delivered or dead {drained:.1?} after the faults ended \
         ({} dead by policy); faults {:?}; relay restarts {restarts}",
        acked.len(),
        missing.len(),
        tally.lock().unwrap().0
    )
}

/// The relay's request timeout in this harness: a request is in flight from its
/// arrival until it is answered or the relay gives up on it.
const TIMEOUT: Duration = Duration::from_secs(2);

/// `webhook-id`s with a request arriving while an earlier one was in flight from the
/// relays' side: from its arrival until it was answered, the relay's timeout ended it,
/// or the relay that sent it was killed (`kills`). A consumer slower than the timeout
/// may still be holding a request nobody waits for any more (actix keeps a handler
/// whose client went away); a retry after that is not two at once.
fn in_flight_twice(got: &[Received], kills: &[Instant]) -> Vec<String> {
    let mut by_id: HashMap<&str, Vec<&Received>> = HashMap::new();
    for r in got {
        if let Some(id) = r.header("webhook-id") {
            by_id.entry(id).or_default().push(r);
        }
    }
    let mut twice = Vec::new();
    for (id, mut requests) in by_id {
        requests.sort_by_key(|r| r.at);
        let mut busy_until: Option<Instant> = None;
        for r in requests {
            if busy_until.is_some_and(|until| r.at < until) {
                twice.push(id.to_owned());
                break;
            }
            let killed = kills.iter().copied().filter(|k| *k >= r.at).min();
            let ends = [r.answered, Some(r.at + TIMEOUT), killed]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(r.at);
            busy_until = Some(busy_until.map_or(ends, |u| u.max(ends)));
        }
    }
    twice
}

/// The marker of a delivered body.
fn marker_of(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    v["data"]["attributes"]["marker"].as_str().map(str::to_owned)
}

/// Records whose first successful deliveries did not come in event-id order (the
/// event id is in the `webhook-id`, `evt_{event}_{destination}`).
fn order_violations(got: &[Received]) -> Vec<String> {
    let mut first: HashSet<String> = HashSet::new();
    let mut last: HashMap<String, u64> = HashMap::new();
    let mut bad = Vec::new();
    for r in got.iter().filter(|r| r.status == 200) {
        let Some(id) = r.header("webhook-id") else { continue };
        if !first.insert(id.to_owned()) {
            continue;
        }
        // `evt_{id}_{destination}`, the id in hex (its Display): a receive time, so
        // later callbacks have larger ids. An id that does not parse is a failure,
        // never a 0 that would make the check vacuous (it was, until a date whose hex
        // ids had no letters in their upper digits showed it).
        let hex = id.split('_').nth(1).unwrap_or_default();
        let Ok(event) = u64::from_str_radix(hex, 16) else {
            bad.push(format!("webhook-id {id:?} names no event id"));
            continue;
        };
        let v: Value = serde_json::from_slice(&r.body).unwrap_or_default();
        let record = v["data"]["id"].as_str().unwrap_or_default().to_owned();
        if let Some(prev) = last.insert(record.clone(), event) {
            if prev > event {
                bad.push(format!("record {record}: event {event} after {prev}"));
            }
        }
    }
    bad
}

/// Whether the acknowledged event's deliveries (or its original's, for a copy) are
/// each delivered or dead.
async fn dead_by_policy(admin: SocketAddr, id: &str) -> bool {
    let get = |id: String| async move {
        serde_json::from_str::<Value>(&admin_get(admin, &format!("/admin/events/{id}")).await).ok()
    };
    let Some(mut event) = get(id.to_owned()).await else { return false };
    if let Some(original) = event["duplicate_of"].as_str() {
        let Some(o) = get(original.to_owned()).await else { return false };
        event = o;
    }
    let deliveries = event["deliveries"].as_array().cloned().unwrap_or_default();
    !deliveries.is_empty()
        && deliveries.iter().all(|d| matches!(d["state"].as_str(), Some("delivered" | "dead")))
        && deliveries.iter().any(|d| d["state"] == "dead")
}

/// Where undelivered callbacks are: the destinations' state, a few events with their
/// deliveries, and the relay's distinct error and warning lines.
async fn diagnose(
    relay: &Supervised,
    acked: &BTreeMap<String, String>,
    missing: &[String],
) -> String {
    let admin = relay.admin();
    let get = |path: String| async move { admin_get(admin, &path).await };
    let mut out = format!("destinations: {}\n", get("/admin/destinations".into()).await);
    for m in missing.iter().take(3) {
        let event = get(format!("/admin/events/{}", acked[m])).await;
        out.push_str(&format!("{m}: {}\n", &event[..event.len().min(1500)]));
    }
    let logs = relay.relay.lock().await.logs();
    let mut lines: BTreeMap<String, usize> = BTreeMap::new();
    for line in logs.lines().filter(|l| l.contains("\"ERROR\"") || l.contains("\"WARN\"")) {
        let v: Value = serde_json::from_str(line).unwrap_or_default();
        let key = format!(
            "{} {}",
            v["message"].as_str().unwrap_or(line),
            v["error"].as_str().unwrap_or("")
        );
        *lines.entry(key.chars().take(300).collect()).or_default() += 1;
    }
    out.push_str(&format!("relay log lines (this incarnation): {lines:#?}"));
    out
}

/// The text of an admin API answer (or the error, for a diagnosis).
async fn admin_get(admin: SocketAddr, path: &str) -> String {
    let sent = reqwest::Client::new()
        .get(format!("http://{admin}{path}"))
        .bearer_auth(common::ADMIN_TOKEN)
        .send()
        .await;
    match sent {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(e) => format!("({e})"),
    }
}
