//! Prometheus metrics: one registry per process, passed around (no globals), so that
//! tests can build their own. Each area's families are declared in a file of their
//! own (`ingress`, `store`, `dispatch`, `delivery`, `relay`, and `UpstreamMetrics`
//! below); what updates them is `crate::internal_events`.

mod delivery;
mod dispatch;
mod ingress;
mod relay;
mod store;
mod upstream;

pub(crate) use delivery::DeliveryMetrics;
pub(crate) use dispatch::DispatchMetrics;
pub(crate) use ingress::IngressMetrics;
pub(crate) use relay::RelayMetrics;
pub(crate) use store::StoreMetrics;
pub(crate) use upstream::UpstreamMetrics;

use std::collections::BTreeMap;

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Latency buckets (seconds) from 100 µs to 5 s: acks and fsyncs live at the low end.
pub(super) const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// End-to-end lag buckets (seconds): from 5 ms to a day, as a consumer may be down for hours.
pub(super) const LAG_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    3600.0, 14400.0, 86400.0,
];
pub(super) const BATCH_BUCKETS: &[f64] =
    &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];

/// Ingress outcomes, the values of the `outcome` label.
pub(crate) mod ingress_outcome {
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

/// The values of a label that takes a fixed set, for the reference.
fn fixed_values(family: &str, label: &str) -> Option<Vec<&'static str>> {
    match (family, label) {
        ("hookrelay_ingress_requests_total", "outcome") => Some(ingress_outcome::ALL.to_vec()),
        ("hookrelay_deliveries_total", "outcome") => Some(DELIVERY_OUTCOMES.to_vec()),
        ("hookrelay_deliveries_filtered_total", "cause") => Some(vec!["no_match", "error"]),
        ("hookrelay_trace_spans_total", "outcome") => Some(vec!["exported", "failed", "dropped"]),
        ("hookrelay_queue_depth", "state") => Some(vec!["pending", "held", "retrying", "dead"]),
        _ => None,
    }
}

/// Every metric the relay exports.
pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) ingress: IngressMetrics,
    pub(crate) store: StoreMetrics,
    pub(crate) dispatch: DispatchMetrics,
    pub(crate) delivery: DeliveryMetrics,
    pub(crate) relay: RelayMetrics,
    pub(crate) upstream: UpstreamMetrics,
    /// Name, help and label names of every metric registered.
    descs: Vec<prometheus::core::Desc>,
    /// The type of each, in the order of `descs`.
    kinds: Vec<&'static str>,
    /// This relay's queue of operational events: what the internal events that raise
    /// one reach, beside the registry (every `emit()` is given the metrics).
    pub(crate) operational: crate::operational::Raiser,
}

/// Registers metrics, remembering their descriptions (so a test can check every one,
/// including those with no sample yet).
pub(super) struct Registrar {
    registry: Registry,
    descs: std::cell::RefCell<Vec<prometheus::core::Desc>>,
    kinds: std::cell::RefCell<Vec<&'static str>>,
}

impl Registrar {
    fn opts(name: &str, help: &str) -> Opts {
        Opts::new(name, help)
    }

    fn hopts(name: &str, help: &str, buckets: &[f64]) -> HistogramOpts {
        HistogramOpts::new(name, help).buckets(buckets.to_vec())
    }

    pub(super) fn counter(&self, name: &str, help: &str) -> Result<IntCounter, MetricsError> {
        reg_one(self, IntCounter::new(name, help)?, "counter")
    }

    pub(super) fn counter_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<IntCounterVec, MetricsError> {
        reg_one(self, IntCounterVec::new(Self::opts(name, help), labels)?, "counter")
    }

    pub(super) fn gauge(&self, name: &str, help: &str) -> Result<IntGauge, MetricsError> {
        reg_one(self, IntGauge::new(name, help)?, "gauge")
    }

    pub(super) fn gauge_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<IntGaugeVec, MetricsError> {
        reg_one(self, IntGaugeVec::new(Self::opts(name, help), labels)?, "gauge")
    }

    pub(super) fn float_gauge(&self, name: &str, help: &str) -> Result<Gauge, MetricsError> {
        reg_one(self, Gauge::new(name, help)?, "gauge")
    }

    pub(super) fn float_gauge_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<GaugeVec, MetricsError> {
        reg_one(self, GaugeVec::new(Self::opts(name, help), labels)?, "gauge")
    }

    pub(super) fn histogram(
        &self,
        name: &str,
        help: &str,
        buckets: &[f64],
    ) -> Result<Histogram, MetricsError> {
        reg_one(self, Histogram::with_opts(Self::hopts(name, help, buckets))?, "histogram")
    }

    pub(super) fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        buckets: &[f64],
        labels: &[&str],
    ) -> Result<HistogramVec, MetricsError> {
        reg_one(self, HistogramVec::new(Self::hopts(name, help, buckets), labels)?, "histogram")
    }
}

/// Registers `metric` and hands it back (metrics are cheap handles onto shared state).
fn reg_one<M: prometheus::core::Collector + Clone + 'static>(
    reg: &Registrar,
    metric: M,
    kind: &'static str,
) -> Result<M, MetricsError> {
    for desc in metric.desc() {
        reg.descs.borrow_mut().push(desc.clone());
        reg.kinds.borrow_mut().push(kind);
    }
    reg.registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

/// Why the metrics could not be set up (a programming error: duplicate names).
pub(crate) type MetricsError = prometheus::Error;

impl Metrics {
    pub(crate) fn new() -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let reg = Registrar {
            registry: registry.clone(),
            descs: Default::default(),
            kinds: Default::default(),
        };
        let build_info = reg.gauge_vec(
            "hookrelay_build_info",
            "Build of the running relay; always 1.",
            &["version"],
        )?;
        build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);

        Ok(Self {
            ingress: IngressMetrics::register(&reg)?,
            store: StoreMetrics::register(&reg)?,
            dispatch: DispatchMetrics::register(&reg)?,
            delivery: DeliveryMetrics::register(&reg)?,
            relay: RelayMetrics::register(&reg)?,
            upstream: UpstreamMetrics::register(&reg)?,
            descs: reg.descs.take(),
            kinds: reg.kinds.take(),
            registry,
            operational: crate::operational::Raiser::default(),
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
            for o in ingress_outcome::ALL {
                self.ingress.ingress_requests.with_label_values(&[source, o]).inc_by(0);
            }
        }
        self.ingress
            .ingress_requests
            .with_label_values(&[unknown_source, ingress_outcome::UNAUTHORIZED])
            .inc_by(0);
        for destination in destinations {
            for o in DELIVERY_OUTCOMES {
                self.delivery.deliveries.with_label_values(&[destination, o]).inc_by(0);
            }
            self.delivery.destination_stalled.with_label_values(&[destination]).set(0);
            self.delivery.worker_restarts.with_label_values(&[destination]).inc_by(0);
            self.delivery.transforms_failed.with_label_values(&[destination]).inc_by(0);
            for program in ["filter", "transform"] {
                let disabled = &self.delivery.programs_disabled;
                disabled.with_label_values(&[destination, program]).set(0);
            }
            self.dispatch.deliveries_superseded.with_label_values(&[destination]).inc_by(0);
            for cause in ["no_match", "error"] {
                let filtered = &self.dispatch.deliveries_filtered;
                filtered.with_label_values(&[destination, cause]).inc_by(0);
            }
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

    /// The samples of the counter or gauge `family`: each one's labels and value.
    pub(crate) fn samples(&self, family: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        let mut out = Vec::new();
        for f in self.registry.gather().iter().filter(|f| f.name() == family) {
            for m in f.get_metric() {
                let labels = m
                    .get_label()
                    .iter()
                    .map(|l| (l.name().to_owned(), l.value().to_owned()))
                    .collect();
                let value = match f.get_field_type() {
                    prometheus::proto::MetricType::COUNTER => m.get_counter().get_value(),
                    prometheus::proto::MetricType::GAUGE => m.get_gauge().get_value(),
                    _ => continue,
                };
                out.push((labels, value));
            }
        }
        out
    }

    /// The samples of `family` summed by the value of the label `by`, then by the
    /// value of `split` (`""` where a sample has no such label).
    pub(crate) fn sums(
        &self,
        family: &str,
        by: &str,
        split: &str,
    ) -> BTreeMap<String, BTreeMap<String, u64>> {
        let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for (labels, value) in self.samples(family) {
            let Some(key) = labels.get(by) else { continue };
            let inner = labels.get(split).cloned().unwrap_or_default();
            *out.entry(key.clone()).or_default().entry(inner).or_default() += value.max(0.0) as u64;
        }
        out
    }

    /// The metrics reference (`docs/metrics.md`, `hookrelay reference metrics`): every
    /// family the registry holds, with its type, labels (and their values where they
    /// are a fixed set) and help, generated here so that it cannot drift.
    pub(crate) fn reference(&self) -> String {
        let mut rows: Vec<(String, String)> = self
            .descs
            .iter()
            .zip(&self.kinds)
            .map(|(d, kind)| {
                let labels: Vec<String> = d
                    .variable_labels
                    .iter()
                    .map(|l| match fixed_values(&d.fq_name, l) {
                        Some(values) => format!("`{l}` ({})", values.join(", ")),
                        None => format!("`{l}`"),
                    })
                    .collect();
                let labels = if labels.is_empty() { "—".to_owned() } else { labels.join(", ") };
                let help = d.help.replace('|', "\\|");
                (d.fq_name.clone(), format!("| `{}` | {kind} | {labels} | {help} |\n", d.fq_name))
            })
            .collect();
        rows.sort();
        let mut out = String::from(
            "# Metrics reference\n\n\
             Every metric family hookrelay serves at `GET /metrics` on the admin listener, \
             generated from its registry (`hookrelay reference metrics > docs/metrics.md`; a \
             test fails when this file is stale). Series named in the configuration \
             (sources, destinations) exist at 0 from the start. Alerts: \
             `deploy/prometheus/alerts.yml`; what to do about each: `docs/runbook.md`.\n\n\
             | metric | type | labels | what it says |\n|---|---|---|---|\n",
        );
        for (_, row) in rows {
            out.push_str(&row);
        }
        out
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

#[cfg(test)]
mod tests;
