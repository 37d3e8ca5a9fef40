//! Durable storage of events and their deliveries: one contract, several backends.
//!
//! [`Store`] is everything the relay asks of its storage. It is written so that a
//! shared database can implement it for several relays at once:
//! - the store allocates event ids (unique across processes, time-ordered);
//! - deliveries are claimed with an owner and a lease, and recording an attempt
//!   checks the claim ([`Claim`]);
//! - shared state (pauses, counts) is read from the store, and every read can fail;
//! - durability belongs to the backend: each write returns once it is as durable as
//!   configured; no caller asks for an fsync. Three writes whose loss a crash only
//!   makes the relay do again are exempt, so that they never hold up an
//!   acknowledgement behind their own fsync: `dispatch` (redone from the durable
//!   inbox), `purge_dedup` and `prune` (redone on the next pass). Each of them is
//!   durable with the next durable write, since every later write is ordered after it;
//! - every method is async: a backend with blocking I/O runs it on the blocking pool.
//!
//! The rules that move events and deliveries on live in [`lifecycle`], pure; a backend
//! reads what a rule asks for, and applies the [`lifecycle::Changes`] it returns in one
//! atomic write. Backends: `sled/` (the embedded default), `postgres/` (several relays on one database), `memory` (tests). Each
//! backend groups concurrent appends into one write ([`Committer`] for a backend with
//! blocking writes).

mod claims;
mod commit;
#[cfg(test)]
pub(crate) mod conformance;
mod counts;
mod deliveries;
mod error;
mod health;
pub(crate) mod lifecycle;
#[cfg(test)]
pub(crate) mod memory;
mod model;
mod observer;
pub(crate) mod postgres;
mod sled;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub(crate) use self::sled::{SledOptions, SledStore};
pub(crate) use claims::ClaimTable;
pub(crate) use commit::Committer;
pub(crate) use counts::QueueCounts;
pub(crate) use deliveries::{
    resource_from_hex, resource_hex, Attempt, Claim, DeadLetterFilter, DedupKey, DeliveryRecord,
    DeliveryState, DispatchOutcome, DispatchPlan, PendingEvent, QueueStats, Recorded,
};
pub(crate) use error::StoreError;
pub(crate) use health::Health;
pub(crate) use model::{
    unix_micros, EventFlag, EventId, EventMeta, EventNameOrigin, EventRecord, EventStatus, NewEvent,
};
#[cfg(test)]
pub(crate) use observer::NoObserver;
pub(crate) use observer::StoreObserver;

use crate::config::{Durability, RetryPolicy, StorageBackend, StorageConfig};

/// Which events to list, newest first.
#[derive(Clone, Debug, Default)]
pub(crate) struct EventFilter {
    pub(crate) source: Option<String>,
    pub(crate) event: Option<String>,
    pub(crate) status: Option<EventStatus>,
    /// Only events about this record (`type/id`, see [`EventMeta::record`]): answered
    /// from an index, not a scan.
    pub(crate) record: Option<String>,
    /// Continue a listing after this id (so: older events only).
    pub(crate) after: Option<EventId>,
    pub(crate) limit: usize,
}

impl EventFilter {
    /// Whether `meta` passes the filter's conditions (all but `after` and `limit`,
    /// which are about the listing's window): one definition for every backend
    /// that filters in code.
    pub(crate) fn matches(&self, meta: &EventMeta) -> bool {
        self.source.as_ref().is_none_or(|s| *s == meta.source)
            && self.event.as_ref().is_none_or(|e| *e == meta.event)
            && self.status.is_none_or(|s| s == meta.status)
            && self.record.as_ref().is_none_or(|r| Some(r) == meta.record.as_ref())
    }
}

/// Everything the relay needs from its storage (see the module docs for the promises).
#[async_trait]
pub(crate) trait Store: Send + Sync + 'static {
    // ---- ingest and reading events

    /// Stores an event and returns its id once it is as durable as configured. A
    /// received event goes to the inbox (body included), a rejected one straight to its
    /// final record. Ids are unique across every process sharing the store, and
    /// increase with time. Concurrent appends are grouped by the backend into one
    /// write (group commit), reported to the [`StoreObserver`] it was opened with.
    async fn append(&self, event: NewEvent) -> Result<EventId, StoreError>;
    async fn event(&self, id: EventId) -> Result<Option<EventRecord>, StoreError>;
    async fn body(&self, id: EventId) -> Result<Option<Vec<u8>>, StoreError>;
    async fn list_events(&self, filter: EventFilter) -> Result<Vec<EventRecord>, StoreError>;
    /// Events waiting for dispatch.
    async fn inbox_len(&self) -> Result<u64, StoreError>;
    /// Bytes the store takes on disk.
    async fn size_on_disk(&self) -> Result<u64, StoreError>;

    // ---- dispatch

    /// The oldest events waiting for dispatch, at most `limit`.
    async fn pending(&self, limit: usize) -> Result<Vec<PendingEvent>, StoreError>;
    /// Dispatches the events of `plans` by [`lifecycle::dispatch`] at `now_us`, in one
    /// atomic write. An event no longer in the inbox is [`DispatchOutcome::Gone`]: a
    /// crash, or another relay, can neither lose an event nor dispatch it twice. Need
    /// not be durable on return: a dispatch lost in a crash is redone from the inbox,
    /// and an attempt's durable record makes the dispatch before it durable too.
    async fn dispatch(
        &self,
        plans: Vec<DispatchPlan>,
        now_us: u64,
    ) -> Result<Vec<DispatchOutcome>, StoreError>;
    /// [`Store::pending`] then [`Store::dispatch`] of the plans `plan` makes of them,
    /// in one call: a blocking backend does both in one hop to its thread pool, which
    /// dispatch pays for every batch. Returns the events taken and their outcomes.
    async fn dispatch_next(
        &self,
        limit: usize,
        plan: Planner,
        now_us: u64,
    ) -> Result<(Vec<PendingEvent>, Vec<DispatchPlan>, Vec<DispatchOutcome>), StoreError> {
        let pending = self.pending(limit).await?;
        if pending.is_empty() {
            return Ok((pending, Vec::new(), Vec::new()));
        }
        let plans: Vec<DispatchPlan> = pending.iter().map(|p| plan(p)).collect();
        let outcomes = self.dispatch(plans.clone(), now_us).await?;
        Ok((pending, plans, outcomes))
    }
    /// Deletes dedup keys whose window ended before `now_us`; returns how many.
    async fn purge_dedup(&self, now_us: u64) -> Result<usize, StoreError>;
    /// Dedup keys currently held.
    async fn dedup_len(&self) -> Result<u64, StoreError>;

    // ---- delivery

    /// Claims up to `limit` of `destination`'s deliveries due at `now_us`, earliest
    /// first, for `owner` until `now_us + lease`. A delivery claimed by anyone whose
    /// lease has not expired is skipped; an expired claim is taken over, and so, in a
    /// fleet, is the claim of a relay silent for [`owner_silence`]`(lease)` (its
    /// heartbeat lapsed: it died, or it is cut off and starts nothing).
    async fn claim_due(
        &self,
        destination: &str,
        owner: &str,
        now_us: u64,
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Claim>, StoreError>;
    /// Gives a claim back without an attempt (it is due again at once).
    async fn release(&self, claim: &Claim) -> Result<(), StoreError>;
    /// Gives back every claim of `owner` on `destination` whose token is not in `keep`
    /// (the claims its worker holds): claims a call took whose answer never reached
    /// the worker (given up on by a timeout after the store had done it, or dropped
    /// with a restarted worker), which would otherwise wait a whole lease. Returns how
    /// many.
    async fn release_unknown(
        &self,
        destination: &str,
        owner: &str,
        keep: &[u64],
    ) -> Result<usize, StoreError>;
    /// When the destination's next delivery after `now_us` is due.
    async fn next_due_after(
        &self,
        destination: &str,
        now_us: u64,
    ) -> Result<Option<u64>, StoreError>;
    /// Records attempts, each made under its claim, by [`lifecycle::record_attempts`],
    /// in one atomic write, and ends the claims; returns what became of each, in order.
    /// Nothing is written for an attempt whose claim was lost (its lease expired and
    /// someone else claimed the delivery) or whose delivery moved meanwhile. Workers
    /// group the attempts that finish together, as the committer groups callbacks.
    async fn record_attempts(
        &self,
        attempts: Vec<(Claim, lifecycle::AttemptReport)>,
        policy: &RetryPolicy,
    ) -> Result<Vec<Recorded>, StoreError>;
    async fn deliveries_of(&self, event: EventId) -> Result<Vec<DeliveryRecord>, StoreError>;
    /// [`lifecycle::replay`] for each of `destinations`; returns how many were scheduled.
    async fn replay(
        &self,
        event: EventId,
        destinations: Vec<String>,
        now_us: u64,
    ) -> Result<usize, StoreError>;
    /// [`lifecycle::discard`]: false if the delivery was not dead.
    async fn discard(&self, event: EventId, destination: &str) -> Result<bool, StoreError>;
    /// Dead deliveries, newest event first.
    async fn dead_letters(
        &self,
        filter: DeadLetterFilter,
    ) -> Result<Vec<DeliveryRecord>, StoreError>;
    /// Counts of a destination's queue, kept current (no scan).
    async fn queue_stats(&self, destination: &str) -> Result<QueueStats, StoreError>;
    /// Destinations with deliveries still to make (pending, retrying or held), sorted:
    /// retention finds those of destinations no longer configured.
    async fn open_destinations(&self) -> Result<Vec<String>, StoreError>;
    /// Paused destinations, shared by every relay on the store.
    async fn paused(&self) -> Result<HashSet<String>, StoreError>;
    async fn set_paused(&self, destination: &str, paused: bool) -> Result<(), StoreError>;
    /// Deletes up to `limit` events with ids below `before_us` (ids are the receive
    /// time, bumped by a few µs when many arrive in one: those near the cutoff go in a
    /// later pass) that [`lifecycle::prunable`] allows, deciding and deleting
    /// atomically; returns how many.
    async fn prune(&self, before_us: u64, limit: usize) -> Result<usize, StoreError>;

    // ---- the hook lifecycle's small state

    /// Rotated OAuth2 refresh tokens and pending gaps, keyed by text.
    async fn upstream_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Sets `key` to `value`, or removes it with `None`; durable when it returns.
    async fn upstream_put(&self, key: &str, value: Option<Vec<u8>>) -> Result<(), StoreError>;
    /// Every entry whose key starts with `prefix`.
    async fn upstream_scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError>;

    // ---- work that runs on one relay at a time

    /// Whether this relay leads `task`: work that one relay of those sharing the store
    /// does for all (dispatch, retention, the dedup purge, the hook reconciler). Asked
    /// before each pass; the lead is a lease the store renews while the relay lives: a
    /// relay that dies or is cut off loses it within seconds, and another takes it at
    /// its next ask. A single-process store always leads.
    async fn lead(&self, _task: &str) -> Result<bool, StoreError> {
        Ok(true)
    }

    /// Waits until no other relay runs `task`, and holds it until the returned guard is
    /// dropped (a hook sync asked of several relays at once runs one after the other).
    /// A single-process store has nothing to hold.
    async fn exclusive(&self, _task: &str) -> Result<Exclusive, StoreError> {
        Ok(Exclusive::default())
    }

    /// Announces this relay (`owner`) to the others sharing the store, and returns the
    /// fleet as it is now: the live relays (announced within `live_for`) and this
    /// one's rank among them, in the order they joined. `None` for a store that one
    /// process owns: that process is the whole fleet.
    async fn heartbeat(
        &self,
        _owner: &str,
        _live_for: Duration,
    ) -> Result<Option<Fleet>, StoreError> {
        Ok(None)
    }

    /// Callbacks stored for `source` so far, by event name, by every relay sharing the
    /// store (for the missing-callbacks comparison). `None` for a store that one
    /// process writes: that process counts its own.
    async fn received_counts(
        &self,
        _source: &str,
    ) -> Result<Option<HashMap<String, u64>>, StoreError> {
        Ok(None)
    }

    /// Wake-ups from the other relays sharing the store: destinations whose deliveries
    /// they made due (so this relay's workers need not wait for their poll), or
    /// [`Wake::All`] when some may have been missed. `None` for a store that one
    /// process writes: that process wakes its own workers.
    fn wakeups(&self) -> Option<tokio::sync::broadcast::Receiver<Wake>> {
        None
    }

    /// Whether the store answers now (a round trip to a database server). An embedded
    /// store is always there.
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Makes everything durable, whatever the durability setting (at shutdown).
    async fn close(&self) -> Result<(), StoreError>;
}

/// The task whose leader dispatches the inbox ([`Store::lead`]): one dispatcher for
/// the fleet, reading the inbox in id order, keeps one order per record.
pub(crate) const DISPATCH_LEAD: &str = "dispatch";

/// A claim's lease beyond its attempt's own bound (the request's timeout): room to
/// record the attempt. An attempt outliving it (a stalled relay) may be made again by
/// another relay.
pub(crate) const CLAIM_MARGIN: Duration = Duration::from_secs(60);

/// How long after its owner last announced itself (a fleet heartbeat, on the store's
/// clock) a claim of `lease` is taken over: the attempt's bound (`lease` less
/// [`CLAIM_MARGIN`]) after [`crate::fleet::LIVE_FOR`]. A relay starts no attempt once
/// its heartbeat has failed for [`crate::fleet::FENCE`] (shorter), so by then its last
/// attempt has ended: the delivery is never in flight twice at once. A killed relay's
/// deliveries move on within seconds instead of a whole lease.
pub(crate) fn owner_silence(lease: Duration) -> Duration {
    lease.saturating_sub(CLAIM_MARGIN) + crate::fleet::LIVE_FOR
}

/// The relays sharing a store (see [`Store::heartbeat`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fleet {
    /// This relay's place among the live ones, from 0.
    pub(crate) rank: usize,
    /// How many are live, this one included.
    pub(crate) size: usize,
    /// The store's clock when it counted, in µs since the epoch: the fleet's one
    /// clock ([`crate::clock`]).
    pub(crate) store_us: u64,
}

/// A wake-up from another relay (see [`Store::wakeups`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// This destination has deliveries due now.
    Due(String),
    /// Anything may be due: wake-ups may have been missed (a reconnection, a
    /// subscriber that fell behind).
    All,
}

/// Holds a task for this relay (see [`Store::exclusive`]) until dropped: whatever
/// holds it (a database connection with a lock) is dropped with it.
#[derive(Default)]
pub(crate) struct Exclusive {
    _hold: Option<Box<dyn Send>>,
}

impl Exclusive {
    /// A hold that ends when `hold` is dropped.
    pub(crate) fn new(hold: impl Send + 'static) -> Self {
        Self { _hold: Some(Box::new(hold)) }
    }
}

/// Makes a pending event's dispatch plan (routing and dedup key: the dispatcher's
/// configuration), callable on whichever thread the store runs it.
pub(crate) type Planner = Arc<dyn Fn(&PendingEvent) -> DispatchPlan + Send + Sync>;

/// How the rest of the relay holds the store.
pub(crate) type SharedStore = Arc<dyn Store>;

/// The database URL of `[storage.postgres]` (validated with the config).
/// What is wrong with `url` as a PostgreSQL URL (libpq's TLS parameters included), if
/// anything; never quoting it (it holds a password).
pub(crate) fn postgres_url_problem(url: &str) -> Option<String> {
    postgres::url_problem(url)
}

fn postgres_url(config: &StorageConfig) -> Result<&crate::config::Secret, StoreError> {
    config.postgres.resolved_url.as_ref().ok_or_else(|| {
        StoreError::Config(
            "storage.postgres.url is not set (nor url_file, nor url_env): set one of them".into(),
        )
    })
}

/// `hookrelay migrate`: brings the configured store's schema to this build's version
/// (or, with `dry_run`, says what that would do); returns what to print.
pub(crate) async fn migrate(config: &StorageConfig, dry_run: bool) -> Result<String, StoreError> {
    match config.backend {
        StorageBackend::Sled => Ok(format!(
            "storage.backend is sled: nothing to migrate (the data directory carries its \
             own layout version, {}, checked at start)",
            config.data_dir.display()
        )),
        StorageBackend::Postgres => {
            let pg = &config.postgres;
            let url = postgres_url(config)?;
            let tls = postgres::TlsSettings { mode: pg.sslmode, ca_file: pg.ca_file.clone() };
            postgres::migrate_only(url.expose(), &pg.schema, tls, dry_run).await
        }
    }
}

/// Opens the backend `config` names: the one factory of the relay. `observer` hears
/// of every group commit.
pub(crate) async fn open(
    config: &StorageConfig,
    observer: Arc<dyn StoreObserver>,
) -> Result<SharedStore, StoreError> {
    match config.backend {
        StorageBackend::Sled => {
            let opts = SledOptions {
                path: config.data_dir.clone(),
                cache_capacity_bytes: config.cache_capacity_bytes,
                compression: config.compression,
                flush_interval: config.flush_interval,
                durable: config.durability == Durability::Durable,
                commit_max_batch: config.commit_max_batch,
                write_timeout: config.write_timeout,
                observer,
            };
            let store = tokio::task::spawn_blocking(move || SledStore::open(&opts))
                .await
                .map_err(|e| StoreError::Task(e.to_string()))??;
            Ok(Arc::new(store))
        }
        StorageBackend::Postgres => {
            let pg = &config.postgres;
            let url = postgres_url(config)?;
            let store = postgres::PostgresStore::open(postgres::PostgresOptions {
                url: url.expose().to_owned(),
                pool_size: pg.pool_size,
                schema: pg.schema.clone(),
                statement_timeout: pg.statement_timeout,
                tls: postgres::TlsSettings { mode: pg.sslmode, ca_file: pg.ca_file.clone() },
                commit_max_batch: config.commit_max_batch,
                write_timeout: config.write_timeout,
                observer,
            })
            .await?;
            Ok(Arc::new(store))
        }
    }
}
