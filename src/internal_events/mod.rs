//! The relay's notable occurrences, one type each: its `emit` writes the log line and
//! updates the metrics, so that the two cannot drift apart (as vector's
//! `internal_events`). A call site builds the event and emits it; it neither logs nor
//! counts the occurrence itself.
//!
//! Gauges that mirror state rather than count occurrences (queue depths, free space,
//! hook counts, the inbox) are set by the task that reads that state; the test below
//! lists them, and holds every event's families against the registry.

mod config;
mod console;
mod delivery;
mod dispatch;
mod ingress;
mod shape;
mod store;
mod tasks;
pub(crate) mod taxonomy;
mod telemetry;
mod upstream;

pub(crate) use config::{ConfigInForce, ConfigReloaded, Reload};
pub(crate) use console::{AdminTokenRefused, ConsoleSignIn, PullTokenRefused, SignIn};
pub(crate) use delivery::{
    AttemptFinished, AttemptRecorded, CircuitChanged, DestinationGone, DestinationPauseSet,
    DestinationRecovered, DestinationStalled, RemovedDestinationFound, RemovedDestinationRetired,
    TransformFailed,
};
pub(crate) use dispatch::{DedupKeysCounted, DedupKeysPurged, DispatchLead, EventDispatched};
pub(crate) use ingress::{
    CallbackClosed, CallbackNotStored, CallbackRefused, CallbackStored, Closed,
};
pub(crate) use shape::{ShapeRunStopped, StopCause};
pub(crate) use store::{AuditChecked, ClockChecked, PostgresTls, StoreProbed};
pub(crate) use tasks::{
    BodiesDroppedAtSettlement, BodiesPruned, EventsPruned, FleetCounted, RelayReady, ShuttingDown,
    StorageCrossed, TaskDied,
};
pub(crate) use telemetry::{SpanDropped, SpanExportFailed, SpansExported};
pub(crate) use upstream::{
    AccountReconciled, HookRecreated, HookTransition, ReconcilerStoreFailed, StoredGapUnreadable,
    TokenRefreshed, UpstreamRequest,
};

use crate::metrics::Metrics;

/// One notable occurrence.
pub(crate) trait InternalEvent {
    /// The metric families `emit` may touch: the test holds them against the
    /// registry, and against what `emit` really touches (read by the tests only).
    #[cfg_attr(not(test), allow(dead_code))]
    const FAMILIES: &'static [&'static str];

    /// Writes the occurrence's log line (if it has one) and updates its metrics.
    fn emit(self, metrics: &Metrics);
}

#[cfg(test)]
mod tests;
