//! Prometheus metrics: one registry per process, passed around (no globals), so that
//! tests can build their own.

use crate::internal_events::{CommitGroup, EventStored, InternalEvent, StoreFailed};
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::store::EventMeta;

/// Latency buckets (seconds) from 100 µs to 5 s: acks and fsyncs live at the low end.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// End-to-end lag buckets (seconds): from 5 ms to a day, as a consumer may be down for hours.
const LAG_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    3600.0, 14400.0, 86400.0,
];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];

/// Ingress outcomes, the values of the `outcome` label.
pub(crate) mod outcome {
    /// Stored, answered 200.
    pub(crate) const ACCEPTED: &str = "accepted";
    /// Too large: recorded as rejected, answered 200.
    pub(crate) const REJECTED: &str = "rejected";
    /// Unknown source or wrong token: answered 404.
    pub(crate) const UNAUTHORIZED: &str = "unauthorized";
    /// The store failed: connection closed without an answer.
    pub(crate) const STORE_FAILED: &str = "store_failed";
    /// The client went away before its body was complete: nothing stored.
    pub(crate) const INCOMPLETE: &str = "incomplete";
    /// Free space below the floor: connection closed without an answer, nothing stored.
    pub(crate) const NO_SPACE: &str = "no_space";
    /// The body took longer than `ingress.body_timeout`: connection closed, nothing
    /// stored (the upstream retries).
    pub(crate) const BODY_TIMEOUT: &str = "body_timeout";
    pub(crate) const ALL: [&str; 7] =
        [ACCEPTED, REJECTED, UNAUTHORIZED, STORE_FAILED, INCOMPLETE, NO_SPACE, BODY_TIMEOUT];
}

/// Delivery attempt outcomes, the values of `hookrelay_deliveries_total{outcome}`.
pub(crate) const DELIVERY_OUTCOMES: [&str; 4] = ["success", "retry", "failed", "dead"];

/// Every metric the relay exports.
pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) ingress_requests: IntCounterVec,
    pub(crate) ingress_duration: Histogram,
    pub(crate) store_commit_duration: Histogram,
    pub(crate) store_commit_batch_size: Histogram,
    pub(crate) store_commit_failures: IntCounter,
    pub(crate) events_stored: IntCounterVec,
    pub(crate) store_size: IntGauge,
    pub(crate) storage_free: IntGauge,
    pub(crate) storage_floor: IntGauge,
    pub(crate) store_failed: IntGauge,
    pub(crate) store_reachable: IntGauge,
    pub(crate) fleet_relays: IntGauge,
    pub(crate) dispatch_leader: IntGauge,
    pub(crate) store_probe_failures: IntCounter,
    pub(crate) inbox_events: IntGauge,
    pub(crate) ready: IntGauge,
    pub(crate) events_dispatched: IntCounterVec,
    pub(crate) events_deduplicated: IntCounterVec,
    pub(crate) events_unrouted: IntCounterVec,
    pub(crate) dedup_keys: IntGauge,
    pub(crate) deliveries: IntCounterVec,
    pub(crate) delivery_attempt_duration: HistogramVec,
    pub(crate) delivery_lag: HistogramVec,
    pub(crate) queue_depth: IntGaugeVec,
    pub(crate) queue_oldest_age: GaugeVec,
    pub(crate) circuit_open: IntGaugeVec,
    pub(crate) destination_stalled: IntGaugeVec,
    pub(crate) worker_restarts: IntCounterVec,
    pub(crate) destination_paused: IntGaugeVec,
    pub(crate) events_pruned: IntCounter,
    pub(crate) task_failures: IntCounterVec,
    pub(crate) internal_errors: IntCounterVec,
    pub(crate) upstream: UpstreamMetrics,
    /// Name, help and label names of every metric registered.
    #[cfg_attr(not(test), allow(dead_code))]
    descs: Vec<prometheus::core::Desc>,
}

/// Metrics of the hook lifecycle (`upstream/`).
pub(crate) struct UpstreamMetrics {
    pub(crate) hooks: IntGaugeVec,
    pub(crate) triggered: IntCounterVec,
    pub(crate) last_triggered: GaugeVec,
    pub(crate) transitions: IntCounterVec,
    pub(crate) requests: IntCounterVec,
    pub(crate) reconcile_duration: HistogramVec,
    pub(crate) token_refreshes: IntCounterVec,
    pub(crate) callbacks_missing: IntGaugeVec,
    pub(crate) account_up: IntGaugeVec,
}

/// Registers metrics, remembering their descriptions (so a test can check every one,
/// including those with no sample yet).
struct Registrar {
    registry: Registry,
    descs: std::cell::RefCell<Vec<prometheus::core::Desc>>,
}

/// Registers `metric` and hands it back (metrics are cheap handles onto shared state).
fn reg_one<M: prometheus::core::Collector + Clone + 'static>(
    reg: &Registrar,
    metric: M,
) -> Result<M, MetricsError> {
    reg.descs.borrow_mut().extend(metric.desc().into_iter().cloned());
    reg.registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

/// Why the metrics could not be set up (a programming error: duplicate names).
pub(crate) type MetricsError = prometheus::Error;

impl Metrics {
    pub(crate) fn new() -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let reg = Registrar { registry: registry.clone(), descs: Default::default() };
        let opts = |name: &str, help: &str| Opts::new(name, help);
        let hopts = |name: &str, help: &str, buckets: &[f64]| {
            HistogramOpts::new(name, help).buckets(buckets.to_vec())
        };
        let counter = |name: &str, help: &str| reg_one(&reg, IntCounter::new(name, help)?);
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            reg_one(&reg, IntCounterVec::new(opts(name, help), labels)?)
        };
        let gauge = |name: &str, help: &str| reg_one(&reg, IntGauge::new(name, help)?);
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            reg_one(&reg, IntGaugeVec::new(opts(name, help), labels)?)
        };
        let float_gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            reg_one(&reg, GaugeVec::new(opts(name, help), labels)?)
        };
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            reg_one(&reg, Histogram::with_opts(hopts(name, help, buckets))?)
        };
        let histogram_vec = |name: &str, help: &str, buckets: &[f64], labels: &[&str]| {
            reg_one(&reg, HistogramVec::new(hopts(name, help, buckets), labels)?)
        };

        let build_info = gauge_vec(
            "hookrelay_build_info",
            "Build of the running relay; always 1.",
            &["version"],
        )?;
        build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);

        Ok(Self {
            ingress_requests: counter_vec(
                "hookrelay_ingress_requests_total",
                "Callbacks received, by source (`unknown` if not configured) and outcome \
                 (accepted, rejected, unauthorized, store_failed, incomplete, no_space).",
                &["source", "outcome"],
            )?,
            ingress_duration: histogram(
                "hookrelay_ingress_request_duration_seconds",
                "Time from a callback's arrival to its answer.",
                LATENCY_BUCKETS,
            )?,
            store_commit_duration: histogram(
                "hookrelay_store_commit_duration_seconds",
                "Time to write one group of events and, when durable, fsync it.",
                LATENCY_BUCKETS,
            )?,
            store_commit_batch_size: histogram(
                "hookrelay_store_commit_batch_size",
                "Events per group commit.",
                BATCH_BUCKETS,
            )?,
            store_commit_failures: counter(
                "hookrelay_store_commit_failures_total",
                "Group commits that failed (their callbacks were not acknowledged).",
            )?,
            events_stored: counter_vec(
                "hookrelay_events_stored_total",
                "Events durably stored, by source and event name (known names or `other`).",
                &["source", "event"],
            )?,
            store_size: gauge("hookrelay_store_size_bytes", "Size of the sled store on disk.")?,
            storage_free: gauge(
                "hookrelay_storage_free_bytes",
                "Free space on the data directory's filesystem (as an unprivileged process \
                 sees it), measured every second.",
            )?,
            storage_floor: gauge(
                "hookrelay_storage_floor_bytes",
                "The free-space floor (storage.min_free_bytes / min_free_percent): below it, \
                 callbacks are refused.",
            )?,
            store_failed: gauge(
                "hookrelay_store_failed",
                "1 once the store failed (a write error, or a write that did not return within \
                 storage.write_timeout); the relay then exits to be restarted.",
            )?,
            store_reachable: gauge(
                "hookrelay_store_reachable",
                "1 while the database answers (PostgreSQL; probed every second), 0 while it \
                 does not. Always 1 for sled.",
            )?,
            fleet_relays: gauge(
                "hookrelay_fleet_relays",
                "Relays sharing the store, as this relay last read it (PostgreSQL); each \
                 destination's max_concurrency and rate_limit are divided among them. 1 for \
                 sled.",
            )?,
            dispatch_leader: gauge(
                "hookrelay_dispatch_leader",
                "1 while this relay dispatches the inbox (one relay of a fleet at a time, on a \
                 lease that moves within seconds when it dies; always 1 for sled).",
            )?,
            store_probe_failures: counter(
                "hookrelay_store_probe_failures_total",
                "Probes of the database that failed or took over 3 s.",
            )?,
            inbox_events: gauge(
                "hookrelay_inbox_events",
                "Stored events waiting to be dispatched.",
            )?,
            ready: gauge("hookrelay_ready", "1 when the relay is ready to serve, 0 otherwise.")?,
            events_dispatched: counter_vec(
                "hookrelay_events_dispatched_total",
                "Events routed to at least one destination.",
                &["source", "event"],
            )?,
            events_deduplicated: counter_vec(
                "hookrelay_events_deduplicated_total",
                "Events recognised as another copy of an occurrence already dispatched.",
                &["source", "event"],
            )?,
            events_unrouted: counter_vec(
                "hookrelay_events_unrouted_total",
                "Events no destination wants.",
                &["source", "event"],
            )?,
            dedup_keys: gauge("hookrelay_dedup_keys", "Keys in the deduplication index.")?,
            deliveries: counter_vec(
                "hookrelay_deliveries_total",
                "Delivery attempts by destination and outcome (success, retry, failed: \
                 permanent error, dead: retries exhausted).",
                &["destination", "outcome"],
            )?,
            delivery_attempt_duration: histogram_vec(
                "hookrelay_delivery_attempt_duration_seconds",
                "Time of one delivery attempt, request to answer.",
                LATENCY_BUCKETS,
                &["destination"],
            )?,
            delivery_lag: histogram_vec(
                "hookrelay_delivery_lag_seconds",
                "Time from a callback's arrival to its successful delivery.",
                LAG_BUCKETS,
                &["destination"],
            )?,
            queue_depth: gauge_vec(
                "hookrelay_queue_depth",
                "Deliveries per destination and state (pending, held: behind an earlier delivery \
                 of the same record, retrying, dead).",
                &["destination", "state"],
            )?,
            queue_oldest_age: float_gauge_vec(
                "hookrelay_queue_oldest_age_seconds",
                "Age of the oldest event with a delivery still scheduled.",
                &["destination"],
            )?,
            circuit_open: gauge_vec(
                "hookrelay_destination_circuit_open",
                "1 while a destination's circuit is open (failing: one probe at a time).",
                &["destination"],
            )?,
            destination_stalled: gauge_vec(
                "hookrelay_destination_stalled",
                "1 while a destination has due deliveries and this relay has started no \
                 attempt for longer than its own bounds allow (the progress watchdog).",
                &["destination"],
            )?,
            worker_restarts: counter_vec(
                "hookrelay_destination_worker_restarts_total",
                "Delivery workers restarted by the progress watchdog after a stall \
                 (at most 3 an hour per destination).",
                &["destination"],
            )?,
            events_pruned: counter(
                "hookrelay_events_pruned_total",
                "Finished events deleted by retention.",
            )?,
            task_failures: counter_vec(
                "hookrelay_task_failures_total",
                "Background tasks (dispatcher, delivery workers, retention, reconciler) that \
                 ended before shutdown; each one also turns readiness false.",
                &["task"],
            )?,
            internal_errors: counter_vec(
                "hookrelay_internal_errors_total",
                "Errors a background task logged and went on from, by what failed \
                 (reconciler_store, reconciler_gap_unreadable).",
                &["kind"],
            )?,
            destination_paused: gauge_vec(
                "hookrelay_destination_paused",
                "1 while a destination is paused.",
                &["destination"],
            )?,
            upstream: UpstreamMetrics {
                hooks: gauge_vec(
                    "hookrelay_upstream_hooks",
                    "Upstream hooks pointing at this relay, by account, event and status \
                     (Active, Disabled, Deleted, other), as of the last reconcile.",
                    &["source", "account", "event", "status"],
                )?,
                triggered: counter_vec(
                    "hookrelay_upstream_hook_triggered_total",
                    "Calls the upstream made through this relay's hooks (their triggeredCount; \
                     resets when a hook is re-created).",
                    &["source", "account", "event"],
                )?,
                last_triggered: float_gauge_vec(
                    "hookrelay_upstream_hook_last_triggered_timestamp_seconds",
                    "When the upstream last called a hook (Unix time), per event.",
                    &["source", "account", "event"],
                )?,
                transitions: counter_vec(
                    "hookrelay_upstream_hook_transitions_total",
                    "Hook state changes seen or made: none->Active (created), Active->Disabled \
                     (disabled by the upstream), Disabled->Active (re-created), *->Deleted \
                     (pruned).",
                    &["source", "account", "event", "from", "to"],
                )?,
                requests: counter_vec(
                    "hookrelay_upstream_requests_total",
                    "Requests to the upstream's resthooks API by method and outcome (ok, \
                     unauthorized, throttled, server_error, client_error, network_error).",
                    &["source", "account", "method", "outcome"],
                )?,
                reconcile_duration: histogram_vec(
                    "hookrelay_upstream_reconcile_duration_seconds",
                    "Time to reconcile one account's hooks.",
                    LAG_BUCKETS,
                    &["source", "account"],
                )?,
                token_refreshes: counter_vec(
                    "hookrelay_upstream_token_refreshes_total",
                    "OAuth2 token refreshes (and token file re-reads after a 401) by outcome \
                     (success, failure).",
                    &["source", "account", "outcome"],
                )?,
                callbacks_missing: gauge_vec(
                    "hookrelay_upstream_callbacks_missing",
                    "Calls the upstream counted (triggeredCount) minus callbacks this relay \
                     stored for the event since it started watching the hooks; restarts at 0 \
                     when a hook is re-created (the HookGap event reports that window).",
                    &["source", "event"],
                )?,
                account_up: gauge_vec(
                    "hookrelay_upstream_account_up",
                    "1 when the account's last reconcile succeeded, 0 when it failed.",
                    &["source", "account"],
                )?,
            },
            descs: reg.descs.take(),
            registry,
        })
    }

    /// Creates the series the config makes known at 0, so that dashboards and alerts
    /// see them from the first scrape (`increase()` needs a 0 to rise from).
    pub(crate) fn init_series(
        &self,
        sources: &[&str],
        destinations: &[&str],
        unknown_source: &str,
    ) {
        for source in sources {
            for o in outcome::ALL {
                self.ingress_requests.with_label_values(&[source, o]).inc_by(0);
            }
        }
        self.ingress_requests.with_label_values(&[unknown_source, outcome::UNAUTHORIZED]).inc_by(0);
        for destination in destinations {
            for o in DELIVERY_OUTCOMES {
                self.deliveries.with_label_values(&[destination, o]).inc_by(0);
            }
            self.destination_stalled.with_label_values(&[destination]).set(0);
            self.worker_restarts.with_label_values(&[destination]).inc_by(0);
        }
    }

    /// The Prometheus text exposition of every metric.
    pub(crate) fn render(&self) -> String {
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        String::from_utf8(out).unwrap_or_default()
    }

    /// The name of every registered family.
    #[cfg(test)]
    pub(crate) fn family_names(&self) -> Vec<String> {
        self.descs.iter().map(|d| d.fq_name.clone()).collect()
    }

    #[cfg(test)]
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }
}

/// The committer reports its groups here (the store imports nothing from metrics).
impl crate::store::StoreObserver for Metrics {
    fn group(&self, size: usize, took: std::time::Duration, ok: bool) {
        CommitGroup { size, took, ok }.emit(self);
    }
    fn stored(&self, meta: &EventMeta) {
        EventStored(meta).emit(self);
    }
    fn failed(&self, _reason: &str) {
        StoreFailed.emit(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::proto::MetricType;

    /// Label names and why their values are bounded.
    const BOUNDED_LABELS: &[(&str, &str)] = &[
        ("source", "configured sources, or `unknown`"),
        ("account", "configured accounts"),
        ("destination", "configured destinations"),
        ("event", "the 21 upstream names, `hookrelay.HookGap`, or `other`"),
        ("outcome", "fixed per metric"),
        ("state", "queue states"),
        ("status", "hook statuses, or `other`"),
        ("method", "the HTTP methods the client uses"),
        ("from", "hook states"),
        ("to", "hook states"),
        ("version", "one per build"),
        ("task", "the relay's background tasks (one per destination for delivery)"),
        ("kind", "fixed per metric"),
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
        m.ingress_requests.with_label_values(&["demo", outcome::ACCEPTED]).inc();
        m.ingress_duration.observe(0.001);
        m.store_commit_duration.observe(0.001);
        m.store_commit_batch_size.observe(1.0);
        m.store_commit_failures.inc();
        m.events_stored.with_label_values(&["demo", "ActionCreated"]).inc();
        m.store_size.set(1);
        m.storage_free.set(1);
        m.storage_floor.set(1);
        m.destination_stalled.with_label_values(&["crm"]).set(0);
        m.worker_restarts.with_label_values(&["crm"]).inc();
        m.store_failed.set(1);
        m.store_reachable.set(1);
        m.fleet_relays.set(1);
        m.store_probe_failures.inc();
        m.inbox_events.set(1);
        m.ready.set(1);
        for v in [&m.events_dispatched, &m.events_deduplicated, &m.events_unrouted] {
            v.with_label_values(&["demo", "ActionCreated"]).inc();
        }
        m.dedup_keys.set(1);
        m.deliveries.with_label_values(&["crm", "success"]).inc();
        m.delivery_attempt_duration.with_label_values(&["crm"]).observe(0.01);
        m.delivery_lag.with_label_values(&["crm"]).observe(0.01);
        m.queue_depth.with_label_values(&["crm", "pending"]).set(1);
        m.queue_oldest_age.with_label_values(&["crm"]).set(1.0);
        m.circuit_open.with_label_values(&["crm"]).set(0);
        m.destination_paused.with_label_values(&["crm"]).set(0);
        m.events_pruned.inc();
        m.task_failures.with_label_values(&["dispatcher"]).inc();
        m.internal_errors.with_label_values(&["reconciler_store"]).inc();
        let u = &m.upstream;
        u.hooks.with_label_values(&["demo", "alice", "ActionCreated", "Active"]).set(1);
        u.triggered.with_label_values(&["demo", "alice", "ActionCreated"]).inc();
        u.last_triggered.with_label_values(&["demo", "alice", "ActionCreated"]).set(1.7e9);
        u.transitions
            .with_label_values(&["demo", "alice", "ActionCreated", "none", "Active"])
            .inc();
        u.requests.with_label_values(&["demo", "alice", "GET", "ok"]).inc();
        u.reconcile_duration.with_label_values(&["demo", "alice"]).observe(0.1);
        u.token_refreshes.with_label_values(&["demo", "alice", "success"]).inc();
        u.callbacks_missing.with_label_values(&["demo", "ActionCreated"]).set(0);
        u.account_up.with_label_values(&["demo", "alice"]).set(1);
    }

    #[test]
    fn verdict_labels_are_the_pre_created_outcomes() {
        use crate::store::lifecycle::Verdict;
        for v in [Verdict::Success, Verdict::Retry, Verdict::Failed, Verdict::Dead] {
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
        assert!(text
            .contains("hookrelay_ingress_requests_total{outcome=\"accepted\",source=\"demo\"} 1"));
    }
}
