//! Filters and transforms (jq, per destination) end to end: what each consumer
//! receives, the verdicts recorded and counted, the signature over the transformed
//! body, the preview (API and CLI), a replay that asks the filter again, and a
//! broken transform fixed in the config and replayed.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::sink::Sink;
use common::{metric, Relay};
use serde_json::{json, Value};

/// `whsec_` + base64 of 32 bytes.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwRv5D8XT7Qm8=";
/// Everything due is delivered within this bound after each step.
const BOUND: Duration = Duration::from_secs(15);

fn destinations(
    open: &Sink,
    strict: &Sink,
    flat: &Sink,
    picky: &Sink,
    picky_transform: &str,
) -> String {
    let flatten = include_str!("../../docs/transforms/flatten.jq");
    format!(
        r#"
[[destinations]]
name = "open"
url = "{}"
filter = '.body.data.attributes.status == "Open"'

[[destinations]]
name = "strict"
url = "{}"
filter = '.body.data.attributes.status | ascii_downcase == "open"'

[[destinations]]
name = "flat"
url = "{}"
secret = "{SECRET}"
transform = '''
{flatten}
'''

[[destinations]]
name = "picky"
url = "{}"
transform = '{picky_transform}'
"#,
        open.url(),
        strict.url(),
        flat.url(),
        picky.url()
    )
}

const BROKEN: &str =
    r#"if .body.data.id == "7" then error("no id 7") else {id: .body.data.id} end"#;
const FIXED: &str = r#"if .body.data.id == "7" then {fixed: true} else {id: .body.data.id} end"#;

/// The delivery of `id` to `dest` as the admin API shows it.
async fn delivery(relay: &Relay, id: &str, dest: &str) -> Value {
    let (_, v) = relay.admin_get(&format!("/admin/events/{id}")).await;
    v["deliveries"].as_array().unwrap().iter().find(|d| d["destination"] == dest).cloned().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_and_transforms_shape_what_each_destination_gets() {
    let dir = tempfile::tempdir().unwrap();
    let (open, strict, flat, picky) =
        (Sink::start().await, Sink::start().await, Sink::start().await, Sink::start().await);
    let config = |picky_transform: &str| {
        common::config_with(
            &dir.path().join("data"),
            "",
            &destinations(&open, &strict, &flat, &picky, picky_transform),
        )
    };
    let mut relay = Relay::start(dir.path(), &config(BROKEN)).await;

    // Three callbacks at once: an open action, a closed one, a task without a status.
    let bodies = [
        r#"{"data":{"type":"actions","id":"5","attributes":{"status":"Open","subject":"a"}}}"#,
        r#"{"data":{"type":"actions","id":"6","attributes":{"status":"Closed"}}}"#,
        r#"{"data":{"type":"tasks","id":"7","attributes":{"done":false}}}"#,
    ];
    let mut ids = Vec::new();
    let sent = futures_util::future::join_all(
        bodies
            .iter()
            .map(|b| relay.callback(Some("ActionUpdated"), "application/json", (*b).to_owned())),
    )
    .await;
    for r in sent {
        assert_eq!(r.status(), 200);
        ids.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned());
    }

    // Everything due arrives within the bound: the open action to `open` and `strict`,
    // all three flattened and signed to `flat`, two of three to `picky`.
    open.wait_for(1, BOUND).await;
    strict.wait_for(1, BOUND).await;
    let got = flat.wait_for(3, BOUND).await;
    picky.wait_for(2, BOUND).await;
    relay
        .admin_until(&format!("/admin/events/{}", ids[2]), BOUND, |v| {
            v["deliveries"].as_array().is_some_and(|d| {
                d.iter().any(|d| d["destination"] == "picky" && d["state"] == "dead")
            })
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!((open.count(), strict.count(), flat.count(), picky.count()), (1, 1, 3, 2));
    assert!(String::from_utf8_lossy(&open.received()[0].body).contains("\"5\""));

    // The filtered deliveries say why; a failing filter is a filter error.
    let closed = delivery(&relay, &ids[1], "open").await;
    assert_eq!(
        (closed["state"].as_str(), closed["reason"].as_str()),
        (Some("filtered"), Some("the filter gave false"))
    );
    let task = delivery(&relay, &ids[2], "strict").await;
    assert_eq!(task["state"], "filtered", "{task}");
    assert!(task["reason"].as_str().unwrap().starts_with("the filter failed: "), "{task}");
    let m = relay.metrics().await;
    let filtered = |dest, cause| {
        metric(
            &m,
            "hookrelay_deliveries_filtered_total",
            &[("destination", dest), ("cause", cause)],
        )
    };
    assert_eq!(
        (filtered("open", "no_match"), filtered("strict", "no_match"), filtered("strict", "error")),
        (Some(2.0), Some(1.0), Some(1.0)),
        "{m}"
    );

    // The transformed body, as JSON, signed: the reference verifier accepts it.
    let mut flattened: Vec<Value> =
        got.iter().map(|r| serde_json::from_slice(&r.body).unwrap()).collect();
    flattened.sort_by_key(|v| v["id"].as_str().unwrap_or_default().to_owned());
    assert_eq!(
        flattened[0],
        json!({"event": "ActionUpdated", "type": "actions", "id": "5", "attributes": {"status": "Open", "subject": "a"}})
    );
    assert_eq!(flattened[2]["type"], "tasks");
    for r in &got {
        assert_eq!(r.header("content-type"), Some("application/json"));
        crate::signatures::verify_with_reference(dir.path(), SECRET, r);
    }

    // A transform that fails makes the delivery dead, with the error, and is counted.
    let dead = delivery(&relay, &ids[2], "picky").await;
    assert!(dead["last_error"].as_str().unwrap().contains("no id 7"), "{dead}");
    // No destination takes operational events here: the death raised none.
    let (_, raised) = relay.admin_get("/admin/events?event=hookrelay.DeliveryDead").await;
    assert_eq!(raised["events"].as_array().map(Vec::len), Some(0), "{raised}");
    assert_eq!(
        metric(&m, "hookrelay_transforms_failed_total", &[("destination", "picky")]),
        Some(1.0)
    );

    // Preview: the configured filter, one tried inline, a transform tried inline, and a
    // syntax error with its position.
    let preview = |dest: &str, body: Value| {
        let path = format!("/admin/destinations/{dest}/preview");
        let relay = &relay;
        async move { relay.admin_post(&path, Some(body)).await }
    };
    let (status, p) = preview("open", json!({"event": ids[1]})).await;
    assert_eq!((status, p["verdict"].as_str()), (200, Some("filtered")), "{p}");
    let (_, p) = preview(
        "open",
        json!({"event": ids[1], "filter": ".body.data.attributes.status == \"Closed\"", "transform": "{s: .body.data.attributes.status}"}),
    )
    .await;
    assert_eq!(
        (p["verdict"].as_str(), p["body"].as_str()),
        (Some("matched"), Some(r#"{"s":"Closed"}"#)),
        "{p}"
    );
    let (status, p) = preview("open", json!({"event": ids[1], "filter": ".a == "})).await;
    assert_eq!(status, 400, "{p}");
    assert!(p["error"].as_str().unwrap().contains("filter: line 1, column"), "{p}");
    let (_, p) = preview("picky", json!({"event": ids[2]})).await;
    assert!(p["body_error"].as_str().unwrap().contains("no id 7"), "{p}");
    // The same from the CLI.
    let out = Command::new(common::binary())
        .args(["destinations", "preview", "--destination", "flat", "--event", &ids[0]])
        .arg("--config")
        .arg(dir.path().join("hookrelay.toml"))
        .arg("--admin-url")
        .arg(format!("http://{}", relay.admin))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with("flat: matched") && text.contains("\"attributes\": {"), "{text}");

    // A replay asks the filter again: the closed action stays out of `open`.
    let (status, r) = relay
        .admin_post(
            &format!("/admin/events/{}/replay", ids[1]),
            Some(json!({"destinations": ["open"]})),
        )
        .await;
    assert_eq!((status, r["replayed"].as_u64()), (200, Some(0)), "{r}");
    assert_eq!(r["filtered"][0]["reason"], "the filter gave false", "{r}");

    // The transform fixed in the config: the dead delivery is replayed and delivered
    // with the new body, within the bound.
    relay.signal(libc::SIGTERM);
    assert!(relay.wait_exit(Duration::from_secs(10)).success());
    let relay = Relay::start(dir.path(), &config(FIXED)).await;
    let (status, r) = relay
        .admin_post(
            &format!("/admin/events/{}/replay", ids[2]),
            Some(json!({"destinations": ["picky"]})),
        )
        .await;
    assert_eq!((status, r["replayed"].as_u64()), (200, Some(1)), "{r}");
    let got = picky.wait_for(3, BOUND).await;
    assert_eq!(String::from_utf8_lossy(&got[2].body), r#"{"fixed":true}"#);
    assert!(!relay.logs().contains("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"));
}

/// A program that does not compile is a config error naming the destination and the
/// position, reported by check-config and refused by serve.
#[test]
fn a_program_that_does_not_compile_is_a_config_error_with_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookrelay.toml");
    let tail = "\n[[destinations]]\nname = \"crm\"\nurl = \"http://127.0.0.1:9/\"\nfilter = '''.event ==\n  (\"x\"'''\ntransform = 'env.HOME'\n";
    std::fs::write(&path, common::config_with(&dir.path().join("data"), "", tail)).unwrap();
    for cmd in ["check-config", "serve"] {
        let out =
            Command::new(common::binary()).args([cmd, "--config"]).arg(&path).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd}: {err}");
        assert!(
            err.contains(r#"destinations[0].filter (destination "crm"): line 2"#),
            "{cmd}: {err}"
        );
        assert!(err.contains("closing parenthesis"), "{cmd}: {err}");
        assert!(err.contains(r#"destinations[0].transform (destination "crm"): line 1, column 1: unknown filter env"#), "{cmd}: {err}");
    }
}

/// The programs and the body that once stopped the relay, composed: a filter that
/// loops, a transform that loops, a filter that recurses without end, a preview that
/// loops, and a callback of 200,000 nested `[` with a plain filter configured (issue
/// 40). Each costs only its own runs: the looping programs are stopped three times
/// each and then disabled (their deliveries filtered or dead, with the reason), the
/// nested body is filtered with its reason, and every other destination gets every
/// event within the bound. The relay's threads do not grow, no shaping process is left
/// behind, and a restart on the same store stays up and delivers what comes next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_that_never_end_and_bodies_nested_200_000_deep_cost_only_their_own_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (plain, looping, plain_filter) =
        (Sink::start().await, Sink::start().await, Sink::start().await);
    let tail = format!(
        "\n[[destinations]]\nname = \"plain\"\nurl = \"{}\"\n\n[[destinations]]\nname = \"looping\"\nurl = \"{}\"\nfilter = 'last(range(1e18)) > 0'\n\n[[destinations]]\nname = \"stuck\"\nurl = \"{}\"\ntransform = '[limit(1e18; repeat(1))] | length'\n\n[[destinations]]\nname = \"deep\"\nurl = \"{}\"\nfilter = 'def f: [f]; f'\n\n[[destinations]]\nname = \"named\"\nurl = \"{}\"\nfilter = '.event == \"ActionCreated\"'\n",
        plain.url(),
        looping.url(),
        looping.url(),
        looping.url(),
        plain_filter.url()
    );
    let config = common::config_with(&dir.path().join("data"), "", &tail);
    let mut relay = Relay::start(dir.path(), &config).await;
    // Once both listeners have answered (each server's accept thread is up by then).
    let _ = relay.metrics().await;
    let alive = relay.client.get(format!("http://{}/healthz", relay.ingress)).send().await;
    assert_eq!(alive.unwrap().status(), 200);
    let before = thread_names(relay.pid());
    // Dispatch on the embedded store has a thread of its own, running its store calls
    // itself (src/dispatch/mod.rs, `Dispatcher::start`; a name has 15 characters here).
    assert!(before.iter().any(|n| n == "hookrelay-dispa"), "{before:?}");
    let mut ids = Vec::new();
    for n in 0..5 {
        let body = format!(r#"{{"data":{{"type":"actions","id":"{n}"}}}}"#);
        let r = relay.callback(Some("ActionCreated"), "application/json", body).await;
        assert_eq!(r.status(), 200);
        ids.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned());
    }
    // The callback of issue 40: 400 KB of nesting, no event name.
    let nested = format!("{{\"data\":{}{}}}", "[".repeat(200_000), "]".repeat(200_000));
    let r = relay.callback(None, "application/json", nested).await;
    assert_eq!(r.status(), 200);
    let nested_id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    // A preview that loops, beside it all.
    let (status, preview) = relay
        .admin_post(
            "/admin/destinations/plain/preview",
            Some(json!({"event": ids[0], "filter": "def f: f; f"})),
        )
        .await;
    assert_eq!(status, 200, "{preview}");
    assert!(preview["reason"].as_str().unwrap().contains("ran longer than 2s"), "{preview}");
    // Three overruns of 2 s per looping program at most, then the bound.
    plain.wait_for(6, Duration::from_secs(12) + BOUND).await;
    plain_filter.wait_for(5, BOUND).await;
    for (i, id) in ids.iter().enumerate() {
        let filtered = delivery(&relay, id, "looping").await;
        assert_eq!(filtered["state"], "filtered", "{filtered}");
        let reason = filtered["reason"].as_str().unwrap();
        let expected = if i < 3 { "ran longer than 2s" } else { "disabled after 3 runs in a row" };
        assert!(reason.contains(expected), "event {i}: {filtered}");
        let deep = delivery(&relay, id, "deep").await;
        assert_eq!(deep["state"], "filtered", "{deep}");
        let reason = deep["reason"].as_str().unwrap();
        assert!(
            // Recursed too deep, or (a busy machine, the shaping process at its low
            // priority) ran out of its 2 s first: stopped either way.
            reason.contains("recursed too deep")
                || reason.contains("ran longer than 2s")
                || reason.contains("disabled after"),
            "{deep}"
        );
    }
    let nested = delivery(&relay, &nested_id, "named").await;
    assert_eq!(nested["state"], "filtered", "{nested}");
    assert!(
        nested["reason"].as_str().unwrap().contains("nests deeper than 127 levels"),
        "{nested}"
    );
    relay
        .admin_until(
            "/admin/dead-letters?destination=stuck",
            Duration::from_secs(12) + BOUND,
            |v| v["dead_letters"].as_array().is_some_and(|a| a.len() == 6),
        )
        .await;
    let dead = delivery(&relay, &ids[4], "stuck").await;
    assert!(dead["last_error"].as_str().unwrap().contains("disabled after 3 runs"), "{dead}");
    assert_eq!(looping.count(), 0);
    let text = relay.metrics().await;
    let disabled = |d: &str, p: &str| {
        metric(&text, "hookrelay_shape_program_disabled", &[("destination", d), ("program", p)])
    };
    assert_eq!(disabled("looping", "filter"), Some(1.0));
    assert_eq!(disabled("stuck", "transform"), Some(1.0));
    assert_eq!(disabled("deep", "filter"), Some(1.0));
    assert!(relay.logs().contains("a jq program is disabled"));
    // Nothing left running. The relay's own threads (actix's, the store's, the
    // flusher: every thread it names) are exactly those it had before: a runaway
    // costs no thread (the thread pool this replaced kept one `hookrelay-jq` per
    // runaway, 7 here). Tokio's blocking pool (`tokio-rt-worker`, shared by the store's
    // reads and the space checks) is sized by the peak of concurrent blocking calls,
    // not by runaways, and the relay's periodic checks keep its idle threads alive by
    // turns (CI saw +6 after 30 s): bounded, not compared.
    let named = |names: &[String]| -> Vec<String> {
        let mut own: Vec<String> = names.iter().filter(|n| *n != TOKIO_POOL).cloned().collect();
        own.sort();
        own
    };
    let pool = |names: &[String]| names.iter().filter(|n| *n == TOKIO_POOL).count();
    let settled = std::time::Instant::now() + Duration::from_secs(30);
    let mut after = thread_names(relay.pid());
    while named(&after) != named(&before) && std::time::Instant::now() < settled {
        tokio::time::sleep(Duration::from_millis(200)).await;
        after = thread_names(relay.pid());
    }
    assert_eq!(named(&after), named(&before), "the relay's own threads changed: {after:?}");
    assert!(
        pool(&after) <= pool(&before) + 12,
        "tokio's pool grew from {} to {}: {after:?}",
        pool(&before),
        pool(&after)
    );
    let children = std::process::Command::new("pgrep")
        .args(["-P", &relay.pid().to_string()])
        .output()
        .unwrap();
    let children = String::from_utf8_lossy(&children.stdout).lines().count();
    assert!(children <= 3, "{children} shaping processes");
    // A restart on the same store stays up, and what comes next is delivered.
    relay.signal(libc::SIGTERM);
    assert!(relay.wait_exit(Duration::from_secs(30)).success());
    let relay = Relay::start(dir.path(), &config).await;
    let r = relay.callback(Some("ActionCreated"), "application/json", "{}").await;
    assert_eq!(r.status(), 200);
    plain.wait_for(7, BOUND).await;
    plain_filter.wait_for(6, BOUND).await;
}

/// `ordering = "latest"` after a paused backlog: 10 updates of each of 5 resources
/// wait while the consumer is paused; resumed, it gets one request per resource, the
/// last update, within the bound, while a `per-resource` destination gets all 50 in
/// order. The others are recorded as superseded, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_only_sends_one_request_per_resource_after_a_paused_backlog() {
    let dir = tempfile::tempdir().unwrap();
    let (latest, every) = (Sink::start().await, Sink::start().await);
    let tail = format!(
        "\n[[destinations]]\nname = \"latest\"\nurl = \"{}\"\nordering = \"latest\"\n\n[[destinations]]\nname = \"every\"\nurl = \"{}\"\nordering = \"per-resource\"\n",
        latest.url(),
        every.url()
    );
    let relay =
        Relay::start(dir.path(), &common::config_with(&dir.path().join("data"), "", &tail)).await;
    assert_eq!(relay.admin_post("/admin/destinations/latest/pause", None).await.0, 200);
    let mut first = None;
    for n in 1..=10 {
        // Each round's callbacks at once, each resource's after its previous one's 200.
        let sent = futures_util::future::join_all((1..=5).map(|r| {
            let body =
                format!(r#"{{"data":{{"type":"actions","id":"{r}","attributes":{{"n":{n}}}}}}}"#);
            relay.callback(Some("ActionUpdated"), "application/json", body)
        }))
        .await;
        for r in sent {
            assert_eq!(r.status(), 200);
            let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
            first.get_or_insert(id);
        }
    }
    every.wait_for(50, BOUND).await;
    assert_eq!(latest.count(), 0, "paused");
    assert_eq!(relay.admin_post("/admin/destinations/latest/resume", None).await.0, 200);
    let got = latest.wait_for(5, BOUND).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(latest.count(), 5, "one request per resource");
    let mut last: Vec<(String, u64)> = got
        .iter()
        .map(|r| {
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            (
                v["data"]["id"].as_str().unwrap().to_owned(),
                v["data"]["attributes"]["n"].as_u64().unwrap(),
            )
        })
        .collect();
    last.sort();
    let want: Vec<(String, u64)> = (1..=5).map(|r| (r.to_string(), 10)).collect();
    assert_eq!(last, want, "each the last update");
    // `every` got all 50, each resource's in order.
    let mut seen: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for r in every.received() {
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        let (id, n) = (
            v["data"]["id"].as_str().unwrap().to_owned(),
            v["data"]["attributes"]["n"].as_u64().unwrap(),
        );
        seen.entry(id).or_default().push(n);
    }
    assert!(seen.values().all(|ns| *ns == (1..=10).collect::<Vec<_>>()), "{seen:?}");
    // The 45 others: superseded, with the reason, and counted; nothing left waiting.
    let old = delivery(&relay, first.as_deref().unwrap(), "latest").await;
    assert_eq!(old["state"], "superseded", "{old}");
    assert!(old["reason"].as_str().unwrap().starts_with("superseded by event"), "{old}");
    let m = relay.metrics().await;
    assert_eq!(
        metric(&m, "hookrelay_deliveries_superseded_total", &[("destination", "latest")]),
        Some(45.0),
        "{m}"
    );
    let (_, dests) = relay.admin_get("/admin/destinations").await;
    let l = dests["destinations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "latest")
        .unwrap()
        .clone();
    assert_eq!(
        (l["ordering"].as_str(), l["queue"]["pending"].as_u64(), l["queue"]["held"].as_u64()),
        (Some("latest"), Some(0), Some(0)),
        "{l}"
    );
}

/// The name tokio gives its runtime's threads (workers and the blocking pool alike).
const TOKIO_POOL: &str = "tokio-rt-worker";

/// The names of a process's threads (`/proc/PID/task/*/comm`, 15 characters at most).
fn thread_names(pid: i32) -> Vec<String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_owned())
        .collect()
}
