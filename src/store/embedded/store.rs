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
use super::{EmbeddedState, EmbeddedStore};
use crate::config::RetryPolicy;
use crate::store::lifecycle::AttemptReport;
use crate::store::{
    Audit, Claim, Coordination, DeadLetterFilter, DeliveryQueue, DeliveryRecord, Dispatch,
    DispatchPlan, DispatchVerdict, EventFilter, EventId, EventLog, EventRecord, InboxStats,
    JournalEntry, LedgerReading, NewEvent, PendingEvent, QueueChange, QueueStats, Recorded,
    SharedState, StoreError, Upkeep,
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

    async fn purge_dedup(&self, now_us: u64) -> Result<usize, StoreError> {
        self.write(move |s| s.purge_dedup(now_us)).await
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
        self.write(move |s| s.record_attempts(&attempts, &policy, bodies_before_us)).await
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
        let deadline = tokio::time::Instant::now() + CALLS_END;
        while Arc::strong_count(&self.inner) > 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
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
mod tests {
    use std::sync::Arc;
    use std::thread::{self, ThreadId};

    use super::super::engine::Engine;
    use super::super::testutil;
    use super::*;

    /// Where a read and a write of `store` ran.
    async fn where_calls_run(store: &EmbeddedStore) -> (ThreadId, ThreadId) {
        let read = store.run(|_| Ok(thread::current().id())).await.unwrap();
        let write = store.write(|_| Ok(thread::current().id())).await.unwrap();
        (read, write)
    }

    /// A call its caller gave up on still runs on the blocking pool, holding the
    /// database: the close waits for it, so that the file is free once the store is
    /// dropped. Seen in the daemon's start-and-stop test as "in use by another
    /// process" when a relay was started again at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn the_close_waits_for_calls_given_up_on_and_the_file_is_free_after() {
        let dir = tempfile::tempdir().unwrap();
        let store = testutil::open_on(Engine::Redb, dir.path());
        let (began, running) = std::sync::mpsc::channel();
        let mut slow = Box::pin(store.run(move |_| {
            let _ = began.send(());
            thread::sleep(Duration::from_millis(400));
            Ok(())
        }));
        tokio::select! {
            _ = &mut slow => panic!("the slow call ended before it was given up on"),
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        running.recv_timeout(Duration::from_secs(5)).expect("the slow call began");
        drop(slow);
        store.close().await.expect("close");
        drop(store);
        let again = EmbeddedStore::open(&testutil::options(Engine::Redb, dir.path()));
        assert!(again.is_ok(), "opened again at once: {:?}", again.err());
    }

    /// A thread that asked runs the calls itself, reads and writes alike, and a
    /// failed store still refuses its writes; every other thread's calls go to the
    /// blocking pool (a runtime thread never does the disk's work).
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_thread_that_asked_runs_the_calls_itself() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(testutil::open_on(Engine::Redb, dir.path()));
        let runtime_thread = thread::current().id();
        let (read, write) = where_calls_run(&store).await;
        assert_ne!(read, runtime_thread);
        assert_ne!(write, runtime_thread);

        let (runtime, asked) = (tokio::runtime::Handle::current(), store.clone());
        let (own, (read, write), refused) = thread::spawn(move || {
            run_calls_here();
            runtime.block_on(async {
                let ran = where_calls_run(&asked).await;
                asked.inner.health.fail("a test failed it".to_owned());
                let refused = asked.write(|_| Ok(())).await;
                (thread::current().id(), ran, refused)
            })
        })
        .join()
        .unwrap();
        assert_eq!((read, write), (own, own));
        assert!(matches!(refused, Err(StoreError::Failed(_))), "{refused:?}");
        // The runtime's threads were not told: their calls still go to the pool.
        assert_ne!(store.run(|_| Ok(thread::current().id())).await.unwrap(), runtime_thread);
    }
}
