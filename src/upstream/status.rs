//! What the admin API shows of the upstream accounts (`GET /admin/hooks`).

use serde::Serialize;

use super::model::Hook;
use crate::timefmt::format_utc;

/// A hook as the admin API shows it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HookView {
    pub(crate) id: String,
    pub(crate) event: String,
    pub(crate) status: String,
    pub(crate) triggered_count: u64,
    pub(crate) last_triggered: Option<String>,
    pub(crate) target: String,
}

/// A change the reconciler made.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Change {
    /// `created`, `recreated` or `pruned`.
    pub(crate) action: &'static str,
    pub(crate) event: String,
    pub(crate) hook_id: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) replaced: Vec<String>,
}

/// One account as of its last reconcile.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AccountStatus {
    pub(crate) source: String,
    pub(crate) account: String,
    pub(crate) ok: bool,
    pub(crate) errors: Vec<String>,
    pub(crate) last_reconcile: Option<String>,
    pub(crate) events: Vec<String>,
    pub(crate) hooks: Vec<HookView>,
    /// Hooks of this account pointing elsewhere (never touched).
    pub(crate) foreign_hooks: usize,
    /// Changes made by the last reconcile.
    pub(crate) changes: Vec<Change>,
}

impl HookView {
    /// `h` as shown, its target URL already masked (`target`).
    pub(crate) fn of(h: &Hook, target: String) -> Self {
        Self {
            id: h.id.clone(),
            event: h.event_name.clone(),
            status: h.status.clone(),
            triggered_count: h.triggered_count,
            last_triggered: h.last_triggered.map(format_utc),
            target,
        }
    }
}
