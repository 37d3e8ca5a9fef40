//! The hook lifecycle (`upstream/`): hooks, their calls and transitions, requests,
//! reconcile passes, token refreshes, callbacks missing.

use prometheus::{GaugeVec, HistogramVec, IntCounterVec, IntGaugeVec};

use super::{MetricsError, Registrar, LAG_BUCKETS};

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

impl UpstreamMetrics {
    pub(super) fn register(r: &Registrar) -> Result<Self, MetricsError> {
        Ok(Self {
            hooks: r.gauge_vec(
                "hookrelay_upstream_hooks",
                "Upstream hooks pointing at this relay, by account, event and status \
                 (Active, Disabled, Deleted, other), as of the last reconcile.",
                &["source", "account", "event", "status"],
            )?,
            triggered: r.counter_vec(
                "hookrelay_upstream_hook_triggered_total",
                "Calls the upstream made through this relay's hooks (their triggeredCount; \
                 resets when a hook is re-created).",
                &["source", "account", "event"],
            )?,
            last_triggered: r.float_gauge_vec(
                "hookrelay_upstream_hook_last_triggered_timestamp_seconds",
                "When the upstream last called a hook (Unix time), per event.",
                &["source", "account", "event"],
            )?,
            transitions: r.counter_vec(
                "hookrelay_upstream_hook_transitions_total",
                "Hook state changes seen or made: none->Active (created), Active->Disabled \
                 (disabled by the upstream), Disabled->Active (re-created), *->Deleted \
                 (pruned).",
                &["source", "account", "event", "from", "to"],
            )?,
            requests: r.counter_vec(
                "hookrelay_upstream_requests_total",
                "Requests to the upstream's resthooks API by method and outcome (ok, \
                 unauthorized, throttled, server_error, client_error, network_error).",
                &["source", "account", "method", "outcome"],
            )?,
            reconcile_duration: r.histogram_vec(
                "hookrelay_upstream_reconcile_duration_seconds",
                "Time to reconcile one account's hooks.",
                LAG_BUCKETS,
                &["source", "account"],
            )?,
            token_refreshes: r.counter_vec(
                "hookrelay_upstream_token_refreshes_total",
                "OAuth2 token refreshes (and token file re-reads after a 401) by outcome \
                 (success, failure).",
                &["source", "account", "outcome"],
            )?,
            callbacks_missing: r.gauge_vec(
                "hookrelay_upstream_callbacks_missing",
                "Calls the upstream counted (triggeredCount) minus callbacks this relay \
                 stored for the event since it started watching the hooks; restarts at 0 \
                 when a hook is re-created (the HookGap event reports that window).",
                &["source", "event"],
            )?,
            account_up: r.gauge_vec(
                "hookrelay_upstream_account_up",
                "1 when the account's last reconcile succeeded, 0 when it failed.",
                &["source", "account"],
            )?,
        })
    }
}
