//! Outages of the database under three relays: an outage, a relay started before its
//! database, a restart, a stop and failovers to a synchronous and an asynchronous
//! standby. Each ends with everything acknowledged delivered within a stated bound.

use super::*;

/// PostgreSQL stopped under load and started again: no callback gets a non-200 answer
/// (those that cannot be stored are closed unanswered), `/readyz` says why while it is
/// down, ingest resumes by itself, and every acknowledged callback is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_refuses_nothing_with_an_error_and_loses_nothing() {
    use std::sync::Arc;
    let server = Arc::new(tokio::task::spawn_blocking(PgServer::start).await.unwrap());
    let url = server.database("outage");
    let sink = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let relay = Relay::start(dir.path(), &config(dir.path(), &url, &sink)).await;

    let load = Load::start(
        4,
        vec![relay.hook_url(Some("ActionCreated"))],
        Duration::from_millis(5),
        Acked::default(),
        |k, n| format!(r#"{{"data":{{"id":"outage-{k}-{n}"}}}}"#),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.stop()).await.unwrap();
    let before_outage = load.acked_len();
    // Unready, saying why, while the database is down.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let reason = loop {
        let r = reqwest::get(format!("http://{}/readyz", relay.admin)).await.unwrap();
        if r.status() == 503 {
            break r.text().await.unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "still ready with the database down");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(reason.contains("database is unreachable"), "{reason}");
    assert!(!reason.contains(&url), "the URL is a secret: {reason}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.start_again()).await.unwrap();

    // Ready again by itself, and callbacks acknowledged again.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = reqwest::get(format!("http://{}/readyz", relay.admin)).await.unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not ready again after the database came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resumed_from = load.acked_len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let acked = load.stop().await;
    assert!(
        before_outage > 0 && acked.len() > resumed_from,
        "ingest resumed: {before_outage} / {resumed_from} / {}",
        acked.len()
    );

    // Every acknowledged callback is delivered.
    wait_delivered(&sink, &acked, Duration::from_secs(60), "acknowledged callbacks").await;
}

/// Started 30 s before its database, a relay does not exit: it waits, alive
/// (`/healthz` 200), not ready and saying why (`/readyz` 503 naming host:port and the
/// refusal, never the URL), and is ready within its backoff (15 s) of the database
/// coming up, then takes callbacks and delivers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_before_its_database_waits_and_is_ready_once_it_is_up() {
    use std::sync::Arc;
    let server = Arc::new(tokio::task::spawn_blocking(PgServer::start).await.unwrap());
    let url = server.database("early");
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.stop()).await.unwrap();
    let sink = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (ingress, admin) = (free_addr(), free_addr());
    let text = config(dir.path(), &url, &sink)
        .replacen("listen = \"127.0.0.1:0\"", &format!("listen = \"{ingress}\""), 1)
        .replacen("listen = \"127.0.0.1:0\"", &format!("listen = \"{admin}\""), 1);
    let mut child = spawn_serve(dir.path(), &text);
    let (logs, _) = common::read_logs(child.stderr.take().unwrap());
    let http = reqwest::Client::new();
    let get = |path: &'static str| {
        let (http, admin) = (http.clone(), admin.clone());
        async move {
            match http.get(format!("http://{admin}{path}")).send().await {
                Ok(r) => Some((r.status().as_u16(), r.text().await.unwrap_or_default())),
                Err(_) => None,
            }
        }
    };
    let start = std::time::Instant::now();
    let mut seen_waiting = false;
    while start.elapsed() < Duration::from_secs(30) {
        assert!(child.try_wait().unwrap().is_none(), "the relay exited: {}", logs.lock().unwrap());
        if let (Some((200, _)), Some((503, why))) = (get("/healthz").await, get("/readyz").await) {
            let port = server.port();
            assert!(why.contains("waiting for the database"), "{why}");
            assert!(why.contains(&format!("127.0.0.1:{port}")), "no host:port: {why}");
            // The cause is named: "refused" while the port is free. Another test's
            // server may take the freed port meanwhile (CI saw "bytes remaining on
            // stream"): then the cause is what that server did, still named.
            let refused = std::net::TcpStream::connect(("127.0.0.1", port)).is_err();
            let cause = why.split("): ").nth(1).and_then(|c| c.split("; check").next());
            assert!(cause.is_some_and(|c| !c.trim().is_empty()), "no cause: {why}");
            if refused {
                assert!(why.to_lowercase().contains("refused"), "not the refusal: {why}");
            }
            assert!(!why.contains(&url), "the URL is a secret: {why}");
            if !seen_waiting {
                // A reload asked meanwhile (systemctl reload) is not the relay's end.
                // SAFETY: kill(2) on our own child's pid; no memory is involved.
                assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGHUP) }, 0);
            }
            seen_waiting = true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        seen_waiting,
        "never answered /healthz and /readyz while waiting: {}",
        logs.lock().unwrap()
    );
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.start_again()).await.unwrap();
    let up = std::time::Instant::now();
    loop {
        if let Some((200, _)) = get("/readyz").await {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "the relay exited: {}", logs.lock().unwrap());
        assert!(
            up.elapsed() < Duration::from_secs(25),
            "not ready 25 s after the database came up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = http
        .post(format!("http://{ingress}/hooks/{}/{}/ActionCreated", common::SOURCE, common::TOKEN))
        .header("content-type", "application/json")
        .body(r#"{"data":{"id":"early-1"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    sink.wait_for(1, Duration::from_secs(20)).await;
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// Three relays on a primary with a synchronous standby (`remote_apply`), the URL
/// listing both hosts with `target_session_attrs=read-write`, ride through, under
/// load, a restart of the primary, a 60 s stop of it, and its loss with the standby
/// promoted: no relay exits, ingest resumes on the new primary, and every
/// acknowledged callback is delivered within 45 s of the failover (none lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_relays_ride_through_a_restart_a_stop_and_a_failover_to_a_synchronous_standby() {
    let run = failover(true, true).await;
    assert!(run.lost.is_empty(), "{} acknowledged callbacks lost: {:?}", run.lost.len(), run.lost);
}

/// The same failover with an asynchronous standby: what the primary had committed
/// (and acknowledged) but not yet sent when it died is lost. Measured, not promised
/// (docs/deploy.md): the relays still ride through, and everything the new primary
/// has is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_an_asynchronous_standby_is_ridden_through_and_its_loss_measured() {
    let run = failover(false, false).await;
    eprintln!(
        "asynchronous standby: {} of {} acknowledged callbacks lost at the failover",
        run.lost.len(),
        run.acked
    );
    assert!(
        run.lost.len() < run.acked,
        "everything lost: the relays never reached the new primary"
    );
}

/// What a failover run saw: callbacks acknowledged, and those of them the new primary
/// does not have.
struct Failover {
    acked: usize,
    lost: Vec<String>,
}

/// Three relays under load on a primary and its standby (`synchronous` or not); with
/// `outages_first`, a restart and a 60 s stop of the primary come before its loss.
/// Then the primary crashes and the standby is promoted. Asserts that no relay exits,
/// that ingest resumes on the new primary, and that every acknowledged callback the
/// new primary holds is delivered within 45 s: less than a claim's lease (75 s), so a
/// claim left to its lease fails it (measured: 3.4–4.3 s).
async fn failover(synchronous: bool, outages_first: bool) -> Failover {
    use std::sync::Arc;
    let primary = Arc::new(tokio::task::spawn_blocking(PgServer::start).await.unwrap());
    primary.database("failover");
    let p = primary.clone();
    let standby =
        Arc::new(tokio::task::spawn_blocking(move || p.standby(synchronous)).await.unwrap());
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/failover?target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    let sink = Sink::start().await;
    let mut dirs = Vec::new();
    let mut relays = Vec::new();
    for _ in 0..3 {
        let d = tempfile::tempdir().unwrap();
        relays.push(Relay::start(d.path(), &config(d.path(), &url, &sink)).await);
        dirs.push(d);
    }
    let urls: Vec<String> = relays.iter().map(|r| r.hook_url(Some("ActionCreated"))).collect();
    let load = Load::start(4, urls, Duration::from_millis(10), Acked::default(), |k, n| {
        format!(r#"{{"data":{{"id":"fo-{k}-{n}"}}}}"#)
    });
    let alive = |relays: &mut Vec<Relay>, when: &str| {
        for (i, r) in relays.iter_mut().enumerate() {
            assert!(r.exited().is_none(), "relay {i} exited {when}: {}", r.logs());
        }
    };
    let blocking = |f: fn(&PgServer), server: &Arc<PgServer>| {
        let server = server.clone();
        tokio::task::spawn_blocking(move || f(&server))
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    if outages_first {
        // A restart.
        blocking(PgServer::stop, &primary).await.unwrap();
        blocking(PgServer::start_again, &primary).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        alive(&mut relays, "after the restart");
        // A 60 s stop.
        blocking(PgServer::stop, &primary).await.unwrap();
        for _ in 0..12 {
            tokio::time::sleep(Duration::from_secs(5)).await;
            alive(&mut relays, "during the 60 s stop");
        }
        blocking(PgServer::start_again, &primary).await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    // The primary lost; the standby promoted.
    let before_failover = load.acked_len();
    let crashed = std::time::Instant::now();
    blocking(PgServer::crash, &primary).await.unwrap();
    blocking(PgServer::promote, &standby).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while load.acked_len() < before_failover + 50 {
        assert!(std::time::Instant::now() < deadline, "ingest did not resume on the new primary");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("ingest resumed {:.1} s after the primary crashed", crashed.elapsed().as_secs_f64());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let acked = load.stop().await;
    alive(&mut relays, "after the failover");
    // What the new primary holds (by marker), to tell lost from undelivered.
    let (client, connection) = tokio_postgres::connect(
        &format!("postgres://postgres@127.0.0.1:{}/failover", standby.port()),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let bodies: Vec<String> = client
        .query(
            "SELECT convert_from(body, 'UTF8') FROM hookrelay.events WHERE body IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let stored = |marker: &str| bodies.iter().any(|b| b.contains(marker));
    let mut lost = Vec::new();
    let mut kept = Vec::new();
    for (id, body) in &acked {
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        let marker = format!("\"{}\"", v["data"]["id"].as_str().unwrap());
        if stored(&marker) {
            kept.push((id.clone(), body.clone()));
        } else {
            lost.push(marker);
        }
    }
    wait_delivered(&sink, &kept, Duration::from_secs(45), "stored callbacks, after the failover")
        .await;
    eprintln!(
        "everything stored delivered {:.1} s after the primary crashed",
        crashed.elapsed().as_secs_f64()
    );
    alive(&mut relays, "at the end");
    Failover { acked: acked.len(), lost }
}
