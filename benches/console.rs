//! Console benchmark, release build: how long the overview takes to show with many
//! events stored (issue 23's target: under 200 ms at 200,000 events).
//!
//! The relay (test config, sled, durable) gets `BENCH_EVENTS` callbacks (default
//! 200,000) from 64 connections: `crm` delivers them to a sink answering 200, `erp`
//! is paused, so its 200,000 deliveries wait in its queue (the state an operator on
//! call opens the console in). Then, in `BENCH_ROUNDS` rounds (default 7):
//!
//! - headless Chromium (Debian's, through chromedriver) loads `/console/` signed in,
//!   and the page reports, with `performance.now()`, when the overview is on screen:
//!   navigation start → HTML, script, session check, the three API calls, rendering;
//! - each API call the overview makes, timed alone from a client on the same host.
//!
//! Medians are reported. There is no baseline: builds before this one have no console.
//!
//! Run: `cargo bench --bench console` (env: BENCH_ROUNDS, BENCH_EVENTS).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::browser::Browser;
use common::env_or;
use common::sink::Sink;
use serde_json::json;
use tokio::sync::Semaphore;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CONNECTIONS: usize = 64;

/// A callback about one of a thousand matters.
fn body(n: u64) -> String {
    json!({
        "data": {"type": "actions", "id": (n % 1000).to_string(), "attributes": {
            "name": format!("Smith v Jones ({n})"), "status": "in_progress"
        }},
        "meta": {"debug": {"resthook": {"event_name": "ActionUpdated"}}}
    })
    .to_string()
}

/// Sends `n` callbacks from 64 connections.
async fn send_all(relay: &common::Relay, n: u64) {
    let client = reqwest::Client::builder().pool_max_idle_per_host(CONNECTIONS).build().unwrap();
    let url = relay.hook_url(Some("ActionUpdated"));
    let slots = Arc::new(Semaphore::new(CONNECTIONS));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (client, url, slots) = (client.clone(), url.clone(), slots.clone());
        tasks.push(tokio::spawn(async move {
            let _s = slots.acquire_owned().await.unwrap();
            let r =
                client.post(&url).header("content-type", "application/json").body(body(i)).send();
            assert_eq!(r.await.expect("callback").status(), 200);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = env_or("BENCH_ROUNDS", 7);
    let n: u64 = env_or("BENCH_EVENTS", 200_000);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let sink = Sink::start().await;
        let dir = tempfile::tempdir().unwrap();
        let tail = format!(
            "\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n\n[[destinations]]\nname = \"erp\"\nurl = \"{}\"\n",
            sink.url(),
            sink.url()
        );
        let config = common::config_with(&dir.path().join("data"), "", &tail)
            .replace("level = \"info\"", "level = \"hookrelay=info,actix_server=warn\"");
        let relay = common::Relay::start_full(common::binary(), dir.path(), &config, &[]).await;
        let (status, _) = relay.admin_post("/admin/destinations/erp/pause", None).await;
        assert_eq!(status, 200);
        let started = Instant::now();
        send_all(&relay, n).await;
        eprintln!("{n} callbacks stored in {:.1} s", started.elapsed().as_secs_f64());
        sink.wait_for(n as usize, Duration::from_secs(1800)).await;
        let (_, d) = relay.admin_get("/admin/destinations").await;
        eprintln!("delivered to crm; erp holds {} pending", d["destinations"][1]["queue"]["pending"]);

        let b = Browser::start().await;
        let base = format!("http://{}", relay.admin);
        b.goto(&format!("{base}/console/")).await;
        b.find("input[type=password]").await.type_text(common::ADMIN_TOKEN).await;
        b.click_button("Sign in").await;
        b.wait_for_text("Storage and fleet", Duration::from_secs(30)).await;

        let http = reqwest::Client::new();
        let paths = ["/admin/destinations", "/admin/hooks", "/admin/overview"];
        let mut shown = Vec::new();
        let mut api: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
        for round in 0..rounds {
            b.goto(&format!("{base}/console/")).await;
            let ms = b
                .run_async(
                    "const done = arguments[arguments.length - 1];
                     const look = () => {
                       const main = document.getElementById('main');
                       if (main && main.textContent.includes('Storage and fleet')) done(performance.now());
                       else setTimeout(look, 2);
                     };
                     look();",
                    json!([]),
                )
                .await
                .as_f64()
                .expect("a time");
            shown.push(ms);
            for (i, path) in paths.iter().enumerate() {
                let t = Instant::now();
                let r = http
                    .get(format!("{base}{path}"))
                    .bearer_auth(common::ADMIN_TOKEN)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                r.bytes().await.unwrap();
                api[i].push(t.elapsed().as_secs_f64() * 1000.0);
            }
            eprintln!("round {}: overview shown after {ms:.0} ms", round + 1);
        }
        println!("\n{n} events stored, {rounds} rounds, medians:\n");
        println!("| measure | median (ms) | rounds (ms) |");
        println!("|---|---:|---|");
        let list = |v: &[f64]| v.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(", ");
        println!("| overview on screen (navigation start → shown) | **{:.0}** | {} |", median(shown.clone()), list(&shown));
        for (path, v) in paths.iter().zip(&api) {
            println!("| `GET {path}` | {:.1} | {} |", median(v.clone()), list(v));
        }
    });
}
