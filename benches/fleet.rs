//! Fleet benchmark, release build: the same load against
//!   - one relay on sled (the embedded default),
//!   - one relay on PostgreSQL,
//!   - two relays on one PostgreSQL (callbacks spread over both),
//!
//! in interleaved rounds on this machine (the PostgreSQL server, the relays, the load
//! and the sink all share its 2 cores). Each round and contender:
//!   - ingest: 64 connections send distinct callbacks as fast as answers come back for
//!     BENCH_SECS, the destination paused (dispatch runs, delivery waits);
//!   - drain: the destination resumed, how fast every one of those deliveries reaches a
//!     sink that answers 200 at once;
//!   - PostgreSQL's WAL bytes per event over both (`pg_current_wal_lsn`).
//!
//! Then latency at a fixed rate (issue 44): callbacks offered open loop at 200/s and
//! 1,000/s (spread over the relays) over 50 resources, to one relay on redb (the
//! embedded default, for reference), one relay on PostgreSQL and two relays on one
//! PostgreSQL, in interleaved rounds. Per run: the ack's and the end-to-end p50, p99
//! and p99.9 (from the scheduled send), the relays' CPU per callback, and the SQL
//! statements per callback the relays sent (`pg_stat_statements`, top-level
//! statements of that setup's database, BEGIN and COMMIT included), with the most
//! frequent ones, the WAL flushes per callback (`pg_stat_wal.wal_sync`, server-wide),
//! the row updates per callback of `events` and `deliveries` with their share of HOT
//! updates (`pg_stat_user_tables`), and where the slowest 1% fell: in a few seconds of the run (stalls) or spread over
//! it (queueing), with the wall clock of the worst seconds to set beside the server's
//! log (`BENCH_PG_OPTIONS="-c logging_collector=on -c log_directory=..."`).
//!
//! Run: `cargo bench --bench fleet` (env: BENCH_ROUNDS, BENCH_SECS (ingest);
//! BENCH_LATENCY_SECS (20), BENCH_RATES ("200,1000"), BENCH_ONLY (setups whose label
//! holds it), BENCH_WATCH (prints the inbox and pending deliveries every 500 ms),
//! BENCH_TOP (the most frequent statements printed per run, 10); BENCH_SQL (statements
//! run in each PostgreSQL setup's database once its relays made their schema);
//! BENCH_PHASES ("throughput,latency"); BENCH_PG_OPTIONS (more server settings,
//! `-c name=value ...`, to try one);
//! BENCH_BASELINE=path/to/an/older/hookrelay adds its PostgreSQL setups, side by side,
//! each on a database of its own, in the same interleaved rounds; the build itself as
//! its baseline shows the spread between two rounds of one build).

#[path = "../tests/common/mod.rs"]
mod common;

use common::arrivals::{start_sink, Arrivals};
use common::env_or;
use common::open_loop::{await_arrivals, cpu_seconds, offer, tail_shape, Latencies};
use common::stats::median;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pg::PgServer;
use common::sink::Sink;
use tokio::sync::Semaphore;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CONNECTIONS: usize = 64;

struct Contender {
    label: String,
    relays: Vec<common::Relay>,
    /// The database, for its WAL position.
    db: Option<String>,
    _dirs: Vec<tempfile::TempDir>,
}

/// `n` relays of `bin` on `db` (the embedded default when none), their one destination
/// `dest` at `url`.
async fn contender(
    label: String,
    bin: &str,
    n: usize,
    db: Option<String>,
    dest: &str,
    url: &str,
) -> Contender {
    let mut relays = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..n {
        let dir = tempfile::tempdir().unwrap();
        let tail = format!("\n[[destinations]]\nname = \"{dest}\"\nurl = \"{url}\"\n");
        let mut text = common::config_with(&dir.path().join("data"), "", &tail)
            .replace("level = \"info\"", "level = \"hookrelay=info,actix_server=warn\"");
        if let Some(url) = &db {
            text = text.replace("[storage]", "[storage]\nbackend = \"postgres\"")
                + &format!("\n[storage.postgres]\nurl = \"{url}\"\n");
        }
        relays.push(common::Relay::start_binary(bin, dir.path(), &text).await);
        dirs.push(dir);
    }
    Contender { label, relays, db, _dirs: dirs }
}

async fn wal_lsn(db: &str) -> u64 {
    let (client, connection) = tokio_postgres::connect(db, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let row = client
        .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint", &[])
        .await
        .unwrap();
    u64::try_from(row.get::<_, i64>(0)).unwrap_or(0)
}

/// Closed-loop ingest for `secs`; returns the number of callbacks acknowledged.
async fn ingest(c: &Contender, secs: Duration, base: u64) -> u64 {
    let client = reqwest::Client::builder().pool_max_idle_per_host(CONNECTIONS).build().unwrap();
    let urls: Vec<String> = c.relays.iter().map(|r| r.hook_url(Some("ActionUpdated"))).collect();
    let next = Arc::new(AtomicU64::new(base));
    let acked = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + secs;
    let slots = Arc::new(Semaphore::new(CONNECTIONS));
    let mut tasks = Vec::new();
    for k in 0..CONNECTIONS {
        let (client, urls, next, acked, slots) =
            (client.clone(), urls.clone(), next.clone(), acked.clone(), slots.clone());
        tasks.push(tokio::spawn(async move {
            let _slot = slots.acquire_owned().await.unwrap();
            while Instant::now() < deadline {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let body = format!(
                    r#"{{"data":{{"type":"actions","id":"{n}","attributes":{{"name":"Smith v Jones"}}}},"meta":{{"debug":{{"resthook":{{"id":"46","trigger_count":{n}}}}}}}}}"#
                );
                let url = &urls[k % urls.len()];
                if let Ok(r) = client.post(url).header("content-type", "application/json").body(body).send().await {
                    if r.status() == 200 {
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    acked.load(Ordering::Relaxed)
}

/// The closed-loop ingest and the drain, per setup, in `rounds` interleaved rounds.
async fn throughput(server: &PgServer, rounds: usize, secs: Duration) {
    let mut contenders = Vec::new();
    let mut sinks = Vec::new();
    let mut setups = vec![
        ("1 relay, sled".to_owned(), common::binary().to_owned(), 1, None),
        (
            "1 relay, PostgreSQL".to_owned(),
            common::binary().to_owned(),
            1,
            Some(server.database("bench_one")),
        ),
        (
            "2 relays, one PostgreSQL".to_owned(),
            common::binary().to_owned(),
            2,
            Some(server.database("bench_two")),
        ),
    ];
    if let Ok(baseline) = std::env::var("BENCH_BASELINE") {
        setups.push((
            "1 relay, PostgreSQL (baseline)".to_owned(),
            baseline.clone(),
            1,
            Some(server.database("bench_one_base")),
        ));
        setups.push((
            "2 relays, one PostgreSQL (baseline)".to_owned(),
            baseline,
            2,
            Some(server.database("bench_two_base")),
        ));
    }
    for (label, bin, n, db) in setups {
        let sink = Sink::start().await;
        contenders.push(contender(label, &bin, n, db, "crm", &sink.url()).await);
        sinks.push(sink);
    }
    let k = contenders.len();
    let (mut ingest_rates, mut drain_rates, mut wal) =
        (vec![Vec::new(); k], vec![Vec::new(); k], vec![Vec::new(); k]);
    for round in 0..rounds {
        for (i, c) in contenders.iter().enumerate() {
            let sink = &sinks[i];
            let before = sink.count() as u64;
            let lsn = match &c.db {
                Some(db) => wal_lsn(db).await,
                None => 0,
            };
            let relay = &c.relays[0];
            assert_eq!(relay.admin_post("/admin/destinations/crm/pause", None).await.0, 200);
            // Every relay must see the pause before the load (they poll it).
            tokio::time::sleep(Duration::from_millis(1200)).await;
            let base = 1_000_000_000 * (round as u64 + 1) + 10_000_000 * i as u64;
            let started = Instant::now();
            let n = ingest(c, secs, base).await;
            let rate = n as f64 / started.elapsed().as_secs_f64();
            let started = Instant::now();
            assert_eq!(relay.admin_post("/admin/destinations/crm/resume", None).await.0, 200);
            sink.wait_for((before + n) as usize, Duration::from_secs(600)).await;
            let drain = n as f64 / started.elapsed().as_secs_f64();
            let per_event = match &c.db {
                Some(db) => (wal_lsn(db).await - lsn) as f64 / n as f64,
                None => f64::NAN,
            };
            eprintln!(
                "round {}: {}: ingest {rate:.0}/s ({n} callbacks), drain {drain:.0}/s, WAL {per_event:.0} B/event",
                round + 1,
                c.label
            );
            ingest_rates[i].push(rate);
            drain_rates[i].push(drain);
            wal[i].push(per_event);
        }
    }
    println!("\nmedians of {rounds} interleaved rounds; {}s of closed-loop ingest (64 connections, destination paused), then the drain to a sink answering 200:\n", secs.as_secs());
    println!(
        "| setup | ingest (callbacks/s) | delivery drain (deliveries/s) | WAL bytes per event |"
    );
    println!("|---|---:|---:|---:|");
    for (i, c) in contenders.iter().enumerate() {
        let w = median(wal[i].clone());
        let w = if w.is_nan() { "–".to_owned() } else { format!("{w:.0}") };
        println!(
            "| {} | {:.0} | {:.0} | {w} |",
            c.label,
            median(ingest_rates[i].clone()),
            median(drain_rates[i].clone())
        );
    }
}

/// The CPU time so far (s) of every PostgreSQL server process on this machine (the
/// benchmark's server is the only one).
fn postgres_cpu_seconds() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0.0 };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .map(cpu_seconds)
        .sum()
}

/// A connection to the server's `postgres` database, for the statistics.
async fn stats_client(server: &PgServer) -> tokio_postgres::Client {
    let (client, connection) =
        tokio_postgres::connect(&server.url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// The top-level statements run in database `db` since the last reset, most frequent
/// first: (calls, total time in ms, rows returned or changed, the statement).
async fn statements(client: &tokio_postgres::Client, db: &str) -> Vec<(i64, f64, i64, String)> {
    client
        .query(
            "SELECT s.calls, s.total_exec_time, s.rows, s.query FROM pg_stat_statements s \
             JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = $1 ORDER BY s.calls DESC",
            &[&db],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

/// The WAL flushes the server has made since it started (`pg_stat_wal.wal_sync`: the
/// fsyncs a synchronous commit waits for; server-wide, and the setups run one at a
/// time).
async fn wal_syncs(client: &tokio_postgres::Client) -> f64 {
    let row = client.query_one("SELECT wal_sync::float8 FROM pg_stat_wal", &[]).await.unwrap();
    row.get(0)
}

/// Row updates made so far in the database at `url`, per table (`events`,
/// `deliveries`): (table, updates, of which HOT). A HOT update writes no index entry
/// and keeps the row's new version on its page; any other writes the whole row again
/// with an entry in every index. PostgreSQL publishes these counts about a second late.
async fn row_updates(url: &str) -> Vec<(String, i64, i64)> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .query(
            "SELECT relname::text, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables \
             WHERE relname IN ('events', 'deliveries') ORDER BY relname",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// The updates per callback of each table between `before` and `after`
/// ([`row_updates`]), and the share of them that were HOT.
fn updates_line(before: &[(String, i64, i64)], after: &[(String, i64, i64)], n: f64) -> String {
    after
        .iter()
        .map(|(table, upd, hot)| {
            let (upd0, hot0) = before.iter().find(|b| &b.0 == table).map_or((0, 0), |b| (b.1, b.2));
            let (upd, hot) = ((upd - upd0) as f64, (hot - hot0) as f64);
            format!("{table} {:.2}/callback, {:.0}% HOT", upd / n, 100.0 * hot / upd.max(1.0))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// One open-loop run's figures: latencies, CPU per callback (µs) of the relays and of
/// PostgreSQL, SQL statements and WAL flushes per callback.
#[derive(Clone, Copy, Default)]
struct Run {
    seen: Latencies,
    relay_cpu_us: f64,
    pg_cpu_us: f64,
    statements: f64,
    wal_syncs: f64,
}

/// BENCH_WATCH: prints each relay's inbox and pending deliveries every 500 ms (where
/// a backlog builds: dispatch or delivery).
async fn watch_queues(bases: Vec<String>) {
    let client = reqwest::Client::new();
    let started = Instant::now();
    loop {
        let mut line = format!("  {:5.1} s:", started.elapsed().as_secs_f64());
        for base in &bases {
            let text = match client.get(format!("{base}/metrics")).send().await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            let inbox = common::metric(&text, "hookrelay_inbox_events", &[]).unwrap_or(f64::NAN);
            let pending = text
                .lines()
                .filter(|l| {
                    l.starts_with("hookrelay_queue_depth{") && l.contains("state=\"pending\"")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>();
            let leader =
                common::metric(&text, "hookrelay_dispatch_leader", &[]).unwrap_or(f64::NAN);
            line += &format!(" inbox {inbox:.0} pending {pending:.0} leader {leader:.0};");
        }
        eprintln!("{line}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Latency at fixed rates, per setup, in `rounds` interleaved rounds.
async fn latency(server: &PgServer, rounds: usize) {
    let secs: u64 = env_or("BENCH_LATENCY_SECS", 20);
    let rates: Vec<u64> = env_or("BENCH_RATES", "200,1000".to_owned())
        .split(',')
        .filter_map(|r| r.trim().parse().ok())
        .collect();
    const RESOURCES: u64 = 50;
    let arrivals: Arrivals = Arc::default();
    let sink = format!("http://{}/in", start_sink(arrivals.clone()));
    let mut setups: Vec<(String, String, usize, Option<&str>)> = vec![
        ("1 relay, redb".into(), common::binary().into(), 1, None),
        ("1 relay, PostgreSQL".into(), common::binary().into(), 1, Some("lat_one")),
        ("2 relays, one PostgreSQL".into(), common::binary().into(), 2, Some("lat_two")),
    ];
    if let Ok(baseline) = std::env::var("BENCH_BASELINE") {
        setups.push((
            "1 relay, PostgreSQL (baseline)".into(),
            baseline.clone(),
            1,
            Some("lat_one_base"),
        ));
        setups.push((
            "2 relays, one PostgreSQL (baseline)".into(),
            baseline,
            2,
            Some("lat_two_base"),
        ));
    }
    // BENCH_ONLY=text: only the setups whose label holds it.
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        setups.retain(|s| s.0.contains(&only));
    }
    let mut contenders = Vec::new();
    for (i, (label, bin, n, db)) in setups.iter().enumerate() {
        let url = db.map(|name| server.database(name));
        let dest = format!("lat{i}");
        contenders.push((contender(label.clone(), bin, *n, url, &dest, &sink).await, dest, *db));
    }
    // BENCH_SQL: statements run in each PostgreSQL setup's database once its relays
    // have made their schema (a storage setting to try, say).
    if let Ok(sql) = std::env::var("BENCH_SQL") {
        for (c, _, _) in &contenders {
            if let Some(url) = &c.db {
                let (client, connection) =
                    tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
                tokio::spawn(connection);
                client.batch_execute(&sql).await.unwrap();
            }
        }
    }
    let stats = stats_client(server).await;
    let mut runs = vec![vec![Vec::<Run>::new(); contenders.len()]; rates.len()];
    for round in 0..rounds {
        for (k, &rate) in rates.iter().enumerate() {
            // Each round starts with the next setup: none always follows the same one
            // (a build's one relay always after the other build's two showed as a gap
            // of its own).
            for j in 0..contenders.len() {
                let i = (j + round) % contenders.len();
                let (c, dest, db) = &contenders[i];
                let urls: Vec<String> =
                    c.relays.iter().map(|r| r.hook_url(Some("ActionUpdated"))).collect();
                let pids: Vec<i32> = c.relays.iter().map(|r| r.pid()).collect();
                let base = 1_000_000_000 * (round as u64 + 1)
                    + 100_000_000 * k as u64
                    + 10_000_000 * i as u64;
                stats.execute("SELECT pg_stat_statements_reset()", &[]).await.unwrap();
                let relay_cpu0: f64 = pids.iter().copied().map(cpu_seconds).sum();
                let pg_cpu0 = postgres_cpu_seconds();
                let syncs0 = wal_syncs(&stats).await;
                let updates0 = match &c.db {
                    Some(url) => row_updates(url).await,
                    None => Vec::new(),
                };
                let watch = std::env::var("BENCH_WATCH").is_ok().then(|| {
                    let ports: Vec<String> =
                        c.relays.iter().map(|r| format!("http://{}", r.admin)).collect();
                    tokio::spawn(watch_queues(ports))
                });
                let offered = offer(&urls, dest, rate, secs, RESOURCES, base).await;
                await_arrivals(&arrivals, &offered, Duration::from_secs(30)).await;
                if let Some(w) = watch {
                    w.abort();
                }
                let n = offered.sent.len().max(1) as f64;
                let relay_cpu_us =
                    (pids.iter().copied().map(cpu_seconds).sum::<f64>() - relay_cpu0) * 1e6 / n;
                let (pg_cpu_us, per_callback, top, syncs) = match db {
                    Some(db) => {
                        let top = statements(&stats, db).await;
                        let total: i64 = top.iter().map(|t| t.0).sum();
                        let syncs = (wal_syncs(&stats).await - syncs0) / n;
                        ((postgres_cpu_seconds() - pg_cpu0) * 1e6 / n, total as f64 / n, top, syncs)
                    }
                    None => (f64::NAN, f64::NAN, Vec::new(), f64::NAN),
                };
                let r = Run {
                    seen: Latencies::of(&offered, &arrivals),
                    relay_cpu_us,
                    pg_cpu_us,
                    statements: per_callback,
                    wal_syncs: syncs,
                };
                eprintln!(
                    "round {}, {rate}/s: {}: ack p50/p99/p99.9 {:.2}/{:.2}/{:.2} ms, e2e {:.2}/{:.2}/{:.2} ms, {:.1}% delivered, CPU {:.0} µs relays + {:.0} µs PostgreSQL per callback, {:.2} statements and {:.2} WAL flushes per callback",
                    round + 1, c.label, r.seen.ack[0], r.seen.ack[1], r.seen.ack[2],
                    r.seen.e2e[0], r.seen.e2e[1], r.seen.e2e[2], r.seen.delivered * 100.0,
                    r.relay_cpu_us, r.pg_cpu_us, r.statements, r.wal_syncs
                );
                eprintln!("    tail: {}", tail_shape(&offered, &arrivals));
                if let Some(url) = &c.db {
                    // The server publishes its table counts about a second late.
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    let updates = updates_line(&updates0, &row_updates(url).await, n);
                    eprintln!("    row updates: {updates}");
                }
                for (calls, ms, rows, query) in top.iter().take(env_or("BENCH_TOP", 10)) {
                    let query: String = query.split_whitespace().collect::<Vec<_>>().join(" ");
                    eprintln!(
                        "    {:.3}/callback, {:.3} ms and {:.1} rows each: {}",
                        *calls as f64 / n,
                        ms / (*calls).max(1) as f64,
                        *rows as f64 / (*calls).max(1) as f64,
                        query.chars().take(140).collect::<String>()
                    );
                }
                runs[k][i].push(r);
            }
        }
    }
    println!("\nmedians of {rounds} interleaved rounds; callbacks offered open loop for {secs} s over {RESOURCES} resources (spread over the relays); one destination answering 200 at once:\n");
    println!("| setup | rate (/s) | ack p50 / p99 / p99.9 (ms) | end to end p50 / p99 / p99.9 (ms) | delivered | CPU per callback, relays + PostgreSQL (µs) | SQL statements per callback | WAL flushes per callback |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (k, rate) in rates.iter().enumerate() {
        for (i, (c, _, _)) in contenders.iter().enumerate() {
            let r = &runs[k][i];
            let m = |f: &dyn Fn(&Run) -> f64| median(r.iter().map(f).collect());
            // A figure of PostgreSQL's, or a dash for the setup without it.
            let per = |v: f64, digits: usize| {
                if v.is_nan() {
                    "–".to_owned()
                } else {
                    format!("{v:.digits$}")
                }
            };
            println!(
                "| {} | {rate} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} / {:.2} | {:.1}% | {:.0} + {} | {} | {} |",
                c.label,
                m(&|x| x.seen.ack[0]), m(&|x| x.seen.ack[1]), m(&|x| x.seen.ack[2]),
                m(&|x| x.seen.e2e[0]), m(&|x| x.seen.e2e[1]), m(&|x| x.seen.e2e[2]),
                100.0 * m(&|x| x.seen.delivered),
                m(&|x| x.relay_cpu_us), per(m(&|x| x.pg_cpu_us), 0),
                per(m(&|x| x.statements), 1),
                per(m(&|x| x.wal_syncs), 2)
            );
        }
    }
}
fn main() {
    common::write_back_dirty_pages();
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let secs = Duration::from_secs(env_or("BENCH_SECS", 5));
    let phases: String = env_or("BENCH_PHASES", "throughput,latency".to_owned());
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // BENCH_PG_OPTIONS: more server settings (`-c name=value ...`), to try one.
        let extra = std::env::var("BENCH_PG_OPTIONS").unwrap_or_default();
        let server = tokio::task::spawn_blocking(move || {
            PgServer::start_with(&format!("-c shared_preload_libraries=pg_stat_statements {extra}"))
        })
        .await
        .unwrap();
        server.psql("CREATE EXTENSION pg_stat_statements");
        if phases.contains("throughput") {
            throughput(&server, rounds, secs).await;
        }
        if phases.contains("latency") {
            latency(&server, rounds).await;
        }
    });
}
