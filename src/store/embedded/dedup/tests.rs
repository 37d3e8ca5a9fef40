//! The dedup index's layout: buckets, lookups across them, the purge by bucket and
//! the upgrade of a layout-2 index, on both engines.

use proptest::prelude::*;

use super::super::{keys, testutil, EmbeddedState, Engine, SCHEMA_KEY};
use super::{Buckets, FILTER_BUDGET};
use crate::store::hex;
use crate::store::lifecycle::DedupEntry;
use crate::store::EventId;

/// A realistic clock: 2026, in µs.
const T0: u64 = 1_790_000_000_000_000;
const MINUTE: u64 = 60_000_000;

fn hash(i: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    // Spread like a hash: the high bytes vary.
    h[..8].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
    h[8..].copy_from_slice(&i.to_be_bytes());
    h
}

/// Files `entries` as dispatch does at `now_us`.
fn write(state: &EmbeddedState, entries: &[([u8; 16], DedupEntry)], now_us: u64) {
    state.dedup_buckets.forget_found();
    // What dispatch's lookups do before it writes: note where renewed keys are.
    for (h, _) in entries {
        state.dedup_entry(h).unwrap();
    }
    let added = state
        .db
        .transaction(&[&state.dedup], |t| {
            state.write_dedup(&t[0], entries.iter().map(|(h, e)| (h, e)), now_us)
        })
        .unwrap();
    state.dedup_count.fetch_add(added, std::sync::atomic::Ordering::Relaxed);
}

fn entry(id: u64, until_us: u64) -> DedupEntry {
    DedupEntry { original: EventId::new(id), until_us }
}

proptest! {
    /// A bucket ends after every window it files (so a bucket that ended holds only
    /// expired keys), and the keys of one window's callbacks fall into 65 buckets at
    /// most (what a lookup's filters are asked about).
    #[test]
    fn a_bucket_ends_after_its_keys_and_a_window_spans_65_at_most(
        now in T0..T0 + 1_000 * MINUTE,
        window in 1u64..100_000 * MINUTE,
        offsets in proptest::collection::vec(0u64..1_000_000_000, 1..50),
    ) {
        let mut ends = std::collections::BTreeSet::new();
        for offset in offsets {
            // Callbacks written over one window, each with the whole window ahead.
            let written = now + offset % window;
            let until = written + window;
            let end = keys::dedup_bucket_end(until, written);
            prop_assert!(end > until, "end {end} not after until {until}");
            ends.insert(end);
        }
        prop_assert!(ends.len() <= 65, "{} buckets for one window of {window} µs", ends.len());
    }

    /// The buckets' invariant with filters: whatever is added and forgotten, under any
    /// budget, a lookup of a hash reads every bucket it was added to (filtered or not),
    /// and the filters never hold more than the budget.
    #[test]
    fn a_lookup_reads_every_bucket_that_may_file_its_key(
        budget in 0usize..40_000,
        ops in proptest::collection::vec((0u64..8, 0u64..4_000, 0u8..50), 1..4_000),
    ) {
        let buckets = Buckets::within(budget);
        let mut model = std::collections::BTreeSet::new();
        for (end, n, forget) in ops {
            if forget == 0 {
                // The purge forgets only a bucket it found empty.
                model.retain(|&(e, _)| e != end);
                buckets.forget(end);
            } else {
                buckets.add(end, &hash(n));
                model.insert((end, n));
            }
            prop_assert!(buckets.filter_bytes() <= budget);
        }
        for (end, n) in model {
            prop_assert!(buckets.read_by(&hash(n)).contains(&end), "{n} in {end} missed");
        }
    }
}

/// Dispatches every 10 s over a window, 20 keys each (hashes `0..1_200`): a steady
/// rate, filed into some 36 narrow buckets.
fn a_window_of_dispatches(state: &EmbeddedState) {
    let window = 10 * MINUTE;
    for i in 0..60 {
        let at = T0 + i * 10_000_000;
        let batch: Vec<_> = (0..20)
            .map(|j| {
                let n = i * 20 + j;
                (hash(n), entry(n + 1, at + window))
            })
            .collect();
        write(state, &batch, at);
    }
}

/// Every key [`a_window_of_dispatches`] wrote is found, with its event.
fn every_dispatched_key_is_found(state: &EmbeddedState) {
    for n in 0..1_200 {
        let found = state.dedup_entry(&hash(n)).unwrap().map(|e| e.original);
        assert_eq!(found, Some(EventId::new(n + 1)), "{n}");
    }
}

/// How many buckets lookups of 2,000 hashes never written read in all.
fn reads_of_absent(buckets: &Buckets) -> usize {
    (10_000..12_000).map(|n| buckets.read_by(&hash(n)).len()).sum()
}

/// Every key of the store is in a bucket `buckets` reads for its hash.
fn every_key_is_read(state: &EmbeddedState, buckets: &Buckets) {
    for item in state.dedup.iter() {
        let (key, _) = item.unwrap();
        let (end, hash) = (keys::dedup_bucket(&key).unwrap(), keys::dedup_hash(&key).unwrap());
        assert!(buckets.read_by(&hash).contains(&end), "{} missed", hex(&key));
    }
}

/// A window's keys written at a steady rate fall into narrow buckets (a
/// thirty-second of the window or so), and a lookup reads few of them: the one that
/// files its key, and hardly any other; every key is found.
#[test]
fn narrow_buckets_are_filtered_so_that_a_lookup_reads_few() {
    for engine in [Engine::Sled, Engine::Redb] {
        let dir = tempfile::tempdir().unwrap();
        let store = testutil::open_on(engine, dir.path());
        let state = &store.inner;
        a_window_of_dispatches(state);
        let buckets = state.dedup_buckets.len();
        assert!((33..=66).contains(&buckets), "{engine:?}: {buckets} buckets");
        every_dispatched_key_is_found(state);
        let present: usize = (0..1_200).map(|n| state.dedup_buckets.read_by(&hash(n)).len()).sum();
        assert!(present < 1_300, "{engine:?}: {present} reads for 1,200 keys");
        let absent = reads_of_absent(&state.dedup_buckets);
        assert!(absent < 200, "{engine:?}: {absent} reads for 2,000 absent keys");
        assert!(state.dedup_buckets.filter_bytes() > 0);
        every_key_is_read(state, &state.dedup_buckets);
    }
}

/// The open makes the filters of the buckets it finds, so that a restarted relay's
/// lookups read as few; past its scan or its budget, the buckets it finds are read by
/// every lookup, and no key is missed either way.
#[test]
fn the_open_filters_the_buckets_it_finds_and_reads_the_rest() {
    for engine in [Engine::Sled, Engine::Redb] {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = testutil::open_on(engine, dir.path());
            a_window_of_dispatches(&store.inner);
        }
        let store = testutil::open_on(engine, dir.path());
        let state = &store.inner;
        assert_eq!(state.dedup_buckets.unfiltered(), 0, "{engine:?}: all within the scan");
        assert!(reads_of_absent(&state.dedup_buckets) < 200, "{engine:?}");
        every_dispatched_key_is_found(state);
        for (scan, budget) in [(500, FILTER_BUDGET), (usize::MAX, 4_000), (0, FILTER_BUDGET)] {
            let partial = Buckets::read_within(&state.dedup, scan, budget).unwrap();
            assert_eq!(partial.len(), state.dedup_buckets.len(), "{engine:?}");
            let unfiltered = partial.unfiltered();
            assert!(unfiltered > 0, "{engine:?} {scan} {budget}: every bucket filtered");
            assert!(partial.filter_bytes() <= budget);
            every_key_is_read(state, &partial);
        }
    }
}

/// A lookup finds a key in whichever bucket files it; a renewed key moves to its
/// new bucket (the old one removed, one key per hash) and is found there.
#[test]
fn lookups_find_keys_in_any_bucket_and_a_renewed_key_moves() {
    for engine in [Engine::Sled, Engine::Redb] {
        let dir = tempfile::tempdir().unwrap();
        let store = testutil::open_on(engine, dir.path());
        let state = &store.inner;
        let window = 10 * MINUTE;
        // Three dispatches, minutes apart: three buckets or more.
        for (i, at) in [T0, T0 + 4 * MINUTE, T0 + 8 * MINUTE].into_iter().enumerate() {
            let batch: Vec<_> = (0..100)
                .map(|j| {
                    let n = i as u64 * 100 + j;
                    (hash(n), entry(n + 1, at + window))
                })
                .collect();
            write(state, &batch, at);
        }
        assert!(state.dedup_buckets.len() >= 2, "{engine:?}: {}", state.dedup_buckets.len());
        for n in 0..300 {
            let found = state.dedup_entry(&hash(n)).unwrap();
            assert_eq!(found.map(|e| e.original), Some(EventId::new(n + 1)), "{engine:?} {n}");
        }
        assert_eq!(state.dedup_entry(&hash(999)).unwrap(), None);
        // Key 0's window ended; a callback 20 minutes on renews it.
        let later = T0 + 20 * MINUTE;
        write(state, &[(hash(0), entry(5_000, later + window))], later);
        assert_eq!(state.dedup_entry(&hash(0)).unwrap(), Some(entry(5_000, later + window)));
        assert_eq!(state.dedup.len().unwrap(), 300, "{engine:?}: the renewed key moved");
        assert_eq!(state.dedup_count.load(std::sync::atomic::Ordering::Relaxed), 300);
    }
}

/// The purge removes every key of the buckets that ended, across several chunks,
/// leaves every key whose window is still open, and forgets the buckets it emptied;
/// a step removes no more than it is asked to.
/// A backlog's key filed later in a bucket that ended is found, then purged.
#[test]
fn the_purge_removes_the_buckets_that_ended_and_nothing_live() {
    for engine in [Engine::Sled, Engine::Redb] {
        let dir = tempfile::tempdir().unwrap();
        let store = testutil::open_on(engine, dir.path());
        let state = &store.inner;
        let window = 10 * MINUTE;
        // 3,000 keys whose windows end around T0 (more than a chunk per bucket) ...
        let old: Vec<_> = (0..3_000).map(|n| (hash(n), entry(n + 1, T0 + n * 1_000))).collect();
        write(state, &old, T0 - window);
        // ... and 2,000 whose windows end an hour on.
        let live: Vec<_> =
            (3_000..5_000).map(|n| (hash(n), entry(n + 1, T0 + 60 * MINUTE + n))).collect();
        write(state, &live, T0 + 50 * MINUTE);
        let buckets = state.dedup_buckets.len();
        // Nothing has ended yet just after the first windows end: their bucket has not.
        assert_eq!(state.purge_dedup(T0, 512).unwrap(), 0, "{engine:?}");
        // In steps of at most 512 keys, each a write of its own, across buckets.
        let steps: Vec<usize> = std::iter::from_fn(|| {
            Some(state.purge_dedup(T0 + 11 * MINUTE, 512).unwrap()).filter(|&n| n > 0)
        })
        .collect();
        assert_eq!(steps, [512, 512, 512, 512, 512, 440], "{engine:?}");
        assert!(state.dedup_buckets.len() < buckets, "{engine:?}: emptied buckets forgotten");
        assert_eq!(state.dedup.len().unwrap(), 2_000, "{engine:?}");
        assert_eq!(state.dedup_count.load(std::sync::atomic::Ordering::Relaxed), 2_000);
        for n in (0..5_000).step_by(7) {
            let found = state.dedup_entry(&hash(n)).unwrap().map(|e| e.original.raw());
            assert_eq!(found, (n >= 3_000).then_some(n + 1), "{engine:?} {n}");
        }
        // A backlog: a callback received long ago, dispatched now, files its key in a
        // bucket that ended. It is found until the next purge.
        write(state, &[(hash(7), entry(9_000, T0 + 1))], T0 + 12 * MINUTE);
        assert_eq!(state.dedup_entry(&hash(7)).unwrap(), Some(entry(9_000, T0 + 1)));
        assert_eq!(state.purge_dedup(T0 + 12 * MINUTE, 512).unwrap(), 1, "{engine:?}");
        assert_eq!(state.dedup_entry(&hash(7)).unwrap(), None);
    }
}

/// A store of layout 2 (keys by hash alone) is upgraded at its next open: every key
/// moved under its bucket and found there, an unreadable one dropped, keys a crashed
/// upgrade already moved kept, and the version bumped.
#[test]
fn a_layout_2_store_is_upgraded_at_open_and_keeps_its_keys() {
    for engine in [Engine::Sled, Engine::Redb] {
        let dir = tempfile::tempdir().unwrap();
        let window = 10 * MINUTE;
        let now = crate::clock::now_us();
        {
            let store = testutil::open_on(engine, dir.path());
            let state = &store.inner;
            for n in 0..2_500u64 {
                let e = entry(n + 1, now + window - n);
                if n % 10 == 0 {
                    // Moved by an upgrade that crashed before the version was bumped.
                    let end = keys::dedup_bucket_end(e.until_us, now);
                    state.dedup.insert(keys::dedup(end, &hash(n)), keys::encode_dedup(&e)).unwrap();
                } else {
                    state.dedup.insert(hash(n), keys::encode_dedup(&e)).unwrap();
                }
            }
            state.dedup.insert(hash(9_999), b"not an entry").unwrap();
            state.meta.insert(SCHEMA_KEY, b"2").unwrap();
            state.db.flush().unwrap();
        }
        let store = testutil::open_on(engine, dir.path());
        let state = &store.inner;
        assert_eq!(state.meta.get(SCHEMA_KEY).unwrap().as_deref(), Some(&b"3"[..]));
        assert_eq!(state.dedup.len().unwrap(), 2_500, "{engine:?}");
        assert!(
            state.dedup.iter().all(|item| item.unwrap().0.len() == 24),
            "{engine:?}: a key of layout 2 left"
        );
        for n in 0..2_500u64 {
            assert_eq!(
                state.dedup_entry(&hash(n)).unwrap(),
                Some(entry(n + 1, now + window - n)),
                "{engine:?} {n}"
            );
        }
        assert_eq!(state.dedup_entry(&hash(9_999)).unwrap(), None);
        assert_eq!(
            state.purge_dedup(now + 3 * window, usize::MAX).unwrap(),
            2_500,
            "{engine:?}: every key purged once its bucket ended"
        );
    }
}
