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

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::keys;
use crate::store::lifecycle::{schedule_entry, Changes};
use crate::store::{
    resource_from_hex, DeliveryRecord, DeliveryState, EventId, QueueCounts, QueueStats, StoreError,
};

mod read;
#[cfg(test)]
mod tests;

pub(super) use self::read::start;

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
