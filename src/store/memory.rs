//! The in-memory backend, for tests: every rule through the same lifecycle module as
//! the real backends, state in ordered maps under one mutex. Nothing survives the
//! process; [`MemoryStore::restart`] stands for a restart (claims are forgotten, the
//! data kept) so the conformance suite can run its reopen steps here too.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::lifecycle::ledger::{self, Count, LedgerEdits, LedgerKey};
use super::lifecycle::{self, AttemptReport, Changes, DedupEntry, Queue, Staged, View};
use super::{
    AttemptWrite, Audit, Claim, ClaimTable, Coordination, DeadLetterFilter, DeliveryQueue,
    DeliveryRecord, Dispatch, DispatchPlan, DispatchVerdict, EventFilter, EventId, EventLog,
    EventMeta, EventRecord, EventStatus, LedgerReading, NewEvent, PendingEvent, QueueCounts,
    QueueStats, SharedState, StoreError, Upkeep,
};
use crate::clock::micros;
use crate::config::RetryPolicy;
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
impl EventLog for MemoryStore {
    async fn append(&self, event: NewEvent) -> Result<EventId, StoreError> {
        let started = std::time::Instant::now();
        let failure = *lock(&self.fail_appends);
        if let Some(observer) = &self.observer {
            observer.group(1, started.elapsed(), failure.is_none());
        }
        if let Some(message) = failure {
            self.failed_appends.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return Err(StoreError::Injected(message));
        }
        let mut d = lock(&self.data);
        let id = EventId::allocate(d.last_id, event.meta.received_at_us);
        d.last_id = id.raw();
        if let Some(observer) = &self.observer {
            observer.stored(&event.meta);
        }
        let mut edits = LedgerEdits::new();
        ledger::appended(&mut edits, id, &event.meta, EventId::new(0));
        ledger::merge(&mut d.ledger, &edits);
        if event.meta.status == EventStatus::Received {
            d.inbox.insert(id, (event.meta, event.body.unwrap_or_default()));
        } else {
            d.events.insert(id, event.meta);
        }
        self.durable_point(&d);
        Ok(id)
    }

    async fn event(&self, id: EventId) -> Result<Option<EventRecord>, StoreError> {
        let d = lock(&self.data);
        let meta = d.inbox.get(&id).map(|(m, _)| m).or_else(|| d.events.get(&id));
        Ok(meta.map(|m| EventRecord { id, meta: m.clone() }))
    }

    async fn body(&self, id: EventId) -> Result<Option<Vec<u8>>, StoreError> {
        let d = lock(&self.data);
        let body = d.inbox.get(&id).map(|(_, b)| b).or_else(|| d.bodies.get(&id));
        Ok(body.map(|b| b.to_vec()))
    }

    async fn list_events(&self, filter: EventFilter) -> Result<Vec<EventRecord>, StoreError> {
        let d = lock(&self.data);
        let all = d
            .inbox
            .iter()
            .map(|(id, (m, _))| (*id, m))
            .chain(d.events.iter().map(|(id, m)| (*id, m)))
            .collect::<BTreeMap<_, _>>();
        Ok(all
            .into_iter()
            .rev()
            .filter(|(id, m)| filter.in_window(*id) && filter.matches(m))
            .take(filter.limit)
            .map(|(id, m)| EventRecord { id, meta: m.clone() })
            .collect())
    }

    async fn prune(&self, before_us: u64, limit: usize) -> Result<usize, StoreError> {
        let mut d = lock(&self.data);
        let candidates: Vec<EventId> =
            d.events.range(..EventId::new(before_us)).map(|(id, _)| *id).collect();
        let mut pruned = 0;
        for id in candidates {
            if pruned >= limit {
                break;
            }
            let meta = d.events[&id].clone();
            let deliveries: Vec<DeliveryRecord> = d
                .deliveries
                .range((id, String::new())..)
                .take_while(|((e, _), _)| *e == id)
                .map(|(_, r)| r.clone())
                .collect();
            let view = Locked { data: &d, claims: &self.claims };
            let mut st = Staged::new(&view);
            if lifecycle::prune(&mut st, id, &meta, &deliveries, before_us)? {
                let changes = st.into_changes();
                d.apply(changes);
                pruned += 1;
            }
        }
        Ok(pruned)
    }

    async fn prune_bodies(
        &self,
        after: EventId,
        before_us: u64,
        limit: usize,
    ) -> Result<(usize, Option<EventId>), StoreError> {
        let mut d = lock(&self.data);
        let start = EventId::new(after.raw().saturating_add(1));
        let candidates: Vec<EventId> =
            d.events.range(start..EventId::new(before_us)).map(|(id, _)| *id).take(limit).collect();
        let mut gone = 0;
        for id in &candidates {
            let deliveries: Vec<DeliveryRecord> = d
                .deliveries
                .range((*id, String::new())..)
                .take_while(|((e, _), _)| e == id)
                .map(|(_, r)| r.clone())
                .collect();
            if lifecycle::prunable(&d.events[id], &deliveries, before_us)
                && d.bodies.remove(id).is_some()
            {
                gone += 1;
            }
        }
        Ok((gone, candidates.last().copied()))
    }
}

#[async_trait]
impl Dispatch for MemoryStore {
    async fn inbox_len(&self) -> Result<u64, StoreError> {
        Ok(lock(&self.data).inbox.len() as u64)
    }

    async fn pending(&self, limit: usize) -> Result<Vec<PendingEvent>, StoreError> {
        let d = lock(&self.data);
        Ok(d.inbox
            .iter()
            .take(limit)
            .map(|(id, (meta, body))| PendingEvent {
                id: *id,
                meta: meta.clone(),
                body: body.clone(),
            })
            .collect())
    }

    async fn dispatch(
        &self,
        plans: Vec<DispatchPlan>,
        now_us: u64,
    ) -> Result<Vec<DispatchVerdict>, StoreError> {
        let mut d = lock(&self.data);
        let view = Locked { data: &d, claims: &self.claims };
        let mut st = Staged::new(&view);
        let mut outcomes = Vec::with_capacity(plans.len());
        for plan in &plans {
            let Some((meta, _)) = d.inbox.get(&plan.id) else {
                outcomes.push(DispatchVerdict::Gone);
                continue;
            };
            outcomes.push(lifecycle::dispatch(&mut st, meta.clone(), plan, now_us)?);
        }
        let changes = st.into_changes();
        d.apply(changes);
        Ok(outcomes)
    }

    async fn purge_dedup(&self, now_us: u64) -> Result<usize, StoreError> {
        let mut d = lock(&self.data);
        let before = d.dedup.len();
        d.dedup.retain(|_, e| e.until_us > now_us);
        Ok(before - d.dedup.len())
    }

    async fn dedup_len(&self) -> Result<u64, StoreError> {
        Ok(lock(&self.data).dedup.len() as u64)
    }
}

#[async_trait]
impl DeliveryQueue for MemoryStore {
    async fn claim_due(
        &self,
        destination: &str,
        owner: &str,
        now_us: u64,
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Claim>, StoreError> {
        let d = lock(&self.data);
        let expires_us = now_us.saturating_add(micros(lease));
        let from = (destination.to_owned(), 0, EventId::new(0));
        let mut out = Vec::new();
        for (dest, due_us, event) in d.schedule.range(from..) {
            if dest != destination || *due_us > now_us || out.len() >= limit {
                break;
            }
            let Some(record) = d.deliveries.get(&(*event, dest.clone())).cloned() else {
                continue;
            };
            let Some(token) = self.claims.try_claim(dest, *event, now_us, expires_us) else {
                continue;
            };
            out.push(Claim {
                event: *event,
                destination: dest.clone(),
                due_us: *due_us,
                owner: owner.to_owned(),
                token,
                expires_us,
                record,
                meta: d.events.get(event).cloned(),
                body: d.bodies.get(event).cloned(),
            });
        }
        Ok(out)
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        self.claims.release(&claim.destination, claim.event, claim.token);
        Ok(())
    }

    async fn release_unknown(
        &self,
        destination: &str,
        _owner: &str,
        keep: &[u64],
    ) -> Result<usize, StoreError> {
        Ok(self.claims.release_except(destination, keep))
    }

    async fn next_due_after(
        &self,
        destination: &str,
        now_us: u64,
    ) -> Result<Option<u64>, StoreError> {
        let d = lock(&self.data);
        let from = (destination.to_owned(), now_us.saturating_add(1), EventId::new(0));
        Ok(d.schedule.range(from..).next().filter(|(dest, _, _)| dest == destination).map(|e| e.1))
    }

    async fn record_attempts(
        &self,
        attempts: Vec<(Claim, AttemptReport)>,
        policy: &RetryPolicy,
    ) -> Result<Vec<AttemptWrite>, StoreError> {
        let mut d = lock(&self.data);
        let view = Locked { data: &d, claims: &self.claims };
        let mut st = Staged::new(&view);
        let out = lifecycle::record_attempts(&mut st, &attempts, policy, |c| {
            self.claims.holds(&c.destination, c.event, c.token)
        })?;
        let changes = st.into_changes();
        d.apply(changes);
        for (claim, _) in &attempts {
            self.claims.release(&claim.destination, claim.event, claim.token);
        }
        self.durable_point(&d);
        Ok(out)
    }

    async fn deliveries_of(&self, event: EventId) -> Result<Vec<DeliveryRecord>, StoreError> {
        let d = lock(&self.data);
        Ok(d.deliveries
            .range((event, String::new())..)
            .take_while(|((e, _), _)| *e == event)
            .map(|(_, r)| r.clone())
            .collect())
    }

    async fn replay(
        &self,
        event: EventId,
        destinations: Vec<String>,
        now_us: u64,
    ) -> Result<usize, StoreError> {
        let mut d = lock(&self.data);
        let view = Locked { data: &d, claims: &self.claims };
        let mut st = Staged::new(&view);
        let mut n = 0;
        for dest in &destinations {
            n += usize::from(lifecycle::replay(&mut st, event, dest, now_us)?);
        }
        let changes = st.into_changes();
        d.apply(changes);
        self.durable_point(&d);
        Ok(n)
    }

    async fn discard(&self, event: EventId, destination: &str) -> Result<bool, StoreError> {
        let mut d = lock(&self.data);
        let view = Locked { data: &d, claims: &self.claims };
        let mut st = Staged::new(&view);
        let done = lifecycle::discard(&mut st, event, destination)?;
        let changes = st.into_changes();
        d.apply(changes);
        self.durable_point(&d);
        Ok(done)
    }

    async fn dead_letters(
        &self,
        filter: DeadLetterFilter,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        let d = lock(&self.data);
        Ok(d.dead
            .iter()
            .rev()
            .filter(|(event, dest)| {
                let meta = d.events.get(event);
                filter.after.is_none_or(|a| *event < a)
                    && filter.since.is_none_or(|s| *event >= s)
                    && filter.destination.as_ref().is_none_or(|x| x == dest)
                    && filter.source.as_ref().is_none_or(|s| meta.is_some_and(|m| m.source == *s))
                    && filter.event.as_ref().is_none_or(|e| meta.is_some_and(|m| m.event == *e))
            })
            .take(filter.limit)
            .filter_map(|k| d.deliveries.get(&(k.0, k.1.clone())).cloned())
            .collect())
    }

    async fn queue_stats(&self, destination: &str) -> Result<QueueStats, StoreError> {
        Ok(lock(&self.data).counts.stats(destination))
    }

    async fn open_destinations(&self) -> Result<Vec<String>, StoreError> {
        Ok(lock(&self.data).counts.open_destinations())
    }

    async fn paused(&self) -> Result<HashSet<String>, StoreError> {
        Ok(lock(&self.data).paused.iter().cloned().collect())
    }

    async fn set_paused(&self, destination: &str, paused: bool) -> Result<(), StoreError> {
        let mut d = lock(&self.data);
        if paused {
            d.paused.insert(destination.to_owned());
        } else {
            d.paused.remove(destination);
        }
        self.durable_point(&d);
        Ok(())
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
