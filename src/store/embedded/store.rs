//! The async [`Store`] contract over the blocking [`EmbeddedState`]: every call runs on
//! tokio's blocking pool, so a slow disk (an fsync, a full device) never stalls a
//! runtime thread; or, on a thread of its own that asked for it ([`run_calls_here`]),
//! right there. See BENCHMARKS.md for what the hop costs.

use std::cell::Cell;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::engine::read_scope;
use super::ride::Rider;
use super::{EmbeddedState, EmbeddedStore};
use crate::config::RetryPolicy;
use crate::store::lifecycle::AttemptReport;
use crate::store::{
    Audit, Claim, CommitDispatch, Coordination, DeadLetterFilter, DeliveryQueue, DeliveryRecord,
    Dispatch, DispatchPlan, DispatchVerdict, EventFilter, EventId, EventLog, EventRecord,
    InboxStats, JournalEntry, LedgerReading, NewEvent, PendingEvent, QueueChange, QueueStats,
    Recorded, SharedState, StoreError, Upkeep,
};

/// Longest the close waits for calls still running on the blocking pool whose callers
/// gave up on them (a disk that hangs keeps one for longer: then the process's exit
/// ends it).
const CALLS_END: Duration = Duration::from_secs(5);

thread_local! {
    /// Whether this thread runs the store's calls itself ([`run_calls_here`]).
    static HERE: Cell<bool> = const { Cell::new(false) };
}

/// Has the calling thread run the embedded store's calls itself instead of handing
/// each to the blocking pool. For a thread that owns one long task and nothing else
/// (the dispatcher's): the hop there and back wakes two threads per call, about 7% of
/// a callback's CPU at 200/s (BENCHMARKS.md, "What the blocking pool's hops cost").
/// Never for a runtime thread: a disk that hangs would stall it, and with it the
/// health checks and the admin endpoints. On a store that fails, such a thread stays
/// in its call until the disk answers; the relay's shutdown does not wait for it.
pub(crate) fn run_calls_here() {
    HERE.with(|here| here.set(true));
}

/// Whether the calling thread runs the store's calls itself.
fn runs_calls_here() -> bool {
    HERE.with(Cell::get)
}

impl EmbeddedStore {
    /// Runs the read `f` on the blocking pool (or here: [`run_calls_here`]), its
    /// lookups sharing their tables (`engine::read_scope`).
    pub(super) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&EmbeddedState) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        if runs_calls_here() {
            return read_scope(|| f(&self.inner));
        }
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || read_scope(|| f(&inner)))
            .await
            .map_err(|e| StoreError::Task(e.to_string()))?
    }

    /// Runs the write `f` on the blocking pool (or here: [`run_calls_here`]) under the
    /// store's [`Health`]: refused once the store failed, watched while it runs,
    /// failing the store if the engine fails, and given up on (the caller gets an
    /// error) as soon as the store fails. Its lookups share their tables, as in
    /// [`EmbeddedStore::run`].
    ///
    /// [`Health`]: crate::store::Health
    pub(super) async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&EmbeddedState) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = self.inner.clone();
        let health = &self.inner.health;
        health
            .or_failed(async move {
                let call = move || {
                    let scoped = || read_scope(|| f(&inner));
                    inner.health.write(StoreError::is_engine_failure, scoped)
                };
                if runs_calls_here() {
                    return call();
                }
                tokio::task::spawn_blocking(call)
                    .await
                    .map_err(|e| StoreError::Task(e.to_string()))?
            })
            .await
    }
}

#[async_trait]
impl EventLog for EmbeddedStore {
    async fn append(&self, event: NewEvent) -> Result<EventId, StoreError> {
        self.committer.submit(event).await
    }

    async fn event(&self, id: EventId) -> Result<Option<EventRecord>, StoreError> {
        self.run(move |s| s.event(id)).await
    }

    async fn body(&self, id: EventId) -> Result<Option<Vec<u8>>, StoreError> {
        self.run(move |s| s.body(id)).await
    }

    async fn list_events(&self, filter: EventFilter) -> Result<Vec<EventRecord>, StoreError> {
        self.run(move |s| s.list_events(&filter)).await
    }

    async fn prune(&self, before_us: u64, limit: usize) -> Result<usize, StoreError> {
        self.write(move |s| s.prune(before_us, limit)).await
    }

    async fn prune_bodies(
        &self,
        after: EventId,
        before_us: u64,
        limit: usize,
    ) -> Result<(usize, Option<EventId>), StoreError> {
        self.write(move |s| s.prune_bodies(after, before_us, limit)).await
    }
}

#[async_trait]
impl Dispatch for EmbeddedStore {
    async fn inbox(&self) -> Result<InboxStats, StoreError> {
        // Whether it is counting first: once it says no, the number read after is exact.
        let counting = self.inner.counts.inbox_counting();
        Ok(InboxStats { events: super::non_negative(&self.inner.inbox_count), counting })
    }

    async fn pending(&self, limit: usize) -> Result<Vec<PendingEvent>, StoreError> {
        self.run(move |s| s.pending(limit)).await
    }

    async fn dispatch(
        &self,
        plans: Vec<DispatchPlan>,
        now_us: u64,
    ) -> Result<Vec<DispatchVerdict>, StoreError> {
        self.write(move |s| s.dispatch(&plans, now_us)).await
    }

    async fn dispatch_next(
        &self,
        limit: usize,
        plan: crate::store::Planner,
        now_us: u64,
    ) -> Result<(Vec<PendingEvent>, Vec<DispatchPlan>, Vec<DispatchVerdict>), StoreError> {
        self.write(move |s| {
            let pending = s.pending(limit)?;
            if pending.is_empty() {
                return Ok((pending, Vec::new(), Vec::new()));
            }
            let plans = plan(&pending);
            let outcomes = s.dispatch(&plans, now_us)?;
            Ok((pending, plans, outcomes))
        })
        .await
    }

    fn dispatch_with_commits(&self, hook: Option<Arc<dyn CommitDispatch>>) -> bool {
        self.inner.set_commit_dispatch(hook);
        true
    }

    async fn purge_dedup(&self, now_us: u64, limit: usize) -> Result<usize, StoreError> {
        self.write(move |s| s.purge_dedup(now_us, limit)).await
    }

    async fn dedup_len(&self) -> Result<u64, StoreError> {
        Ok(super::non_negative(&self.inner.dedup_count))
    }
}

#[async_trait]
impl DeliveryQueue for EmbeddedStore {
    async fn claim_due(
        &self,
        destination: &str,
        owner: &str,
        now_us: u64,
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Claim>, StoreError> {
        let (dest, owner) = (destination.to_owned(), owner.to_owned());
        self.run(move |s| s.claim_due(&dest, &owner, now_us, lease, limit)).await
    }

    async fn claim_due_and_next(
        &self,
        destination: &str,
        owner: &str,
        now_us: u64,
        lease: Duration,
        limit: usize,
    ) -> Result<(Vec<Claim>, Option<u64>), StoreError> {
        let (dest, owner) = (destination.to_owned(), owner.to_owned());
        // One trip to the blocking pool for both (each trip is a hand-off between
        // threads and back).
        self.run(move |s| {
            let claims = s.claim_due(&dest, &owner, now_us, lease, limit)?;
            Ok((claims, s.next_due_after(&dest, now_us)?))
        })
        .await
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        self.inner.release(claim);
        Ok(())
    }

    async fn release_unknown(
        &self,
        destination: &str,
        _owner: &str,
        keep: &[u64],
    ) -> Result<usize, StoreError> {
        // One process owns every claim of this store.
        Ok(self.inner.claims.release_except(destination, keep))
    }

    async fn next_due_after(
        &self,
        destination: &str,
        now_us: u64,
    ) -> Result<Option<u64>, StoreError> {
        let dest = destination.to_owned();
        self.run(move |s| s.next_due_after(&dest, now_us)).await
    }

    async fn record_attempts(
        &self,
        attempts: Vec<(Claim, AttemptReport)>,
        policy: &RetryPolicy,
        bodies_before_us: Option<u64>,
    ) -> Result<Recorded, StoreError> {
        let policy = policy.clone();
        if !Rider::may_ride(&attempts) {
            return self
                .write(move |s| s.record_attempts(&attempts, &policy, bodies_before_us))
                .await;
        }
        // With the committer's next group (`ride.rs`).
        let (reply, answer) = tokio::sync::oneshot::channel();
        let rider = Rider { attempts, policy, bodies_before_us, reply };
        self.inner.health.or_failed(async { self.committer.ride(rider, answer).await? }).await
    }

    async fn deliveries_of(&self, event: EventId) -> Result<Vec<DeliveryRecord>, StoreError> {
        self.run(move |s| s.deliveries_of(event)).await
    }

    async fn change(
        &self,
        change: QueueChange,
        journal: Option<JournalEntry>,
    ) -> Result<u64, StoreError> {
        self.write(move |s| s.change(&change, journal.as_ref())).await
    }

    async fn dead_letters(
        &self,
        filter: DeadLetterFilter,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        self.run(move |s| s.dead_letters(&filter)).await
    }

    async fn queue_stats(&self, destination: &str) -> Result<QueueStats, StoreError> {
        Ok(self.inner.queue_stats(destination))
    }

    async fn open_destinations(&self) -> Result<Vec<String>, StoreError> {
        // Waits for the count behind the open: on the blocking pool.
        self.run(EmbeddedState::open_destinations).await
    }

    async fn paused(&self) -> Result<HashSet<String>, StoreError> {
        self.run(EmbeddedState::paused).await
    }
}

/// The whole fleet is this process (one process owns a sled store): every default answer.
impl Coordination for EmbeddedStore {}

#[async_trait]
impl SharedState for EmbeddedStore {
    async fn upstream_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = key.to_owned();
        self.run(move |s| s.upstream_get(&key)).await
    }

    async fn upstream_put(&self, key: &str, value: Option<Vec<u8>>) -> Result<(), StoreError> {
        let key = key.to_owned();
        self.write(move |s| s.upstream_put(&key, value.as_deref())).await
    }

    async fn upstream_scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let prefix = prefix.to_owned();
        self.run(move |s| s.upstream_scan(&prefix)).await
    }
}

#[async_trait]
impl Upkeep for EmbeddedStore {
    async fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.run(EmbeddedState::size_on_disk).await
    }

    async fn backup(
        &self,
        out: Box<dyn std::io::Write + Send>,
    ) -> Result<(u64, u64, String), StoreError> {
        self.run(move |s| s.backup(out)).await
    }

    async fn close(&self) -> Result<(), StoreError> {
        // A failed store is left as it is: a write may be stuck inside sled, and what
        // was acknowledged is durable already. What is queued is committed first;
        // later appends fail. A count still going behind the open stops.
        self.inner.counts.close();
        // What the dispatcher lent is given back (it holds the relay's destinations,
        // which hold the store), had the dispatcher not taken it back itself.
        self.inner.set_commit_dispatch(None);
        // It ends after the chunk it reads (the count's close frees it).
        let count = crate::lock::lock(&self.count_thread).take();
        if let Some(count) = count {
            let _ = tokio::task::spawn_blocking(move || count.join()).await;
        }
        self.committer.close_and_join(&self.committer_thread).await?;
        let flushed = self
            .write(|s| {
                s.save_appended()?;
                s.flush_now()
            })
            .await;
        self.inner.watchdog.stop();
        // A call whose caller gave up on it (a timeout, a stop) still runs on the
        // blocking pool, holding the state: the database (its file, its lock) is let go
        // of when the last holder is, so the close waits for them, bounded.
        crate::shutdown::let_go(&self.inner, CALLS_END).await;
        flushed
    }
}

#[async_trait]
impl Audit for EmbeddedStore {
    async fn ledger(&self, from_hour: u64, to_hour: u64) -> Result<LedgerReading, StoreError> {
        self.run(move |s| s.ledger(from_hour, to_hour)).await
    }

    async fn prune_ledger(&self, before_hour: u64, limit: usize) -> Result<usize, StoreError> {
        self.write(move |s| s.prune_ledger(before_hour, limit)).await
    }

    async fn add_triggered(
        &self,
        hour: u64,
        source: &str,
        event: &str,
        n: u64,
    ) -> Result<(), StoreError> {
        let (source, event) = (source.to_owned(), event.to_owned());
        self.write(move |s| s.add_triggered(hour, &source, &event, n)).await
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
