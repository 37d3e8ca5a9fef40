//! The queue counts, counted again behind the open. They live in memory (a scrape or
//! a listing reads them instead of walking the schedule), so each open counts them
//! from the indexes; done before the relay was ready, that cost seconds per million
//! deliveries waiting (2.6 s at a million pending on redb, so ~25 s at ten). The open
//! now counts one chunk ([`Pace::chunk`] entries: a short queue is counted before it
//! returns) and a thread reads the rest a chunk at a time while the relay takes
//! callbacks and delivers (ready in 0.09 s with 5.3 M pending, counted 1.6 s later,
//! measured: BENCHMARKS.md). A close stops it.
//!
//! Why the count is exact with writes going on meanwhile:
//! - every delivery change is applied under the lifecycle lock (`apply.rs`), and the
//!   count reads each chunk under it too, so a chunk never sees half a change;
//! - each counted delivery sits at one [`Place`] in the indexes: its schedule entry
//!   (pending, retrying), its dead letter, or its resource's ordering queue (held);
//! - the count reads the places in one order and remembers the first it has not read
//!   (`unread`). A change is counted as it is applied only for the places before that
//!   mark; a place at or after it is read as it stands when the count gets there.
//!
//! While counting, [`QueueStats::counting`] says so (the numbers are then a lower
//! bound), and [`Counts::open_destinations`] waits for the end (retention must not
//! take a destination for empty because its deliveries are not counted yet).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::engine::Bytes;
use super::{keys, EmbeddedState, SCHEDULED_RETRYING};
use crate::store::lifecycle::{schedule_entry, Changes};
use crate::store::{
    resource_from_hex, DeliveryRecord, DeliveryState, QueueCounts, QueueStats, StoreError,
};

/// The indexes a count reads, in the order it reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Index {
    Schedule,
    DeadLetters,
    Ordering,
}

impl Index {
    /// The index read after this one.
    fn next(self) -> Option<Self> {
        match self {
            Self::Schedule => Some(Self::DeadLetters),
            Self::DeadLetters => Some(Self::Ordering),
            Self::Ordering => None,
        }
    }
}

/// Where a counted delivery is found in the indexes: places sort in the order the
/// count reads them (index, then key).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Place {
    index: Index,
    key: Vec<u8>,
}

impl Place {
    /// The first place of `index` (keys are never empty).
    fn start_of(index: Index) -> Self {
        Self { index, key: Vec::new() }
    }

    /// The first place after `key` in `index`: `key` followed by a zero byte is the
    /// least key above it.
    fn after(index: Index, key: &[u8]) -> Self {
        let mut next = Vec::with_capacity(key.len() + 1);
        next.extend_from_slice(key);
        next.push(0);
        Self { index, key: next }
    }

    /// Where `record` is counted from, or `None` for a state no count holds
    /// (delivered, discarded, filtered, superseded).
    fn of(record: &DeliveryRecord) -> Option<Self> {
        let dest = record.destination.as_str();
        let (index, key) = match record.state {
            DeliveryState::Pending | DeliveryState::Retrying => {
                (Index::Schedule, keys::schedule(dest, schedule_entry(record)?, record.event))
            }
            DeliveryState::Dead => (Index::DeadLetters, keys::delivery(record.event, dest)),
            DeliveryState::Held => {
                let resource = record.resource.as_deref().and_then(resource_from_hex)?;
                (Index::Ordering, keys::order(dest, &resource))
            }
            DeliveryState::Delivered
            | DeliveryState::Discarded
            | DeliveryState::Filtered
            | DeliveryState::Superseded => return None,
        };
        Some(Self { index, key })
    }
}

/// The counts and how far the count behind the open has read.
#[derive(Debug)]
struct Counting {
    counts: QueueCounts,
    /// The first place not read yet; `None` once every index is read.
    unread: Option<Place>,
    /// The store is closing: the count stops, and no one waits for it any more.
    closing: bool,
}

impl Counting {
    /// Whether a change to `record` is counted as it is applied: always once the count
    /// is done; before, only where the count has read already. A counted state with no
    /// place (a scheduled delivery without a due time, a held one without its
    /// resource: never written so) is counted as applied, as it was before the count
    /// moved behind the open.
    fn counts_now(&self, record: &DeliveryRecord) -> bool {
        match &self.unread {
            None => true,
            Some(unread) => Place::of(record).is_none_or(|place| place < *unread),
        }
    }
}

/// The embedded store's queue counts (see the module's doc); made uncounted, by
/// [`Counts::uncounted`], for [`start`] to count.
#[derive(Debug)]
pub(super) struct Counts {
    state: Mutex<Counting>,
    /// Signalled when the count is done.
    done: Condvar,
}

/// How the count behind the open goes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pace {
    /// Index entries one chunk reads under the lifecycle lock: a write waits at most
    /// this many reads behind it. The open reads this many itself before it returns,
    /// so a store with a short queue is counted before the relay is ready.
    pub(crate) chunk: usize,
    /// A pause between chunks: none in service; tests slow the count down to
    /// interleave it with writes.
    pub(crate) pause: Duration,
}

impl Pace {
    /// The relay's: chunks of 10,000 entries (~10 ms of reads), no pause.
    pub(crate) const SERVICE: Self = Self { chunk: 10_000, pause: Duration::ZERO };
}

impl Counts {
    /// Counts to be read from the indexes (by [`start`]).
    pub(super) fn uncounted() -> Self {
        let counting = Counting {
            counts: QueueCounts::default(),
            unread: Some(Place::start_of(Index::Schedule)),
            closing: false,
        };
        Self { state: Mutex::new(counting), done: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, Counting> {
        crate::lock::lock(&self.state)
    }

    /// Moves the counts by a decision's delivery changes, as it is applied (under the
    /// lifecycle lock).
    pub(super) fn apply(&self, changes: &Changes) {
        let mut c = self.lock();
        for change in changes.deliveries.values() {
            let before = change.before.as_ref().filter(|r| c.counts_now(r));
            let after = change.after.as_ref().filter(|r| c.counts_now(r));
            c.counts.apply(before, after);
        }
    }

    /// One destination's queue; a lower bound, said so, while the count goes on.
    pub(super) fn stats(&self, dest: &str) -> QueueStats {
        let c = self.lock();
        QueueStats { counting: c.unread.is_some(), ..c.counts.stats(dest) }
    }

    /// Destinations with a delivery still to make, once the count is done (waits for
    /// it: a destination not counted yet is not empty); an error if the store closes
    /// first.
    pub(super) fn open_destinations(&self) -> Result<Vec<String>, StoreError> {
        let c = self
            .done
            .wait_while(self.lock(), |c| c.unread.is_some() && !c.closing)
            .unwrap_or_else(PoisonError::into_inner);
        if c.unread.is_some() {
            return Err(StoreError::Task(
                "the store closed before its queues were counted; they are counted again at the next open"
                    .into(),
            ));
        }
        Ok(c.counts.open_destinations())
    }

    /// Stops the count (at its next chunk) and wakes whoever waits for it: the store is
    /// closing, and a count of a large backlog must not hold the stop up.
    pub(super) fn close(&self) {
        self.lock().closing = true;
        self.done.notify_all();
    }
}

impl EmbeddedState {
    /// Reads up to `chunk` entries of the indexes from where the count stands, under
    /// the lifecycle lock, and counts them. Returns how many it read and whether there
    /// is more to read.
    fn count_chunk(&self, chunk: usize) -> Result<(usize, bool), StoreError> {
        let _rules = crate::lock::lock(&self.lifecycle);
        let from = {
            let c = self.counts.lock();
            match (&c.unread, c.closing) {
                (Some(from), false) => from.clone(),
                _ => return Ok((0, false)),
            }
        };
        let tree = match from.index {
            Index::Schedule => &self.schedule,
            Index::DeadLetters => &self.dead_letters,
            Index::Ordering => &self.ordering,
        };
        // Counted apart, outside the counts' lock (a scrape does not wait for the
        // engine), into a few entries per destination: no allocation per entry (with
        // memory returned at once, a buffer of a chunk's entries was faulted in anew
        // every chunk, a third of the count's time).
        let mut found = QueueCounts::default();
        let mut last: Option<Bytes> = None;
        let mut read = 0;
        for item in tree.range(from.key.clone()..).take(chunk.max(1)) {
            let (key, value) = item?;
            match from.index {
                Index::Schedule => {
                    if let Some((dest, _, event)) = keys::split_schedule(&key) {
                        let retrying = value.first() == Some(&SCHEDULED_RETRYING);
                        let state =
                            if retrying { DeliveryState::Retrying } else { DeliveryState::Pending };
                        found.restore(dest, event, state);
                    }
                }
                Index::DeadLetters => {
                    if let Some((event, dest)) = keys::split_delivery(&key) {
                        found.restore(&dest, event, DeliveryState::Dead);
                    }
                }
                Index::Ordering => {
                    if let (Some(dest), Some(q)) =
                        (keys::split_order(&key), keys::decode_order(&value))
                    {
                        for _ in 1..q.len {
                            found.restore(&dest, q.head, DeliveryState::Held);
                        }
                    }
                }
            }
            last = Some(key);
            read += 1;
        }
        let mut c = self.counts.lock();
        c.counts.merge(found);
        c.unread = match last {
            Some(key) => Some(Place::after(from.index, &key)),
            None => from.index.next().map(Place::start_of),
        };
        let more = c.unread.is_some();
        if !more {
            self.counts.done.notify_all();
        }
        Ok((read, more))
    }
}

/// Whether the count ended with every index read (not stopped by a close).
fn counted_through(state: &Weak<EmbeddedState>) -> bool {
    state.upgrade().is_some_and(|s| s.counts.lock().unread.is_none())
}

/// Counts the first chunk's worth of index entries, then, if there is more, starts the
/// rest on its own thread, which holds the store only for a chunk at a time (a store
/// closed meanwhile is dropped, and the thread ends).
pub(super) fn start(state: &Arc<EmbeddedState>, pace: Pace) -> Result<(), StoreError> {
    let mut read = 0;
    while read < pace.chunk.max(1) {
        let (n, more) = state.count_chunk(pace.chunk)?;
        if !more {
            return Ok(());
        }
        read += n;
    }
    let weak: Weak<EmbeddedState> = Arc::downgrade(state);
    std::thread::Builder::new()
        .name("hookrelay-count".into())
        .spawn(move || count(&weak, pace, read))
        .map_err(|e| StoreError::Task(format!("cannot start the queue count's thread: {e}")))?;
    Ok(())
}

/// The count's loop: chunk after chunk until the indexes are read; a failed read is
/// logged and tried again (the store's own health decides whether it is failed).
fn count(state: &Weak<EmbeddedState>, pace: Pace, mut read: usize) {
    let started = Instant::now();
    loop {
        std::thread::sleep(pace.pause);
        let Some(s) = state.upgrade() else { return };
        match s.count_chunk(pace.chunk) {
            Ok((n, true)) => read += n,
            Ok((n, false)) => {
                read += n;
                break;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the queue indexes to count them; trying again in 1 s");
                drop(s);
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
    if !counted_through(state) {
        tracing::info!(entries = read, "the store closed before its queues were counted");
        return;
    }
    tracing::info!(
        entries = read,
        took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "queue counts read from the indexes behind the open"
    );
}

#[cfg(test)]
mod tests {
    use super::super::testutil;
    use super::super::{Engine, SCHEDULED_PENDING};
    use super::*;
    use crate::store::{DeliveryQueue, EventId, Upkeep};

    /// A store in `dir` whose schedule holds `n` pending deliveries to `a`, written
    /// into the index directly (the count reads only the indexes).
    fn queued(engine: Engine, dir: &std::path::Path, n: u64) {
        let store = testutil::open_on(engine, dir);
        for i in 1..=n {
            let key = keys::schedule("a", 5_000_000, EventId::new(i * 1_000_000));
            store.inner.schedule.insert(key, [SCHEDULED_PENDING]).unwrap();
        }
        store.inner.db.flush().unwrap();
        drop(store);
    }

    /// Slow enough that the test sees the count going: one entry every 20 ms.
    const SLOW: Pace = Pace { chunk: 1, pause: Duration::from_millis(20) };

    /// While the count goes the queue says so and its numbers are a lower bound;
    /// retention's question waits for the end and gets the whole answer; the counts end
    /// exact.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_queue_is_counted_behind_the_open_and_says_so_meanwhile() {
        for engine in [Engine::Sled, Engine::Redb] {
            let dir = tempfile::tempdir().unwrap();
            queued(engine, dir.path(), 40);
            let store = testutil::open_paced(engine, dir.path(), SLOW);
            let early = store.queue_stats("a").await.unwrap();
            assert!(early.counting && early.pending < 40, "{engine:?}: {early:?}");
            assert_eq!(store.open_destinations().await.unwrap(), ["a"], "{engine:?}");
            let done = store.queue_stats("a").await.unwrap();
            assert_eq!((done.counting, done.pending), (false, 40), "{engine:?}");
        }
    }

    /// A close stops the count and frees whoever waits for it (a stop must not wait
    /// for a large backlog to be counted); the next open counts it all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_close_stops_the_count_and_the_next_open_counts_again() {
        for engine in [Engine::Sled, Engine::Redb] {
            let dir = tempfile::tempdir().unwrap();
            queued(engine, dir.path(), 500);
            let store = std::sync::Arc::new(testutil::open_paced(engine, dir.path(), SLOW));
            let waiting = tokio::spawn({
                let store = store.clone();
                async move { store.open_destinations().await }
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(!waiting.is_finished(), "{engine:?}: answered before the count ended");
            let closed = Instant::now();
            store.close().await.unwrap();
            let answer = tokio::time::timeout(Duration::from_secs(5), waiting).await;
            let err = answer.expect("still waiting after the close").unwrap().unwrap_err();
            assert!(err.to_string().contains("closed before its queues were counted"), "{err}");
            assert!(
                closed.elapsed() < Duration::from_secs(2),
                "{engine:?}: {:?}",
                closed.elapsed()
            );
            drop(store);
            let again = testutil::open_on(engine, dir.path());
            let q = again.queue_stats("a").await.unwrap();
            assert_eq!((q.counting, q.pending), (false, 500), "{engine:?}");
        }
    }
}
