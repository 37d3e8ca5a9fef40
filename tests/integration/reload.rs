//! Reload without a restart (issue 42): SIGHUP and `POST /admin/reload` read the file
//! again and put it in force while callbacks keep coming: a destination added, a filter
//! changed, a destination's settings changed while its attempts are in flight, one
//! removed and brought back. Nothing acknowledged is lost or sent twice, and every
//! destination gets what its configuration in force routed to it. A reload that
//! cannot take (a broken file, a key only a restart changes) changes nothing and says
//! why; a rotated admin token takes at once.

use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::common::load::Steady;
use crate::common::sink::{Mode, Sink};
use crate::common::{self, metric, Relay, ADMIN_TOKEN, TOKEN};

/// How long after the load stops everything due must have arrived.
const BOUND: Duration = Duration::from_secs(60);

/// Rewrites the relay's configuration file (where `Relay::start` wrote it).
fn rewrite(dir: &std::path::Path, text: &str) {
    std::fs::write(dir.join("hookrelay.toml"), text).unwrap();
}

/// `[[destinations]]` entries: (name, url, extra lines).
fn destinations(entries: &[(&str, String, &str)]) -> String {
    entries
        .iter()
        .map(|(name, url, extra)| {
            format!("\n[[destinations]]\nname = \"{name}\"\nurl = \"{url}\"\n{extra}\n")
        })
        .collect()
}

/// Waits until `hookrelay_config_reloads_total{result}` reaches `n`.
async fn reloads_reach(relay: &Relay, result: &str, n: f64) {
    let deadline = Instant::now() + BOUND;
    loop {
        let text = relay.metrics().await;
        if metric(&text, "hookrelay_config_reloads_total", &[("result", result)]) >= Some(n) {
            return;
        }
        assert!(Instant::now() < deadline, "no {n} reloads {result}:\n{}", relay.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Each once: the sorted list has no repeat.
fn assert_once(name: &str, mut seen: Vec<u64>) -> Vec<u64> {
    seen.sort_unstable();
    let repeats: Vec<&u64> = seen.windows(2).filter(|w| w[0] == w[1]).map(|w| &w[0]).collect();
    assert!(repeats.is_empty(), "{name} got these twice: {repeats:?}");
    seen
}

/// The load: callbacks a second. Each is filtered by a jq program at dispatch: on a
/// loaded 2-core machine, 300 a second put dispatch seconds behind.
const RATE: u32 = 100;

/// How long the load runs between two reloads.
const PHASE: Duration = Duration::from_secs(4);

/// The sequence numbers (`"n"` of the load's bodies) the sink answered 200 to.
fn delivered(sink: &Sink) -> Vec<u64> {
    sink.received()
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap()["n"].as_u64().unwrap())
        .collect()
}

/// Waits until `sink` answered 200 to every one of `due` (within [`BOUND`]).
async fn wait_delivered(name: &str, sink: &Sink, due: &[u64], relay: &Relay) {
    let deadline = Instant::now() + BOUND;
    loop {
        let seen: std::collections::BTreeSet<u64> = delivered(sink).into_iter().collect();
        let missing: Vec<&u64> = due.iter().filter(|n| !seen.contains(n)).collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} is missing {} callbacks (first {:?}) {BOUND:?} after the load:\n{}",
            missing.len(),
            &missing[..missing.len().min(10)],
            relay.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_under_load_add_change_and_remove_destinations_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // crm answers slowly: every reload finds its attempts in flight.
    let (crm, erp, billing) = (Sink::start().await, Sink::start().await, Sink::start().await);
    crm.set_mode(Mode::Slow(Duration::from_millis(40)));
    let (even, odd) = ("filter = '.body.n % 2 == 0'", "filter = '.body.n % 2 == 1'");
    let wide = "max_concurrency = 32";
    let file = |entries: &[(&str, String, &str)]| {
        common::config_with(&data, "", &format!("{}{}", common::FAST_RETRY, destinations(entries)))
    };
    let text = file(&[("crm", crm.url(), wide), ("erp", erp.url(), even)]);
    let relay = Relay::start(dir.path(), &text).await;
    // Callbacks at a steady rate (each on a connection of its own).
    let url = relay.hook_url(Some("ActionCreated"));
    let load = Steady::start(url, RATE, move |n| {
        format!(r#"{{"data":{{"type":"actions","id":"{n}"}},"n":{n}}}"#)
    });
    tokio::time::sleep(PHASE).await;

    // 1. SIGHUP: billing added, erp's filter turned around.
    let crm_v2 = format!("{wide}\nheaders = {{ \"X-Generation\" = \"2\" }}");
    let hup =
        file(&[("crm", crm.url(), wide), ("erp", erp.url(), odd), ("billing", billing.url(), "")]);
    rewrite(dir.path(), &hup);
    relay.signal(libc::SIGHUP);
    reloads_reach(&relay, "reloaded", 1.0).await;
    tokio::time::sleep(PHASE).await;

    // 2. POST /admin/reload: crm's settings change (a header) with its attempts in
    // flight; its new worker starts once the old one has recorded them.
    let with_erp = file(&[
        ("crm", crm.url(), &crm_v2),
        ("erp", erp.url(), odd),
        ("billing", billing.url(), ""),
    ]);
    rewrite(dir.path(), &with_erp);
    let v2_asked = Instant::now();
    let (status, answer) = relay.admin_post("/admin/reload", None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"], "reloaded");
    assert_eq!(answer["changed"], serde_json::json!(["crm"]), "{answer}");
    let v2_done = Instant::now();
    tokio::time::sleep(PHASE).await;

    // 3. erp fails, then is removed: what it owes is held, not lost, and nothing new
    // is routed to it; 4. it comes back, healthy, and gets all it was owed.
    erp.set_mode(Mode::Status(503));
    tokio::time::sleep(Duration::from_millis(400)).await;
    rewrite(dir.path(), &file(&[("crm", crm.url(), &crm_v2), ("billing", billing.url(), "")]));
    let (status, answer) = relay.admin_post("/admin/reload", None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["removed"], serde_json::json!(["erp"]), "{answer}");
    // Long enough that callbacks well clear of both reloads are routed without erp.
    tokio::time::sleep(PHASE * 2).await;
    erp.set_mode(Mode::Ok);
    rewrite(dir.path(), &with_erp);
    let (status, answer) = relay.admin_post("/admin/reload", None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["added"], serde_json::json!(["erp"]), "{answer}");
    tokio::time::sleep(PHASE).await;
    let failed = load.failed.clone();
    let acked = load.stop().await;
    let failed = failed.lock().unwrap().clone();
    assert!(failed.is_empty(), "callbacks not answered 200: {failed:?}");
    assert!(acked.len() > 1500, "only {} callbacks acknowledged", acked.len());
    let mut all: Vec<u64> = acked
        .iter()
        .map(|(_, body)| serde_json::from_str::<Value>(body).unwrap()["n"].as_u64().unwrap())
        .collect();
    all.sort_unstable();

    // Progress: within the bound, crm has every acknowledged callback, each once.
    wait_delivered("crm", &crm, &all, &relay).await;
    assert_eq!(assert_once("crm", delivered(&crm)), all, "crm got exactly what was acknowledged");
    // Its header, by when each request was sent (an attempt starts under the settings
    // in force then, whenever its callback came): none before the second reload was
    // asked; on every one sent a second after it was answered (its old worker's
    // attempts in flight were recorded by then, the new worker sending since).
    for r in crm.received() {
        let header = r.header("x-generation");
        if r.at < v2_asked {
            assert_eq!(header, None, "sent with the header before it was configured");
        } else if r.at > v2_done + Duration::from_secs(1) {
            assert_eq!(header, Some("2"), "sent under crm's old settings after the reload");
        }
    }
    // billing and erp, by the configuration in force when each callback was
    // dispatched (its deliveries' `created_at`), as the relay recorded it: the journal
    // says when each reload took. A callback dispatched right at a reload may be
    // either's.
    let (_, journal) = relay.admin_get("/admin/journal?action=reload").await;
    let mut swaps: Vec<SystemTime> = journal["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| humantime::parse_rfc3339_weak(e["at"].as_str().unwrap()).unwrap())
        .collect();
    swaps.reverse();
    assert_eq!(swaps.len(), 4, "{journal}");
    let (hup, removal, back) = (swaps[0], swaps[2], swaps[3]);
    let near = |t: SystemTime, swap: SystemTime| {
        let (early, late) = (swap - Duration::from_millis(500), swap + Duration::from_millis(100));
        t > early && t < late
    };
    let (mut for_billing, mut for_erp, mut filtered) = (Vec::new(), Vec::new(), 0);
    for (id, body) in &acked {
        let n = serde_json::from_str::<Value>(body).unwrap()["n"].as_u64().unwrap();
        let (_, event) = relay.admin_get(&format!("/admin/events/{id}")).await;
        let deliveries = event["deliveries"].as_array().unwrap();
        let to = |d: &str| deliveries.iter().find(|x| x["destination"] == d).cloned();
        let crm_delivery = to("crm").unwrap_or_else(|| panic!("{n} has no crm delivery: {event}"));
        let at =
            humantime::parse_rfc3339_weak(crm_delivery["created_at"].as_str().unwrap()).unwrap();
        if [hup, removal, back].iter().any(|s| near(at, *s)) {
            continue;
        }
        // billing from the SIGHUP on.
        assert_eq!(to("billing").is_some(), at > hup, "{n} and billing: {event}");
        if to("billing").is_some() {
            for_billing.push(n);
        }
        // erp: even before the SIGHUP, odd after it; not routed while it was gone.
        let gone = at > removal && at < back;
        let Some(erp_delivery) = to("erp") else {
            assert!(gone, "{n} was not routed to erp while it was configured: {event}");
            continue;
        };
        assert!(!gone, "{n} was routed to erp while it was not configured: {event}");
        let passes = if at < hup { n.is_multiple_of(2) } else { !n.is_multiple_of(2) };
        assert_eq!(erp_delivery["state"] != "filtered", passes, "{n} and erp's filter: {event}");
        if passes {
            for_erp.push(n);
        } else {
            filtered += 1;
        }
    }
    assert!(filtered > 100 && for_erp.len() > 100, "{filtered} filtered, {} passed", for_erp.len());
    // Progress: each delivered, once, within the bound (erp's owed while it failed and
    // was gone included).
    wait_delivered("billing", &billing, &for_billing, &relay).await;
    assert_once("billing", delivered(&billing));
    wait_delivered("erp", &erp, &for_erp, &relay).await;
    assert_once("erp", delivered(&erp));
    let text = relay.metrics().await;
    let reloaded = metric(&text, "hookrelay_config_reloads_total", &[("result", "reloaded")]);
    assert_eq!(reloaded, Some(4.0));
    let journal = relay.admin_get("/admin/journal?action=reload").await.1;
    let who: Vec<&str> =
        journal["entries"].as_array().unwrap().iter().map(|e| e["who"].as_str().unwrap()).collect();
    assert_eq!(who, ["admin", "admin", "admin", "SIGHUP"], "{journal}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_cannot_take_changes_nothing_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let crm = Sink::start().await;
    let dests = destinations(&[("crm", crm.url(), "")]);
    let text = common::config_with(&data, "", &dests);
    let relay = Relay::start(dir.path(), &text).await;
    let fingerprint =
        || async { metric(&relay.metrics().await, "hookrelay_config_fingerprint", &[]).unwrap() };
    let first = fingerprint().await;
    assert!(first > 0.0);
    // The same file: unchanged.
    let (status, answer) = relay.admin_post("/admin/reload", None).await;
    assert_eq!((status, answer["result"].as_str()), (200, Some("unchanged")), "{answer}");

    // A file that does not parse, a filter that does not compile, a key only a
    // restart changes: each 409 with why, and nothing changed.
    let broken = [
        (format!("{text}\n[[destinations]\nname = "), "hookrelay.toml"),
        (
            common::config_with(&data, "", &destinations(&[("crm", crm.url(), "filter = '.[' ")])),
            "destinations[0].filter",
        ),
        (
            text.replace(
                "[ingress]\nlisten = \"127.0.0.1:0\"",
                "[ingress]\nlisten = \"127.0.0.1:1\"",
            ),
            "ingress.listen changed",
        ),
        (text.replace("level = \"info\"", "level = \"debug\""), "log.level changed"),
    ];
    for (file, said) in &broken {
        rewrite(dir.path(), file);
        let (status, answer) = relay.admin_post("/admin/reload", None).await;
        assert_eq!(status, 409, "{answer}");
        let error = answer["error"].as_str().unwrap();
        assert!(error.contains(said), "{said:?} not in {error}");
        assert!(error.contains("the running configuration stays"), "{error}");
    }
    let text_now = relay.metrics().await;
    assert_eq!(
        metric(&text_now, "hookrelay_config_reloads_total", &[("result", "invalid")]),
        Some(2.0)
    );
    assert_eq!(
        metric(&text_now, "hookrelay_config_reloads_total", &[("result", "refused")]),
        Some(2.0)
    );
    assert_eq!(fingerprint().await, first, "nothing changed");
    // A SIGHUP with a broken file: the relay stays up and says why in its log.
    rewrite(dir.path(), &broken[0].0);
    relay.signal(libc::SIGHUP);
    reloads_reach(&relay, "invalid", 3.0).await;
    assert!(relay.logs().contains("configuration reload failed"));
    let r = relay.callback(Some("ActionCreated"), "application/json", r#"{"data":{"n":1}}"#).await;
    assert_eq!(r.status(), 200);
    crm.wait_for(1, BOUND).await;

    // A rotated admin token and a new viewer take at once; the old token no longer does.
    let rotated = "rotated-admin-token-0123456789abcdef";
    let viewer = "helpdesk-viewer-token-0123456789ab";
    let next = text.replace(ADMIN_TOKEN, rotated)
        + &format!(
            "\n[[admin.tokens]]\nname = \"helpdesk\"\nrole = \"viewer\"\ntoken = \"{viewer}\"\n"
        );
    rewrite(dir.path(), &next);
    let (status, answer) = relay.admin_post("/admin/reload", None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["tokens"], true, "{answer}");
    assert_ne!(fingerprint().await, first);
    let (status, _) = relay.admin_get("/admin/overview").await;
    assert_eq!(status, 401, "the old token is refused");
    let (status, _) = relay.admin_as(rotated, "GET", "/admin/overview", None).await;
    assert_eq!(status, 200);
    let (status, answer) = relay.admin_as(viewer, "POST", "/admin/reload", None).await;
    assert_eq!(status, 403, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("admin"), "{answer}");
    // The command line asks the same: unchanged, then refused (exit 1, with why).
    let (code, out, err) = relay.cli(dir.path(), &["reload"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("unchanged"), "{out}");
    rewrite(dir.path(), &next.replace("level = \"info\"", "level = \"debug\""));
    let (code, out, err) = relay.cli(dir.path(), &["reload"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("log.level changed"), "{err}");
    // The journal: who asked, and what came of it, newest first.
    let (_, journal) = relay.admin_as(rotated, "GET", "/admin/journal?action=reload", None).await;
    let entries: Vec<(String, String)> = journal["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["who"].as_str().unwrap().into(), e["result"].as_str().unwrap().into()))
        .collect();
    assert_eq!(entries.len(), 9, "{journal}");
    assert!(entries[0].1.contains("log.level changed"), "{entries:?}");
    assert_eq!(entries[1], ("admin".into(), "ok".into()), "the command line's");
    assert_eq!(entries[2], ("admin".into(), "ok".into()), "the rotation");
    assert_eq!(entries[3].0, "SIGHUP");
    assert!(entries[3].1.contains("hookrelay.toml"), "{entries:?}");
    assert!(entries[4].1.contains("log.level changed"), "{entries:?}");
    assert_eq!(entries[8], ("admin".into(), "ok".into()), "the unchanged one");
    // Secrets are never said: not in the answers, the journal or the log.
    for secret in [ADMIN_TOKEN, rotated, viewer, TOKEN] {
        assert!(!journal.to_string().contains(secret));
        assert!(!relay.logs().contains(secret), "{secret} in the log");
    }
}
