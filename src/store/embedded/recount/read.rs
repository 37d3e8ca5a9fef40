//! The count itself: chunks read under the lifecycle lock, the inbox's records and the
//! queue indexes, and the thread that reads them behind the open.

use std::sync::atomic::Ordering as Atomic;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::super::codec::decode_meta;
use super::super::engine::{Bytes, Tree};
use super::super::ledger::{waiting_key, Waiting};
use super::super::{keys, EmbeddedState, RECORDS, SCHEDULED_RETRYING};
use super::{Index, Pace, Place, INBOX_WEIGHT};
use crate::store::{hex, DeliveryState, EventId, QueueCounts, StoreError};

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
        tree: &Tree,
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
pub(in crate::store::embedded) fn start(
    state: &Arc<EmbeddedState>,
    pace: Pace,
) -> Result<Option<std::thread::JoinHandle<()>>, StoreError> {
    let mut read = Read::default();
    while read.cost() < pace.chunk.max(1) {
        let (n, more) = state.count_chunk(pace.chunk)?;
        if !more {
            return Ok(None);
        }
        read.add(n);
    }
    let weak: Weak<EmbeddedState> = Arc::downgrade(state);
    let thread = std::thread::Builder::new()
        .name("hookrelay-count".into())
        .spawn(move || count(&weak, pace, read))
        .map_err(|e| StoreError::Task(format!("cannot start the count's thread: {e}")))?;
    Ok(Some(thread))
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
                let what = "cannot read the inbox or the queue indexes to count them; trying \
                            again in 1 s";
                s.health.trouble(crate::store::Trouble::Storage, what, &e);
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
