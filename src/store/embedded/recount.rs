//! The inbox and queue counts, counted again behind the open. They live in memory (a
//! scrape or a listing reads them instead of walking the records and the schedule),
//! so each open counts them from what is stored; done before the relay was ready,
//! that cost seconds per million deliveries waiting (2.6 s at a million pending on
//! redb, so ~25 s at ten) and per hundred thousand events a flood left undispatched
//! (7.9 s with 1.14 M). The open now counts one chunk ([`Pace::chunk`] entries: a
//! short inbox and queue are counted before it returns) and a thread reads the rest a
//! chunk at a time while the relay takes callbacks, dispatches and delivers (ready in
//! 0.09 s with 5.3 M pending, counted 1.6 s later, measured: BENCHMARKS.md). A close
//! stops it.
//!
//! What it counts: the inbox (the events the dispatch cursor has not passed at open
//! that still await dispatch: their number and the audit ledger's `waiting` tally),
//! then each destination's queue from the indexes.
//!
//! Why the count is exact with writes going on meanwhile:
//! - every dispatch and delivery change is applied under the lifecycle lock
//!   (`apply.rs`), and the count reads each chunk under it too, so a chunk never sees
//!   half a change;
//! - each counted event or delivery sits at one [`Place`]: an event in the inbox at
//!   its record, a delivery at its schedule entry (pending, retrying), its dead letter,
//!   or its resource's ordering queue (held);
//! - the count reads the places in one order and remembers the first it has not read
//!   (`unread`). A change is counted as it is applied only for the places before that
//!   mark; a place at or after it is read as it stands when the count gets there. An
//!   event appended after the open is above every place the count reads
//!   ([`Counting::inbox_through`]): it is counted as it is appended and dispatched.
//!
//! While counting, [`QueueStats::counting`] and [`InboxStats::counting`](crate::store::InboxStats::counting) say so (the
//! numbers are then a lower bound); [`Counts::open_destinations`] waits for the end
//! (retention must not take a destination for empty because its deliveries are not
//! counted yet), and [`Counts::wait_for_inbox`] for the inbox (an audit must not read
//! events not counted yet as missing).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use std::sync::atomic::Ordering as Atomic;

use super::codec::decode_meta;
use super::engine::Bytes;
use super::ledger::{waiting_key, Waiting};
use super::{keys, EmbeddedState, RECORDS, SCHEDULED_RETRYING};
use crate::store::lifecycle::{schedule_entry, Changes};
use crate::store::{
    hex, resource_from_hex, DeliveryRecord, DeliveryState, EventId, QueueCounts, QueueStats,
    StoreError,
};

/// What the count reads, in the order it reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Index {
    /// The records from the dispatch cursor at open to the last event then.
    Inbox,
    Schedule,
    DeadLetters,
    Ordering,
}

/// What reading one inbox record costs against one index entry (its value with the
/// body, the outcome looked up, the meta parsed for the tally: ~7 µs against ~0.3 µs):
/// a chunk reads [`Pace::chunk`] index entries or this many times fewer records, so a
/// write waits about as long behind either.
const INBOX_WEIGHT: usize = 20;

impl Index {
    /// The index read after this one.
    fn next(self) -> Option<Self> {
        match self {
            Self::Inbox => Some(Self::Schedule),
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

    /// An event's place in the inbox.
    fn inbox(id: EventId) -> Self {
        Self { index: Index::Inbox, key: id.to_key().to_vec() }
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

/// The counts and how far the count behind the open has read. (The inbox's own
/// counts, its number and `waiting` tally, are the store's: appends move them without
/// the lifecycle lock.)
#[derive(Debug)]
struct Counting {
    counts: QueueCounts,
    /// The first place not read yet; `None` once every index is read.
    unread: Option<Place>,
    /// The last event at open: the inbox is read up to it, and every later event is
    /// counted as it is appended.
    inbox_through: EventId,
    /// The store is closing: the count stops, and no one waits for it any more.
    closing: bool,
}

impl Counting {
    /// Whether the inbox is read through: its counts are exact from here.
    fn inbox_counted(&self) -> bool {
        self.unread.as_ref().is_none_or(|unread| unread.index > Index::Inbox)
    }

    /// Whether every index is read: the queue counts are exact from here.
    fn queues_counted(&self) -> bool {
        self.unread.is_none()
    }

    /// Whether event `id` leaving the inbox is counted as it is dispatched: appended
    /// after the open, or read by the count already (one not read yet is not counted
    /// when the count gets there: it has its outcome then).
    fn counts_dispatch_now(&self, id: EventId) -> bool {
        id > self.inbox_through
            || self.unread.as_ref().is_none_or(|unread| Place::inbox(id) < *unread)
    }

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
    /// Counts to be read (by [`start`]), an empty inbox until [`Counts::inbox_between`]
    /// says where it is.
    pub(super) fn uncounted() -> Self {
        let counting = Counting {
            counts: QueueCounts::default(),
            unread: Some(Place::start_of(Index::Schedule)),
            inbox_through: EventId::new(0),
            closing: false,
        };
        Self { state: Mutex::new(counting), done: Condvar::new() }
    }

    /// At open, before the count starts: the inbox is read from `first` (the event after
    /// the dispatch cursor) through `last` (the last event stored).
    pub(super) fn inbox_between(&self, first: EventId, last: EventId) {
        let mut c = self.lock();
        c.unread = Some(if first <= last {
            Place::inbox(first)
        } else {
            Place::start_of(Index::Schedule)
        });
        c.inbox_through = last;
    }

    fn lock(&self) -> MutexGuard<'_, Counting> {
        crate::lock::lock(&self.state)
    }

    /// Waits until `counted` holds of the count, or the store closes (an error that
    /// says `what` was not counted).
    fn wait_for(
        &self,
        counted: fn(&Counting) -> bool,
        what: &str,
    ) -> Result<MutexGuard<'_, Counting>, StoreError> {
        let c = self
            .done
            .wait_while(self.lock(), |c| !counted(c) && !c.closing)
            .unwrap_or_else(PoisonError::into_inner);
        if !counted(&c) {
            return Err(StoreError::Task(format!(
                "the store closed before its {what} counted; the next open counts again"
            )));
        }
        Ok(c)
    }

    /// Of the events `changes` dispatch, those whose leaving the inbox is counted now
    /// (under the lifecycle lock, as they are applied).
    pub(super) fn dispatches_counted_now(&self, changes: &Changes) -> Vec<EventId> {
        let c = self.lock();
        changes.dispatched.keys().copied().filter(|id| c.counts_dispatch_now(*id)).collect()
    }

    /// Whether the inbox's counts are still being read: they are a lower bound.
    pub(super) fn inbox_counting(&self) -> bool {
        !self.lock().inbox_counted()
    }

    /// Waits until the inbox is counted (an audit must not take events not counted yet
    /// for missing); an error if the store closes first. The caller must not hold the
    /// lifecycle lock (the count takes it).
    pub(super) fn wait_for_inbox(&self) -> Result<(), StoreError> {
        self.wait_for(Counting::inbox_counted, "inbox was").map(drop)
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
        QueueStats { counting: !c.queues_counted(), ..c.counts.stats(dest) }
    }

    /// Destinations with a delivery still to make, once the count is done (waits for
    /// it: a destination not counted yet is not empty); an error if the store closes
    /// first.
    pub(super) fn open_destinations(&self) -> Result<Vec<String>, StoreError> {
        let c = self.wait_for(Counting::queues_counted, "queues were")?;
        Ok(c.counts.open_destinations())
    }

    /// Stops the count (at its next chunk) and wakes whoever waits for it: the store is
    /// closing, and a count of a large backlog must not hold the stop up.
    pub(super) fn close(&self) {
        self.lock().closing = true;
        self.done.notify_all();
    }
}

/// What a count has read so far.
#[derive(Clone, Copy, Debug, Default)]
struct Read {
    /// Inbox records.
    records: usize,
    /// Queue index entries.
    entries: usize,
}

impl Read {
    /// What it cost, in index entries (see [`INBOX_WEIGHT`]).
    fn cost(self) -> usize {
        self.records.saturating_mul(INBOX_WEIGHT).saturating_add(self.entries)
    }

    fn add(&mut self, other: Self) {
        self.records += other.records;
        self.entries += other.entries;
    }
}

impl EmbeddedState {
    /// Reads up to `chunk` index entries (or [`INBOX_WEIGHT`] times fewer inbox
    /// records) from where the count stands, under the lifecycle lock, and counts them.
    /// Returns what it read and whether there is more to read.
    fn count_chunk(&self, chunk: usize) -> Result<(Read, bool), StoreError> {
        let _rules = crate::lock::lock(&self.lifecycle);
        let (from, through) = {
            let c = self.counts.lock();
            match (&c.unread, c.closing) {
                (Some(from), false) => (from.clone(), c.inbox_through),
                _ => return Ok((Read::default(), false)),
            }
        };
        let queue = |tree, restore| -> Result<(Read, Option<Place>), StoreError> {
            let (entries, unread) = self.count_queue(tree, &from, chunk, restore)?;
            Ok((Read { records: 0, entries }, unread))
        };
        let (read, unread) = match from.index {
            Index::Inbox => {
                let limit = (chunk / INBOX_WEIGHT).max(1);
                let (records, unread) = self.count_inbox(&from.key, through, limit)?;
                (Read { records, entries: 0 }, unread)
            }
            Index::Schedule => queue(&self.schedule, scheduled)?,
            Index::DeadLetters => queue(&self.dead_letters, dead)?,
            Index::Ordering => queue(&self.ordering, held)?,
        };
        let mut c = self.counts.lock();
        let inbox_done = !c.inbox_counted();
        c.unread = unread;
        let inbox_done = inbox_done && c.inbox_counted();
        let more = c.unread.is_some();
        if inbox_done || !more {
            self.counts.done.notify_all();
        }
        Ok((read, more))
    }

    /// Counts up to `limit` inbox records from `from` through `through` into the inbox's
    /// number and `waiting` tally. Returns how many it read and the place after them.
    fn count_inbox(
        &self,
        from: &[u8],
        through: EventId,
        limit: usize,
    ) -> Result<(usize, Option<Place>), StoreError> {
        let start = self.ledger_start();
        let (mut found, mut tally, mut read) = (0, Waiting::new(), 0);
        let mut last = None;
        for item in self.records.range(from.to_vec()..=through.to_key().to_vec()).take(limit) {
            let (key, value) = item?;
            let corrupt = |reason| StoreError::Corrupt { table: RECORDS, key: hex(&key), reason };
            let id = EventId::from_key(&key).ok_or_else(|| corrupt("key is not 8 bytes".into()))?;
            if self.awaits_dispatch(&key, &value)? {
                found += 1;
                if id >= start {
                    let meta = decode_meta(&value).map_err(corrupt)?;
                    *tally.entry(waiting_key(id, &meta)).or_insert(0) += 1;
                }
            }
            last = Some(id);
            read += 1;
        }
        // Added before the mark moves past them (under the lifecycle lock, so no
        // dispatch of theirs comes between): once the mark says the inbox is counted, a
        // reader finds them.
        self.inbox_count.fetch_add(found, Atomic::Relaxed);
        let mut waiting = crate::lock::lock(&self.waiting);
        for (key, n) in tally {
            *waiting.entry(key).or_insert(0) += n;
        }
        waiting.retain(|_, n| *n != 0);
        drop(waiting);
        let unread = match last {
            Some(id) if read == limit && id < through => {
                Some(Place::inbox(EventId::new(id.raw().saturating_add(1))))
            }
            _ => Index::Inbox.next().map(Place::start_of),
        };
        Ok((read, unread))
    }

    /// Counts up to `chunk` entries of `tree`, the queue index `from` is in, from
    /// there, into the queue counts, each by `restore`. Returns how many it read and the
    /// place after them.
    fn count_queue(
        &self,
        tree: &super::engine::Tree,
        from: &Place,
        chunk: usize,
        restore: fn(&mut QueueCounts, &[u8], &[u8]),
    ) -> Result<(usize, Option<Place>), StoreError> {
        // Counted apart, outside the counts' lock (a scrape does not wait for the
        // engine), into a few entries per destination: no allocation per entry (with
        // memory returned at once, a buffer of a chunk's entries was faulted in anew
        // every chunk, a third of the count's time).
        let mut found = QueueCounts::default();
        let mut last: Option<Bytes> = None;
        let mut read = 0;
        for item in tree.range(from.key.clone()..).take(chunk.max(1)) {
            let (key, value) = item?;
            restore(&mut found, &key, &value);
            last = Some(key);
            read += 1;
        }
        self.counts.lock().counts.merge(found);
        let unread = match last {
            Some(key) => Some(Place::after(from.index, &key)),
            None => from.index.next().map(Place::start_of),
        };
        Ok((read, unread))
    }
}

/// Counts a schedule entry: a pending or retrying delivery.
fn scheduled(found: &mut QueueCounts, key: &[u8], value: &[u8]) {
    if let Some((dest, _, event)) = keys::split_schedule(key) {
        let retrying = value.first() == Some(&SCHEDULED_RETRYING);
        let state = if retrying { DeliveryState::Retrying } else { DeliveryState::Pending };
        found.restore(dest, event, state);
    }
}

/// Counts a dead letter.
fn dead(found: &mut QueueCounts, key: &[u8], _: &[u8]) {
    if let Some((event, dest)) = keys::split_delivery(key) {
        found.restore(&dest, event, DeliveryState::Dead);
    }
}

/// Counts a resource's ordering queue: every delivery after its head is held.
fn held(found: &mut QueueCounts, key: &[u8], value: &[u8]) {
    if let (Some(dest), Some(q)) = (keys::split_order(key), keys::decode_order(value)) {
        for _ in 1..q.len {
            found.restore(&dest, q.head, DeliveryState::Held);
        }
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
    let mut read = Read::default();
    while read.cost() < pace.chunk.max(1) {
        let (n, more) = state.count_chunk(pace.chunk)?;
        if !more {
            return Ok(());
        }
        read.add(n);
    }
    let weak: Weak<EmbeddedState> = Arc::downgrade(state);
    std::thread::Builder::new()
        .name("hookrelay-count".into())
        .spawn(move || count(&weak, pace, read))
        .map_err(|e| StoreError::Task(format!("cannot start the count's thread: {e}")))?;
    Ok(())
}

/// The count's loop: chunk after chunk until the indexes are read; a failed read is
/// logged and tried again (the store's own health decides whether it is failed).
fn count(state: &Weak<EmbeddedState>, pace: Pace, mut read: Read) {
    let started = Instant::now();
    loop {
        std::thread::sleep(pace.pause);
        let Some(s) = state.upgrade() else { return };
        match s.count_chunk(pace.chunk) {
            Ok((n, more)) => {
                read.add(n);
                if !more {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the inbox or the queue indexes to count them; trying again in 1 s");
                drop(s);
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
    if !counted_through(state) {
        tracing::info!(
            inbox_records = read.records,
            index_entries = read.entries,
            "the store closed before its inbox and queues were counted"
        );
        return;
    }
    tracing::info!(
        inbox_records = read.records,
        index_entries = read.entries,
        took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "the inbox and queues counted behind the open"
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

    /// The inbox is counted behind the open too: meanwhile it says so, with a lower
    /// bound; events dispatched before the count reads them leave it once (not counted,
    /// and not taken off); the audit waits for the count and balances; the counts end
    /// exact.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_inbox_is_counted_behind_the_open_and_the_audit_waits_for_it() {
        use crate::store::conformance::{plan, received};
        use crate::store::{EventLog, SharedStore};
        for engine in [Engine::Sled, Engine::Redb] {
            let dir = tempfile::tempdir().unwrap();
            let store = testutil::open_on(engine, dir.path());
            for i in 1..=40 {
                store.append(received("demo", "A", i * 1_000_000, "{}")).await.unwrap();
            }
            store.close().await.unwrap();
            drop(store);
            let store: SharedStore =
                std::sync::Arc::new(testutil::open_paced(engine, dir.path(), SLOW));
            let early = store.inbox().await.unwrap();
            assert!(early.counting && early.events < 40, "{engine:?}: {early:?}");
            // The last ten, which the count has not read yet, dispatched (unrouted).
            let pending = store.pending(40).await.unwrap();
            assert_eq!(pending.len(), 40, "{engine:?}");
            let plans = pending[30..].iter().map(|p| plan(p.id, 1, &[])).collect();
            store.dispatch(plans, 50_000_000).await.unwrap();
            let audit = crate::audit::read(&store, 0, 1_000, None).await.unwrap();
            assert!(audit.balanced, "{engine:?}: {:?}", audit.imbalances);
            let waiting: i64 = audit.events.iter().map(|e| e.waiting).sum();
            let received: i64 = audit.events.iter().map(|e| e.received).sum();
            assert_eq!((received, waiting), (40, 30), "{engine:?}");
            let done = store.inbox().await.unwrap();
            assert_eq!((done.counting, done.events), (false, 30), "{engine:?}");
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
