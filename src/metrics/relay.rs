//! The relay as a process: readiness, the fleet, background tasks and their errors.

use prometheus::{Gauge, IntCounterVec, IntGauge};

use super::{MetricsError, Registrar};
#[allow(unused_imports)]
use super::{BATCH_BUCKETS, LAG_BUCKETS, LATENCY_BUCKETS};

/// The relay as a process: readiness, the fleet, background tasks and their errors.
pub(crate) struct RelayMetrics {
    pub(crate) ready: IntGauge,
    pub(crate) fleet_relays: IntGauge,
    pub(crate) task_failures: IntCounterVec,
    pub(crate) errors: IntCounterVec,
    pub(crate) console_sign_ins: IntCounterVec,
    pub(crate) admin_token_refusals: IntCounterVec,
    pub(crate) pull_token_refusals: IntCounterVec,
    pub(crate) trace_spans: IntCounterVec,
    pub(crate) clock_skew: Gauge,
    pub(crate) config_reloads: IntCounterVec,
    pub(crate) config_fingerprint: Gauge,
}

impl RelayMetrics {
    pub(super) fn register(r: &Registrar) -> Result<Self, MetricsError> {
        Ok(Self {
            ready: r
                .gauge("hookrelay_ready", "1 when the relay is ready to serve, 0 otherwise.")?,
            fleet_relays: r.gauge(
                "hookrelay_fleet_relays",
                "Relays sharing the store, as this relay last read it (PostgreSQL); each \
                 destination's max_concurrency and rate_limit are divided among them. 1 for \
                 sled.",
            )?,
            task_failures: r.counter_vec(
                "hookrelay_task_failures_total",
                "Background tasks (dispatcher, delivery workers, retention, reconciler) that \
                 ended before shutdown; each one also turns readiness false.",
                &["task"],
            )?,
            errors: r.counter_vec(
                "hookrelay_errors_total",
                "The relay's own errors, by stage (ingress, store, dispatch, shape, delivery, \
                 upstream, telemetry, audit, retention, admin, relay) and error_type (storage, unreachable, full, corrupt, \
                 runaway, invalid, stalled, imbalance, clock_skew, task_died, dropped): every \
                 error the relay logs is counted here (a caller's mistakes, such as a wrong \
                 token, have their own families).",
                &["stage", "error_type"],
            )?,
            admin_token_refusals: r.counter_vec(
                "hookrelay_admin_token_refusals_total",
                "Bearer tokens refused on /admin, by result: wrong_token, or throttled (refused \
                 unread: its client gave 5 wrong tokens within a minute).",
                &["result"],
            )?,
            pull_token_refusals: r.counter_vec(
                "hookrelay_pull_token_refusals_total",
                "Requests to the pull API (/pull/...) refused before they were read, by \
                 result: wrong_token, unknown_destination (no pull destination of that \
                 name), or throttled (refused unread: its client gave too many wrong tokens \
                 within a minute, admin tokens included).",
                &["result"],
            )?,
            console_sign_ins: r.counter_vec(
                "hookrelay_console_sign_ins_total",
                "Sign-ins to the console, by result: ok, wrong_token, throttled (refused \
                 unread: 5 wrong admin tokens from its client within a minute).",
                &["result"],
            )?,
            clock_skew: r.float_gauge(
                "hookrelay_clock_skew_seconds",
                "This machine's wall clock minus the database's, at the last fleet heartbeat \
                 (PostgreSQL; 0 on an embedded store). Beyond 2 s either way the relay is not \
                 ready until time synchronisation brings it back.",
            )?,
            config_reloads: r.counter_vec(
                "hookrelay_config_reloads_total",
                "Reloads of the configuration (SIGHUP, systemctl reload, POST /admin/reload), \
                 by result: reloaded, unchanged (the file says what runs), refused (a key only \
                 a restart changes), invalid (the file does not load or validate). Refused \
                 and invalid ones change nothing.",
                &["result"],
            )?,
            config_fingerprint: r.float_gauge(
                "hookrelay_config_fingerprint",
                "A fingerprint of the configuration in force (48 bits of the SHA-256 of its \
                 printed form, secrets masked): relays running the same configuration show \
                 the same number; it moves when a reload takes.",
            )?,
            trace_spans: r.counter_vec(
                "hookrelay_trace_spans_total",
                "Spans of callbacks' traces ([telemetry] otlp_endpoint), by outcome: exported \
                 (the receiver took them), failed (the export failed three times), dropped \
                 (the export queue was full).",
                &["outcome"],
            )?,
        })
    }
}
