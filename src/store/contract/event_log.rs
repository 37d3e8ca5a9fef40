//! The event log: every callback as stored (or refused), its body, the search over
//! them, and retention.

use std::collections::HashMap;

use async_trait::async_trait;

use crate::store::{EventId, EventMeta, EventRecord, EventStatus, NewEvent, StoreError};

/// Which events to list, newest first.
#[derive(Clone, Debug, Default)]
pub(crate) struct EventFilter {
    pub(crate) source: Option<String>,
    pub(crate) event: Option<String>,
    pub(crate) status: Option<EventStatus>,
    /// Only events about this resource (`type/id`, see [`EventMeta::resource`]):
    /// answered from an index, not a scan.
    pub(crate) resource: Option<String>,
    /// Continue a listing after this id (so: older events only). An id is its receive
    /// time in µs, so this is also "received before".
    pub(crate) after: Option<EventId>,
    /// Only events with this id or a later one: received at or after its time.
    pub(crate) since: Option<EventId>,
    pub(crate) limit: usize,
}

impl EventFilter {
    /// Whether `id` is inside the listing's window (`after` and `since`): one
    /// definition for every backend that filters in code.
    pub(crate) fn in_window(&self, id: EventId) -> bool {
        self.after.is_none_or(|a| id < a) && self.since.is_none_or(|s| id >= s)
    }

    /// Whether `meta` passes the filter's conditions (all but `after` and `limit`,
    /// which are about the listing's window): one definition for every backend
    /// that filters in code.
    pub(crate) fn matches(&self, meta: &EventMeta) -> bool {
        self.source.as_ref().is_none_or(|s| *s == meta.source)
            && self.event.as_ref().is_none_or(|e| *e == meta.event)
            && self.status.is_none_or(|s| s == meta.status)
            && self.resource.as_ref().is_none_or(|r| Some(r) == meta.resource.as_ref())
    }
}

/// The events the relay stored: written by the ingress, read by the admin API and the
/// console, trimmed by retention.
#[async_trait]
pub(crate) trait EventLog: Send + Sync {
    /// Stores an event and returns its id once it is as durable as configured. A
    /// received event goes to the inbox (body included), a rejected one straight to its
    /// final record. Ids are unique across every process sharing the store, and
    /// increase with time. Concurrent appends are grouped by the backend into one
    /// write (group commit), reported to the [`StoreObserver`] it was opened with.
    ///
    /// [`StoreObserver`]: crate::store::StoreObserver
    async fn append(&self, event: NewEvent) -> Result<EventId, StoreError>;
    /// One event's record, if it is still stored.
    async fn event(&self, id: EventId) -> Result<Option<EventRecord>, StoreError>;
    /// One event's body, if it had one and is still stored.
    async fn body(&self, id: EventId) -> Result<Option<Vec<u8>>, StoreError>;
    /// The events `filter` selects, newest first.
    async fn list_events(&self, filter: EventFilter) -> Result<Vec<EventRecord>, StoreError>;
    /// Deletes up to `limit` events with ids below `before_us` (ids are the receive
    /// time, bumped by a few µs when many arrive in one: those near the cutoff go in a
    /// later pass) that [`lifecycle::prunable`] allows, deciding and deleting
    /// atomically; returns how many.
    ///
    /// [`lifecycle::prunable`]: crate::store::lifecycle::prunable
    async fn prune(&self, before_us: u64, limit: usize) -> Result<usize, StoreError>;
    /// Drops the bodies of events received before `before_us` that [`Self::prune`]
    /// would delete at that cutoff ([`lifecycle::prunable`]: settled, every delivery
    /// final), looking at up to `limit` events after `after`, in id order; their
    /// records, deliveries and attempts stay until `prune` takes them
    /// (`retention.delivered_bodies`). Returns how many bodies went, and the last event
    /// looked at: where the next call starts (`None`: none was left to look at).
    async fn prune_bodies(
        &self,
        after: EventId,
        before_us: u64,
        limit: usize,
    ) -> Result<(usize, Option<EventId>), StoreError>;
    /// Callbacks stored for `source` so far, by event name, by every relay sharing the
    /// store (for the missing-callbacks comparison). `None` for a store that one
    /// process writes: that process counts its own.
    async fn received_counts(
        &self,
        _source: &str,
    ) -> Result<Option<HashMap<String, u64>>, StoreError> {
        Ok(None)
    }
}
