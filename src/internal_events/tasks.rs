//! The relay's background tasks: one dying, retention's passes, the fleet's size.

use super::taxonomy::{self, ErrorType, Stage, ERRORS};
use super::InternalEvent;
use crate::metrics::Metrics;

/// A background task ended before shutdown: the relay is no longer ready.
pub(crate) struct TaskDied<'a> {
    /// The task's kind, a bounded metric label.
    pub(crate) kind: &'static str,
    /// Which task (a destination's worker, say), for the log.
    pub(crate) name: &'a str,
    pub(crate) why: &'a str,
}

impl InternalEvent for TaskDied<'_> {
    const FAMILIES: &'static [&'static str] =
        &["hookrelay_task_failures_total", "hookrelay_ready", ERRORS];
    fn emit(self, m: &Metrics) {
        taxonomy::count(m, Stage::Relay, ErrorType::TaskDied);
        m.relay.task_failures.with_label_values(&[self.kind]).inc();
        m.relay.ready.set(0);
        tracing::error!(task = %self.name, why = %self.why,
            "background task died: the relay is no longer ready; restart it");
    }
}

/// A retention pass deleted finished events past retention.
pub(crate) struct EventsPruned(pub(crate) usize);

impl InternalEvent for EventsPruned {
    const FAMILIES: &'static [&'static str] = &["hookrelay_events_pruned_total"];
    fn emit(self, m: &Metrics) {
        m.store.events_pruned.inc_by(self.0 as u64);
        if self.0 > 0 {
            tracing::info!(pruned = self.0, "finished events past retention deleted");
        }
    }
}

/// A retention pass dropped the bodies of settled events (retention by part).
pub(crate) struct BodiesPruned(pub(crate) usize);

impl InternalEvent for BodiesPruned {
    const FAMILIES: &'static [&'static str] = &["hookrelay_bodies_pruned_total"];
    fn emit(self, m: &Metrics) {
        m.store.bodies_pruned.inc_by(self.0 as u64);
        if self.0 > 0 {
            tracing::info!(
                bodies = self.0,
                "bodies of settled events dropped (retention.delivered_bodies)"
            );
        }
    }
}

/// Attempts just recorded settled events past `retention.delivered_bodies`, whose
/// bodies went with that write (the pass went past them while they were owed). Counted
/// with the pass's; logged at debug only: under a backlog's recovery it is every group.
pub(crate) struct BodiesDroppedAtSettlement(pub(crate) usize);

impl InternalEvent for BodiesDroppedAtSettlement {
    const FAMILIES: &'static [&'static str] = &["hookrelay_bodies_pruned_total"];
    fn emit(self, m: &Metrics) {
        if self.0 > 0 {
            m.store.bodies_pruned.inc_by(self.0 as u64);
            tracing::debug!(bodies = self.0, "bodies of events settled late dropped");
        }
    }
}

/// A fleet heartbeat answered: how many relays are live; `recovered` when the one
/// before had failed.
pub(crate) struct FleetCounted {
    pub(crate) relays: usize,
    pub(crate) recovered: bool,
}

impl InternalEvent for FleetCounted {
    const FAMILIES: &'static [&'static str] = &["hookrelay_fleet_relays"];
    fn emit(self, m: &Metrics) {
        m.relay.fleet_relays.set(i64::try_from(self.relays).unwrap_or(i64::MAX));
        if self.recovered {
            tracing::info!(relays = self.relays, "fleet heartbeat works again");
        }
    }
}

/// The relay listens and takes callbacks.
pub(crate) struct RelayReady {
    pub(crate) sources: usize,
}

impl InternalEvent for RelayReady {
    const FAMILIES: &'static [&'static str] = &["hookrelay_ready"];
    fn emit(self, m: &Metrics) {
        m.relay.ready.set(1);
        tracing::info!(sources = self.sources, "ready");
    }
}

/// The relay drains and stops: a signal, a listener that ended, a failed store.
pub(crate) struct ShuttingDown<'a> {
    pub(crate) reason: &'a str,
    pub(crate) grace: std::time::Duration,
}

impl InternalEvent for ShuttingDown<'_> {
    const FAMILIES: &'static [&'static str] = &["hookrelay_ready"];
    fn emit(self, m: &Metrics) {
        m.relay.ready.set(0);
        tracing::info!(reason = %self.reason, grace = ?self.grace, "shutting down");
    }
}

/// Free space of the data directory crossed the floor (`below` true: under it).
pub(crate) struct StorageCrossed<'a> {
    pub(crate) data_dir: &'a str,
    pub(crate) below: bool,
    pub(crate) free: u64,
    pub(crate) floor: u64,
}

impl InternalEvent for StorageCrossed<'_> {
    /// `hookrelay_storage_free_bytes` mirrors the measure (set by the space watch).
    const FAMILIES: &'static [&'static str] = &[ERRORS];
    fn emit(self, m: &Metrics) {
        let Self { data_dir, below, free, floor } = self;
        if below {
            taxonomy::count(m, Stage::Store, ErrorType::Full);
            tracing::error!(
                free,
                floor,
                data_dir,
                "free space below storage.min_free_bytes / min_free_percent: refusing callbacks \
                 (connections closed, the upstream retries) and holding dispatch, delivery, \
                 purges and retention until space is freed"
            );
        } else {
            tracing::info!(
                free,
                floor,
                data_dir,
                "free space back above the floor: taking callbacks and delivering again"
            );
        }
        m.operational.raise(&crate::operational::OperationalEvent::StorageLow {
            data_dir,
            low: below,
            free_bytes: free,
            floor_bytes: floor,
        });
    }
}
