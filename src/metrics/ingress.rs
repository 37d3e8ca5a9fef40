//! Callbacks at the ingress.

use prometheus::{Histogram, IntCounterVec};

use super::{MetricsError, Registrar};
#[allow(unused_imports)]
use super::{BATCH_BUCKETS, LAG_BUCKETS, LATENCY_BUCKETS};

/// Callbacks at the ingress.
pub(crate) struct IngressMetrics {
    pub(crate) ingress_requests: IntCounterVec,
    pub(crate) ingress_duration: Histogram,
}

impl IngressMetrics {
    pub(super) fn register(r: &Registrar) -> Result<Self, MetricsError> {
        Ok(Self {
            ingress_requests: r.counter_vec(
                "hookrelay_ingress_requests_total",
                "Callbacks received, by source (`unknown` if not configured) and outcome \
                 (accepted, rejected, unauthorized, store_failed, incomplete, no_space).",
                &["source", "outcome"],
            )?,
            ingress_duration: r.histogram(
                "hookrelay_ingress_request_duration_seconds",
                "Time from a callback's arrival to its answer.",
                LATENCY_BUCKETS,
            )?,
        })
    }
}
