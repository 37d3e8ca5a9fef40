//! Durable storage of events and their deliveries.
//!
//! The rest of the relay sees only the traits here, one per concern: [`EventStore`]
//! (ingest and reads), [`DispatchStore`] (inbox to deliveries), [`DeliveryStore`]
//! (schedule, attempts, dead letters). `sled/` is the one backend; [`Committer`]
//! groups concurrent appends so they share one fsync.

mod codec;
mod commit;
mod deliveries;
pub(crate) mod keys;
mod model;
mod sled;

use std::collections::HashSet;
use std::sync::Arc;

pub(crate) use commit::{Committer, CommitterOptions};
pub(crate) use deliveries::{
    Attempt, DeadLetterFilter, DedupKey, DeliveryRecord, DeliveryState, DispatchOutcome,
    DispatchPlan, PendingEvent, QueueStats, Scheduled,
};
pub(crate) use model::{
    unix_micros, EventFlag, EventId, EventMeta, EventNameOrigin, EventRecord, EventStatus, NewEvent,
};
pub(crate) use sled::{SledOptions, SledStore};

/// Why a store operation failed. Messages never contain event bodies or secrets.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    #[error("sled: {0}")]
    Sled(#[from] ::sled::Error),
    #[error("record {key} in tree `{tree}` is unreadable: {reason}")]
    Corrupt { tree: &'static str, key: String, reason: String },
    #[error("cannot encode a record: {0}")]
    Encode(#[from] serde_json::Error),
    #[error(
        "the data directory holds schema version {found}, this build understands {supported}: \
         use a newer hookrelay or another storage.data_dir"
    )]
    Schema { found: String, supported: u32 },
    #[error("cannot start the committer thread: {0}")]
    Thread(String),
    #[cfg(test)]
    #[error("injected failure: {0}")]
    Injected(&'static str),
}

/// Which events to list, newest first.
#[derive(Clone, Debug, Default)]
pub(crate) struct EventFilter {
    pub(crate) source: Option<String>,
    pub(crate) event: Option<String>,
    pub(crate) status: Option<EventStatus>,
    /// Continue a listing after this id (so: older events only).
    pub(crate) after: Option<EventId>,
    pub(crate) limit: usize,
}

/// Ingest and reading of events. Every method is blocking: async callers run them on
/// the blocking pool.
pub(crate) trait EventStore: Send + Sync + 'static {
    /// Writes a group of events: each received event, body included, into the inbox,
    /// each rejected one into the event records. Every event is written whole or not
    /// at all. Durable only after [`EventStore::flush`].
    fn append(&self, events: &[(EventId, &NewEvent)]) -> Result<(), StoreError>;
    /// Makes everything written so far durable (fsync).
    fn flush(&self) -> Result<(), StoreError>;
    /// The highest event id ever stored, so that ids keep increasing across restarts.
    fn last_event_id(&self) -> Result<Option<EventId>, StoreError>;
    fn event(&self, id: EventId) -> Result<Option<EventRecord>, StoreError>;
    fn body(&self, id: EventId) -> Result<Option<Vec<u8>>, StoreError>;
    fn list_events(&self, filter: &EventFilter) -> Result<Vec<EventRecord>, StoreError>;
    /// Events waiting for dispatch.
    fn inbox_len(&self) -> usize;
    /// Bytes the store takes on disk.
    fn size_on_disk(&self) -> Result<u64, StoreError>;
}

/// From the inbox to deliveries.
pub(crate) trait DispatchStore: Send + Sync + 'static {
    /// The oldest events waiting for dispatch, at most `limit`.
    fn pending(&self, limit: usize) -> Result<Vec<PendingEvent>, StoreError>;
    /// Applies the plans in one transaction: for each event, the dedup check and key,
    /// its record and body, its deliveries and their schedule entries, and its removal
    /// from the inbox. A crash can neither lose an event nor dispatch it twice.
    fn dispatch(
        &self,
        plans: &[DispatchPlan],
        now_us: u64,
    ) -> Result<Vec<DispatchOutcome>, StoreError>;
    /// Deletes dedup keys whose window ended before `now_us`; returns how many.
    fn purge_dedup(&self, now_us: u64) -> Result<usize, StoreError>;
    /// Dedup keys currently held.
    fn dedup_len(&self) -> usize;
}

/// Schedules, attempts and dead letters.
pub(crate) trait DeliveryStore: Send + Sync + 'static {
    /// A destination's schedule entries due at `now_us`, earliest first.
    fn due(
        &self,
        destination: &str,
        now_us: u64,
        limit: usize,
    ) -> Result<Vec<Scheduled>, StoreError>;
    /// When the destination's next entry after `now_us` is due.
    fn next_due_after(&self, destination: &str, now_us: u64) -> Result<Option<u64>, StoreError>;
    fn delivery(
        &self,
        event: EventId,
        destination: &str,
    ) -> Result<Option<DeliveryRecord>, StoreError>;
    fn deliveries_of(&self, event: EventId) -> Result<Vec<DeliveryRecord>, StoreError>;
    /// Stores the outcome of an attempt made for schedule entry `done`: the record,
    /// and atomically with it the schedule entry (removed, or replaced by one at
    /// `record.next_attempt_us`) and the dead letter (added when `record` is dead).
    fn record_attempt(&self, done: Scheduled, record: &DeliveryRecord) -> Result<(), StoreError>;
    /// Starts a new round for the event's deliveries to `destinations` (creating the
    /// ones that do not exist), due now; returns how many were scheduled.
    fn replay(
        &self,
        event: EventId,
        destinations: &[String],
        now_us: u64,
    ) -> Result<usize, StoreError>;
    /// Deletes a dead letter: the delivery becomes `discarded` (kept in the event's
    /// history, never retried). Returns false if it was not dead.
    fn discard(&self, event: EventId, destination: &str) -> Result<bool, StoreError>;
    /// Dead deliveries, newest event first.
    fn dead_letters(&self, filter: &DeadLetterFilter) -> Result<Vec<DeliveryRecord>, StoreError>;
    /// Counts of a destination's queue.
    fn queue_stats(&self, destination: &str) -> Result<QueueStats, StoreError>;
    /// Paused destinations (persisted, so a pause survives a restart).
    fn paused(&self) -> Result<HashSet<String>, StoreError>;
    fn set_paused(&self, destination: &str, paused: bool) -> Result<(), StoreError>;
    /// Deletes finished events received before `before_us`, at most `limit`: rejected,
    /// duplicate and unrouted ones, and dispatched ones whose deliveries all
    /// succeeded or were discarded (with those deliveries). Dead letters and anything still scheduled
    /// stay. Returns how many events were deleted.
    fn prune(&self, before_us: u64, limit: usize) -> Result<usize, StoreError>;
}

/// The hook lifecycle's small state (rotated OAuth2 refresh tokens, callback gaps not
/// yet reported), keyed by text; each write is durable when it returns, because the
/// upstream call that follows depends on it.
pub(crate) trait UpstreamStore: Send + Sync + 'static {
    fn upstream_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Sets `key` to `value`, or removes it with `None`, and flushes.
    fn upstream_put(&self, key: &str, value: Option<&[u8]>) -> Result<(), StoreError>;
    /// Every entry whose key starts with `prefix`.
    fn upstream_scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError>;
}

/// Everything the relay needs from its storage.
pub(crate) trait Store: EventStore + DispatchStore + DeliveryStore + UpstreamStore {}
impl<T: EventStore + DispatchStore + DeliveryStore + UpstreamStore> Store for T {}

/// How the rest of the relay holds the store.
pub(crate) type SharedStore = Arc<dyn Store>;
