//! Dispatch: what became of each event, the dedup keys, which relay dispatches.

use prometheus::{IntCounter, IntCounterVec, IntGauge};

use super::{MetricsError, Registrar};
#[allow(unused_imports)]
use super::{BATCH_BUCKETS, LAG_BUCKETS, LATENCY_BUCKETS};

/// Dispatch: what became of each event, the dedup keys, which relay dispatches.
pub(crate) struct DispatchMetrics {
    pub(crate) events_dispatched: IntCounterVec,
    pub(crate) events_deduplicated: IntCounterVec,
    pub(crate) events_unrouted: IntCounterVec,
    pub(crate) deliveries_filtered: IntCounterVec,
    pub(crate) deliveries_superseded: IntCounterVec,
    pub(crate) dedup_keys: IntGauge,
    pub(crate) dedup_keys_purged: IntCounter,
    pub(crate) dispatch_leader: IntGauge,
}

impl DispatchMetrics {
    pub(super) fn register(r: &Registrar) -> Result<Self, MetricsError> {
        Ok(Self {
            events_dispatched: r.counter_vec(
                "hookrelay_events_dispatched_total",
                "Events routed to at least one destination.",
                &["source", "event"],
            )?,
            events_deduplicated: r.counter_vec(
                "hookrelay_events_deduplicated_total",
                "Events recognised as another copy of an occurrence already dispatched.",
                &["source", "event"],
            )?,
            events_unrouted: r.counter_vec(
                "hookrelay_events_unrouted_total",
                "Events no destination wants.",
                &["source", "event"],
            )?,
            deliveries_filtered: r.counter_vec(
                "hookrelay_deliveries_filtered_total",
                "Deliveries not made because the destination's filter did not match: \
                 cause=\"no_match\" (false or no output) or \"error\" (the filter failed or \
                 gave something other than a boolean: fix the filter, then replay).",
                &["destination", "cause"],
            )?,
            deliveries_superseded: r.counter_vec(
                "hookrelay_deliveries_superseded_total",
                "Deliveries not sent because a newer update of the same resource came first \
                 (ordering = \"latest\").",
                &["destination"],
            )?,
            dedup_keys: r.gauge(
                "hookrelay_dedup_keys",
                "Keys in the deduplication index. On the embedded store it includes expired keys not yet purged: they go with their bucket, up to a thirty-second of `dedup_window` (a second at least) after they expire.",
            )?,
            dedup_keys_purged: r.counter(
                "hookrelay_dedup_keys_purged_total",
                "Expired dedup keys removed by the purge (one relay of a fleet purges for all), \
                 counted step by step as a pass goes.",
            )?,
            dispatch_leader: r.gauge(
                "hookrelay_dispatch_leader",
                "1 while this relay dispatches the inbox (one relay of a fleet at a time, on a \
                 lease that moves within seconds when it dies; always 1 for sled).",
            )?,
        })
    }
}
