//! The dedup index of the embedded store (the `dedup` tree): its keys filed by when
//! they expire, so that the purge removes runs of neighbouring keys, in narrow
//! buckets, so that a checkpoint writes few pages for the keys of its period.
//!
//! Layout 3 (`keys::dedup`): `[bucket end µs: 8, big-endian][hash: 16]`, the value
//! `[original event id: 8][window end µs: 8]` as before. A key's **bucket** is a span
//! of time holding its window's end (`until`); the bucket's end files it
//! (`keys::dedup_bucket_end`). Why: layout 2 keyed an entry by its hash alone, so
//! each insert and each of the purge's deletes landed on a page of its own, and the
//! purge read the whole index every minute to find what had expired. On a large
//! store, after a burst, the purge's scattered deletes made redb's checkpoints write
//! a page per key and hold the writers for 46 ms (BENCHMARKS.md, "Checkpoints paced by
//! their own length"). Now:
//! - the purge takes the buckets whose end has passed and removes their keys in key
//!   order, reading nothing that has not expired;
//! - an insert lands among the keys of its own bucket, not of the whole index.
//!
//! **Narrow buckets.** Within a bucket the keys are in hash order, so inserts scatter
//! over its pages: a bucket as wide as the window (as first built) held 100,000 keys
//! at 200 callbacks/s, and a checkpoint wrote a page or two for each key inserted
//! since the last one (400 inserts: 3.4 MiB and 9.2 ms, against 0.6 MiB and 2.1 ms
//! into a small bucket; after a burst, millions of keys and worse; BENCHMARKS.md,
//! "Narrow dedup buckets"). So a bucket is a thirty-second of the window, and
//! the one being filled stays small. A window then spans 33 to 65 buckets, and each
//! has a membership filter in memory (`dedup/filter.rs`, about 10 bits a key): a
//! lookup reads the buckets whose filter may hold its hash, newest first, and about 1%
//! of the others. Filters are made as keys are written and, at the open, from the
//! keys of the buckets found (up to [`OPEN_SCAN_KEYS`]); a bucket past that scan, or
//! whose filter would go over [`FILTER_BUDGET`], is read by every lookup, as all were
//! before the filters.
//!
//! The price: the filters' memory (1.25 bytes a key in the window), and an expired
//! key stays until its bucket's end, up to a thirty-second of a window late. Lookups
//! compare `until` with the callback's receive time as before, so what is
//! deduplicated does not change.
//!
//! Invariant: every bucket end that files a key is in [`Buckets`], with no filter or
//! one that holds the key's hash, or a lookup would miss the key. Kept by: dispatch
//! (the only writer of dedup keys, under the lifecycle lock) adds a bucket and the
//! hash before it writes the key; a filter only grows (a key removed stays a false
//! positive); the purge forgets a bucket only under the lifecycle lock, once it found
//! it empty; the open reads them all, and a bucket's filter there holds every key it
//! read or the bucket has none.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use super::engine::{Tree, TxResult, TxTree};
use super::{keys, EmbeddedState, DEDUP};
use crate::lock::lock;
use crate::store::lifecycle::DedupEntry;
use crate::store::{hex, StoreError};
use filter::Filter;

mod filter;

/// The most the buckets' filters may hold in all: 16 MiB, 7 to 13 million keys with
/// their segments' slack (a 10-minute window at 12,000-22,000 callbacks/s, a day's at
/// 80-150/s). A bucket whose filter would take more is read by every lookup instead.
const FILTER_BUDGET: usize = 16 << 20;
/// The most keys the open reads to make the filters of the buckets it finds: a
/// 10-minute window at 400 callbacks/s (the 10 M store's restart to ready, the scan
/// included, stayed at 0.1 s). The buckets beyond it (after a burst) are read by every
/// lookup until they expire.
const OPEN_SCAN_KEYS: usize = 256 * 1024;

/// The buckets a store knows, each with its filter (`None`: every lookup reads it),
/// and the bytes the filters hold.
#[derive(Debug)]
struct Known {
    ends: BTreeMap<u64, Option<Filter>>,
    bytes: usize,
    /// The most `bytes` may be: [`FILTER_BUDGET`] but in tests.
    budget: usize,
}

/// The ends of the buckets that file at least one key (and perhaps a few that file
/// none any more, until the purge looks), what each may hold, and where dispatch's
/// lookups found keys.
#[derive(Debug)]
pub(super) struct Buckets {
    known: Mutex<Known>,
    /// The bucket each key a lookup found is filed under, while dispatch holds the
    /// lifecycle lock: a key it renews moves to a later bucket, and its old key is
    /// removed in the same transaction (one key per hash, as in layout 2).
    found: Mutex<HashMap<[u8; 16], u64>>,
}

impl Buckets {
    /// Every bucket of `tree` (layout 3) with its filter, made from the keys read
    /// (up to [`OPEN_SCAN_KEYS`]); past that, the buckets are found by seeking from
    /// one to the next (a read per bucket, not per key) and left without a filter.
    pub(super) fn read(tree: &Tree) -> Result<Self, StoreError> {
        Self::read_within(tree, OPEN_SCAN_KEYS, FILTER_BUDGET)
    }

    /// [`Buckets::read`], reading up to `scan` keys, the filters held to `budget`.
    fn read_within(tree: &Tree, mut scan: usize, budget: usize) -> Result<Self, StoreError> {
        let buckets = Self::within(budget);
        let mut from: Vec<u8> = Vec::new();
        loop {
            let Some(item) = tree.range(from.as_slice()..).next() else { break };
            let (key, _) = item?;
            let Some(end) = keys::dedup_bucket(&key) else {
                // Not a layout-3 key (the open migrated them all): stepped over.
                from = key.to_vec();
                from.push(0);
                continue;
            };
            // Filtered once every key was read into it; a bucket the scan ended in, or
            // reached after it ended, is read by every lookup.
            let mut complete = true;
            for item in tree.range(bucket_range(end)) {
                let (key, _) = item?;
                match keys::dedup_hash(&key) {
                    Some(hash) if scan > 0 => {
                        buckets.add(end, &hash);
                        scan -= 1;
                    }
                    _ => {
                        complete = false;
                        break;
                    }
                }
            }
            if !complete {
                buckets.unfilter(end);
            }
            // On from the end of this bucket's range: the next bucket's first key.
            match bucket_range(end).1 {
                Bound::Excluded(next) => from = next,
                _ => break,
            }
        }
        Ok(buckets)
    }

    /// Registers `hash` in the bucket ending at `end` before its key is written there
    /// (and as the open reads the keys): the bucket is left without a filter, read by
    /// every lookup, once its filter would go over the budget.
    fn add(&self, end: u64, hash: &[u8; 16]) {
        let mut known = lock(&self.known);
        let Known { ends, bytes, budget } = &mut *known;
        let members = ends.entry(end).or_insert_with(|| Some(Filter::default()));
        if let Some(filter) = members {
            if *bytes + filter.next_growth() <= *budget {
                *bytes += filter.insert(hash);
            } else {
                *bytes -= filter.bytes();
                *members = None;
            }
        }
    }

    /// Leaves the bucket ending at `end` without a filter: every lookup reads it.
    fn unfilter(&self, end: u64) {
        let mut known = lock(&self.known);
        if let Some(Some(filter)) = known.ends.insert(end, None) {
            known.bytes -= filter.bytes();
        }
    }

    /// Forgets the bucket ending at `end` (the purge found it empty).
    fn forget(&self, end: u64) {
        let mut known = lock(&self.known);
        if let Some(Some(filter)) = known.ends.remove(&end) {
            known.bytes -= filter.bytes();
        }
    }

    /// Forgets where earlier lookups found keys: at the start of a dispatch.
    pub(super) fn forget_found(&self) {
        lock(&self.found).clear();
    }

    /// No bucket known yet, the filters held to `budget`.
    fn within(budget: usize) -> Self {
        let known = Known { ends: BTreeMap::new(), bytes: 0, budget };
        Self { known: Mutex::new(known), found: Mutex::default() }
    }

    /// How many buckets are known.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        lock(&self.known).ends.len()
    }

    /// The buckets a lookup of `hash` reads: those whose filter may hold it, and those
    /// without one.
    #[cfg(test)]
    pub(super) fn read_by(&self, hash: &[u8; 16]) -> Vec<u64> {
        let known = lock(&self.known);
        let may = |f: &Option<Filter>| f.as_ref().is_none_or(|f| f.may_contain(hash));
        known.ends.iter().filter(|(_, f)| may(f)).map(|(end, _)| *end).collect()
    }

    /// How many buckets have no filter (read by every lookup).
    #[cfg(test)]
    pub(super) fn unfiltered(&self) -> usize {
        lock(&self.known).ends.values().filter(|f| f.is_none()).count()
    }

    /// The bytes the filters hold.
    #[cfg(test)]
    pub(super) fn filter_bytes(&self) -> usize {
        lock(&self.known).bytes
    }
}

/// The key range of the bucket ending at `end`.
fn bucket_range(end: u64) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let start = Bound::Included(end.to_be_bytes().to_vec());
    let stop = match end.checked_add(1) {
        Some(next) => Bound::Excluded(next.to_be_bytes().to_vec()),
        None => Bound::Unbounded,
    };
    (start, stop)
}

impl EmbeddedState {
    /// The entry of `hash` with the latest window end: the buckets are read from the
    /// latest, and a key renewed after its window ended files under a later bucket
    /// than the one it replaces (its new end is after the callback's receive time,
    /// the old one was not).
    pub(super) fn dedup_entry(&self, hash: &[u8; 16]) -> Result<Option<DedupEntry>, StoreError> {
        let known = lock(&self.dedup_buckets.known);
        for (end, filter) in known.ends.iter().rev() {
            if filter.as_ref().is_some_and(|f| !f.may_contain(hash)) {
                continue;
            }
            let key = keys::dedup(*end, hash);
            if let Some(value) = self.dedup.get(key)? {
                lock(&self.dedup_buckets.found).insert(*hash, *end);
                let entry = keys::decode_dedup(&value);
                if entry.is_none() {
                    // Taken as absent: the callback takes the key anew, over this entry.
                    let what = format!("the entry {} of the {DEDUP} tree", hex(&key));
                    let why = "its value does not decode: its callback is not deduplicated";
                    self.health.trouble(crate::store::Trouble::Corrupt, &what, &why);
                }
                return Ok(entry);
            }
        }
        Ok(None)
    }

    /// Writes `entries` into `tree` (dispatch's transaction, under the lifecycle
    /// lock), each under the bucket of its window's end as seen at `now_us`, the key
    /// it renews removed from its earlier bucket; returns how many keys it added.
    pub(super) fn write_dedup<'a>(
        &self,
        tree: &TxTree<'_>,
        entries: impl Iterator<Item = (&'a [u8; 16], &'a DedupEntry)>,
        now_us: u64,
    ) -> TxResult<i64> {
        let mut added = 0;
        // Copied, not taken: sled may run a transaction's body again.
        let found = lock(&self.dedup_buckets.found).clone();
        for (hash, entry) in entries {
            let end = keys::dedup_bucket_end(entry.until_us, now_us);
            if let Some(&old) = found.get(hash).filter(|&&old| old != end) {
                if tree.remove(keys::dedup(old, hash))?.is_some() {
                    added -= 1;
                }
            }
            self.dedup_buckets.add(end, hash);
            if tree.insert(keys::dedup(end, hash), keys::encode_dedup(entry))?.is_none() {
                added += 1;
            }
        }
        Ok(added)
    }

    /// Removes up to `limit` keys of the buckets that ended by `now_us` (every key in
    /// them expired), earliest bucket first and in key order, in one transaction made
    /// durable before it returns (on redb the pages a non-durable commit frees wait
    /// for the next durable one); returns how many. Reads only what it removes; a
    /// bucket it emptied is forgotten.
    pub(super) fn purge_dedup(&self, now_us: u64, limit: usize) -> Result<usize, StoreError> {
        let ended: Vec<u64> =
            lock(&self.dedup_buckets.known).ends.range(..=now_us).map(|(end, _)| *end).collect();
        let (mut chunk, mut emptied) = (Vec::new(), Vec::new());
        for end in ended {
            let want = limit.saturating_sub(chunk.len());
            if want == 0 {
                break;
            }
            let before = chunk.len();
            for item in self.dedup.range(bucket_range(end)).take(want) {
                chunk.push(item?.0);
            }
            if chunk.len() - before < want {
                emptied.push(end);
            }
        }
        let removed = if chunk.is_empty() {
            0
        } else {
            self.db.transaction(&[&self.dedup], |t| {
                let mut removed = 0;
                for key in &chunk {
                    // A key dispatch rewrote here meanwhile (a backlog's callback,
                    // whose window had ended) is expired too.
                    if t[0].remove(key)?.is_some() {
                        removed += 1;
                    }
                }
                Ok(removed)
            })?
        };
        self.dedup_count.fetch_sub(super::apply::signed(removed as u64), Ordering::Relaxed);
        if removed > 0 {
            self.durable()?;
        }
        if !emptied.is_empty() {
            // Forgotten only if still empty under the lifecycle lock: dispatch writes
            // under it, and may just have filed a backlog's key here.
            let _rules = lock(&self.lifecycle);
            for end in emptied {
                if self.dedup.range(bucket_range(end)).next().transpose()?.is_none() {
                    self.dedup_buckets.forget(end);
                }
            }
        }
        Ok(removed)
    }

    /// Moves the keys of layout 2 (the hash alone) under their buckets: at the open
    /// of a store of layout 2, before the version is bumped. Idempotent: a crash part
    /// way leaves some keys moved and the rest still to move, and the next open goes
    /// on. An entry whose value does not decode is dropped, as the purge of layout 2
    /// did (its callback's key may be dispatched twice). Returns how many moved.
    pub(super) fn dedup_from_v2(db: &super::engine::Db, now_us: u64) -> Result<u64, StoreError> {
        /// Keys moved per transaction: bounded memory for a large index.
        const CHUNK: usize = 1024;
        let tree = db.open_tree(DEDUP)?;
        let mut moved = 0;
        let mut from: Bound<Vec<u8>> = Bound::Unbounded;
        loop {
            let mut chunk = Vec::with_capacity(CHUNK);
            for item in tree.range::<Vec<u8>, _>((from.clone(), Bound::Unbounded)) {
                let (key, value) = item?;
                // Layout 3's keys are 24 bytes: they may sort among the old ones.
                if key.len() == 16 {
                    chunk.push((key.to_vec(), value.to_vec()));
                }
                from = Bound::Excluded(key.to_vec());
                if chunk.len() == CHUNK {
                    break;
                }
            }
            if chunk.is_empty() {
                return Ok(moved);
            }
            db.transaction(&[&tree], |t| {
                for (key, value) in &chunk {
                    t[0].remove(key)?;
                    let (Ok(hash), Some(entry)) =
                        (<[u8; 16]>::try_from(key.as_slice()), keys::decode_dedup(value))
                    else {
                        tracing::warn!(
                            key = %hex(key),
                            "an unreadable entry of the dedup index was dropped as the store \
                             was upgraded (a callback of its key may be dispatched twice)"
                        );
                        continue;
                    };
                    let end = keys::dedup_bucket_end(entry.until_us, now_us);
                    t[0].insert(keys::dedup(end, &hash), value.as_slice())?;
                }
                Ok(())
            })?;
            moved += chunk.len() as u64;
        }
    }
}

#[cfg(test)]
mod tests;
