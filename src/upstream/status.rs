//! What the admin API shows of the upstream accounts (`GET /admin/hooks`).

use serde::{Deserialize, Serialize};

use super::model::Hook;
use crate::timefmt::format_admin;

/// A hook as the admin API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct HookView {
    pub(crate) id: String,
    pub(crate) event: String,
    pub(crate) status: String,
    pub(crate) triggered_count: u64,
    pub(crate) last_triggered: Option<String>,
    pub(crate) target: String,
}

/// A change the reconciler made.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct Change {
    /// `created`, `recreated` or `pruned`.
    pub(crate) action: String,
    pub(crate) event: String,
    pub(crate) hook_id: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) replaced: Vec<String>,
}

/// One account as of its last reconcile, by whichever relay made it: each relay
/// stores the status of its passes (`upstream` key `status/{source}/{account}`), so
/// that any relay of a fleet shows the same.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// When the last reconcile ended (µs since the epoch), to pick the newest.
    #[serde(default)]
    pub(crate) reconciled_at_us: Option<u64>,
    /// Seconds since then, when shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) age_seconds: Option<u64>,
    /// Older than two reconcile intervals: the relays stopped reconciling (no leader,
    /// or every pass fails before it ends), so the hooks shown may have changed.
    #[serde(default)]
    pub(crate) stale: bool,
    /// The last gap reported per event (a Disabled hook re-created), read from the
    /// store when shown: any relay may have reported it.
    #[serde(default)]
    pub(crate) last_gaps: Vec<GapView>,
}

/// The last window in which an event's callbacks may be missing: a Disabled hook,
/// from its last trigger until the hook that replaced it; its `hookrelay.HookGap`
/// event says the same to consumers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct GapView {
    pub(crate) event: String,
    /// From the Disabled hooks' last trigger (or when the relay noticed, if unknown).
    pub(crate) window_start: String,
    /// When the new hook was created.
    pub(crate) window_end: String,
    /// Calls the upstream counted on the Disabled hooks.
    pub(crate) triggered_count: u64,
    pub(crate) disabled_hook_ids: Vec<String>,
    pub(crate) new_hook_id: String,
    /// The `hookrelay.HookGap` event that reported it.
    pub(crate) hook_gap_event: String,
}

impl HookView {
    /// `h` as shown, its target URL already masked (`target`).
    pub(crate) fn of(h: &Hook, target: String) -> Self {
        Self {
            id: h.id.clone(),
            event: h.event_name.clone(),
            status: h.status.clone(),
            triggered_count: h.triggered_count,
            last_triggered: h.last_triggered.map(format_admin),
            target,
        }
    }
}
