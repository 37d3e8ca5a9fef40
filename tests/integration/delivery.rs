//! Dispatch and delivery end to end: a real relay process, real sink servers on
//! loopback, real sled files.

use crate::common;
use common::FAST_RETRY;

use std::time::Duration;

use common::sink::{closed_port, Mode, Sink};
use common::Relay;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(15);

/// A callback body as the upstream sends it: `data` names the record, `meta` the hook.
fn occurrence(kind: &str, id: &str, name: &str, hook: &str) -> String {
    json!({
        "jsonapi": {"version": "1.0"},
        "data": {"type": kind, "id": id, "attributes": {"name": name}},
        "meta": {"debug": {"time": format!("2026-06-12 13:23:{hook} +1200"),
                 "resthook": {"id": hook, "trigger_count": hook.parse::<u32>().unwrap_or(1)}}}
    })
    .to_string()
}

fn destination(name: &str, url: &str, extra: &str) -> String {
    format!("\n[[destinations]]\nname = \"{name}\"\nurl = \"{url}\"\n{extra}\n")
}

async fn start(tail: &str) -> (tempfile::TempDir, Relay) {
    let dir = tempfile::tempdir().unwrap();
    let text = common::config_with(&dir.path().join("data"), "", tail);
    let relay = Relay::start(dir.path(), &text).await;
    (dir, relay)
}

/// Waits until `/metrics` shows `line` (counters move once work is flushed).
async fn wait_metric(relay: &Relay, line: &str) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let metrics = relay.metrics().await;
        if metrics.contains(line) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "missing {line} in\n{metrics}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn send(relay: &Relay, event: &str, body: String) -> String {
    let r = relay.callback(Some(event), "application/json", body).await;
    assert_eq!(r.status(), 200);
    r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_one_occurrence_are_delivered_once_per_destination() {
    let (a, b) = (Sink::start().await, Sink::start().await);
    let tail =
        destination("a", &a.url(), "") + &destination("b", &b.url(), "events = [\"Action*\"]");
    let (_dir, relay) = start(&tail).await;

    // Three users' hooks deliver the same occurrence; their `meta` blocks differ.
    let first = send(&relay, "ActionUpdated", occurrence("actions", "5", "Smith", "46")).await;
    send(&relay, "ActionUpdated", occurrence("actions", "5", "Smith", "47")).await;
    send(&relay, "ActionUpdated", occurrence("actions", "5", "Smith", "48")).await;
    // A later change to the same record is a new occurrence.
    send(&relay, "ActionUpdated", occurrence("actions", "5", "Jones", "46")).await;
    // Routed to `a` only.
    send(&relay, "TaskCreated", occurrence("tasks", "9", "Call", "50")).await;

    let got = a.wait_for(3, WAIT).await;
    b.wait_for(2, WAIT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!((a.count(), b.count()), (3, 2), "one delivery per occurrence and destination");

    let r = got
        .iter()
        .find(|r| r.header("webhook-id") == Some(format!("evt_{first}_a").as_str()))
        .unwrap();
    assert_eq!(r.header("hookrelay-event"), Some("ActionUpdated"));
    assert_eq!(r.header("hookrelay-source"), Some("demo"));
    assert_eq!(r.header("hookrelay-attempt"), Some("1"));
    // A W3C trace context on every delivery; not sampled: this relay exports no traces.
    let tp: Vec<&str> = r.header("traceparent").expect("traceparent").split('-').collect();
    assert_eq!((tp.len(), tp[0], tp[1].len(), tp[2].len(), tp[3]), (4, "00", 32, 16, "00"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(r.header("webhook-timestamp").unwrap().parse::<i64>().is_ok());
    assert_eq!(r.header("webhook-signature"), None, "no secret, no signature");
    assert_eq!(String::from_utf8_lossy(&r.body), occurrence("actions", "5", "Smith", "46"));
    let mut names: Vec<String> = got
        .iter()
        .map(|r| {
            serde_json::from_slice::<Value>(&r.body).unwrap()["data"]["attributes"]["name"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    names.sort();
    assert_eq!(names, ["Call", "Jones", "Smith"], "ordering = none: any order");

    let (_, dups) = relay.admin_get("/admin/events?status=duplicate").await;
    let dups = dups["events"].as_array().unwrap().clone();
    assert_eq!(dups.len(), 2);
    assert!(dups.iter().all(|e| e["duplicate_of"] == first.as_str()));
    // Each outcome is recorded after the consumer's answer (a shared fsync): a moment
    // after the sink saw the request, not at once.
    let shown = relay
        .admin_until(&format!("/admin/events/{first}"), WAIT, |v| {
            v["deliveries"].as_array().is_some_and(|d| d.iter().all(|d| d["state"] == "delivered"))
        })
        .await;
    assert_eq!(shown["status"], "dispatched");
    assert_eq!(shown["destinations"], json!(["a", "b"]));
    let deliveries = shown["deliveries"].as_array().unwrap();
    assert_eq!(deliveries.len(), 2);
    assert!(deliveries
        .iter()
        .all(|d| d["state"] == "delivered" && d["attempts"][0]["status"] == 200));

    for line in [
        r#"hookrelay_events_deduplicated_total{event="ActionUpdated",source="demo"} 2"#,
        r#"hookrelay_events_dispatched_total{event="ActionUpdated",source="demo"} 2"#,
        r#"hookrelay_deliveries_total{destination="a",outcome="success"} 3"#,
        r#"hookrelay_deliveries_total{destination="b",outcome="success"} 2"#,
        r#"hookrelay_queue_depth{destination="a",state="pending"} 0"#,
        r#"hookrelay_delivery_lag_seconds_count{destination="a"} 3"#,
    ] {
        wait_metric(&relay, line).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrouted_events_are_recorded_and_counted() {
    let a = Sink::start().await;
    let (_dir, relay) = start(&destination("a", &a.url(), "events = [\"Task*\"]")).await;
    let id = send(&relay, "ActionCreated", occurrence("actions", "1", "X", "1")).await;
    let e = relay
        .admin_until(&format!("/admin/events/{id}"), WAIT, |e| e["status"] != "received")
        .await;
    assert_eq!(e["status"], "unrouted");
    // Counted once dispatch has flushed, a moment after the status is visible.
    wait_metric(
        &relay,
        r#"hookrelay_events_unrouted_total{event="ActionCreated",source="demo"} 1"#,
    )
    .await;
    assert_eq!(a.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_destination_gets_everything_once_back_and_slows_nobody() {
    let (a, b) = (Sink::start().await, Sink::start().await);
    let down = closed_port();
    let tail = destination("a", &a.url(), "")
        + &destination("b", &b.url(), "")
        + &destination("c", &format!("http://{down}/hook"), "")
        + FAST_RETRY;
    let (_dir, relay) = start(&tail).await;
    for i in 0..5 {
        send(&relay, "ActionCreated", occurrence("actions", &i.to_string(), "X", "1")).await;
    }
    a.wait_for(5, WAIT).await;
    b.wait_for(5, WAIT).await;
    let view = relay
        .admin_until("/admin/destinations", WAIT, |v| {
            // A sink sees a delivery a moment before the relay has recorded it.
            v["destinations"][2]["queue"]["retrying"] == 5
                && v["destinations"][0]["queue"]["pending"] == 0
        })
        .await;
    assert_eq!(view["destinations"][2]["name"], "c");
    assert_eq!(
        view["destinations"][0]["queue"],
        json!({"pending": 0, "held": 0, "retrying": 0, "dead": 0, "counting": false})
    );

    let c = Sink::start_on(down).await;
    let got = c.wait_for(5, WAIT).await;
    let mut ids: Vec<u64> = got
        .iter()
        .map(|r| {
            serde_json::from_slice::<Value>(&r.body).unwrap()["data"]["id"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    ids.sort();
    assert_eq!(ids, [0, 1, 2, 3, 4]);
    assert!(got.iter().all(|r| r.header("hookrelay-attempt").unwrap().parse::<u32>().unwrap() > 1));
    relay
        .admin_until("/admin/destinations", WAIT, |v| {
            v["destinations"][2]["queue"]["retrying"] == 0
        })
        .await;
    let (_, events) = relay.admin_get("/admin/events?limit=1").await;
    let id = events["events"][0]["id"].as_str().unwrap();
    let (_, e) = relay.admin_get(&format!("/admin/events/{id}")).await;
    let c_delivery = e["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["destination"] == "c")
        .unwrap()
        .clone();
    assert_eq!(c_delivery["state"], "delivered");
    assert!(
        c_delivery["attempts"][0]["error"].as_str().unwrap().starts_with("connection failed"),
        "{c_delivery}"
    );
    assert!(
        !c_delivery["attempts"][0]["error"].as_str().unwrap().contains(&down.to_string()),
        "no URL in errors"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_failures_go_dead_and_bulk_replay_delivers_them() {
    let a = Sink::start().await;
    a.set_mode(Mode::Status(400));
    let (_dir, relay) = start(&(destination("a", &a.url(), "") + FAST_RETRY)).await;
    send(&relay, "ActionCreated", occurrence("actions", "1", "X", "1")).await;
    send(&relay, "ActionCreated", occurrence("actions", "2", "X", "1")).await;
    let dead = relay
        .admin_until("/admin/dead-letters", WAIT, |v| {
            v["dead_letters"].as_array().is_some_and(|d| d.len() == 2)
        })
        .await;
    let d = &dead["dead_letters"][0];
    assert_eq!((d["state"].as_str(), d["last_status"].as_u64()), (Some("dead"), Some(400)));
    assert_eq!(d["last_response"], "sink says 400");
    assert_eq!(d["total_attempts"], 1, "a permanent failure is not retried");
    assert_eq!(a.count(), 2);
    // Counted after the attempt is flushed, a moment after it is visible.
    wait_metric(&relay, r#"hookrelay_deliveries_total{destination="a",outcome="failed"} 2"#).await;
    let metrics = relay.metrics().await;
    assert!(
        metrics.contains(r#"hookrelay_queue_depth{destination="a",state="dead"} 2"#),
        "{metrics}"
    );

    a.set_mode(Mode::Ok);
    let (status, body) = relay.admin_post("/admin/dead-letters/replay?destination=a", None).await;
    assert_eq!((status, body["replayed"].as_u64()), (200, Some(2)), "{body}");
    let got = a.wait_for(4, WAIT).await;
    assert!(got[2..].iter().all(|r| r.header("hookrelay-attempt") == Some("2")));
    relay.admin_until("/admin/dead-letters", WAIT, |v| v["dead_letters"] == json!([])).await;
    let (_, filtered) = relay.admin_get("/admin/dead-letters?destination=nobody").await;
    assert_eq!(filtered["dead_letters"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured() {
    let a = Sink::start().await;
    a.set_mode(Mode::RetryAfter(2));
    let (_dir, relay) =
        start(&(destination("a", &a.url(), "") + FAST_RETRY.replace("400ms", "5s").as_str())).await;
    send(&relay, "ActionCreated", occurrence("actions", "1", "X", "1")).await;
    a.wait_for(1, WAIT).await;
    a.set_mode(Mode::Ok);
    let got = a.wait_for(2, WAIT).await;
    let gap = got[1].at - got[0].at;
    assert!(gap >= Duration::from_millis(1900), "retried after {gap:?}, asked for 2s");
    assert!(gap < Duration::from_secs(6), "{gap:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_pauses_and_admin_pause_resume_hold_deliveries() {
    let a = Sink::start().await;
    a.set_mode(Mode::Status(410));
    let (_dir, relay) = start(&(destination("a", &a.url(), "") + FAST_RETRY)).await;
    send(&relay, "ActionCreated", occurrence("actions", "1", "X", "1")).await;
    relay
        .admin_until("/admin/destinations", WAIT, |v| v["destinations"][0]["paused"] == true)
        .await;
    a.set_mode(Mode::Ok);
    send(&relay, "ActionCreated", occurrence("actions", "2", "X", "1")).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(a.count(), 1, "a paused destination gets nothing");
    let metrics = relay.metrics().await;
    assert!(metrics.contains(r#"hookrelay_destination_paused{destination="a"} 1"#), "{metrics}");

    let (status, _) = relay.admin_post("/admin/destinations/a/resume", None).await;
    assert_eq!(status, 200);
    a.wait_for(3, WAIT).await;

    // Paused by hand, too; and unknown names are refused.
    assert_eq!(relay.admin_post("/admin/destinations/a/pause", None).await.0, 200);
    send(&relay, "ActionCreated", occurrence("actions", "3", "X", "1")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(a.count(), 3);
    assert_eq!(relay.admin_post("/admin/destinations/a/resume", None).await.0, 200);
    a.wait_for(4, WAIT).await;
    assert_eq!(relay.admin_post("/admin/destinations/nope/pause", None).await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_can_be_replayed_to_chosen_destinations() {
    let (a, b) = (Sink::start().await, Sink::start().await);
    let (_dir, relay) =
        start(&(destination("a", &a.url(), "") + &destination("b", &b.url(), ""))).await;
    let id = send(&relay, "ActionCreated", occurrence("actions", "1", "X", "1")).await;
    a.wait_for(1, WAIT).await;
    b.wait_for(1, WAIT).await;
    let path = format!("/admin/events/{id}/replay");
    let (status, body) = relay.admin_post(&path, Some(json!({"destinations": ["b"]}))).await;
    assert_eq!((status, body["replayed"].as_u64()), (200, Some(1)), "{body}");
    let got = b.wait_for(2, WAIT).await;
    assert_eq!(got[0].header("webhook-id"), got[1].header("webhook-id"), "stable across replays");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(a.count(), 1);
    let (status, _) = relay.admin_post(&path, Some(json!({"destinations": ["zzz"]}))).await;
    assert_eq!(status, 400);
    let (status, _) = relay.admin_post(&path, None).await;
    assert_eq!(status, 200);
    a.wait_for(2, WAIT).await;
    assert_eq!(relay.admin_post("/admin/events/0000000000000001/replay", None).await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_destination_opens_its_circuit_and_is_probed_once_per_interval() {
    let a = Sink::start().await;
    a.set_mode(Mode::Status(503));
    let tail = destination("a", &a.url(), "max_concurrency = 2")
        + &FAST_RETRY.replace(
            "circuit_probe_interval = \"200ms\"",
            "circuit_failure_threshold = 3\ncircuit_probe_interval = \"1s\"",
        );
    let (_dir, relay) = start(&tail).await;
    for i in 0..20 {
        send(&relay, "ActionCreated", occurrence("actions", &i.to_string(), "X", "1")).await;
    }
    relay
        .admin_until("/admin/destinations", WAIT, |v| v["destinations"][0]["circuit"] != "closed")
        .await;
    let opened_after = a.count();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let probes = a.count() - opened_after;
    // Without the circuit, 20 deliveries retrying every ≤ 400 ms would have made ~100
    // requests in 2.5 s; with it, about one probe per second.
    assert!((1..=4).contains(&probes), "{probes} requests while open");
    assert!(opened_after <= 6, "{opened_after} requests before the circuit opened");
    let metrics = relay.metrics().await;
    assert!(
        metrics.contains(r#"hookrelay_destination_circuit_open{destination="a"} 1"#),
        "{metrics}"
    );

    // The consumer recovers: the next probe succeeds, the circuit closes, all flows.
    a.set_mode(Mode::Ok);
    relay
        .admin_until("/admin/destinations", WAIT, |v| {
            v["destinations"][0]["queue"]["retrying"] == 0
                && v["destinations"][0]["queue"]["pending"] == 0
        })
        .await;
    let (_, v) = relay.admin_get("/admin/destinations").await;
    assert_eq!(v["destinations"][0]["circuit"], "closed");
    let (_, events) = relay.admin_get("/admin/events?status=dispatched&limit=100").await;
    for e in events["events"].as_array().unwrap() {
        let (_, shown) =
            relay.admin_get(&format!("/admin/events/{}", e["id"].as_str().unwrap())).await;
        assert_eq!(shown["deliveries"][0]["state"], "delivered", "{shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_resource_ordering_holds_back_only_the_same_record() {
    let a = Sink::start().await;
    // Matter 5 cannot be delivered for now; matter 6 can.
    a.set_mode(Mode::FailIfContains("\"id\":\"5\"".into(), 503));
    let tail = destination("a", &a.url(), "ordering = \"per-resource\"") + FAST_RETRY;
    let (_dir, relay) = start(&tail).await;
    let created5 = send(&relay, "ActionCreated", occurrence("actions", "5", "v1", "1")).await;
    let updated5 = send(&relay, "ActionUpdated", occurrence("actions", "5", "v2", "1")).await;
    send(&relay, "ActionCreated", occurrence("actions", "6", "w1", "1")).await;
    send(&relay, "ActionUpdated", occurrence("actions", "6", "w2", "1")).await;

    // Matter 6 flows, in order, while matter 5's first delivery keeps failing.
    relay
        .admin_until(&format!("/admin/events/{created5}"), WAIT, |e| {
            e["deliveries"][0]["total_attempts"].as_u64() >= Some(2)
        })
        .await;
    let names = |got: &[common::sink::Received], ok_only: bool| -> Vec<String> {
        got.iter()
            .filter(|r| !ok_only || !String::from_utf8_lossy(&r.body).contains("\"id\":\"5\""))
            .map(|r| {
                serde_json::from_slice::<Value>(&r.body).unwrap()["data"]["attributes"]["name"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };
    // w2 waits for w1's answer, and then for a worker: wait for it rather than assume
    // it came before matter 5's second attempt (a busy machine reorders those).
    let deadline = std::time::Instant::now() + WAIT;
    while names(&a.received(), true).len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let got = a.received();
    assert_eq!(names(&got, true), ["w1", "w2"], "the other record is not held back");
    assert!(names(&got, false).iter().all(|n| n != "v2"), "v2 must wait for v1");
    let (_, held) = relay.admin_get(&format!("/admin/events/{updated5}")).await;
    assert_eq!(held["deliveries"][0]["state"], "held", "{held}");
    let (_, dests) = relay.admin_get("/admin/destinations").await;
    assert_eq!(dests["destinations"][0]["queue"]["held"], 1);

    // Matter 5 recovers: v1, then v2, never the other way round.
    a.set_mode(Mode::Ok);
    relay
        .admin_until(&format!("/admin/events/{updated5}"), WAIT, |e| {
            e["deliveries"][0]["state"] == "delivered"
        })
        .await;
    let all = names(&a.received(), false);
    let last_v1 = all.iter().rposition(|n| n == "v1").unwrap();
    let first_v2 = all.iter().position(|n| n == "v2").unwrap();
    assert!(last_v1 < first_v2, "{all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_destination_does_not_slow_the_others() {
    let (slow, fast) = (Sink::start().await, Sink::start().await);
    slow.set_mode(Mode::Slow(Duration::from_secs(5)));
    let tail = destination("slow", &slow.url(), "max_concurrency = 1\ntimeout = \"30s\"")
        + &destination("fast", &fast.url(), "");
    let (_dir, relay) = start(&tail).await;
    let started = std::time::Instant::now();
    for i in 0..5 {
        send(&relay, "ActionCreated", occurrence("actions", &i.to_string(), "X", "1")).await;
    }
    fast.wait_for(5, WAIT).await;
    assert!(started.elapsed() < Duration::from_secs(3), "fast waited {:?}", started.elapsed());
    // The slow one's first request may reach its sink just after the fast ones (its
    // worker is no earlier than the others); the next can come only once that one is
    // answered, 5 s after it was sent.
    slow.wait_for(1, Duration::from_secs(4)).await;
    assert_eq!(slow.count(), 1, "the slow one has its single request in flight");
}

/// An event name from the body obeys the rule a name from the path does: a control
/// character or a NUL (which made every attempt fail while building the
/// `hookrelay-event` header, retried for 72 h, and made PostgreSQL refuse the whole
/// commit group) is not taken as the name: the event is stored as `unknown` and
/// delivered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_event_name_with_control_characters_is_not_taken() {
    let sink = Sink::start().await;
    let (_dir, relay) = start(&destination("crm", &sink.url(), "")).await;
    let names = ["Action\nCreated", "Action\u{0}Created", "Action\rX-Injected: 1", "Actión"];
    for (i, name) in names.iter().enumerate() {
        let body = json!({"data": {"type": "actions", "id": i.to_string()},
                          "meta": {"debug": {"resthook": {"event_name": name}}}});
        let r = relay.callback(None, "application/json", body.to_string()).await;
        assert_eq!(r.status(), 200);
        let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
        let (_, e) = relay.admin_get(&format!("/admin/events/{id}")).await;
        assert_eq!(
            (e["event"].as_str(), e["event_from"].as_str()),
            (Some("unknown"), Some("unknown")),
            "{e}"
        );
    }
    let got = sink.wait_for(names.len(), WAIT).await;
    for r in &got {
        assert_eq!(r.header("hookrelay-event"), Some("unknown"));
    }
}

/// Bulk replay and delete honour `after` and `limit` on every page, not only the
/// first: `?after=X` handles only dead letters older than X, `?limit=N` at most N in
/// all; and against a consumer that answers 4xx at once (each replayed one dies again
/// before the next page is read) the request still ends, each handled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_dead_letter_operations_keep_after_and_limit_and_end() {
    let a = Sink::start().await;
    a.set_mode(Mode::Status(400));
    let (_dir, relay) = start(&(destination("a", &a.url(), "") + FAST_RETRY)).await;
    for n in 0..5 {
        send(&relay, "ActionCreated", occurrence("actions", &n.to_string(), "X", "1")).await;
    }
    let dead = relay
        .admin_until("/admin/dead-letters", WAIT, |v| {
            v["dead_letters"].as_array().is_some_and(|d| d.len() == 5)
        })
        .await;
    // Newest first: the two oldest are older than the third newest.
    let ids: Vec<String> = dead["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["event"].as_str().unwrap().to_owned())
        .collect();
    let (status, body) = relay
        .admin_post(&format!("/admin/dead-letters/replay?destination=a&after={}", ids[2]), None)
        .await;
    assert_eq!((status, body["replayed"].as_u64()), (200, Some(2)), "{body}");
    a.wait_for(7, WAIT).await;
    let attempts = |v: &Value, id: &str| -> u64 {
        v["deliveries"].as_array().unwrap()[0]["total_attempts"]
            .as_u64()
            .unwrap_or_else(|| panic!("{id}: {v}"))
    };
    for (i, id) in ids.iter().enumerate() {
        let v = relay
            .admin_until(&format!("/admin/events/{id}"), WAIT, |v| {
                v["deliveries"][0]["state"] == "dead"
            })
            .await;
        assert_eq!(attempts(&v, id), if i >= 3 { 2 } else { 1 }, "event {i} ({id})");
    }
    // `limit` caps the whole operation.
    let (status, body) = relay.admin_post("/admin/dead-letters/replay?limit=1", None).await;
    assert_eq!((status, body["replayed"].as_u64()), (200, Some(1)), "{body}");
    a.wait_for(8, WAIT).await;
    // Delete with `after`: the newest two stay.
    let url = format!("http://{}/admin/dead-letters?after={}", relay.admin, ids[1]);
    let r = relay.client.delete(url).bearer_auth(common::ADMIN_TOKEN).send().await.unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["deleted"].as_u64(), Some(3), "{v}");
    let left = relay
        .admin_until("/admin/dead-letters", WAIT, |v| {
            v["dead_letters"].as_array().is_some_and(|d| d.len() == 2)
        })
        .await;
    let left: Vec<&str> = left["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["event"].as_str().unwrap())
        .collect();
    assert_eq!(left, [ids[0].as_str(), ids[1].as_str()]);
}

/// Deliveries to a destination removed from the config do not stay scheduled for
/// ever: after `retention.removed_destinations` they are dead letters with the reason
/// (which bulk replay leaves alone while the destination is gone), and once it is back
/// they can be replayed and are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_to_a_removed_destination_go_dead_and_can_be_replayed_once_it_is_back() {
    let a = Sink::start().await;
    let down = closed_port();
    let retention = "\n[retention]\ninterval = \"1s\"\nremoved_destinations = \"2s\"\n";
    let both = destination("a", &a.url(), "")
        + &destination("b", &format!("http://{down}/x"), "")
        + FAST_RETRY
        + retention;
    let dir = tempfile::tempdir().unwrap();
    let config = |tail: &str| common::config_with(&dir.path().join("data"), "", tail);
    let mut relay = Relay::start(dir.path(), &config(&both)).await;
    for n in 0..3 {
        send(&relay, "ActionCreated", occurrence("actions", &n.to_string(), "X", "1")).await;
    }
    a.wait_for(3, WAIT).await;
    relay.signal(libc::SIGTERM);
    relay.wait_exit(WAIT);

    // `b` is gone from the config: noted, then dead after the grace period.
    let relay = Relay::start(
        dir.path(),
        &config(&(destination("a", &a.url(), "") + FAST_RETRY + retention)),
    )
    .await;
    let dead = relay
        .admin_until("/admin/dead-letters?destination=b", WAIT, |v| {
            v["dead_letters"].as_array().is_some_and(|d| d.len() == 3)
        })
        .await;
    let error = dead["dead_letters"][0]["last_error"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains("no longer in the config"), "{dead}");
    assert!(relay.logs().contains("is no longer in the config"), "noticed and said");
    let (status, body) = relay.admin_post("/admin/dead-letters/replay", None).await;
    assert_eq!(
        (status, body["replayed"].as_u64()),
        (200, Some(0)),
        "kept dead while it is gone: {body}"
    );
    // Stopped cleanly: a SIGKILL here could lose the dead letters' last records (not
    // yet flushed), and the deliveries would come back as retries, not dead letters.
    let mut relay = relay;
    relay.signal(libc::SIGTERM);
    assert!(relay.wait_exit(WAIT).success());
    drop(relay);

    // Back in the config: replayed and delivered.
    let b = Sink::start().await;
    let back =
        destination("a", &a.url(), "") + &destination("b", &b.url(), "") + FAST_RETRY + retention;
    let relay = Relay::start(dir.path(), &config(&back)).await;
    let (status, body) = relay.admin_post("/admin/dead-letters/replay?destination=b", None).await;
    assert_eq!((status, body["replayed"].as_u64()), (200, Some(3)), "{body}");
    b.wait_for(3, WAIT).await;
}

/// Retention by part, end to end: the bodies of delivered events go after
/// `retention.delivered_bodies`, their records stay (the event page with its attempts,
/// the search by resource, the audit balanced), a replay of one is refused with why; a
/// dead letter keeps its body and is replayed and delivered; across a restart the pass
/// goes on, and an event that arrives after it loses its body in its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_go_after_delivered_bodies_and_records_stay() {
    let a = Sink::start().await;
    a.set_mode(Mode::FailIfContains("Refused".into(), 400));
    let tail = destination("a", &a.url(), "")
        + FAST_RETRY
        + "\n[retention]\ninterval = \"1s\"\ndelivered_bodies = \"1s\"\n";
    let dir = tempfile::tempdir().unwrap();
    let text = common::config_with(&dir.path().join("data"), "", &tail);
    let mut relay = Relay::start(dir.path(), &text).await;
    let delivered = send(&relay, "ActionCreated", occurrence("actions", "1", "Kept", "1")).await;
    let dead = send(&relay, "ActionCreated", occurrence("actions", "2", "Refused", "1")).await;
    a.wait_for(2, WAIT).await;

    let pruned = relay
        .admin_until(&format!("/admin/events/{delivered}"), WAIT, |v| v["body_pruned"] == true)
        .await;
    assert_eq!(pruned["body"], Value::Null);
    assert_eq!(pruned["deliveries"][0]["state"], "delivered");
    assert_eq!(pruned["deliveries"][0]["attempts"].as_array().map(Vec::len), Some(1));
    let (_, found) = relay.admin_get("/admin/events?resource=actions/1").await;
    assert_eq!(found["events"][0]["id"], delivered.as_str(), "{found}");
    let (status, body) = relay.admin_post(&format!("/admin/events/{delivered}/replay"), None).await;
    assert_eq!(status, 409, "{body}");
    assert!(body.to_string().contains("retention.delivered_bodies"), "{body}");
    let (_, kept) = relay.admin_get(&format!("/admin/events/{dead}")).await;
    assert_eq!(kept["body_pruned"], false, "a dead letter keeps its body: {kept}");
    let metrics = relay.metrics().await;
    assert!(common::metric(&metrics, "hookrelay_bodies_pruned_total", &[]).unwrap() >= 1.0);

    // A restart; the consumer takes everything now; the dead letter is replayed.
    relay.signal(libc::SIGTERM);
    relay.wait_exit(WAIT);
    a.set_mode(Mode::Ok);
    let relay = Relay::start(dir.path(), &text).await;
    let (status, _) = relay.admin_post("/admin/dead-letters/replay", None).await;
    assert_eq!(status, 200);
    let later = send(&relay, "ActionCreated", occurrence("actions", "3", "Later", "1")).await;
    a.wait_for(4, WAIT).await;
    let body = |r: &common::sink::Received| String::from_utf8_lossy(&r.body).into_owned();
    assert!(a.received().iter().filter(|r| body(r).contains("Refused")).count() == 2);
    relay.admin_until(&format!("/admin/events/{later}"), WAIT, |v| v["body_pruned"] == true).await;
    let (_, audit) = relay.admin_get("/admin/audit").await;
    assert_eq!(audit["balanced"], true, "{audit}");
}
