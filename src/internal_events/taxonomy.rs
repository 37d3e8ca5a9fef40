//! The relay's errors, in one small taxonomy shared by the internal events and the
//! metrics (as vector's `component_errors_total{error_type, stage}`): *where* in the
//! data flow ([`Stage`]) and *what kind* of failure ([`ErrorType`]), so an operator
//! can read every error of the relay from one family, `hookrelay_errors_total`, and
//! the alerts can be written against it.
//!
//! - An internal event that logs at ERROR level counts here (`tests.rs` holds every
//!   event to that); a background loop's failed step is such an event
//!   ([`StepFailed`]).
//! - A failure the relay works around at once (a view shown without a part, a
//!   database waited for, a claim given back later) is a [`StepFailed`] `worked_around`:
//!   counted, logged at WARN.
//! - The store and the operational-event queue sit below the internal events: they
//!   report through what their owner gave them (`StoreObserver::failed` and
//!   `trouble`, `operational::Lost`), and the daemon's side counts it here.
//!
//! What stays a plain log line: the admin API's failed store read (answered 500 with
//! its reason), a metrics encoding failure, the command line's last word, one-time
//! notices at start (an interrupted engine switch finished, an unfinished sled
//! snapshot removed, running on sled, no admin token), a lead handed to another
//! relay, a shaping process's own stderr, redb's periodic flush failing (the next
//! write fails and counts), and the simulator's. A caller's mistakes (a wrong
//! token, a body too large) are not the relay's errors, and have their own families.

use crate::metrics::Metrics;

/// Where the error happened: a stage of the data flow, or the relay itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Taking a callback in.
    Ingress,
    /// The store: writes, reads, the database, the disk under it.
    Store,
    /// Dispatch: the inbox read, dedup, routes.
    Dispatch,
    /// Shaping: filters and transforms.
    Shape,
    /// Delivery to the destinations.
    Delivery,
    /// The upstream's hooks and accounts.
    Upstream,
    /// Traces going out.
    Telemetry,
    /// The audit's check of the ledger.
    Audit,
    /// Retention's passes.
    Retention,
    /// The admin API and the console.
    Admin,
    /// The relay as a process: its tasks, its clock.
    Relay,
}

/// What kind of failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorType {
    /// A store write or read failed.
    Storage,
    /// A peer (a database, a collector, the upstream) did not answer.
    Unreachable,
    /// The disk is below the free-space floor.
    Full,
    /// Something stored cannot be read back.
    Corrupt,
    /// A program was stopped (it ran past its limit, or its process died).
    Runaway,
    /// An input the relay could not use (a transform gave no body).
    Invalid,
    /// Work is due and nothing moves.
    Stalled,
    /// The ledger's equations do not hold.
    Imbalance,
    /// This machine's clock is too far from the database's.
    ClockSkew,
    /// A background task ended before the stop.
    TaskDied,
    /// Data was dropped (a queue full).
    Dropped,
}

impl Stage {
    /// Every stage, in order: the label's values.
    pub(crate) const ALL: [Stage; 11] = [
        Stage::Ingress,
        Stage::Store,
        Stage::Dispatch,
        Stage::Shape,
        Stage::Delivery,
        Stage::Upstream,
        Stage::Telemetry,
        Stage::Audit,
        Stage::Retention,
        Stage::Admin,
        Stage::Relay,
    ];

    /// As the `stage` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Stage::Ingress => "ingress",
            Stage::Store => "store",
            Stage::Dispatch => "dispatch",
            Stage::Shape => "shape",
            Stage::Delivery => "delivery",
            Stage::Upstream => "upstream",
            Stage::Telemetry => "telemetry",
            Stage::Audit => "audit",
            Stage::Retention => "retention",
            Stage::Admin => "admin",
            Stage::Relay => "relay",
        }
    }
}

impl ErrorType {
    /// Every error type, in order: the label's values.
    pub(crate) const ALL: [ErrorType; 11] = [
        ErrorType::Storage,
        ErrorType::Unreachable,
        ErrorType::Full,
        ErrorType::Corrupt,
        ErrorType::Runaway,
        ErrorType::Invalid,
        ErrorType::Stalled,
        ErrorType::Imbalance,
        ErrorType::ClockSkew,
        ErrorType::TaskDied,
        ErrorType::Dropped,
    ];

    /// As the `error_type` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            ErrorType::Storage => "storage",
            ErrorType::Unreachable => "unreachable",
            ErrorType::Full => "full",
            ErrorType::Corrupt => "corrupt",
            ErrorType::Runaway => "runaway",
            ErrorType::Invalid => "invalid",
            ErrorType::Stalled => "stalled",
            ErrorType::Imbalance => "imbalance",
            ErrorType::ClockSkew => "clock_skew",
            ErrorType::TaskDied => "task_died",
            ErrorType::Dropped => "dropped",
        }
    }
}

/// The family every error counts in.
pub(crate) const ERRORS: &str = "hookrelay_errors_total";

/// Counts one error of `error_type` at `stage`.
pub(crate) fn count(m: &Metrics, stage: Stage, error_type: ErrorType) {
    m.relay.errors.with_label_values(&[stage.label(), error_type.label()]).inc();
}

/// Every (stage, error type) series at 0, so that the first error of each shows as
/// an increase (a counter born at 1 is invisible to `increase()`).
pub(crate) fn init(m: &Metrics) {
    for stage in Stage::ALL {
        for error_type in ErrorType::ALL {
            m.relay.errors.with_label_values(&[stage.label(), error_type.label()]);
        }
    }
}

/// A step of a background loop or a request failed, and the relay goes on (the loop
/// tries again, the request is answered with the error): its log line and its count.
/// One the relay works around at once (a view shown without a part, a claim given
/// back by the next look, a database waited for) is `worked_around`: it counts the
/// same, and logs at WARN, since nobody needs to act on one.
pub(crate) struct StepFailed<'a> {
    pub(crate) stage: Stage,
    pub(crate) error_type: ErrorType,
    /// What failed and what happens next, in words ("dispatch failed; retrying in 1 s").
    pub(crate) what: &'a str,
    pub(crate) error: &'a dyn std::fmt::Display,
    pub(crate) worked_around: bool,
}

impl super::InternalEvent for StepFailed<'_> {
    const FAMILIES: &'static [&'static str] = &[ERRORS];
    fn emit(self, m: &Metrics) {
        let Self { stage, error_type, what, error, worked_around } = self;
        count(m, stage, error_type);
        let (stage, error_type) = (stage.label(), error_type.label());
        if worked_around {
            tracing::warn!(stage, error_type, %error, "{what}");
        } else {
            tracing::error!(stage, error_type, %error, "{what}");
        }
    }
}

/// Emits a [`StepFailed`]: `what` failed at `stage` with `error`, and the relay goes on.
pub(crate) fn failed(
    m: &Metrics,
    stage: Stage,
    error_type: ErrorType,
    what: &str,
    error: &dyn std::fmt::Display,
) {
    let step = StepFailed { stage, error_type, what, error, worked_around: false };
    super::InternalEvent::emit(step, m);
}

/// Emits a [`StepFailed`] the relay worked around: `what` failed at `stage` with
/// `error`, logged as a warning.
pub(crate) fn degraded(
    m: &Metrics,
    stage: Stage,
    error_type: ErrorType,
    what: &str,
    error: &dyn std::fmt::Display,
) {
    let step = StepFailed { stage, error_type, what, error, worked_around: true };
    super::InternalEvent::emit(step, m);
}
