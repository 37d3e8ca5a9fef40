//! Durable storage of events (and, later, of their deliveries).
//!
//! Ingress and workers see only the [`Store`] trait; `sled_store` is the one backend.
//! [`Committer`] groups concurrent appends so they share one fsync.

mod codec;
mod commit;
mod model;
mod sled_store;

use std::sync::Arc;

pub(crate) use commit::{Committer, CommitterOptions};
pub(crate) use model::{
    unix_micros, EventFlag, EventId, EventMeta, EventNameOrigin, EventRecord, EventStatus, NewEvent,
};
pub(crate) use sled_store::{SledOptions, SledStore};

/// Why a store operation failed. Messages never contain event bodies or secrets.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
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

/// The durable storage the relay needs. One implementation per backend; every method
/// is blocking, so async callers run them on the blocking pool.
pub(crate) trait Store: Send + Sync + 'static {
    /// Writes a group of events: each received event, body included, into the inbox,
    /// each rejected one into the event records. Every event is written whole or not
    /// at all. Durable only after [`Store::flush`].
    fn append(&self, events: &[(EventId, &NewEvent)]) -> Result<(), StoreError>;
    /// Makes everything appended so far durable (fsync).
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

/// How the rest of the relay holds the store.
pub(crate) type SharedStore = Arc<dyn Store>;
