//! The in-memory backend, for tests: every rule through the same lifecycle module as
//! the real backends, state in ordered maps under one mutex. Nothing survives the
//! process; [`MemoryStore::restart`] stands for a restart (claims are forgotten, the
//! data kept) so the conformance suite can run its reopen steps here too. One file per
//! trait of the contract that takes more than a few lines, as `postgres/`.

mod delivery_queue;
mod dispatch;
mod event_log;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::lifecycle::ledger::{self, Count, LedgerEdits, LedgerKey};
use super::lifecycle::{Changes, DedupEntry, Queue, View};
use super::{
    Audit, ClaimTable, Coordination, DeliveryRecord, EventId, EventMeta, LedgerReading,
    QueueCounts, SharedState, StoreError, Upkeep,
};
use crate::lock::lock;

/// Everything stored.
#[derive(Clone, Default)]
struct Data {
    inbox: BTreeMap<EventId, (EventMeta, bytes::Bytes)>,
    events: BTreeMap<EventId, EventMeta>,
    bodies: BTreeMap<EventId, bytes::Bytes>,
    dedup: BTreeMap<[u8; 16], DedupEntry>,
    deliveries: BTreeMap<(EventId, String), DeliveryRecord>,
    /// (destination, due, event): derived from the records, as in every backend.
    schedule: BTreeSet<(String, u64, EventId)>,
    dead: BTreeSet<(EventId, String)>,
    queues: BTreeMap<(String, [u8; 16]), Queue>,
    paused: BTreeSet<String>,
    upstream: BTreeMap<String, Vec<u8>>,
    /// The journal, by `(at_us, tie)`.
    journal: BTreeMap<(u64, u64), super::JournalEntry>,
    counts: QueueCounts,
    /// The audit ledger's counters.
    ledger: LedgerEdits,
    last_id: u64,
}

/// The data under its lock, with the claims: what the rules read.
struct Locked<'a> {
    data: &'a Data,
    claims: &'a ClaimTable,
}

impl View for Locked<'_> {
    fn dedup(&self, hash: &[u8; 16]) -> Result<Option<DedupEntry>, StoreError> {
        Ok(self.data.dedup.get(hash).copied())
    }
    fn delivery(&self, event: EventId, dest: &str) -> Result<Option<DeliveryRecord>, StoreError> {
        Ok(self.data.deliveries.get(&(event, dest.to_owned())).cloned())
    }
    fn queue(&self, dest: &str, resource: &[u8; 16]) -> Result<Option<Queue>, StoreError> {
        Ok(self.data.queues.get(&(dest.to_owned(), *resource)).copied())
    }
    fn event(&self, id: EventId) -> Result<Option<EventMeta>, StoreError> {
        Ok(self.data.events.get(&id).cloned())
    }
    fn claimed(&self, event: EventId, dest: &str, now_us: u64) -> Result<bool, StoreError> {
        Ok(self.claims.is_claimed(dest, event, now_us))
    }
    fn deliveries_of(&self, event: EventId) -> Result<Vec<DeliveryRecord>, StoreError> {
        let next = EventId::new(event.raw().saturating_add(1));
        let range = (event, String::new())..(next, String::new());
        Ok(self.data.deliveries.range(range).map(|(_, d)| d.clone()).collect())
    }
}

impl Data {
    fn apply(&mut self, changes: Changes) {
        ledger::merge(&mut self.ledger, &ledger::edits(&changes, EventId::new(0)));
        for (id, meta) in changes.dispatched {
            if let Some((_, body)) = self.inbox.remove(&id) {
                self.events.insert(id, meta);
                self.bodies.insert(id, body);
            }
        }
        self.dedup.extend(changes.dedup);
        for ((event, dest), change) in changes.deliveries {
            let edits = change.index_edits();
            if let Some(due) = edits.unschedule {
                self.schedule.remove(&(dest.clone(), due, event));
            }
            if let Some(due) = edits.schedule {
                self.schedule.insert((dest.clone(), due, event));
            }
            match edits.dead {
                Some(true) => self.dead.insert((event, dest.clone())),
                Some(false) => self.dead.remove(&(event, dest.clone())),
                None => false,
            };
            self.counts.apply(change.before.as_ref(), change.after.as_ref());
            match change.after {
                Some(after) => self.deliveries.insert((event, dest), after),
                None => self.deliveries.remove(&(event, dest)),
            };
        }
        for (key, queue) in changes.queues {
            match queue {
                Some(q) => self.queues.insert(key, q),
                None => self.queues.remove(&key),
            };
        }
        for (id, _) in changes.pruned {
            self.events.remove(&id);
            self.bodies.remove(&id);
        }
        for id in changes.bodies_dropped {
            self.bodies.remove(&id);
        }
    }
}

/// See the module docs; cheap to clone (clones share the data).
#[derive(Clone, Default)]
pub(crate) struct MemoryStore {
    data: Arc<Mutex<Data>>,
    claims: Arc<ClaimTable>,
    /// When set, every append fails with this message (a full disk), counted.
    fail_appends: Arc<Mutex<Option<&'static str>>>,
    failed_appends: Arc<std::sync::atomic::AtomicUsize>,
    /// Hears of every append (a group of one: nothing here is worth grouping).
    observer: Option<Arc<dyn super::StoreObserver>>,
    /// For [`MemoryStore::lossy`]: the data as of the last durable write, which is
    /// all a crash leaves.
    durable: Option<Arc<Mutex<Data>>>,
}

impl MemoryStore {
    /// A store whose appends are reported to `observer`.
    pub(crate) fn with_observer(observer: Arc<dyn super::StoreObserver>) -> Self {
        Self { observer: Some(observer), ..Self::default() }
    }

    /// Makes every later append fail with `message`.
    pub(crate) fn fail_appends(&self, message: &'static str) {
        *lock(&self.fail_appends) = Some(message);
    }

    /// How many appends failed so.
    pub(crate) fn failed_appends(&self) -> usize {
        self.failed_appends.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The same data as after a restart of its process: claims forgotten.
    pub(crate) fn restart(&self) -> Self {
        self.claims.clear();
        self.clone()
    }

    /// A store that keeps, besides its data, the data as of its last durable write,
    /// as the contract allows a backend to: every write but dispatch, the dedup purge
    /// and pruning is durable on return, and those three are durable with the next
    /// durable write ([`MemoryStore::crash`] loses them).
    pub(crate) fn lossy() -> Self {
        Self { durable: Some(Arc::default()), ..Self::default() }
    }

    /// What a power cut leaves of a [`MemoryStore::lossy`] store: the data as of its
    /// last durable write, in a new process (claims forgotten).
    pub(crate) fn crash(&self) -> Self {
        let durable = self.durable.as_ref().map(|d| lock(d).clone()).unwrap_or_default();
        Self {
            data: Arc::new(Mutex::new(durable.clone())),
            claims: Arc::default(),
            durable: Some(Arc::new(Mutex::new(durable))),
            ..Self::default()
        }
    }

    /// A durable write just ended with `d` as the data: a lossy store keeps it.
    fn durable_point(&self, d: &Data) {
        if let Some(durable) = &self.durable {
            *lock(durable) = d.clone();
        }
    }
}

#[async_trait]
impl super::Journal for MemoryStore {
    async fn journal_append(&self, entry: super::JournalEntry) -> Result<(), StoreError> {
        let mut d = lock(&self.data);
        d.journal.insert((entry.at_us, entry.tie), entry);
        self.durable_point(&d);
        Ok(())
    }

    async fn journal_list(
        &self,
        filter: super::JournalFilter,
    ) -> Result<Vec<super::JournalEntry>, StoreError> {
        let d = lock(&self.data);
        let taken = d.journal.values().rev().filter(|e| filter.takes(e));
        Ok(taken.take(filter.limit).cloned().collect())
    }

    async fn journal_prune(&self, before_us: u64) -> Result<usize, StoreError> {
        let mut d = lock(&self.data);
        let before = d.journal.len();
        d.journal.retain(|(at, _), _| *at >= before_us);
        Ok(before - d.journal.len())
    }
}

/// The whole fleet is this process (one process owns a memory store): every default answer.
impl Coordination for MemoryStore {}

#[async_trait]
impl SharedState for MemoryStore {
    async fn upstream_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(lock(&self.data).upstream.get(key).cloned())
    }

    async fn upstream_put(&self, key: &str, value: Option<Vec<u8>>) -> Result<(), StoreError> {
        let mut d = lock(&self.data);
        match value {
            Some(v) => d.upstream.insert(key.to_owned(), v),
            None => d.upstream.remove(key),
        };
        self.durable_point(&d);
        Ok(())
    }

    async fn upstream_scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let d = lock(&self.data);
        Ok(d.upstream
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

#[async_trait]
impl Upkeep for MemoryStore {
    async fn size_on_disk(&self) -> Result<u64, StoreError> {
        Ok(0)
    }

    async fn close(&self) -> Result<(), StoreError> {
        self.durable_point(&lock(&self.data));
        Ok(())
    }
}

#[async_trait]
impl Audit for MemoryStore {
    async fn ledger(&self, from_hour: u64, to_hour: u64) -> Result<LedgerReading, StoreError> {
        let d = lock(&self.data);
        let mut counts = ledger::hours(&d.ledger, from_hour, to_hour);
        let mut waiting = LedgerEdits::new();
        for (id, (meta, _)) in &d.inbox {
            let hour = ledger::hour_of(*id);
            if (from_hour..to_hour).contains(&hour) {
                let key = LedgerKey::event(hour, &meta.source, &meta.event, Count::Waiting);
                *waiting.entry(key).or_insert(0) += 1;
            }
        }
        ledger::merge(&mut counts, &waiting);
        Ok(LedgerReading { counts, start: EventId::new(0) })
    }

    async fn prune_ledger(&self, before_hour: u64, limit: usize) -> Result<usize, StoreError> {
        let mut d = lock(&self.data);
        let old: Vec<LedgerKey> =
            d.ledger.keys().filter(|k| k.hour < before_hour).take(limit).cloned().collect();
        for key in &old {
            d.ledger.remove(key);
        }
        self.durable_point(&d);
        Ok(old.len())
    }

    async fn add_triggered(
        &self,
        hour: u64,
        source: &str,
        event: &str,
        n: u64,
    ) -> Result<(), StoreError> {
        let mut d = lock(&self.data);
        ledger::merge(&mut d.ledger, &ledger::triggered(hour, source, event, n));
        self.durable_point(&d);
        Ok(())
    }
}
