//! How often the embedded engine flushes on its own (sled) or checkpoints (redb):
//! `storage.flush_interval`, except where a durable relay's checkpoints are paced by
//! their own length ([`Pacing`]).
//!
//! On redb in `durable` mode each write is made durable by the redo log's own
//! `fdatasync` before it returns; a checkpoint only bounds the log (and so what a
//! restart after a crash applies again, which the 1 MiB trigger bounds as well), and
//! every writer, acks included, waits while one runs. Its length is a fixed part (the
//! durable commit's syncs, ~5 ms on the bench machine) and a part that grows with the
//! pages written since the last one. How many pages that is depends on the store:
//! - on a small store the same few pages are written again and again, so a checkpoint
//!   every 5 s takes about as long as one every 500 ms, and a long period writes a third
//!   less and stalls writers six times less often (BENCHMARKS.md, "Checkpoints out of
//!   the ack's tail");
//! - on a large one whose dedup index takes scattered writes (each callback's key, and
//!   the purge's deletes of expired keys after a burst), the pages grow with the period:
//!   at 2 M events a 5 s period made 46 ms checkpoints and a p99 ack of 46.5 ms at
//!   200/s, 500 ms made 11.5 ms ones and 11.4 ms (BENCHMARKS.md, "Checkpoints paced by
//!   their own length"). The dedup index's narrow buckets (`dedup.rs`) have since made
//!   a callback's key land among few pages: right after a 10 M fill a checkpoint
//!   wrote 2.6 MiB in 7.3 ms, where it wrote 10 MiB in 39 ms before (BENCHMARKS.md,
//!   "Narrow dedup buckets"); the pacing still guards a store whose pages grow with
//!   the period.
//!
//! A checkpoint's fixed part grows with the store too: each durable commit saves redb's
//! allocator state, a bitmap of every page of the file (about 0.5 MiB written per 4 GiB
//! region). On a 10 M-event store (12 GiB) a checkpoint writes 2.1-3.7 MiB however
//! short its period, 7.5-11 ms, and a period of 2 s costs a few ms more than one of
//! 500 ms (BENCHMARKS.md, "The 10 M tail is the store's, not the build's").
//!
//! So the period follows what the checkpoints take, measured against what one at the
//! floor takes (the fixed part and the floor's own pages): after one that held the
//! writers longer than twice that (and longer than [`STALL_BUDGET`]) it drops to
//! `flush_interval` at once (a burst of scattered writes is when the next would be
//! longer still); after one within it, the period doubles, up to [`LONGEST_PERIOD`].
//! A store whose checkpoints stay short keeps the longest period; one whose
//! checkpoints grow with the period climbs from the floor until a checkpoint costs
//! twice one at the floor, and starts again from there; one whose checkpoints are
//! mostly their fixed part stays long, where that part is paid least often. After a
//! quiet spell (short checkpoints) the first busy one may be long, bounded by the 1 MiB
//! trigger, and the next ones are short again.

use std::time::Duration;

use super::Engine;

/// The least a checkpoint may hold the writers before the period drops to the floor:
/// about twice the fixed cost of a durable redb commit of a small store on the bench
/// machine's disk, so that a checkpoint's own pages cost at most as much as its syncs.
/// A store whose checkpoints take longer even at the floor is measured there instead
/// ([`Pacing::checkpointed`]).
const STALL_BUDGET: Duration = Duration::from_millis(10);

/// The longest period between a durable relay's checkpoints: what a small store's
/// checkpoints come down to (the 1 MiB trigger then comes first at 200/s, every ~3 s).
const LONGEST_PERIOD: Duration = Duration::from_secs(5);

/// The period of redb's checkpoints (or the engine's flush), and how it moves with
/// what each checkpoint took. A pure state machine: the checkpointer feeds it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pacing {
    period: Duration,
    /// The shortest and longest the period may be: equal when it is fixed.
    floor: Duration,
    ceiling: Duration,
    /// What the last checkpoint made at the floor took (zero before one): the
    /// checkpoint's fixed part on this store, and the floor's own pages.
    at_floor: Duration,
}

impl Pacing {
    /// The engine's pacing: `flush_interval` for sled and for `buffered` mode (what
    /// makes its writes durable); on redb in `durable` mode, paced between
    /// `flush_interval` and [`LONGEST_PERIOD`], starting at the longest (a small store's
    /// checkpoints keep it there; a large one's first long checkpoint brings it down).
    pub(crate) fn of(engine: Engine, flush_interval: Duration, durable: bool) -> Self {
        match engine {
            Engine::Redb if durable => {
                let ceiling = flush_interval.max(LONGEST_PERIOD);
                Pacing { period: ceiling, floor: flush_interval, ceiling, at_floor: Duration::ZERO }
            }
            _ => Pacing::fixed(flush_interval),
        }
    }

    /// Always `period`.
    pub(crate) fn fixed(period: Duration) -> Self {
        Pacing { period, floor: period, ceiling: period, at_floor: Duration::ZERO }
    }

    /// How long after the last checkpoint the next one is due.
    pub(crate) fn period(&self) -> Duration {
        self.period
    }

    /// The shortest the period may become: how often the checkpointer must look.
    pub(crate) fn shortest(&self) -> Duration {
        self.floor
    }

    /// After a checkpoint that held the writers for `took`, made `self.period()` after
    /// the last: the floor when it took longer than twice a checkpoint at the floor
    /// (and longer than [`STALL_BUDGET`]): fewer pages each from now on; else twice as
    /// late, up to the ceiling. One at the floor sets that measure and never exceeds
    /// it, so the period climbs from the floor until a checkpoint costs twice as much.
    pub(crate) fn checkpointed(&mut self, took: Duration) {
        if self.period == self.floor {
            self.at_floor = took;
        }
        let budget = STALL_BUDGET.max(self.at_floor.saturating_mul(2));
        self.period = if took > budget {
            self.floor
        } else {
            self.period.saturating_mul(2).min(self.ceiling)
        };
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::super::{testutil, EmbeddedOptions, EmbeddedStore};
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    proptest! {
        /// On any store whose checkpoints grow with their period no faster than in
        /// proportion ([`model`]), no checkpoint after the first at the floor holds the
        /// writers longer than twice the most a checkpoint at the floor may take before
        /// the period drops: the budget at the floor times two, the cost of the climb.
        #[test]
        fn no_checkpoint_exceeds_twice_its_budget(fixed_ms in 0u32..40, per_s_ms in 0u32..60) {
            let floor = model(fixed_ms, per_s_ms, 500 * MS);
            let budget = STALL_BUDGET.max(floor * 2);
            for period in periods_of(fixed_ms, per_s_ms) {
                let took = model(fixed_ms, per_s_ms, period);
                prop_assert!(took <= budget * 2, "{took:?} at {period:?}, budget {budget:?}");
            }
        }

        /// Whatever the checkpoints take, the period stays within `flush_interval` and
        /// the longest; a fixed pacing never moves.
        #[test]
        fn the_period_stays_within_its_bounds(
            interval_ms in 1u32..20_000,
            durable in any::<bool>(),
            took_ms in proptest::collection::vec(0u32..200, 0..50),
        ) {
            let interval = MS * interval_ms;
            let mut pacing = Pacing::of(Engine::Redb, interval, durable);
            let mut sled = Pacing::of(Engine::Sled, interval, durable);
            for took in took_ms {
                pacing.checkpointed(MS * took);
                sled.checkpointed(MS * took);
                prop_assert!(pacing.period() >= pacing.shortest());
                prop_assert_eq!(pacing.shortest(), interval);
                prop_assert!(pacing.period() <= interval.max(LONGEST_PERIOD));
                if !durable {
                    prop_assert_eq!(pacing.period(), interval);
                }
                prop_assert_eq!(sled.period(), interval);
            }
        }
    }

    /// A long checkpoint brings the period down to `flush_interval` at once; from there
    /// it climbs while a checkpoint takes at most twice one at the floor (the budget
    /// at least), back to the longest.
    #[test]
    fn a_long_checkpoint_brings_the_next_sooner_and_short_ones_later() {
        let mut pacing = Pacing::of(Engine::Redb, 500 * MS, true);
        assert_eq!(pacing.period(), LONGEST_PERIOD);
        pacing.checkpointed(STALL_BUDGET);
        assert_eq!(pacing.period(), LONGEST_PERIOD, "the budget itself is within it");
        pacing.checkpointed(46 * MS);
        assert_eq!(pacing.period(), 500 * MS);
        pacing.checkpointed(11 * MS);
        assert_eq!(pacing.period(), 1_000 * MS, "one at the floor is within twice itself");
        pacing.checkpointed(23 * MS);
        assert_eq!(pacing.period(), 500 * MS, "over twice the one at the floor (11 ms)");
        let periods: Vec<_> = (0..5)
            .map(|_| {
                pacing.checkpointed(7 * MS);
                pacing.period().as_millis()
            })
            .collect();
        assert_eq!(periods, [1_000, 2_000, 4_000, 5_000, 5_000]);
    }

    /// A checkpoint of `fixed_ms` plus `per_s_ms` for each second of its period: how
    /// long one takes on a store, to the µs.
    fn model(fixed_ms: u32, per_s_ms: u32, period: Duration) -> Duration {
        let per_s = u64::from(per_s_ms);
        MS * fixed_ms + Duration::from_micros(per_s * period.as_millis() as u64)
    }

    /// The periods the pacing goes through after a first long checkpoint, on a store
    /// whose checkpoints follow [`model`]; from 500 ms to 5 s, 40 checkpoints.
    fn periods_of(fixed_ms: u32, per_s_ms: u32) -> Vec<Duration> {
        let mut pacing = Pacing::of(Engine::Redb, 500 * MS, true);
        pacing.checkpointed(Duration::from_secs(1));
        (0..40)
            .map(|_| {
                let period = pacing.period();
                pacing.checkpointed(model(fixed_ms, per_s_ms, period));
                period
            })
            .collect()
    }

    /// A store whose checkpoints are mostly their fixed part (a 10 M-event store: 8 ms
    /// of allocator state and syncs, 2 ms per second of pages) climbs to the longest
    /// period and stays: it pays the fixed part a tenth as often as at the floor. One
    /// whose checkpoints grow with the period (3 ms and 10 ms per second) climbs to
    /// where one costs twice one at the floor (2 s: 23 ms against 8) and starts again.
    #[test]
    fn the_period_rests_where_the_fixed_part_is_paid_least_often_within_twice_the_floor() {
        let large = periods_of(8, 2);
        assert_eq!(large[..4], [500 * MS, 1_000 * MS, 2_000 * MS, 4_000 * MS]);
        assert!(large[4..].iter().all(|p| *p == LONGEST_PERIOD), "{large:?}");
        let scattered = periods_of(3, 10);
        assert_eq!(scattered[..4], [500 * MS, 1_000 * MS, 2_000 * MS, 500 * MS], "{scattered:?}");
        assert!(scattered.iter().all(|p| *p <= 2_000 * MS), "{scattered:?}");
    }

    /// Each of redb's checkpoints: when it ended, and its length, in order.
    #[derive(Default)]
    struct Lengths(std::sync::Mutex<Vec<(std::time::Instant, Duration)>>);

    impl crate::store::StoreObserver for Lengths {
        fn group(&self, _size: usize, _took: Duration, _ok: bool) {}
        fn stored(&self, _meta: &crate::store::EventMeta) {}
        fn failed(&self, _reason: &str) {}
        fn trouble(&self, _: crate::store::Trouble, _: &str, _: &dyn std::fmt::Display) {}
        fn checkpoint(&self, took: Duration, _ok: bool) {
            crate::lock::lock(&self.0).push((std::time::Instant::now(), took));
        }
    }

    /// The checkpointer feeds the pacing: after a checkpoint over the budget (64 MiB of
    /// pages written in one transaction), checkpoints come every `flush_interval`
    /// (100 ms here), then later and later, under a trickle that alone would not bring
    /// one in 5 s. Fails if the checkpointer keeps its first period.
    #[test]
    fn a_long_checkpoint_brings_the_next_ones_sooner_in_the_engine() {
        use crate::store::embedded::engine::{Db, EngineOptions};
        let dir = tempfile::tempdir().unwrap();
        let opts = EngineOptions {
            path: dir.path(),
            cache_capacity_bytes: 1 << 20,
            compression: false,
            flush: Pacing::of(Engine::Redb, Duration::from_millis(100), true),
        };
        let db = Db::open(Engine::Redb, &opts).unwrap();
        let seen = Arc::new(Lengths::default());
        db.observe(seen.clone());
        let tree = db.open_tree("t").unwrap();
        let value = vec![7u8; 4096];
        db.transaction(&[&tree], |t| {
            for n in 0..16_384u64 {
                t[0].insert(n.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes(), &value)?;
            }
            Ok(())
        })
        .unwrap();
        // The 1 MiB trigger brings the long one within the checkpointer's next look.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while crate::lock::lock(&seen.0).is_empty() {
            assert!(std::time::Instant::now() < deadline, "no checkpoint after 64 MiB logged");
            std::thread::sleep(Duration::from_millis(10));
        }
        let first = crate::lock::lock(&seen.0)[0].1;
        assert!(first > STALL_BUDGET, "64 MiB of pages took only {first:?}: no test of the rule");
        for n in 0..60u64 {
            tree.insert(n.to_be_bytes(), b"trickle").unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
        let after = crate::lock::lock(&seen.0).len() - 1;
        assert!(after >= 2, "{after} checkpoints in the 1.2 s after a long one (period 100 ms)");
    }

    /// Checkpoints made in the 4 s after the store's open, while callbacks trickle in
    /// for 1.5 s, `flush_interval` 100 ms. Counted by time, not by callbacks: on a
    /// loaded machine the trickle may take longer than its 1.5 s, and a durable store's
    /// first period (5 s) then ends within it.
    async fn checkpoints_under_a_trickle(durable: bool) -> usize {
        use crate::store::EventLog;
        let dir = tempfile::tempdir().unwrap();
        let seen = Arc::new(Lengths::default());
        let opts = EmbeddedOptions {
            flush_interval: Duration::from_millis(100),
            durable,
            observer: seen.clone(),
            ..testutil::options(Engine::Redb, dir.path())
        };
        let started = std::time::Instant::now();
        let store = EmbeddedStore::open(&opts).unwrap();
        let opened = crate::lock::lock(&seen.0).len();
        let mut ids = Vec::new();
        for n in 0..15 {
            if started.elapsed() > Duration::from_millis(1_500) {
                break;
            }
            let event = crate::store::fixtures::received("demo", "ActionCreated", n, "");
            ids.push(store.append(event).await.unwrap());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(4).saturating_sub(started.elapsed())).await;
        let window = started + Duration::from_secs(4);
        let made =
            crate::lock::lock(&seen.0)[opened..].iter().filter(|(at, _)| *at <= window).count();
        for id in ids {
            assert!(store.event(id).await.unwrap().is_some(), "event {id:?} is not stored");
        }
        made
    }

    /// The pacing is the engine's: a durable store starts at the longest period,
    /// whatever `flush_interval` says, and makes no checkpoint in its first 4 s under a
    /// trickle; a buffered one keeps `flush_interval`, its promise.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redb_checkpoints_stay_out_of_a_durable_relays_way_and_keep_a_buffered_ones_promise() {
        let durable = checkpoints_under_a_trickle(true).await;
        assert_eq!(durable, 0, "a durable store checkpointed {durable} times in 4 s");
        let buffered = checkpoints_under_a_trickle(false).await;
        assert!(buffered >= 5, "a buffered store checkpointed only {buffered} times in 4 s");
    }
}
