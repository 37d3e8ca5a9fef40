//! The PostgreSQL backend through the real binary: relays on one database (Debian's
//! `postgresql`, started by the harness; no skip), the URL never shown, callbacks
//! spread over two relays delivered once each, two users' copies arriving at
//! different relays delivered once, and a pause made on one relay reaching the other;
//! hook syncs, limits, a relay killed under load, migrations, a worker stuck on the
//! store. Outages and failovers (`outages.rs`), connecting (`connecting.rs`: errors,
//! TLS, poolers) and per-resource order across relays (`order.rs`) have files of their
//! own; a relay whose clock is off from the database's (`clock.rs`) too.

use crate::common;

mod clock;
mod connecting;
mod order;
mod outages;

use std::time::Duration;

use common::load::{Acked, Load};
use common::pg::PgServer;
use common::sink::Sink;
use common::Relay;

/// A relay config on `url` with one destination to `sink`.
fn config(dir: &std::path::Path, url: &str, sink: &Sink) -> String {
    config_crm(dir, url, sink, "")
}

/// [`config`] with `extra` (TOML lines) right after the destination's URL: its
/// settings, then any further tables.
fn config_crm(dir: &std::path::Path, url: &str, sink: &Sink, extra: &str) -> String {
    let tail = format!("\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n{extra}", sink.url());
    common::config_with(&dir.join("data"), "", &tail)
        .replace("[storage]", "[storage]\nbackend = \"postgres\"")
        + &format!("\n[storage.postgres]\nurl = \"{url}\"\n")
}

/// The `data.id` of each acknowledged callback (its marker) that the sink has not had.
fn undelivered(sink: &Sink, acked: &[(String, String)]) -> Vec<String> {
    let got: Vec<String> =
        sink.received().iter().map(|r| String::from_utf8_lossy(&r.body).into_owned()).collect();
    acked
        .iter()
        .map(|(_, body)| {
            let sent: serde_json::Value = serde_json::from_str(body).expect("sent JSON");
            format!("\"{}\"", sent["data"]["id"].as_str().expect("data.id"))
        })
        .filter(|marker| !got.iter().any(|b| b.contains(marker.as_str())))
        .collect()
}

/// Waits until the sink has had every one of `acked` (`what` they are, for the
/// message); fails after `within`.
async fn wait_delivered(sink: &Sink, acked: &[(String, String)], within: Duration, what: &str) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let missing = undelivered(sink, acked);
        if missing.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {} {what} not delivered within {within:?}, e.g. {:?}",
            missing.len(),
            acked.len(),
            &missing[..missing.len().min(3)]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn body(n: u64) -> String {
    format!(r#"{{"data":{{"id":"{n}","name":"Smith v Jones"}},"meta":{{"hook":"{}"}}}}"#, n * 7)
}

/// The fleet shares one journal: a change made on one relay is read on the other,
/// and each relay's entries are in both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_share_one_journal() {
    use crate::journal::{call, journal, operator_token, OPERATOR};
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let url = server.database("journal");
    let sink = Sink::start().await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let text = |dir: &std::path::Path| config_crm(dir, &url, &sink, &operator_token());
    let a = Relay::start(dir_a.path(), &text(dir_a.path())).await;
    let b = Relay::start(dir_b.path(), &text(dir_b.path())).await;
    assert_eq!(call(&a, OPERATOR, "POST", "/admin/destinations/crm/pause", None).await.0, 200);
    assert_eq!(call(&b, OPERATOR, "POST", "/admin/destinations/crm/resume", None).await.0, 200);
    // Both relays read both entries. Their order is each relay's reading of the
    // database's clock (`clock.rs`: within its offset estimate, a few ms), so two
    // changes made a few ms apart on two relays may be listed either way round.
    let both = [
        ("crm-team".to_owned(), "pause".to_owned(), 1, "ok".to_owned()),
        ("crm-team".to_owned(), "resume".to_owned(), 1, "ok".to_owned()),
    ];
    for relay in [&a, &b] {
        let mut read = journal(relay, "").await;
        read.sort();
        assert_eq!(read, both);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_one_database_deliver_each_occurrence_once() {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let url = server.database("fleet");
    let sink = Sink::start().await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Relay::start(dir_a.path(), &config(dir_a.path(), &url, &sink)).await;
    let b = Relay::start(dir_b.path(), &config(dir_b.path(), &url, &sink)).await;

    // The URL is a secret: not in the logs.
    let password_free = url.replace("postgres://", "");
    for relay in [&a, &b] {
        assert!(!relay.logs().contains(&password_free), "the database URL was logged");
    }

    // 40 distinct events, alternately to each relay.
    for n in 0..40u64 {
        let relay = if n % 2 == 0 { &a } else { &b };
        let r = relay.callback(Some("ActionCreated"), "application/json", body(n)).await;
        assert_eq!(r.status(), 200);
    }
    // Two users' copies of one occurrence (same `data`, other `meta`), one per relay.
    let copy =
        |hook: &str| format!(r#"{{"data":{{"id":"copy","x":1}},"meta":{{"hook":"{hook}"}}}}"#);
    assert_eq!(
        a.callback(Some("ActionCreated"), "application/json", copy("u1")).await.status(),
        200
    );
    assert_eq!(
        b.callback(Some("ActionCreated"), "application/json", copy("u2")).await.status(),
        200
    );

    let got = sink.wait_for(41, Duration::from_secs(60)).await;
    // Nothing more arrives: each occurrence once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got_all = sink.received();
    assert_eq!(got_all.len(), 41, "deliveries: {}", got_all.len());
    let mut ids: Vec<&str> = got.iter().filter_map(|r| r.header("webhook-id")).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 41, "each delivery has its own webhook-id");
    let copies =
        got_all.iter().filter(|r| String::from_utf8_lossy(&r.body).contains("\"copy\"")).count();
    assert_eq!(copies, 1, "two users' copies at two relays are one occurrence");

    // Both relays list the same events (the fleet's state from any relay).
    let (ids_a, ids_b) = (a.all_event_ids().await, b.all_event_ids().await);
    assert_eq!(ids_a.len(), 42);
    assert_eq!(ids_a, ids_b);

    // A pause made on one relay holds deliveries on the other within a second or so.
    assert_eq!(a.admin_post("/admin/destinations/crm/pause", None).await.0, 200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        b.callback(Some("ActionCreated"), "application/json", body(1000)).await.status(),
        200
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sink.count(), 41, "paused through relay a, relay b still delivered");
    assert_eq!(b.admin_post("/admin/destinations/crm/resume", None).await.0, 200);
    sink.wait_for(42, Duration::from_secs(30)).await;

    // The fleet's queue gauges come from one relay only, so a dashboard's sum is right.
    let (ma, mb) = (a.metrics().await, b.metrics().await);
    let reporting = [&ma, &mb].iter().filter(|m| m.contains("hookrelay_queue_depth{")).count();
    assert_eq!(reporting, 1, "queue gauges from {reporting} relays");
}

#[test]
fn check_config_masks_the_database_url() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookrelay.toml");
    std::fs::write(
        &path,
        "[storage]\nbackend = \"postgres\"\n[storage.postgres]\nurl = \"postgres://relay:s3cret-pw@db.example:5432/hooks\"\n\
         [[sources]]\nname = \"demo\"\ntoken = \"source-token-0123456789abcdef\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(common::binary())
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("backend = \"postgres\""), "{text}");
    assert!(!text.contains("s3cret-pw"), "the URL's password was printed:\n{text}");

    // A missing URL is a clear error naming the key.
    std::fs::write(&path, "[storage]\nbackend = \"postgres\"\n").unwrap();
    let out = std::process::Command::new(common::binary())
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("storage.postgres.url: missing"), "{err}");
}

/// `hookrelay migrate` on a config of the storage settings alone (the URL from
/// `PG_URL`, then `extra` in `[storage.postgres]`): whether it succeeded, and what it
/// printed.
fn migrate_with(url: &str, extra: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookrelay.toml");
    let text = format!(
        "[storage]\nbackend = \"postgres\"\n[storage.postgres]\nurl_env = \"PG_URL\"\n{extra}"
    );
    std::fs::write(&path, text).unwrap();
    let out = std::process::Command::new(common::binary())
        .args(["migrate", "--config"])
        .arg(&path)
        .env("PG_URL", url)
        .output()
        .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// `hookrelay serve` on `text` (written into `dir`), its stderr piped, without
/// waiting for anything (the harness's `Relay` waits for the listeners).
fn spawn_serve(dir: &std::path::Path, text: &str) -> std::process::Child {
    let path = dir.join("hookrelay.toml");
    std::fs::write(&path, text).unwrap();
    std::process::Command::new(common::binary())
        .args(["serve", "--config"])
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// A free loopback address (bound, then released) for a listener of fixed port.
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// Three relays on one database, each asked to sync hooks at the same moment (and each
/// running its own start-up pass if it leads): every hook exists once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_relays_syncing_hooks_at_once_create_each_hook_once() {
    use common::proxy::Proxy;
    use common::sim::Sim;
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let url = server.database("hooks");
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), &format!("callback_retries = 1\n{}", common::sim::USERS));
    let proxy = Proxy::start().await;
    let sink = Sink::start().await;
    let mut relays = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..3 {
        let d = tempfile::tempdir().unwrap();
        let tail = format!(
            "events = [\"ActionCreated\", \"TaskCreated\"]\n\
             [[sources.accounts]]\nname = \"alice\"\napi_base = \"{}\"\ntoken = \"alice-token\"\n\
             [upstream]\npublic_url = \"{}\"\nreconcile_interval = \"1h\"\n\
             [[destinations]]\nname = \"crm\"\nurl = \"{}\"\n",
            sim.api_base(),
            proxy.url(),
            sink.url()
        );
        let text = common::config_with(&d.path().join("data"), "", &tail)
            .replace("[storage]", "[storage]\nbackend = \"postgres\"")
            + &format!("\n[storage.postgres]\nurl = \"{url}\"\n");
        relays.push(Relay::start(d.path(), &text).await);
        dirs.push(d);
    }
    proxy.forward_to(relays[0].ingress);
    // The leading relay registers the hooks at start; delete them, so that the three
    // syncs below all find none and race to create them.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while sim.all_hooks().await.len() < 2 {
        assert!(std::time::Instant::now() < deadline, "the leader did not register the hooks");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One relay reconciled; every relay shows its result (the status is in the store),
    // with its age, not stale.
    for r in &relays {
        let v = r
            .admin_until("/admin/hooks", Duration::from_secs(20), |v| {
                v["accounts"][0]["ok"] == true
                    && v["accounts"][0]["hooks"].as_array().map(Vec::len) == Some(2)
            })
            .await;
        assert_eq!(v["accounts"][0]["stale"], false, "{v}");
        assert!(v["accounts"][0]["age_seconds"].as_u64().is_some(), "{v}");
    }
    for h in sim.all_hooks().await {
        let id = h["id"].as_str().map(str::to_owned).unwrap_or_else(|| h["id"].to_string());
        let (status, _, _) =
            sim.api(reqwest::Method::DELETE, &format!("/{id}"), Some("alice-token"), None).await;
        assert!(status < 300, "deleting hook {id}: {status}");
    }
    assert!(sim.all_hooks().await.is_empty());
    let syncs = relays.iter().map(|r| r.admin_post("/admin/hooks/sync", None));
    let Ok(answers) =
        tokio::time::timeout(Duration::from_secs(25), futures_util::future::join_all(syncs)).await
    else {
        let logs: Vec<String> = relays.iter().map(|r| r.logs()).collect();
        panic!("the syncs did not finish; logs:\n{}", logs.join("\n-----\n"));
    };
    for (status, v) in answers {
        assert_eq!(status, 200, "{v}");
    }
    let hooks = sim.all_hooks().await;
    let mut events: Vec<&str> = hooks.iter().filter_map(|h| h["eventName"].as_str()).collect();
    events.sort();
    assert_eq!(events, ["ActionCreated", "TaskCreated"], "each hook once: {hooks:?}");
}

/// A destination's `max_concurrency` and `rate_limit` hold for the fleet, not per
/// relay: three relays, a slow consumer, and never more requests at once than the
/// limit (each relay alone would allow as many); then a rate limit, whose fleet-wide
/// spacing the consumer measures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destinations_limits_hold_across_the_fleet() {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let url = server.database("limits");
    let sink = Sink::start().await;
    sink.set_mode(common::sink::Mode::Slow(Duration::from_millis(300)));
    let paced = Sink::start().await;
    let limits = format!(
        "max_concurrency = 2\n[[destinations]]\nname = \"erp\"\nurl = \"{}\"\nrate_limit = 4\n",
        paced.url()
    );
    let mut relays = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..3 {
        let d = tempfile::tempdir().unwrap();
        let text = config_crm(d.path(), &url, &sink, &limits);
        relays.push(Relay::start(d.path(), &text).await);
        dirs.push(d);
    }
    // Every relay counts the three (one heartbeat, 2 s) before the load.
    for r in &relays {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while common::metric(&r.metrics().await, "hookrelay_fleet_relays", &[]) != Some(3.0) {
            assert!(std::time::Instant::now() < deadline, "the relays did not see each other");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for n in 0..24u64 {
        let r = relays[n as usize % 3]
            .callback(Some("ActionCreated"), "application/json", body(n))
            .await;
        assert_eq!(r.status(), 200);
    }
    sink.wait_for(24, Duration::from_secs(60)).await;
    assert_eq!(sink.max_in_flight(), 2, "max_concurrency = 2 across three relays");
    // 4 requests/s for the fleet: 24 take about 6 s (at 4/s each, three relays would
    // send them in about 2).
    let got = paced.wait_for(24, Duration::from_secs(60)).await;
    let span = got.last().unwrap().at - got.first().unwrap().at;
    assert!(span >= Duration::from_secs(4), "rate_limit = 4/s across three relays: 24 in {span:?}");
}

/// Three relays under load, one SIGKILLed mid-way: every acknowledged callback is
/// delivered (the dead relay's claims expire and another relay makes its attempts,
/// with the same `webhook-id`), and no delivery is ever in flight twice at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_under_load_loses_nothing_and_never_doubles_an_attempt() {
    use std::collections::HashMap;
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let url = server.database("kill");
    let sink = Sink::start().await;
    // Each attempt takes 100 ms at the sink: two at once with one webhook-id would show.
    const BUSY: Duration = Duration::from_millis(100);
    sink.set_mode(common::sink::Mode::Slow(BUSY));
    let mut dirs = Vec::new();
    let mut relays = Vec::new();
    for _ in 0..3 {
        let d = tempfile::tempdir().unwrap();
        let text = config_crm(d.path(), &url, &sink, "timeout = \"2s\"\n");
        relays.push(Relay::start(d.path(), &text).await);
        dirs.push(d);
    }
    let urls: Vec<String> = relays.iter().map(|r| r.hook_url(Some("ActionCreated"))).collect();
    // Errors are the killed relay's closed connections.
    let load = Load::start(6, urls, Duration::from_millis(10), Acked::default(), |k, n| {
        format!(r#"{{"data":{{"id":"kill-{k}-{n}"}}}}"#)
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    relays[0].kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let acked = load.stop().await;
    assert!(acked.len() > 50, "too little load: {}", acked.len());

    // The dead relay's claims go to the others once its heartbeat has lapsed for its
    // attempts' bound (timeout 2 s + 10 s), and its dispatch lease (if it led) within
    // 10 s: everything is delivered well within 45 s, not a whole claim lease (62 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(45);
    let received = loop {
        let got = sink.received();
        let missing = undelivered(&sink, &acked).len();
        if missing == 0 {
            break got;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{missing} of {} acknowledged callbacks never delivered",
            acked.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut by_id: HashMap<String, Vec<std::time::Instant>> = HashMap::new();
    for r in &received {
        if let Some(id) = r.header("webhook-id") {
            by_id.entry(id.to_owned()).or_default().push(r.at);
        }
    }
    for (id, mut at) in by_id {
        at.sort();
        for pair in at.windows(2) {
            assert!(pair[1].duration_since(pair[0]) >= BUSY, "{id} was in flight twice at once");
        }
    }
}

/// `hookrelay migrate --dry-run` says what it would do and changes nothing; `migrate`
/// applies; a schema newer than the build is refused, by `migrate` and by `serve`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_dry_run_applies_nothing_and_a_newer_schema_is_refused() {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let url = server.database("migrate");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookrelay.toml");
    std::fs::write(
        &path,
        // Every secret but the database's is missing: migrate needs none of them.
        "[storage]\nbackend = \"postgres\"\n[storage.postgres]\nurl_env = \"PG_URL\"\n\
         [admin]\ntoken_env = \"UNSET_ADMIN_TOKEN\"\n\
         [[sources]]\nname = \"demo\"\ntoken_env = \"UNSET_SOURCE_TOKEN\"\n",
    )
    .unwrap();
    let migrate = |args: &[&str]| {
        let out = std::process::Command::new(common::binary())
            .arg("migrate")
            .args(args)
            .arg("--config")
            .arg(&path)
            .env("PG_URL", &url)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = migrate(&["--dry-run"]);
    assert!(ok && text.contains("at version 0") && text.contains("would apply"), "{text}");
    let (ok, text) = migrate(&["--dry-run"]);
    assert!(ok && text.contains("at version 0"), "the dry run changed something: {text}");
    let (ok, text) = migrate(&[]);
    assert!(ok && text.contains("was at version 0, is at version 8"), "{text}");
    let (ok, text) = migrate(&["--dry-run"]);
    assert!(ok && text.contains("nothing to apply"), "{text}");
    assert!(!text.contains(&url), "the URL is a secret: {text}");

    // A schema of the first release is brought up to date by the later migrations.
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "DROP TABLE hookrelay.relays, hookrelay.received, hookrelay.leases,
                 hookrelay.audit, hookrelay.audit_start, hookrelay.journal;
             ALTER TABLE hookrelay.events DROP COLUMN record;
             UPDATE hookrelay.schema_version SET version = 1",
        )
        .await
        .unwrap();
    let (ok, text) = migrate(&["--dry-run"]);
    assert!(
        ok && text.contains("at version 1; would apply migration(s) 2, 3, 4, 5, 6, 7, 8 "),
        "{text}"
    );
    let (ok, text) = migrate(&[]);
    assert!(ok && text.contains("was at version 1, is at version 8"), "{text}");
    // The ledger starts after the events already stored.
    client.query_one("SELECT start FROM hookrelay.audit_start", &[]).await.unwrap();
    client.query_one("SELECT count(*) FROM hookrelay.leases", &[]).await.unwrap();
    client.query_one("SELECT count(*) FROM hookrelay.relays", &[]).await.unwrap();
    client.query_one("SELECT count(*) FROM hookrelay.received", &[]).await.unwrap();
    client.query_one("SELECT count(*) FROM hookrelay.journal", &[]).await.unwrap();
    client
        .query_one("SELECT count(*) FROM hookrelay.events WHERE record = 'a/1'", &[])
        .await
        .unwrap();

    client.execute("UPDATE hookrelay.schema_version SET version = 99", &[]).await.unwrap();
    let (ok, text) = migrate(&[]);
    assert!(!ok && text.contains("schema version 99"), "{text}");
    // `serve` on the same file wants the secrets, and names them.
    let out = std::process::Command::new(common::binary())
        .args(["check-config", "--config"])
        .arg(&path)
        .env("PG_URL", &url)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && text.contains("UNSET_SOURCE_TOKEN"), "{text}");
}

/// A stall is never silent: with the `deliveries` table locked by another session,
/// the worker's store calls wait (slow, not failed: the write watchdog is set far out),
/// no attempt starts, and the progress watchdog reports it (log line with the state,
/// `/readyz` degraded but 200), restarts the worker within its budget, and once the
/// lock goes, everything due is delivered and the stall is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stuck_on_the_store_is_reported_restarted_and_recovers() {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let url = server.database("stall");
    let sink = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    // Stall bound: probe interval 1 s + timeout 1 s + 2 s of sleeps + 10 s = 14 s.
    let text = config_crm(dir.path(), &url, &sink, "timeout = \"1s\"\n")
        .replace("[storage]", "[storage]\nwrite_timeout = \"10m\"")
        + "\n[delivery]\ncircuit_probe_interval = \"1s\"\n";
    let relay = Relay::start(dir.path(), &text).await;
    assert_eq!(
        relay.callback(Some("ActionCreated"), "application/json", body(1)).await.status(),
        200
    );
    sink.wait_for(1, Duration::from_secs(20)).await;

    let (locker, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    locker
        .batch_execute("BEGIN; LOCK TABLE hookrelay.deliveries IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    for n in 2..5 {
        let r = relay.callback(Some("ActionCreated"), "application/json", body(n)).await;
        assert_eq!(r.status(), 200, "ingest does not wait on deliveries");
    }
    // Reported within the bound and a check interval, restarted, and still reported.
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    while !relay.logs().contains("restarting its worker") {
        assert!(std::time::Instant::now() < deadline, "no stall reported:\n{}", relay.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logs = relay.logs();
    let line = logs.lines().find(|l| l.contains("destination stalled")).unwrap();
    for field in ["\"destination\":\"crm\"", "idle_seconds", "circuit", "in_flight"] {
        assert!(line.contains(field), "{field} missing in {line}");
    }
    let ready = reqwest::get(format!("http://{}/readyz", relay.admin)).await.unwrap();
    assert_eq!(ready.status(), 200, "ingest is unaffected: readiness stays");
    let text = ready.text().await.unwrap();
    assert!(text.contains("degraded") && text.contains("crm"), "{text}");

    // The lock goes: what was due is delivered, and the stall is over.
    locker.batch_execute("COMMIT").await.unwrap();
    sink.wait_for(4, Duration::from_secs(30)).await;
    let metrics = relay.metrics().await;
    let stalled = || async {
        common::metric(
            &relay.metrics().await,
            "hookrelay_destination_stalled",
            &[("destination", "crm")],
        )
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while stalled().await != Some(0.0) {
        assert!(std::time::Instant::now() < deadline, "still stalled after progress");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let restarts = common::metric(
        &metrics,
        "hookrelay_destination_worker_restarts_total",
        &[("destination", "crm")],
    );
    assert!(restarts.is_some_and(|r| (1.0..=3.0).contains(&r)), "{restarts:?}");
    assert!(relay.logs().contains("destination makes progress again"));
    let ready = reqwest::get(format!("http://{}/readyz", relay.admin)).await.unwrap();
    assert_eq!(ready.text().await.unwrap(), "ready\n");
}
