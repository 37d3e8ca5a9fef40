//! Every family: help, base units, bounded labels, a sample each.

use super::*;
use prometheus::proto::MetricType;

/// Label names and why their values are bounded.
const BOUNDED_LABELS: &[(&str, &str)] = &[
    ("source", "configured sources, or `unknown`"),
    ("account", "configured accounts"),
    ("destination", "configured destinations"),
    ("event", "the 21 upstream names, `hookrelay.HookGap`, or `other`"),
    ("outcome", "fixed per metric"),
    ("stage", "internal_events::taxonomy::Stage, 11 values"),
    ("error_type", "internal_events::taxonomy::ErrorType, 11 values"),
    ("cause", "fixed per metric"),
    ("state", "queue states"),
    ("status", "hook statuses, or `other`"),
    ("method", "the HTTP methods the client uses"),
    ("from", "hook states"),
    ("to", "hook states"),
    ("version", "one per build"),
    ("task", "the relay's background tasks (one per destination for delivery)"),
    ("kind", "fixed per metric"),
    ("result", "fixed per metric"),
    ("program", "filter, transform or preview"),
    ("sslmode", "libpq's five modes"),
];

/// Words that say a metric measures time or size, and the base unit it must end in.
const UNITS: &[(&str, &str)] = &[
    ("duration", "_seconds"),
    ("lag", "_seconds"),
    ("age", "_seconds"),
    ("timestamp", "_seconds"),
    ("size_bytes", "_bytes"),
];

/// Every metric with one sample, so that `gather()` shows every family.
fn touch_all(m: &Metrics) {
    m.ingress.ingress_requests.with_label_values(&["demo", ingress_outcome::ACCEPTED]).inc();
    m.ingress.ingress_duration.observe(0.001);
    m.store.store_commit_duration.observe(0.001);
    m.store.store_commit_batch_size.observe(1.0);
    m.store.store_commit_failures.inc();
    m.store.store_checkpoint_duration.observe(0.001);
    m.store.events_stored.with_label_values(&["demo", "ActionCreated"]).inc();
    m.store.store_size.set(1);
    m.store.storage_free.set(1);
    m.store.storage_floor.set(1);
    m.relay.admin_token_refusals.with_label_values(&["wrong_token"]).inc();
    m.relay.pull_token_refusals.with_label_values(&["wrong_token"]).inc();
    m.store.postgres_tls_verified.with_label_values(&["verify-full"]).set(1);
    m.delivery.destination_stalled.with_label_values(&["crm"]).set(0);
    m.delivery.worker_restarts.with_label_values(&["crm"]).inc();
    m.delivery.transforms_failed.with_label_values(&["crm"]).inc();
    m.delivery.shape_runs_stopped.with_label_values(&["crm", "filter", "overran"]).inc();
    m.delivery.programs_disabled.with_label_values(&["crm", "filter"]).set(1);
    m.dispatch.deliveries_filtered.with_label_values(&["crm", "error"]).inc();
    m.dispatch.deliveries_superseded.with_label_values(&["crm"]).inc();
    m.store.store_failed.set(1);
    m.store.store_reachable.set(1);
    m.relay.fleet_relays.set(1);
    m.store.store_probe_failures.inc();
    m.store.inbox().set(1);
    m.relay.ready.set(1);
    m.relay.console_sign_ins.with_label_values(&["ok"]).inc();
    m.relay.trace_spans.with_label_values(&["exported"]).inc();
    m.relay.clock_skew.set(0.5);
    m.relay.config_reloads.with_label_values(&["reloaded"]).inc();
    m.relay.config_fingerprint.set(1.0);
    m.store.bodies_pruned.inc();
    for v in [
        &m.dispatch.events_dispatched,
        &m.dispatch.events_deduplicated,
        &m.dispatch.events_unrouted,
    ] {
        v.with_label_values(&["demo", "ActionCreated"]).inc();
    }
    m.dispatch.dedup_keys.set(1);
    m.dispatch.dedup_keys_purged.inc();
    m.delivery.deliveries.with_label_values(&["crm", "success"]).inc();
    m.delivery.delivery_attempt_duration.with_label_values(&["crm"]).observe(0.01);
    m.delivery.delivery_lag.with_label_values(&["crm"]).observe(0.01);
    m.delivery.queue_depth.with_label_values(&["crm", "pending"]).set(1);
    m.delivery.queue_oldest_age.with_label_values(&["crm"]).set(1.0);
    m.delivery.circuit_open.with_label_values(&["crm"]).set(0);
    m.delivery.destination_paused.with_label_values(&["crm"]).set(0);
    m.store.events_pruned.inc();
    m.relay.task_failures.with_label_values(&["dispatcher"]).inc();
    m.relay.errors.with_label_values(&["upstream", "storage"]).inc();
    let u = &m.upstream;
    u.hooks.with_label_values(&["demo", "alice", "ActionCreated", "Active"]).set(1);
    u.triggered.with_label_values(&["demo", "alice", "ActionCreated"]).inc();
    u.last_triggered.with_label_values(&["demo", "alice", "ActionCreated"]).set(1.7e9);
    u.transitions.with_label_values(&["demo", "alice", "ActionCreated", "none", "Active"]).inc();
    u.requests.with_label_values(&["demo", "alice", "GET", "ok"]).inc();
    u.reconcile_duration.with_label_values(&["demo", "alice"]).observe(0.1);
    u.token_refreshes.with_label_values(&["demo", "alice", "success"]).inc();
    u.callbacks_missing.with_label_values(&["demo", "ActionCreated"]).set(0);
    u.account_up.with_label_values(&["demo", "alice"]).set(1);
}

#[test]
fn verdict_labels_are_the_pre_created_outcomes() {
    use crate::store::lifecycle::AttemptVerdict;
    for v in [
        AttemptVerdict::Success,
        AttemptVerdict::Retry,
        AttemptVerdict::Failed,
        AttemptVerdict::Dead,
    ] {
        assert!(DELIVERY_OUTCOMES.contains(&v.label()), "{v:?}");
    }
}

#[test]
fn every_metric_has_help_base_units_and_bounded_labels() {
    let m = Metrics::new().unwrap();
    assert!(m.descs.len() >= 30, "{} metrics registered", m.descs.len());
    for d in &m.descs {
        let name = d.fq_name.as_str();
        assert!(name.starts_with("hookrelay_"), "{name}");
        assert!(d.help.len() >= 10 && d.help.ends_with('.'), "{name}: HELP {:?}", d.help);
        // Whole `_`-separated words ("storage" is not an "age"); `size_bytes` spans two.
        let padded = format!("_{name}_");
        for (word, unit) in UNITS {
            if padded.contains(&format!("_{word}_")) {
                let base = name.trim_end_matches("_total");
                assert!(base.ends_with(unit), "{name} measures {word}: must end in {unit}");
            }
        }
        for bad in [
            "_ms",
            "_milliseconds",
            "_microseconds",
            "_minutes",
            "_hours",
            "_kb",
            "_mb",
            "_percent",
        ] {
            assert!(!name.contains(bad), "{name}: not a base unit ({bad})");
        }
        for label in &d.variable_labels {
            assert!(
                BOUNDED_LABELS.iter().any(|(l, _)| l == label),
                "{name}: label {label:?} is not known to be bounded"
            );
        }
    }

    touch_all(&m);
    let families = m.registry().gather();
    assert_eq!(families.len(), m.descs.len(), "touch_all() must give every metric a sample");
    for family in families {
        let name = family.name();
        let is_counter = family.get_field_type() == MetricType::COUNTER;
        assert_eq!(name.ends_with("_total"), is_counter, "{name}: `_total` iff a counter");
    }
    let text = m.render();
    assert!(text.contains("hookrelay_build_info{version=\""), "{text}");
    assert!(
        text.contains("hookrelay_ingress_requests_total{outcome=\"accepted\",source=\"demo\"} 1")
    );
}

/// The committed metrics reference is the one the registry gives (regenerate with
/// `cargo run -- reference metrics > docs/metrics.md`), and names every family.
#[test]
fn the_committed_metrics_reference_is_up_to_date() {
    let m = Metrics::new().unwrap();
    let reference = m.reference();
    for name in m.family_names() {
        assert!(reference.contains(&format!("| `{name}` |")), "{name} is not in the reference");
    }
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md"))
            .unwrap_or_default();
    assert!(
        committed == reference,
        "docs/metrics.md is stale: run `cargo run -- reference metrics > docs/metrics.md`"
    );
}
