//! The embedded backend: one process, one data directory, one named tree per concept
//! with big-endian keys (see ARCHITECTURE.md), kept by a key-value engine
//! ([`engine`]: redb, the default for a new directory, or sled); the engine locks the database to its
//! process.
//!
//! How it keeps the contract:
//! - **Rules**: every decision is made by [`crate::store::lifecycle`] under the
//!   backend's lifecycle lock (one process: a mutex makes read-decide-write atomic
//!   against the other writers), and applied in one multi-tree transaction
//!   (`apply.rs`), which also derives the schedule and dead-letter entries and the
//!   queue counts from each delivery's state before and after.
//! - **Ids** come from an in-process counter ([`EventId::allocate`]), seeded at open
//!   from the highest stored id or the dispatch cursor, whichever is higher (retention
//!   may have deleted the newest records).
//! - **Claims** live in memory ([`ClaimTable`]): a restart ends every attempt anyway.
//! - **Durability**: in `durable` mode each write waits for a shared fsync
//!   (`flush.rs`) before it returns (on redb, the redo log's, and checkpoints are paced
//!   by their own length, up to 5 s apart: `background_flush.rs`); in `buffered` mode
//!   the engine flushes every `flush_interval`.
//! - **Async**: every call runs on tokio's blocking pool (`store.rs`), but appends,
//!   which go to the group committer's own thread ([`Committer`]).
//!
//! An event is written once, at ingest, into `records` (meta and body in one value,
//! `codec.rs`); dispatch adds its small verdict to `outcomes` and never rewrites the
//! record. So an ack costs one sled insert per event (sled 0.34 spends several
//! microseconds per insert whatever the value size, which makes the insert count the
//! cost of the ack path), and each body enters sled's log once (the footprint).
//! The events awaiting dispatch are the received records after the **dispatch cursor**
//! (every id up to it is settled) that have no outcome yet.

mod apply;
mod background_flush;
pub(crate) mod backup;
mod bin;
pub(super) mod codec;
pub(crate) mod copy;
mod dedup;
mod deliveries;
mod dispatch;
pub(crate) mod engine;
mod events;
mod flush;
mod journal;
pub(super) mod keys;
mod ledger;
mod migrate;
mod open;
mod record;
mod recount;
mod ride;
pub(crate) use recount::Pace as CountPace;
mod store;
pub(crate) use store::run_calls_here;
mod view;

use crate::store::hex;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use self::codec::{decode_meta, DispatchRecord};
use self::engine::{Db, Engine, Tree};
use super::{
    ClaimTable, Committer, EventId, EventMeta, EventRecord, Health, StoreError, StoreObserver,
};

/// Version of the on-disk layout; bumped on incompatible changes. Version 1 (an
/// `inbox` moved into `events` + `bodies` at dispatch) is migrated at open
/// (`migrate.rs`); version 2 (`dedup` keyed by the hash alone) too (`dedup.rs`).
const SCHEMA_VERSION: u32 = 3;
const SCHEMA_KEY: &[u8] = b"schema_version";

/// Tree names.
const RECORDS: &str = "records";
const OUTCOMES: &str = "outcomes";
const META: &str = "meta";
const DELIVERIES: &str = "deliveries";
const SCHEDULE: &str = "schedule";
const DEDUP: &str = "dedup";
const DEAD_LETTERS: &str = "dead_letters";
const ORDERING: &str = "ordering";
const UPSTREAM: &str = "upstream";
const JOURNAL: &str = "journal";
/// Every tree of the layout (what `hookrelay migrate --to` copies).
const TREES: [&str; 10] = [
    META,
    RECORDS,
    OUTCOMES,
    DELIVERIES,
    SCHEDULE,
    DEDUP,
    DEAD_LETTERS,
    ORDERING,
    UPSTREAM,
    JOURNAL,
];
/// `schedule` values: what kind of entry it is.
const SCHEDULED_PENDING: u8 = 0;
const SCHEDULED_RETRYING: u8 = 1;
/// The key in `outcomes` (not 8 bytes, so never an event's) of the dispatch cursor: it
/// is written in the same transaction as the outcomes it moves over.
const CURSOR_KEY: &[u8] = b"dispatch_cursor";
/// Keys of `meta` holding a paused destination: `paused/{name}`.
const PAUSED_PREFIX: &[u8] = b"paused/";

/// The embedded [`crate::store::Store`]; cheap to clone.
#[derive(Clone)]
pub(crate) struct EmbeddedStore {
    inner: Arc<EmbeddedState>,
    /// Appends go through group commit on its own thread.
    committer: Committer<ride::Rider>,
    committer_thread: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
    /// The count behind the open, while it runs: stopped and joined at close.
    count_thread: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
}

/// The backend's state; its methods are blocking.
pub(super) struct EmbeddedState {
    db: Db,
    records: Tree,
    outcomes: Tree,
    deliveries: Tree,
    schedule: Tree,
    /// Keyed by when each key expires (`dedup.rs`).
    dedup: Tree,
    /// The buckets of `dedup` that file keys (`dedup.rs`).
    dedup_buckets: dedup::Buckets,
    dead_letters: Tree,
    ordering: Tree,
    upstream: Tree,
    /// The admin changes (`journal.rs`).
    journal: Tree,
    meta: Tree,
    /// Held while a lifecycle rule reads, decides and writes.
    lifecycle: Mutex<()>,
    /// Counted behind the open (`recount/`).
    counts: recount::Counts,
    pub(super) claims: ClaimTable,
    /// Every event id up to this one is settled (dispatched, or stored final); moved
    /// forward only, over settled records, so the scan for pending events starts here.
    cursor: AtomicU64,
    /// Every id up to this one is written with its whole group and tallied in the
    /// ledger: published by `append` after its batch is applied. sled's iterators are
    /// not snapshots, so a scan may see a group's later ids before its earlier ones;
    /// the cursor never passes this watermark, so it never steps over an id that is
    /// not visible yet, and dispatch takes no id above it (the ledger's `waiting`
    /// would keep an event dispatched before its append tallied it).
    committed: AtomicU64,
    /// Events awaiting dispatch, and entries in `dedup`: sled's own `len()` walks the
    /// whole tree. Signed, because the writer that adds and the one that subtracts
    /// update them after their writes, in either order: dispatch can take an event
    /// before `append` has counted it, and the sum is right once both are done (an
    /// unsigned count clamped at zero lost that decrement and stayed above the inbox
    /// for good). Read through [`non_negative`].
    inbox_count: AtomicI64,
    dedup_count: AtomicI64,
    /// The last event id handed out.
    last_id: Mutex<u64>,
    /// The first event the audit ledger counts (`ledger.rs`), set at open.
    ledger_start: AtomicU64,
    /// The inbox tallied per hour, source and event: the ledger's `waiting` (both it and
    /// `inbox_count` are counted behind the open for the events stored before it).
    waiting: Mutex<ledger::Waiting>,
    /// Appends' ledger counts not written yet (`ledger.rs`).
    unsaved: Mutex<ledger::Unsaved>,
    flusher: flush::GroupFlush,
    durable: bool,
    /// Fail-stop: after an engine's write error (sled's error is sticky, redb's I/O
    /// error too) or a write that does not return, no more writes.
    health: Arc<Health>,
    /// The write watchdog's thread, stopped at close (and when the state goes).
    watchdog: super::Ticker,
    /// The dispatcher's rules lent to the committer while the dispatcher runs
    /// (`Dispatch::dispatch_with_commits`).
    commit_dispatch: Mutex<Option<Arc<dyn crate::store::CommitDispatch>>>,
}

/// How to open the store.
pub(crate) struct EmbeddedOptions {
    pub(crate) engine: Engine,
    pub(crate) path: PathBuf,
    pub(crate) cache_capacity_bytes: u64,
    /// sled: zstd-compress a new database (an existing one keeps what it was created
    /// with).
    pub(crate) compression: bool,
    pub(crate) flush_interval: Duration,
    /// Whether each write waits for an fsync.
    pub(crate) durable: bool,
    /// Most callbacks one group commit takes.
    pub(crate) commit_max_batch: usize,
    /// Writes waiting this long with none returning fail the store (`health.rs`).
    pub(crate) write_timeout: Duration,
    pub(crate) observer: Arc<dyn StoreObserver>,
    /// How the count behind the open goes (`recount/`; tests slow it down).
    pub(crate) count_pace: CountPace,
}

impl EmbeddedState {
    /// Whether the event stored as `value` under `key` awaits dispatch: received, and
    /// no outcome written for it yet.
    pub(super) fn awaits_dispatch(&self, key: &[u8], value: &[u8]) -> Result<bool, StoreError> {
        if !codec::awaits_outcome(value) {
            return Ok(false);
        }
        let outcome = codec::outcome_key(key, value).map_err(|reason| StoreError::Corrupt {
            table: RECORDS,
            key: hex(key),
            reason,
        })?;
        Ok(!self.outcomes.contains_key(outcome)?)
    }

    /// The first event the audit ledger counts.
    pub(super) fn ledger_start(&self) -> EventId {
        EventId::new(self.ledger_start.load(Ordering::Relaxed))
    }
}

impl EmbeddedState {
    /// An event's record as readers see it: the meta stored at ingest with dispatch's
    /// outcome laid over it.
    pub(super) fn decode(&self, key: &[u8], value: &[u8]) -> Result<EventRecord, StoreError> {
        let corrupt = |table, reason: String| StoreError::Corrupt { table, key: hex(key), reason };
        let id =
            EventId::from_key(key).ok_or_else(|| corrupt(RECORDS, "key is not 8 bytes".into()))?;
        let mut meta: EventMeta = decode_meta(value).map_err(|r| corrupt(RECORDS, r))?;
        if codec::awaits_outcome(value) {
            let outcome_key = codec::outcome_key(key, value).map_err(|r| corrupt(RECORDS, r))?;
            if let Some(outcome) = self.outcomes.get(outcome_key)? {
                serde_json::from_slice::<DispatchRecord>(&outcome)
                    .map_err(|e| corrupt(OUTCOMES, e.to_string()))?
                    .apply_to(&mut meta);
            }
        }
        Ok(EventRecord { id, meta })
    }
}

/// A signed count as reported: transiently negative while a subtraction has
/// overtaken its addition (see `EmbeddedState::inbox_count`), which reads as empty.
pub(super) fn non_negative(count: &AtomicI64) -> u64 {
    u64::try_from(count.load(Ordering::Relaxed)).unwrap_or(0)
}

#[cfg(test)]
pub(crate) mod testutil;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = testutil::engine_db(Engine::Sled, dir.path());
            db.open_tree(META).unwrap().insert(SCHEMA_KEY, b"99").unwrap();
            db.flush().unwrap();
        }
        let err = testutil::try_open_on(Engine::Sled, dir.path()).err().unwrap();
        assert!(err.to_string().contains("schema version 99"), "{err}");
    }
}
