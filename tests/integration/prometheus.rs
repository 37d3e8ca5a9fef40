//! The dashboards and alert rules against a real Prometheus: a Prometheus server on
//! loopback scrapes a relay that has seen every kind of traffic (duplicates, an
//! unauthorised callback, a failing destination, a disabled and re-created hook, a
//! throttled upstream), then every PromQL expression of the dashboards and rules is
//! evaluated through Prometheus' HTTP API. Each must parse, and each must return data:
//! a panel on a metric the relay does not export fails here.

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::sim::Sim;
use common::sink::{closed_port, Sink};
use common::{Relay, SOURCE};
use reqwest::Method;
use serde_json::{json, Value};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const WAIT: Duration = Duration::from_secs(30);

/// A Prometheus server scraping the relay every second.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    http: reqwest::Client,
}

impl Prometheus {
    async fn start(dir: &Path, relay_admin: SocketAddr) -> Prometheus {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {ROOT}/deploy/prometheus/alerts.yml\n\
                 scrape_configs:\n  - job_name: hookrelay\n    static_configs:\n      - targets: ['{relay_admin}']\n"
            ),
        )
        .unwrap();
        let addr = closed_port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("prometheus not found: install the Debian package `prometheus` (scripts/test.sh does)");
        let p = Prometheus { child, addr, http: reqwest::Client::new() };
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(r) = p.http.get(format!("http://{addr}/-/ready")).send().await {
                if r.status() == 200 {
                    return p;
                }
            }
            assert!(Instant::now() < deadline, "prometheus did not get ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Samples of `metric` scraped in the last minute.
    async fn samples(&self, metric: &str) -> f64 {
        let seen = self.query(&format!("count_over_time({metric}[1m])")).await;
        seen.first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    async fn wait_for_samples(&self, metric: &str, n: f64) {
        let deadline = Instant::now() + WAIT;
        while self.samples(metric).await < n {
            assert!(Instant::now() < deadline, "prometheus is not scraping the relay");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Value {
        let r = self
            .http
            .get(format!("http://{}/api/v1/{path}", self.addr))
            .query(query)
            .send()
            .await
            .unwrap();
        r.json().await.unwrap()
    }

    /// The result of an instant query; panics if Prometheus cannot parse it.
    async fn query(&self, expr: &str) -> Vec<Value> {
        let v = self.api("query", &[("query", expr)]).await;
        assert_eq!(v["status"], "success", "{expr}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Families only a relay on PostgreSQL exports: their panels are queried (they must
/// parse) but show no data on the embedded relay these tests scrape.
const POSTGRES_ONLY: &[&str] = &["hookrelay_postgres_tls_verified"];

/// Whether `expr` reads the family `name` (itself, or a histogram's series of it), not
/// merely one whose name it begins.
fn reads(expr: &str, name: &str) -> bool {
    expr.match_indices(name).any(|(at, _)| {
        let rest = &expr[at + name.len()..];
        let whole = !rest.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        whole || ["_bucket", "_sum", "_count"].iter().any(|s| rest.starts_with(s))
    })
}

#[test]
fn every_metric_family_has_a_panel_and_no_job_is_hard_coded() {
    let out = Command::new(common::binary()).args(["reference", "metrics"]).output().unwrap();
    let reference = String::from_utf8(out.stdout).unwrap();
    let families: Vec<&str> = reference
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
        .filter(|f| f.starts_with("hookrelay_"))
        .collect();
    assert!(families.len() > 40, "{} families in the reference", families.len());
    let mut exprs = Vec::new();
    for file in ["hookrelay.json", "hookrelay-fleet.json"] {
        let text = std::fs::read_to_string(format!("{ROOT}/dashboards/{file}")).unwrap();
        let dashboard: Value = serde_json::from_str(&text).unwrap();
        panel_exprs(&dashboard["panels"], &mut exprs);
        // The scrape job's name is the operator's: a panel reads it from the `job`
        // variable, never from a name of its own.
        for (title, expr) in &exprs {
            let named = expr.replace(r#"job=~"$job""#, "");
            assert!(!named.contains("job"), "{file} / {title} names a job: {expr}");
        }
    }
    let without: Vec<&&str> =
        families.iter().filter(|f| !exprs.iter().any(|(_, e)| reads(e, f))).collect();
    assert!(without.is_empty(), "families without a dashboard panel: {without:?}");
    // The reading is exact: a family is not counted for one that only begins with it.
    assert!(!reads("rate(hookrelay_store_failed_total[1m])", "hookrelay_store_failed"));
    assert!(reads(
        "rate(hookrelay_delivery_lag_seconds_bucket[1m])",
        "hookrelay_delivery_lag_seconds"
    ));
}

/// Every `expr` of every panel (rows' nested panels included).
fn panel_exprs(panels: &Value, out: &mut Vec<(String, String)>) {
    for p in panels.as_array().into_iter().flatten() {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push((p["title"].as_str().unwrap_or("?").to_owned(), expr.to_owned()));
            }
        }
        panel_exprs(&p["panels"], out);
    }
}

/// Replaces the dashboard variables as Grafana would for this relay.
fn substitute(expr: &str, instance: &str) -> String {
    expr.replace("$instance", instance)
        .replace("$job", "hookrelay")
        .replace("$source", SOURCE)
        .replace("$__rate_interval", "15s")
        .replace("$__interval", "15s")
}

/// An alert expression without its threshold, for each side of an `or`: what must
/// return data even while the alert is not firing. A comparison of two series
/// (`free < floor`) gives both.
fn alert_operands(expr: &str) -> Vec<String> {
    expr.split(" or ")
        .flat_map(|side| {
            let side = side.trim();
            for op in [" == ", " != ", " >= ", " <= ", " > ", " < "] {
                if let Some((lhs, rhs)) = side.rsplit_once(op) {
                    if rhs.trim().parse::<f64>().is_ok() {
                        return vec![lhs.trim().to_owned()];
                    }
                    return vec![lhs.trim().to_owned(), rhs.trim().to_owned()];
                }
            }
            vec![side.to_owned()]
        })
        .collect()
}

#[test]
fn alert_operands_drop_thresholds() {
    assert_eq!(alert_operands("up{job=\"x\"} == 0"), ["up{job=\"x\"}"]);
    assert_eq!(
        alert_operands("increase(a[5m]) > 0 or increase(b[5m]) > 0"),
        ["increase(a[5m])", "increase(b[5m])"]
    );
    assert_eq!(alert_operands("hookrelay_ready"), ["hookrelay_ready"]);
    assert_eq!(
        alert_operands("predict_linear(free[1h], 6 * 3600) < floor"),
        ["predict_linear(free[1h], 6 * 3600)", "floor"]
    );
}

/// A relay with two accounts, three destinations (one refusing connections, one for
/// hook gaps), and a simulator behind a switchable proxy; then traffic of every kind.
async fn busy_relay(dir: &Path) -> (Sim, Proxy, Relay, Vec<Sink>) {
    let sim = Sim::start_args(&["--user", "alice:alice-token", "--user", "bob:bob-token"]);
    let proxy = Proxy::start().await;
    let (crm, gaps) = (Sink::start().await, Sink::start().await);
    let accounts: String = ["alice", "bob"]
        .iter()
        .map(|u| {
            format!(
                "[[sources.accounts]]\nname = \"{u}\"\napi_base = \"{}\"\ntoken = \"{u}-token\"\n",
                sim.api_base()
            )
        })
        .collect();
    let tail = format!(
        r#"events = ["ActionCreated", "TaskCreated"]
{accounts}
[upstream]
public_url = "{public}"
reconcile_interval = "2s"
initial_backoff = "100ms"
[delivery]
circuit_failure_threshold = 2
circuit_probe_interval = "500ms"
[delivery.retry]
initial_backoff = "50ms"
max_attempts = 2
[[destinations]]
name = "crm"
url = "{crm}"
events = ["ActionCreated", "TaskCreated"]
[[destinations]]
name = "gaps"
url = "{gaps}"
events = ["hookrelay.HookGap"]
[[destinations]]
name = "down"
url = "http://{down}/"
events = ["ActionCreated"]
"#,
        public = proxy.url(),
        crm = crm.url(),
        gaps = gaps.url(),
        down = closed_port(),
    );
    let relay = Relay::start(dir, &common::config_with(dir, "", &tail)).await;
    proxy.forward_to(relay.ingress);
    (sim, proxy, relay, vec![crm, gaps])
}

async fn drive_traffic(sim: &Sim, proxy: &Proxy, relay: &Relay, sinks: &[Sink]) {
    relay.admin_post("/admin/hooks/sync", None).await;
    // Two users' hooks: every occurrence arrives twice.
    sim.fire(json!({"event": "ActionCreated", "count": 3})).await;
    // No destination wants TaskUpdated: unrouted.
    relay.callback(Some("TaskUpdated"), "text/plain", "not json").await;
    let wrong =
        format!("http://{}/hooks/{SOURCE}/wrong-token-0123456789/ActionCreated", relay.ingress);
    relay.client.post(wrong).body("{}").send().await.unwrap();
    // The relay looks broken: a hook gets disabled, then re-created with a HookGap.
    proxy.fail_with(500);
    sim.fire(json!({"event": "TaskCreated"})).await;
    proxy.fail_with(0);
    sinks[1].wait_for(1, WAIT).await;
    // A throttled upstream.
    sim.control(Method::POST, "/sim/throttle", json!({"requests": 1, "retry_after": 1})).await;
    relay.admin_post("/admin/hooks/sync", None).await;
    sinks[0].wait_for(3, WAIT).await;
    relay
        .admin_until("/admin/dead-letters", WAIT, |v| {
            v["dead_letters"].as_array().is_some_and(|a| !a.is_empty())
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_and_alert_expression_returns_data_from_a_real_prometheus() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, proxy, relay, sinks) = busy_relay(dir.path()).await;
    let prom = Prometheus::start(dir.path(), relay.admin).await;
    // Traffic only once Prometheus has seen the quiet relay: alerts on increases need
    // the "before".
    prom.wait_for_samples("hookrelay_build_info", 1.0).await;
    drive_traffic(&sim, &proxy, &relay, &sinks).await;
    let instance = relay.admin.to_string();

    // Let Prometheus take a few scrapes of every series, and evaluate the rules.
    let before = prom.samples("hookrelay_build_info").await;
    prom.wait_for_samples("hookrelay_build_info", before + 4.0).await;

    let mut failures = Vec::new();
    for file in ["hookrelay.json", "hookrelay-fleet.json"] {
        let text = std::fs::read_to_string(format!("{ROOT}/dashboards/{file}")).unwrap();
        let dashboard: Value = serde_json::from_str(&text).unwrap();
        let mut exprs = Vec::new();
        panel_exprs(&dashboard["panels"], &mut exprs);
        assert!(exprs.len() >= 6, "{file}: {} expressions", exprs.len());
        for (title, expr) in exprs {
            let expr = substitute(&expr, &instance);
            let postgres_only = POSTGRES_ONLY.iter().any(|f| expr.contains(f));
            if prom.query(&expr).await.is_empty() && !postgres_only {
                failures.push(format!("{file} / {title}: no data for {expr}"));
            }
        }
        for var in dashboard["templating"]["list"].as_array().unwrap() {
            let Some(q) = var["query"]["query"].as_str() else { continue };
            let inner = q.strip_prefix("label_values(").and_then(|r| r.strip_suffix(')')).unwrap();
            let (selector, label) = inner.rsplit_once(',').unwrap();
            let selector = substitute(selector.trim(), &instance);
            let v = prom
                .api(&format!("label/{}/values", label.trim()), &[("match[]", &selector)])
                .await;
            if v["data"].as_array().is_none_or(|a| a.is_empty()) {
                failures.push(format!("{file} / variable {}: no values for {q}: {v}", var["name"]));
            }
        }
    }

    let rules = prom.api("rules", &[]).await;
    let mut count = 0;
    for group in rules["data"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            count += 1;
            let (name, expr) = (rule["name"].as_str().unwrap(), rule["query"].as_str().unwrap());
            if rule["health"] != "ok" {
                failures
                    .push(format!("alert {name}: health {} {}", rule["health"], rule["lastError"]));
            }
            for operand in alert_operands(expr) {
                if prom.query(&operand).await.is_empty() {
                    failures.push(format!("alert {name}: no data for {operand}"));
                }
            }
        }
    }
    assert!(count >= 10, "{count} rules loaded: {rules}");
    assert!(failures.is_empty(), "{} problems:\n{}", failures.len(), failures.join("\n"));

    // And the alerts mean what they say: the disabled hook fires HookrelayHookDisabled.
    let alerts = prom.api("alerts", &[]).await;
    let firing: Vec<&str> = alerts["data"]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["state"] == "firing")
        .map(|a| a["labels"]["alertname"].as_str().unwrap())
        .collect();
    assert!(firing.contains(&"HookrelayHookDisabled"), "firing: {firing:?} {alerts}");
    assert!(firing.contains(&"HookrelayDeadLettersGrowing"), "firing: {firing:?}");
    assert!(!firing.contains(&"HookrelayIngressStoreFailures"), "firing: {firing:?}");
}
