//! Following one event through the logs: every line about it, from the callback to
//! each delivery attempt, carries its id (and source, event name, destination) in its
//! span, so `grep <event id>` finds them all.

use crate::common;

use std::time::Duration;

use common::sink::{closed_port, Sink};
use common::Relay;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_can_be_followed_by_its_id() {
    let sink = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let tail = format!(
        "[delivery.retry]\nmax_attempts = 1\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n\
         [[destinations]]\nname = \"down\"\nurl = \"http://{}/\"\n",
        sink.url(),
        closed_port()
    );
    let text = common::config_with(dir.path(), "", &tail)
        .replace("level = \"info\"", "level = \"hookrelay=debug\"");
    let relay = Relay::start(dir.path(), &text).await;
    let r = relay
        .callback(Some("FileNoteCreated"), "application/json", r#"{"data":{"id":"259"}}"#)
        .await;
    let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    sink.wait_for(1, Duration::from_secs(20)).await;
    relay
        .admin_until("/admin/dead-letters", Duration::from_secs(20), |v| {
            v["dead_letters"].as_array().is_some_and(|a| !a.is_empty())
        })
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let logs = relay.logs();
    let lines: Vec<Value> = logs
        .lines()
        .filter(|l| l.contains(&id))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let find = |message: &str, destination: Option<&str>| {
        lines
            .iter()
            .find(|l| {
                l["message"] == message && destination.is_none_or(|d| l["span"]["destination"] == d)
            })
            .unwrap_or_else(|| panic!("no {message:?} ({destination:?}) line for {id} in:\n{logs}"))
    };
    let stored = find("callback stored", None);
    assert_eq!(stored["span"]["name"], "callback");
    assert_eq!(
        (stored["span"]["source"].as_str(), stored["span"]["event"].as_str()),
        (Some("demo"), Some("FileNoteCreated"))
    );
    assert_eq!(stored["span"]["id"], id.as_str());
    let dispatched = find("event dispatched", None);
    assert_eq!(dispatched["id"], id.as_str());
    for (message, destination) in [
        ("delivery attempt", "crm"),
        ("delivery attempt", "down"),
        ("delivery is dead: see the dead letters", "down"),
    ] {
        let line = find(message, Some(destination));
        assert_eq!(line["span"]["name"], "delivery");
        assert_eq!(
            (line["span"]["source"].as_str(), line["span"]["event"].as_str()),
            (Some("demo"), Some("FileNoteCreated")),
            "{line}"
        );
    }
    let dead = find("delivery is dead: see the dead letters", Some("down"));
    assert_eq!(dead["level"], "WARN");
    // Values, not Rust's debug forms: no `Some(...)`, a status is a number.
    assert!(!dead.to_string().contains("Some("), "{dead}");
    assert!(dead["error"].is_string() || dead["status"].is_u64(), "{dead}");
}

/// At the default `info` level the callback's span is off (it is debug-level: at info
/// it cost a few percent of held ingest's CPU, formatted for every callback): no line
/// carries it, and the line that matters, a body too large recorded as rejected, names
/// its event id, source and event name itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_info_the_lines_that_matter_name_their_event_without_a_span() {
    let dir = tempfile::tempdir().unwrap();
    let text = common::config(&dir.path().join("data"), "max_body_bytes = 1024");
    assert!(text.contains("level = \"info\""), "{text}");
    let relay = Relay::start(dir.path(), &text).await;
    let ok = relay.callback(Some("FileNoteCreated"), "application/json", r#"{"data":{}}"#).await;
    assert_eq!(ok.status(), 200);
    let big = format!(r#"{{"data":"{}"}}"#, "x".repeat(5000));
    let r = relay.callback(Some("ActionCreated"), "application/json", big).await;
    let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let logs = relay.logs();
    let lines: Vec<Value> = logs.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert!(!lines.is_empty(), "{logs}");
    let spanned: Vec<&Value> = lines.iter().filter(|l| l["span"]["name"] == "callback").collect();
    assert!(spanned.is_empty(), "lines in a callback span at info: {spanned:?}");
    let rejected = lines
        .iter()
        .find(|l| l["message"] == "callback body too large; recorded as rejected")
        .unwrap_or_else(|| panic!("no line for the rejected callback in:\n{logs}"));
    assert_eq!(rejected["level"], "WARN", "{rejected}");
    assert_eq!(
        (rejected["id"].as_str(), rejected["source"].as_str(), rejected["event"].as_str()),
        (Some(id.as_str()), Some("demo"), Some("ActionCreated")),
        "{rejected}"
    );
}
