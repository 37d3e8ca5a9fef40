//! The configuration in force: the one the relay started with, and each reload.

use super::InternalEvent;
use crate::config::reload::Changes;
use crate::metrics::Metrics;

/// The configuration the relay starts with: its fingerprint shown, and every result of
/// a reload counted from 0 (so that `increase()` sees the first).
pub(crate) struct ConfigInForce {
    pub(crate) fingerprint: u64,
}

/// Every `result` of `hookrelay_config_reloads_total`.
const RESULTS: [&str; 4] = ["reloaded", "unchanged", "refused", "invalid"];

impl InternalEvent for ConfigInForce {
    const FAMILIES: &'static [&'static str] =
        &["hookrelay_config_fingerprint", "hookrelay_config_reloads_total"];
    fn emit(self, m: &Metrics) {
        m.relay.config_fingerprint.set(self.fingerprint as f64);
        for result in RESULTS {
            m.relay.config_reloads.with_label_values(&[result]).inc_by(0);
        }
    }
}

/// A reload asked by `by` (`SIGHUP`, or an admin token's name), and what came of it.
pub(crate) struct ConfigReloaded<'a> {
    pub(crate) by: &'a str,
    pub(crate) result: Reload<'a>,
}

/// What came of a reload.
pub(crate) enum Reload<'a> {
    /// In force: what changed, and the new fingerprint.
    Reloaded { changes: &'a Changes, fingerprint: u64 },
    /// The file says what runs already.
    Unchanged,
    /// A key only a restart changes: nothing changed.
    Refused(&'a str),
    /// The file does not load or validate: nothing changed.
    Invalid(&'a str),
}

impl Reload<'_> {
    /// The `result` label.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Reload::Reloaded { .. } => "reloaded",
            Reload::Unchanged => "unchanged",
            Reload::Refused(_) => "refused",
            Reload::Invalid(_) => "invalid",
        }
    }
}

impl InternalEvent for ConfigReloaded<'_> {
    const FAMILIES: &'static [&'static str] =
        &["hookrelay_config_reloads_total", "hookrelay_config_fingerprint"];
    fn emit(self, m: &Metrics) {
        m.relay.config_reloads.with_label_values(&[self.result.label()]).inc();
        let by = self.by;
        match self.result {
            Reload::Reloaded { changes, fingerprint } => {
                m.relay.config_fingerprint.set(fingerprint as f64);
                tracing::info!(%by, added = ?changes.added, changed = ?changes.changed,
                    removed = ?changes.removed, sources = changes.sources, tokens = changes.tokens,
                    fingerprint = %format_args!("{fingerprint:012x}"),
                    "configuration reloaded: in force for what starts from now on");
            }
            Reload::Unchanged => {
                tracing::info!(%by, "configuration reloaded: nothing changed");
            }
            Reload::Refused(why) => {
                tracing::warn!(%by, %why,
                    "configuration reload refused: the running configuration stays");
            }
            Reload::Invalid(why) => {
                tracing::warn!(%by, %why,
                    "configuration reload failed: the file does not load; the running configuration stays");
            }
        }
    }
}
