//! The audit ledger end to end: after a run with duplicates, an oversized (rejected)
//! callback, an unrouted event, a filter, a dead letter and its replay, every callback
//! is accounted for, through the API and the CLI, and still after a SIGKILL.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::sink::{Mode, Sink};
use common::Relay;
use serde_json::Value;

/// Everything due is delivered within this bound after each step.
const BOUND: Duration = Duration::from_secs(20);

/// The row of `source`/`event` in an audit, as (received, rejected, unrouted,
/// duplicate, routed, waiting).
fn event_row(audit: &Value, event: &str) -> [i64; 6] {
    let row = audit["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["source"] == common::SOURCE && r["event"] == event)
        .unwrap_or_else(|| panic!("no row for {event} in {audit:#}"));
    ["received", "rejected", "unrouted", "duplicate", "routed", "waiting"]
        .map(|k| row[k].as_i64().unwrap())
}

/// A destination's row as (routed, delivered, filtered, dead, pending, retrying).
fn dest_row(audit: &Value, name: &str) -> [i64; 6] {
    let row = audit["destinations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["destination"] == name)
        .unwrap_or_else(|| panic!("no row for {name} in {audit:#}"));
    ["routed", "delivered", "filtered", "dead", "pending", "retrying"]
        .map(|k| row[k].as_i64().unwrap())
}

fn hookrelay_audit(relay: &Relay, dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(common::binary())
        .arg("audit")
        .args(args)
        .arg("--config")
        .arg(dir.join("hookrelay.toml"))
        .arg("--admin-url")
        .arg(format!("http://{}", relay.admin))
        .env_remove("HOOKRELAY_ADMIN_TOKEN")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_callback_is_accounted_for_after_duplicates_filters_dead_letters_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let (crm, erp) = (Sink::start().await, Sink::start().await);
    // erp refuses action 13 for good (400): a dead letter.
    erp.set_mode(Mode::FailIfContains("\"id\":\"13\"".into(), 400));
    let tail = format!(
        r#"
[[destinations]]
name = "crm"
url = "{}"
events = ["ActionUpdated"]
filter = '.body.data.attributes.status == "Open"'

[[destinations]]
name = "erp"
url = "{}"
events = ["ActionUpdated"]
"#,
        crm.url(),
        erp.url()
    );
    let config = common::config_with(&dir.path().join("data"), "max_body_bytes = 4096", &tail);
    let mut relay = Relay::start(dir.path(), &config).await;

    // Ten actions, each sent three times at once (three users' hooks), half of them
    // Open; one callback too large to keep; one event nobody takes.
    let mut sends = Vec::new();
    for id in 10..20 {
        let status = if id % 2 == 0 { "Open" } else { "Closed" };
        let body = format!(
            r#"{{"data":{{"type":"actions","id":"{id}","attributes":{{"status":"{status}"}}}}}}"#
        );
        for _ in 0..3 {
            sends.push(relay.callback(Some("ActionUpdated"), "application/json", body.clone()));
        }
    }
    sends.push(relay.callback(Some("ActionUpdated"), "application/json", "x".repeat(10_000)));
    sends.push(relay.callback(Some("ContactCreated"), "application/json", "{}".into()));
    for r in futures_util::future::join_all(sends).await {
        assert_eq!(r.status(), 200);
    }

    // Progress: the five Open actions reach crm, nine actions reach erp, action 13 is
    // dead there, within the bound.
    crm.wait_for(5, BOUND).await;
    erp.wait_for(10, BOUND).await; // nine 200s and the 400
    relay
        .admin_until("/admin/dead-letters", BOUND, |v| {
            v["dead_letters"].as_array().is_some_and(|d| d.len() == 1)
        })
        .await;
    // Every copy dispatched (a late copy may still wait in the inbox a moment), and
    // every answer the sinks sent recorded (a sink has answered a moment before the
    // relay writes the attempt).
    let waiting = |v: &Value| -> i64 {
        v["events"].as_array().map_or(1, |e| e.iter().map(|r| r["waiting"].as_i64().unwrap()).sum())
    };
    let settled = |v: &Value| {
        waiting(v) == 0
            && ["crm", "erp"].iter().all(|d| {
                let row = dest_row(v, d);
                row[4] == 0 && row[5] == 0
            })
    };
    let audit = relay.admin_until("/admin/audit", BOUND, settled).await;
    assert_eq!(audit["balanced"], true, "{audit:#}");
    assert_eq!(event_row(&audit, "ActionUpdated"), [31, 1, 0, 20, 10, 0], "{audit:#}");
    // A name the relay does not know is counted in its source's `other` row.
    assert_eq!(event_row(&audit, "other"), [1, 0, 1, 0, 0, 0]);
    assert!(!audit.to_string().contains("ContactCreated"), "{audit:#}");
    assert_eq!(dest_row(&audit, "crm"), [10, 5, 5, 0, 0, 0]);
    assert_eq!(dest_row(&audit, "erp"), [10, 9, 0, 1, 0, 0]);

    // The consumer is fixed; the dead letter is replayed and delivered.
    erp.set_mode(Mode::Ok);
    let (status, replayed) = relay.admin_post("/admin/dead-letters/replay", None).await;
    assert_eq!((status, replayed["replayed"].as_u64()), (200, Some(1)));
    erp.wait_for(11, BOUND).await;
    let audit = relay
        .admin_until("/admin/audit", BOUND, |v| {
            v["destinations"].as_array().is_some_and(|d| {
                d.iter().any(|d| d["destination"] == "erp" && d["delivered"] == 10)
            })
        })
        .await;
    assert_eq!(audit["balanced"], true, "{audit:#}");
    assert_eq!(dest_row(&audit, "erp"), [10, 10, 0, 0, 0, 0]);

    // The CLI says the same, and exits 0.
    let out = hookrelay_audit(&relay, dir.path(), &["--since", "2h"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(": balanced"), "{text}");
    assert!(text.contains("other") && text.contains("erp"), "{text}");
    let out = hookrelay_audit(&relay, dir.path(), &["--since", "yesterday-ish"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("6h or 7d"));
    let metrics = relay.metrics().await;
    assert_eq!(common::metric(&metrics, "hookrelay_audit_imbalance", &[]), Some(0.0));

    // A SIGKILL loses none of it. (A dispatch is durable with the next durable write:
    // the last ones may be redone after the restart, their events waiting meanwhile.)
    relay.kill();
    let relay = Relay::start(dir.path(), &config).await;
    let after = relay
        .admin_until("/admin/audit", BOUND, |v| {
            v["events"] == audit["events"] && v["destinations"] == audit["destinations"]
        })
        .await;
    assert_eq!(after["balanced"], true, "{after:#}");
    // A window before any of it is empty, and a window the wrong way round is refused.
    let (_, old) = relay.admin_get("/admin/audit?until=2020-01-02T00:00:00Z").await;
    assert_eq!(old["events"], serde_json::json!([]));
    let (status, err) =
        relay.admin_get("/admin/audit?since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z").await;
    assert_eq!(status, 400);
    assert!(err["error"].as_str().unwrap().contains("since must be before until"));
}
