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
//! Run: `cargo bench --bench fleet` (env: BENCH_ROUNDS, BENCH_SECS;
//! BENCH_BASELINE=path/to/an/older/hookrelay adds its PostgreSQL setups, side by side,
//! each on a database of its own, in the same interleaved rounds).

#[path = "../tests/common/mod.rs"]
mod common;

use common::env_or;

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

async fn contender(
    label: String,
    bin: &str,
    n: usize,
    db: Option<String>,
    sink: &Sink,
) -> Contender {
    let mut relays = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..n {
        let dir = tempfile::tempdir().unwrap();
        let tail = format!("\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n", sink.url());
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let secs = Duration::from_secs(env_or("BENCH_SECS", 5));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
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
            contenders.push(contender(label, &bin, n, db, &sink).await);
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
        println!("| setup | ingest (callbacks/s) | delivery drain (deliveries/s) | WAL bytes per event |");
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
    });
}
