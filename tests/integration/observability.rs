//! Metrics and alert rules checked by Prometheus' own tool, promtool, against a relay
//! that has seen traffic of every kind (callbacks, deliveries that fail, upstream hooks).

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::proxy::Proxy;
use common::sim::Sim;
use common::sink::{closed_port, Sink};
use common::{promtool, Relay};
use serde_json::json;

const ALERTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus/alerts.yml");
const RUNBOOK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/runbook.md");

fn text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The `hookrelay_*` metric names an expression file mentions (series suffixes of
/// histograms folded into the family name).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("hookrelay_") {
        let tail = &rest[i..];
        let end =
            tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        let name = &tail[..end];
        let family =
            ["_bucket", "_count", "_sum"].iter().fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
        names.insert(family.to_owned());
        rest = &tail[end..];
    }
    names
}

#[test]
fn alert_rules_pass_promtool_and_each_has_severity_summary_and_runbook() {
    let out = promtool(&["check", "rules", ALERTS], None);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("SUCCESS"), "{}", text(&out));

    let rules = std::fs::read_to_string(ALERTS).unwrap();
    let runbook = std::fs::read_to_string(RUNBOOK).unwrap();
    let blocks: Vec<&str> = rules.split("- alert: ").skip(1).collect();
    assert!(blocks.len() >= 10, "{} alerts", blocks.len());
    for block in blocks {
        let name = block.lines().next().unwrap().trim();
        assert!(
            block.contains("severity: critical") || block.contains("severity: warning"),
            "{name}: severity"
        );
        assert!(block.contains("summary: "), "{name}: summary");
        let anchor = format!("docs/runbook.md#{}", name.to_lowercase());
        assert!(block.contains(&anchor), "{name}: runbook annotation {anchor}");
        assert!(
            runbook.contains(&format!("\n## {name}\n")),
            "{name}: no section in docs/runbook.md"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_the_metrics_of_a_busy_relay_and_the_alerts_name_only_them() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start_args(&["--user", "alice:alice-token"]);
    let proxy = Proxy::start().await;
    let sink = Sink::start().await;
    let tail = format!(
        r#"events = ["ActionCreated"]
[[sources.accounts]]
name = "alice"
api_base = "{api}"
token = "alice-token"
[upstream]
public_url = "{public}"
[delivery.retry]
initial_backoff = "50ms"
max_attempts = 2
[[destinations]]
name = "ok"
url = "{ok}"
[[destinations]]
name = "down"
url = "http://{down}/"
"#,
        api = sim.api_base(),
        public = proxy.url(),
        ok = sink.url(),
        down = closed_port(),
    );
    let relay = Relay::start(dir.path(), &common::config_with(dir.path(), "", &tail)).await;
    proxy.forward_to(relay.ingress);
    relay.admin_post("/admin/hooks/sync", None).await;
    sim.fire(json!({"event": "ActionCreated", "count": 3})).await;
    relay.callback(Some("TaskCreated"), "text/plain", "not json").await;
    sink.wait_for(4, Duration::from_secs(20)).await;
    relay
        .admin_until("/admin/dead-letters", Duration::from_secs(20), |v| {
            v["dead_letters"].as_array().is_some_and(|a| !a.is_empty())
        })
        .await;
    relay.admin_post("/admin/hooks/sync", None).await;

    let scrape = relay.metrics().await;
    let out = promtool(&["check", "metrics"], Some(&scrape));
    assert!(
        out.status.success() && text(&out).trim().is_empty(),
        "promtool: {}\n{scrape}",
        text(&out)
    );

    let exported = metric_names(
        &scrape.lines().filter(|l| l.starts_with("# TYPE ")).collect::<Vec<_>>().join("\n"),
    );
    for family in
        ["hookrelay_upstream_hooks", "hookrelay_deliveries_total", "hookrelay_queue_depth"]
    {
        assert!(exported.contains(family), "{family} not exported");
    }
    let named = metric_names(&std::fs::read_to_string(ALERTS).unwrap());
    let unknown: Vec<_> = named.difference(&exported).collect();
    assert!(unknown.is_empty(), "alerts name metrics the relay does not export: {unknown:?}");
}

/// Every panel of a dashboard, rows' nested panels included.
fn all_panels(panels: &serde_json::Value, out: &mut Vec<serde_json::Value>) {
    for p in panels.as_array().into_iter().flatten() {
        out.push(p.clone());
        all_panels(&p["panels"], out);
    }
}

#[test]
fn dashboards_are_ready_for_file_provisioning() {
    for (file, uid) in
        [("hookrelay.json", "hookrelay"), ("hookrelay-fleet.json", "hookrelay-fleet")]
    {
        let text =
            std::fs::read_to_string(format!("{}/dashboards/{file}", env!("CARGO_MANIFEST_DIR")))
                .unwrap();
        assert!(
            !text.contains("__inputs") && !text.contains("${DS_"),
            "{file}: import placeholders"
        );
        let d: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(d["uid"], uid, "{file}");
        assert!(d["id"].is_null(), "{file}: a provisioned dashboard carries no database id");
        let vars = d["templating"]["list"].as_array().unwrap();
        let ds = vars.iter().find(|v| v["name"] == "datasource").expect("datasource variable");
        assert_eq!(
            (ds["type"].as_str(), ds["query"].as_str()),
            (Some("datasource"), Some("prometheus"))
        );
        let mut panels = Vec::new();
        all_panels(&d["panels"], &mut panels);
        let mut ids = BTreeSet::new();
        for p in &panels {
            assert!(ids.insert(p["id"].as_u64().unwrap()), "{file}: panel id {} twice", p["id"]);
            assert!(p["gridPos"]["w"].as_u64().is_some(), "{file}: {} has no gridPos", p["title"]);
            if p["type"] == "row" {
                continue;
            }
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{file}: {}", p["title"]);
            assert!(
                !p["description"].as_str().unwrap_or("").is_empty(),
                "{file}: {} undescribed",
                p["title"]
            );
            for t in p["targets"].as_array().unwrap() {
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{file}: {}", p["title"]);
            }
        }
        if uid == "hookrelay" {
            for name in ["instance", "source"] {
                assert!(vars.iter().any(|v| v["name"] == name), "{file}: no {name} variable");
            }
            let rows: Vec<&str> = panels
                .iter()
                .filter(|p| p["type"] == "row")
                .map(|p| p["title"].as_str().unwrap())
                .collect();
            // The rows docs/operations.md describes, in its order.
            let described = [
                "Ingress",
                "Pipeline",
                "Delivery",
                "Hook lifecycle",
                "Storage",
                "Routing and shaping",
                "Relay health",
                "Fleet, access and configuration",
            ];
            assert_eq!(rows, described);
            let doc = std::fs::read_to_string(format!(
                "{}/docs/operations.md",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap();
            for row in described {
                assert!(
                    doc.contains(&format!("- **{row}**")),
                    "docs/operations.md does not describe {row}"
                );
            }
        }
    }
    for provisioning in ["dashboards/hookrelay.yaml", "datasources/prometheus.yaml"] {
        let path = format!("{}/dashboards/provisioning/{provisioning}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("apiVersion: 1"), "{path}");
    }
}
