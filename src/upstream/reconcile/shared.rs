//! The accounts' status across relays: a relay's own, and the newest any relay
//! sharing the store saved (`status/{source}/{account}` in the shared state), so that
//! every relay's `GET /admin/hooks` shows the reconciling relay's.

use super::*;
use crate::internal_events::taxonomy::{degraded, ErrorType, Stage};

/// The `upstream` key of an account's last status.
pub(super) fn status_key(source: &str, account: &str) -> String {
    format!("status/{source}/{account}")
}

impl Reconciler {
    /// Every account's status as of its last reconcile.
    pub(crate) fn statuses(&self) -> Vec<AccountStatus> {
        let known = lock(&self.status);
        self.accounts
            .iter()
            .map(|a| {
                known.get(a.id()).cloned().unwrap_or_else(|| AccountStatus {
                    source: a.id().source.clone(),
                    account: a.id().account.clone(),
                    ok: false,
                    errors: vec!["not reconciled yet".into()],
                    last_reconcile: None,
                    events: a.events.clone(),
                    hooks: Vec::new(),
                    foreign_hooks: 0,
                    changes: Vec::new(),
                    reconciled_at_us: None,
                    age_seconds: None,
                    stale: false,
                    last_gaps: Vec::new(),
                })
            })
            .collect()
    }

    /// Every account's status as of its last reconcile by any relay sharing the store
    /// (the newest of this relay's and the stored one), with its age; one older than
    /// two reconcile intervals is stale.
    pub(crate) async fn shared_statuses(&self) -> Vec<AccountStatus> {
        let interval = self.interval;
        let now_us = crate::clock::now_us();
        let mut out = Vec::new();
        for mut status in self.statuses() {
            let key = status_key(&status.source, &status.account);
            match self.store.upstream_get(&key).await {
                Ok(Some(bytes)) => match serde_json::from_slice::<AccountStatus>(&bytes) {
                    Ok(stored) if stored.reconciled_at_us > status.reconciled_at_us => {
                        status = stored
                    }
                    Ok(_) => {}
                    Err(e) => degraded(
                        &self.gauges.metrics,
                        Stage::Upstream,
                        ErrorType::Corrupt,
                        &format!(
                            "the stored account status {key} is unreadable; showing this relay's"
                        ),
                        &e,
                    ),
                },
                Ok(None) => {}
                Err(e) => degraded(
                    &self.gauges.metrics,
                    Stage::Upstream,
                    ErrorType::Storage,
                    &format!("cannot read the stored account status {key}; showing this relay's"),
                    &e,
                ),
            }
            status.last_gaps = self.last_gaps(&status.source, &status.account).await;
            if let Some(at) = status.reconciled_at_us {
                let age = std::time::Duration::from_micros(now_us.saturating_sub(at));
                status.age_seconds = Some(age.as_secs());
                status.stale = age > interval * 2;
            }
            out.push(status);
        }
        out
    }

    /// The last gap reported per event of an account, by any relay sharing the store.
    pub(super) async fn last_gaps(&self, source: &str, account: &str) -> Vec<GapView> {
        let prefix = gap::last_prefix(source, account);
        match self.store.upstream_scan(&prefix).await {
            Ok(entries) => entries
                .into_iter()
                .filter_map(|(key, value)| match serde_json::from_slice(&value) {
                    Ok(view) => Some(view),
                    Err(e) => {
                        StoredGapUnreadable { key: &key, error: &e }.emit(&self.gauges.metrics);
                        None
                    }
                })
                .collect(),
            Err(e) => {
                degraded(
                    &self.gauges.metrics,
                    Stage::Upstream,
                    ErrorType::Storage,
                    &format!(
                        "cannot read the last hook gaps of {source}/{account}; shown without them"
                    ),
                    &e,
                );
                Vec::new()
            }
        }
    }
}
