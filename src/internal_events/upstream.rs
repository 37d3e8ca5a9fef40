//! The hook lifecycle: requests to the upstream, token refreshes, hooks changing
//! state, reconcile passes and their failures.

use std::time::Duration;

use super::taxonomy::{self, ErrorType, Stage, ERRORS};
use super::InternalEvent;
use crate::account::AccountId;
use crate::event_names;
use crate::metrics::Metrics;

/// One request to the upstream's API, with its outcome label.
pub(crate) struct UpstreamRequest<'a> {
    pub(crate) account: &'a AccountId,
    pub(crate) method: &'a str,
    pub(crate) outcome: &'a str,
}

impl InternalEvent for UpstreamRequest<'_> {
    const FAMILIES: &'static [&'static str] = &["hookrelay_upstream_requests_total"];
    fn emit(self, m: &Metrics) {
        let a = self.account;
        let labels = [a.source.as_str(), a.account.as_str(), self.method, self.outcome];
        m.upstream.requests.with_label_values(&labels).inc();
    }
}

/// A new upstream token was sought after a 401 or an expiry (an OAuth2 refresh, or
/// the token file read again): got, or `failed` with why. A failure logs at WARN: the
/// account's requests fail until a token works, and its reconcile says so.
pub(crate) struct TokenRefreshed<'a> {
    pub(crate) account: &'a AccountId,
    pub(crate) failed: Option<&'a dyn std::fmt::Display>,
}

impl InternalEvent for TokenRefreshed<'_> {
    const FAMILIES: &'static [&'static str] = &["hookrelay_upstream_token_refreshes_total"];
    fn emit(self, m: &Metrics) {
        let a = self.account;
        let outcome = if self.failed.is_some() { "failure" } else { "success" };
        let labels = [a.source.as_str(), a.account.as_str(), outcome];
        m.upstream.token_refreshes.with_label_values(&labels).inc();
        match self.failed {
            None => tracing::info!(source = %a.source, account = %a.account,
                "upstream access token refreshed"),
            Some(error) => tracing::warn!(source = %a.source, account = %a.account, %error,
                "upstream token refresh failed; the account's requests fail until a token works \
                 (put a fresh token in the config or its file)"),
        }
    }
}

/// One of the relay's hooks moved from one state to another (`none`: absent).
pub(crate) struct HookTransition<'a> {
    pub(crate) account: &'a AccountId,
    pub(crate) event: &'a str,
    pub(crate) from: &'a str,
    pub(crate) to: &'a str,
}

impl InternalEvent for HookTransition<'_> {
    const FAMILIES: &'static [&'static str] = &["hookrelay_upstream_hook_transitions_total"];
    fn emit(self, m: &Metrics) {
        let a = self.account;
        let event = event_names::metric_label(self.event);
        let labels = [a.source.as_str(), a.account.as_str(), event, self.from, self.to];
        m.upstream.transitions.with_label_values(&labels).inc();
    }
}

/// A Disabled hook was deleted and created again: a move from Disabled to Active,
/// and a window of callbacks the upstream may not have sent (its HookGap follows).
pub(crate) struct HookRecreated<'a> {
    pub(crate) account: &'a AccountId,
    pub(crate) event: &'a str,
    pub(crate) old: &'a [String],
    pub(crate) new: &'a str,
    /// When the gap began, if the hooks said.
    pub(crate) window_start: Option<&'a str>,
}

impl InternalEvent for HookRecreated<'_> {
    const FAMILIES: &'static [&'static str] = &["hookrelay_upstream_hook_transitions_total"];
    fn emit(self, m: &Metrics) {
        let Self { account, event, old, new, window_start } = self;
        HookTransition { account, event, from: "Disabled", to: "Active" }.emit(m);
        tracing::warn!(source = %account.source, account = %account.account, event, ?old, new,
            window_start = window_start.unwrap_or("unknown"),
            "disabled hook re-created; raising HookGap");
    }
}

/// One account's reconcile pass ended: `errors` empty when it succeeded.
pub(crate) struct AccountReconciled<'a> {
    pub(crate) account: &'a AccountId,
    pub(crate) took: Duration,
    pub(crate) hooks: usize,
    pub(crate) changes: usize,
    pub(crate) errors: &'a [String],
}

impl InternalEvent for AccountReconciled<'_> {
    const FAMILIES: &'static [&'static str] =
        &["hookrelay_upstream_reconcile_duration_seconds", "hookrelay_upstream_account_up"];
    fn emit(self, m: &Metrics) {
        let Self { account, took, hooks, changes, errors } = self;
        let labels = [account.source.as_str(), account.account.as_str()];
        m.upstream.reconcile_duration.with_label_values(&labels).observe(took.as_secs_f64());
        let ok = errors.is_empty();
        m.upstream.account_up.with_label_values(&labels).set(i64::from(ok));
        if ok {
            tracing::debug!(source = %account.source, account = %account.account, hooks, changes,
                "account reconciled");
        } else {
            tracing::warn!(source = %account.source, account = %account.account, errors = %errors.join("; "),
                "account reconcile failed");
        }
    }
}

/// The reconciler could not use the store for something it needed; `what` says what
/// and what follows from it.
pub(crate) struct ReconcilerStoreFailed<'a> {
    pub(crate) what: &'static str,
    pub(crate) account: Option<&'a AccountId>,
    pub(crate) error: &'a dyn std::fmt::Display,
}

impl InternalEvent for ReconcilerStoreFailed<'_> {
    const FAMILIES: &'static [&'static str] = &[ERRORS];
    fn emit(self, m: &Metrics) {
        taxonomy::count(m, Stage::Upstream, ErrorType::Storage);
        let (source, account) =
            self.account.map_or(("", ""), |a| (a.source.as_str(), a.account.as_str()));
        tracing::error!(error = %self.error, source, account, "{}", self.what);
    }
}

/// A stored hook gap cannot be decoded: it is not reported.
pub(crate) struct StoredGapUnreadable<'a> {
    pub(crate) key: &'a str,
    pub(crate) error: &'a dyn std::fmt::Display,
}

impl InternalEvent for StoredGapUnreadable<'_> {
    const FAMILIES: &'static [&'static str] = &[ERRORS];
    fn emit(self, m: &Metrics) {
        taxonomy::count(m, Stage::Upstream, ErrorType::Corrupt);
        tracing::error!(key = %self.key, error = %self.error,
            "a stored hook gap is unreadable and is not reported; remove it with the store's tools");
    }
}
