//! The store: commits, events stored, size and free space, failure and reachability, the inbox.

use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

use super::{MetricsError, Registrar};
#[allow(unused_imports)]
use super::{BATCH_BUCKETS, LAG_BUCKETS, LATENCY_BUCKETS};

/// The store: commits, events stored, size and free space, failure and reachability, the inbox.
pub(crate) struct StoreMetrics {
    pub(crate) store_commit_duration: Histogram,
    pub(crate) store_commit_batch_size: Histogram,
    pub(crate) store_commit_failures: IntCounter,
    pub(crate) store_checkpoint_duration: Histogram,
    pub(crate) events_stored: IntCounterVec,
    pub(crate) store_size: IntGauge,
    pub(crate) storage_free: IntGauge,
    pub(crate) storage_floor: IntGauge,
    pub(crate) store_failed: IntGauge,
    pub(crate) store_reachable: IntGauge,
    pub(crate) postgres_tls_verified: prometheus::IntGaugeVec,
    pub(crate) store_probe_failures: IntCounter,
    /// No labels: a vector only so that it can be absent (while the inbox is counted
    /// behind a restart) rather than low.
    pub(crate) inbox_events: IntGaugeVec,
    pub(crate) events_pruned: IntCounter,
    pub(crate) bodies_pruned: IntCounter,
    pub(crate) audit_imbalance: IntGauge,
}

impl StoreMetrics {
    /// `hookrelay_inbox_events`' one series (made present by a set; `inbox_events.reset()`
    /// makes it absent).
    pub(crate) fn inbox(&self) -> IntGauge {
        self.inbox_events.with_label_values(&[] as &[&str])
    }

    pub(super) fn register(r: &Registrar) -> Result<Self, MetricsError> {
        Ok(Self {
            store_commit_duration: r.histogram(
                "hookrelay_store_commit_duration_seconds",
                "Time to write one group of events (at a gentle rate on an embedded store, with \
                 their dispatch) and, when durable, fsync it.",
                LATENCY_BUCKETS,
            )?,
            store_commit_batch_size: r.histogram(
                "hookrelay_store_commit_batch_size",
                "Events per group commit.",
                BATCH_BUCKETS,
            )?,
            store_checkpoint_duration: r.histogram(
                "hookrelay_store_checkpoint_duration_seconds",
                "redb only: time of one checkpoint (a durable commit of the database file, \
                 after which its redo log is emptied), during which writers wait.",
                LATENCY_BUCKETS,
            )?,
            store_commit_failures: r.counter(
                "hookrelay_store_commit_failures_total",
                "Group commits that failed (their callbacks were not acknowledged).",
            )?,
            events_stored: r.counter_vec(
                "hookrelay_events_stored_total",
                "Events durably stored, by source and event name (known names or `other`).",
                &["source", "event"],
            )?,
            store_size: r.gauge("hookrelay_store_size_bytes", "Bytes the store takes on disk: the embedded engine's files (redb's redo log included), or the schema's tables on PostgreSQL.")?,
            storage_free: r.gauge(
                "hookrelay_storage_free_bytes",
                "Free space on the data directory's filesystem (as an unprivileged process \
                 sees it), measured every second.",
            )?,
            storage_floor: r.gauge(
                "hookrelay_storage_floor_bytes",
                "The free-space floor (storage.min_free_bytes / min_free_percent): below it, \
                 callbacks are refused.",
            )?,
            store_failed: r.gauge(
                "hookrelay_store_failed",
                "1 once the store failed (a write error, or a write that did not return within \
                 storage.write_timeout); the relay then exits to be restarted.",
            )?,
            postgres_tls_verified: r.gauge_vec(
                "hookrelay_postgres_tls_verified",
                "1 when the database server's certificate is verified against a chosen CA \
                 (sslmode verify-ca or verify-full, or require with ca_file); 0 when an \
                 impostor on the path would be talked to (prefer, allow, require, disable). \
                 Labelled with the sslmode; absent on an embedded store.",
                &["sslmode"],
            )?,
            store_reachable: r.gauge(
                "hookrelay_store_reachable",
                "1 while the database answers (PostgreSQL; probed every second), 0 while it \
                 does not. Always 1 for sled.",
            )?,
            store_probe_failures: r.counter(
                "hookrelay_store_probe_failures_total",
                "Probes of the database that failed or took over 3 s.",
            )?,
            inbox_events: r.gauge_vec(
                "hookrelay_inbox_events",
                "Stored events waiting to be dispatched. Absent while the relay counts them \
                 after a restart (seconds for a million a flood left undispatched).",
                &[],
            )?,
            events_pruned: r.counter(
                "hookrelay_events_pruned_total",
                "Finished events deleted by retention.",
            )?,
            bodies_pruned: r.counter(
                "hookrelay_bodies_pruned_total",
                "Bodies of settled events dropped by retention.delivered_bodies (their \
                 records stay until retention.delivered): by its periodic pass, or as the \
                 attempt that settles an older event is recorded.",
            )?,
            audit_imbalance: r.gauge(
                "hookrelay_audit_imbalance",
                "Equations of the audit ledger that do not hold over the last 24 hours \
                 (checked every minute; GET /admin/audit says which): 0 when every callback \
                 received is accounted for.",
            )?,
        })
    }
}
