//! Shaping: a jq run the relay stopped (`shape/pool.rs`).

use super::taxonomy::{self, ErrorType, Stage, ERRORS};
use super::InternalEvent;
use crate::metrics::Metrics;
use crate::operational::OperationalEvent;

/// A run of a destination's program was stopped: it ran past its limit, or its
/// process died under it. `disabled` when this stop disabled its program.
pub(crate) struct ShapeRunStopped<'a> {
    pub(crate) destination: &'a str,
    /// `filter`, `transform` or `preview`.
    pub(crate) role: &'a str,
    pub(crate) cause: StopCause,
    pub(crate) reason: &'a str,
    pub(crate) disabled: bool,
}

impl InternalEvent for ShapeRunStopped<'_> {
    const FAMILIES: &'static [&'static str] =
        &["hookrelay_shape_runs_stopped_total", "hookrelay_shape_program_disabled", ERRORS];
    fn emit(self, m: &Metrics) {
        let Self { destination, role, cause, reason, disabled } = self;
        taxonomy::count(m, Stage::Shape, ErrorType::Runaway);
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
            m.operational.raise(&OperationalEvent::ProgramDisabled { destination, role, reason });
            tracing::error!(destination, program = role, reason,
                "a jq program is disabled: fix it in the config, then restart the relay (docs/runbook.md)");
        }
    }
}

/// Why a run was stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StopCause {
    /// It ran past its time limit (`shape::pool::LIMIT`), and its process was killed.
    Overran,
    /// Its process died under it (stack, memory), or could not be started.
    Crashed,
}

impl StopCause {
    /// As a metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Overran => "overran",
            Self::Crashed => "crashed",
        }
    }
}
