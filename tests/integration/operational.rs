//! Operational events (`hookrelay.*`): the relay reports a dead delivery, a circuit
//! opened and closed, and a pause, to a destination that asked for them, turned into
//! a chat message by its transform; never to the destination they are about.

use crate::common;

use std::time::Duration;

use common::sink::{Mode, Sink};
use common::Relay;
use serde_json::Value;

/// Everything due arrives within this bound after each step.
const BOUND: Duration = Duration::from_secs(20);

/// The chat messages `ops` received so far, as `(event, text)`.
fn messages(ops: &Sink) -> Vec<(String, String)> {
    ops.received()
        .iter()
        .map(|r| {
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            (
                r.header("hookrelay-event").unwrap_or_default().to_owned(),
                v["text"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Waits until `ops` got a message for `event` whose text contains `text`.
async fn wait_message(ops: &Sink, event: &str, text: &str) {
    let deadline = std::time::Instant::now() + BOUND;
    while !messages(ops).iter().any(|(e, t)| e == event && t.contains(text)) {
        assert!(
            std::time::Instant::now() < deadline,
            "no {event} with {text:?}: {:?}",
            messages(ops)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_reports_dead_deliveries_circuits_and_pauses_to_those_who_ask() {
    let dir = tempfile::tempdir().unwrap();
    let (crm, flaky, ops) = (Sink::start().await, Sink::start().await, Sink::start().await);
    crm.set_mode(Mode::Status(400));
    flaky.set_mode(Mode::Status(503));
    // `crm` asks for the relay's events too: those about itself never reach it.
    let tail = format!(
        r#"
[[destinations]]
name = "crm"
url = "{}"
events = ["ActionCreated", "hookrelay.*"]

[[destinations]]
name = "flaky"
url = "{}"
events = ["TaskCreated"]

[[destinations]]
name = "ops"
url = "{}"
events = ["hookrelay.*"]
sources = ["demo"]
transform = '{{text: "\(.event) on \(.resource): \(.body.data.attributes | tostring)"}}'
"#,
        crm.url(),
        flaky.url(),
        ops.url()
    );
    let relay =
        Relay::start(dir.path(), &common::config_with(&dir.path().join("data"), "", &tail)).await;

    // A delivery that dies: the ops channel hears of it, with the event and the status.
    let r = relay
        .callback(
            Some("ActionCreated"),
            "application/json",
            r#"{"data":{"type":"actions","id":"5"}}"#,
        )
        .await;
    let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    wait_message(&ops, "hookrelay.DeliveryDead", "destinations/crm").await;
    let (_, text) =
        messages(&ops).into_iter().find(|(e, _)| e == "hookrelay.DeliveryDead").unwrap();
    assert!(
        text.contains(&id) && text.contains("\"status\":400") && text.contains("actions/5"),
        "{text}"
    );

    // Five failures in a row open `flaky`'s circuit; once it answers, a probe closes it.
    for n in 0..5 {
        let body = format!(r#"{{"data":{{"type":"tasks","id":"{n}"}}}}"#);
        assert_eq!(
            relay.callback(Some("TaskCreated"), "application/json", body).await.status(),
            200
        );
    }
    wait_message(&ops, "hookrelay.CircuitOpened", "destinations/flaky").await;
    flaky.set_mode(Mode::Ok);
    wait_message(&ops, "hookrelay.CircuitClosed", "destinations/flaky").await;
    flaky.wait_for(10, BOUND).await;

    // A pause by the admin.
    assert_eq!(relay.admin_post("/admin/destinations/flaky/pause", None).await.0, 200);
    wait_message(&ops, "hookrelay.DestinationPaused", "\"by\":\"admin\"").await;

    // None of it went to the destination it is about; each is a stored event.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let to_crm: Vec<String> = crm
        .received()
        .iter()
        .filter_map(|r| r.header("hookrelay-event").map(str::to_owned))
        .collect();
    assert!(
        !to_crm.contains(&"hookrelay.DeliveryDead".to_owned()),
        "the death of crm's delivery went to crm: {to_crm:?}"
    );
    assert!(
        to_crm.contains(&"hookrelay.CircuitOpened".to_owned()),
        "about flaky, to crm: {to_crm:?}"
    );
    let (_, listed) = relay.admin_get("/admin/events?event=hookrelay.DeliveryDead").await;
    assert_eq!(listed["events"].as_array().map(Vec::len), Some(1), "{listed}");
    let m = relay.metrics().await;
    let stored = common::metric(
        &m,
        "hookrelay_events_stored_total",
        &[("event", "hookrelay.CircuitOpened")],
    );
    assert!(stored.is_some_and(|n| n >= 1.0), "{m}");
}
