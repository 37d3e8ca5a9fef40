//! Delivery: attempts and their verdicts, lag, the queues, circuits, stalls, pauses.

use prometheus::{GaugeVec, HistogramVec, IntCounterVec, IntGaugeVec};

use super::{MetricsError, Registrar};
#[allow(unused_imports)]
use super::{BATCH_BUCKETS, LAG_BUCKETS, LATENCY_BUCKETS};

/// Delivery: attempts and their verdicts, lag, the queues, circuits, stalls, pauses.
pub(crate) struct DeliveryMetrics {
    pub(crate) deliveries: IntCounterVec,
    pub(crate) delivery_attempt_duration: HistogramVec,
    pub(crate) delivery_lag: HistogramVec,
    pub(crate) queue_depth: IntGaugeVec,
    pub(crate) queue_oldest_age: GaugeVec,
    pub(crate) circuit_open: IntGaugeVec,
    pub(crate) destination_stalled: IntGaugeVec,
    pub(crate) worker_restarts: IntCounterVec,
    pub(crate) destination_paused: IntGaugeVec,
    pub(crate) transforms_failed: IntCounterVec,
    pub(crate) shape_runs_stopped: IntCounterVec,
    pub(crate) programs_disabled: IntGaugeVec,
}

impl DeliveryMetrics {
    /// Forgets that `destination`'s programs were disabled: a reload gave it new ones
    /// (or took it away), which start with no strikes.
    pub(crate) fn forget_programs(&self, destination: &str) {
        for program in ["filter", "transform"] {
            let _ = self.programs_disabled.remove_label_values(&[destination, program]);
        }
    }

    pub(super) fn register(r: &Registrar) -> Result<Self, MetricsError> {
        Ok(Self {
            shape_runs_stopped: r.counter_vec(
                "hookrelay_shape_runs_stopped_total",
                "jq runs stopped by the relay, by destination, program (filter, transform, \
                 preview) and cause: overran (ran past its time limit, its process killed) or \
                 crashed (its process died: a recursion without end, memory past the limit). \
                 Only that run's event pays; see docs/runbook.md.",
                &["destination", "program", "cause"],
            )?,
            programs_disabled: r.gauge_vec(
                "hookrelay_shape_program_disabled",
                "1 while a destination's filter or transform is disabled: stopped too many runs \
                 in a row or within an hour, it is no longer run (every event is filtered out, or its delivery \
                 dead) until the config is fixed and the relay restarted.",
                &["destination", "program"],
            )?,
            transforms_failed: r.counter_vec(
                "hookrelay_transforms_failed_total",
                "Deliveries made dead because the destination's transform failed or gave no \
                 single JSON value (fix the transform, then replay the dead letters).",
                &["destination"],
            )?,
            deliveries: r.counter_vec(
                "hookrelay_deliveries_total",
                "Delivery attempts by destination and outcome (success, retry, failed: \
                 permanent error, dead: retries exhausted).",
                &["destination", "outcome"],
            )?,
            delivery_attempt_duration: r.histogram_vec(
                "hookrelay_delivery_attempt_duration_seconds",
                "Time of one delivery attempt, request to answer.",
                LATENCY_BUCKETS,
                &["destination"],
            )?,
            delivery_lag: r.histogram_vec(
                "hookrelay_delivery_lag_seconds",
                "Time from a callback's arrival to its successful delivery.",
                LAG_BUCKETS,
                &["destination"],
            )?,
            queue_depth: r.gauge_vec(
                "hookrelay_queue_depth",
                "Deliveries per destination and state (pending, held: behind an earlier delivery \
                 of the same resource, retrying, dead). Absent for a few seconds after a restart \
                 with a large backlog, while the embedded store counts it.",
                &["destination", "state"],
            )?,
            queue_oldest_age: r.float_gauge_vec(
                "hookrelay_queue_oldest_age_seconds",
                "Age of the oldest event with a delivery still scheduled. Absent while the \
                 queue is counted after a restart, as hookrelay_queue_depth.",
                &["destination"],
            )?,
            circuit_open: r.gauge_vec(
                "hookrelay_destination_circuit_open",
                "1 while a destination's circuit is open (failing: one probe at a time).",
                &["destination"],
            )?,
            destination_stalled: r.gauge_vec(
                "hookrelay_destination_stalled",
                "1 while a destination has due deliveries and this relay has started no \
                 attempt for longer than its own bounds allow (the progress watchdog).",
                &["destination"],
            )?,
            worker_restarts: r.counter_vec(
                "hookrelay_destination_worker_restarts_total",
                "Delivery workers restarted by the progress watchdog after a stall \
                 (at most 3 an hour per destination).",
                &["destination"],
            )?,
            destination_paused: r.gauge_vec(
                "hookrelay_destination_paused",
                "1 while a destination is paused.",
                &["destination"],
            )?,
        })
    }
}
