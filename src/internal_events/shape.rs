//! Shaping: a jq run the relay stopped (`shape/pool.rs`).

use super::InternalEvent;
use crate::metrics::Metrics;
use crate::operational::OperationalEvent;
use crate::shape::pool::Cause;

/// A run of a destination's program was stopped: it ran past its limit, or its
/// process died under it. `disabled` when this stop disabled its program.
pub(crate) struct ShapeRunStopped<'a> {
    pub(crate) destination: &'a str,
    /// `filter`, `transform` or `preview`.
    pub(crate) role: &'a str,
    pub(crate) cause: Cause,
    pub(crate) reason: &'a str,
    pub(crate) disabled: bool,
}

impl InternalEvent for ShapeRunStopped<'_> {
    const FAMILIES: &'static [&'static str] =
        &["hookrelay_shape_runs_stopped_total", "hookrelay_shape_program_disabled"];
    fn emit(self, m: &Metrics) {
        let Self { destination, role, cause, reason, disabled } = self;
        m.delivery.shape_runs_stopped.with_label_values(&[destination, role, cause.as_str()]).inc();
        tracing::warn!(
            destination,
            program = role,
            cause = cause.as_str(),
            reason,
            "a jq run was stopped: only its event pays, the next is tried again"
        );
        if disabled {
            m.delivery.programs_disabled.with_label_values(&[destination, role]).set(1);
            OperationalEvent::ProgramDisabled { destination, role, reason }.raise();
            tracing::error!(destination, program = role, reason,
                "a jq program is disabled: fix it in the config, then restart the relay (docs/runbook.md)");
        }
    }
}
