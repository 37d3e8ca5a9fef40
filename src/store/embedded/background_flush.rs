//! How often the embedded engine flushes on its own (sled) or checkpoints (redb):
//! `storage.flush_interval`, except where that would only put writers in a
//! checkpoint's way.

use std::time::Duration;

use super::Engine;

/// The shortest period of redb's checkpoints in `durable` mode. There each write is
/// made durable by the redo log's own `fdatasync` before it returns; a checkpoint only
/// bounds the log (and so what a restart after a crash applies again, which the 1 MiB
/// trigger bounds as well), and every writer waits while one runs (5-8 ms at 200/s).
/// At 200/s this period (the 1 MiB trigger then comes first, every ~3 s) makes 6 times
/// fewer such stalls than 500 ms, with a third less written to the disk and 4-10% less
/// CPU per callback; the ack's tail moved within the noise (BENCHMARKS.md,
/// "Checkpoints out of the ack's tail"). On a 10 M-event store, though, each
/// checkpoint writes more while writers wait: one run gave a p99 ack at 200/s of
/// 30.1 ms against 10.6 ms at 500 ms ("10 M at the durable checkpoint period of 5 s"),
/// so this period is to be reconsidered.
const DURABLE_CHECKPOINT_PERIOD: Duration = Duration::from_secs(5);

/// The engine's background flush period: `flush_interval`, what `buffered` mode makes
/// writes durable by; on redb in `durable` mode, where the redo log does that, no
/// shorter than [`DURABLE_CHECKPOINT_PERIOD`]. sled keeps `flush_interval` (its log
/// flush is cheap and bounds its own recovery).
pub(super) fn period(engine: Engine, flush_interval: Duration, durable: bool) -> Duration {
    match engine {
        Engine::Redb if durable => flush_interval.max(DURABLE_CHECKPOINT_PERIOD),
        _ => flush_interval,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use super::super::{testutil, EmbeddedOptions, EmbeddedStore};
    use super::*;

    /// Counts redb's checkpoints.
    #[derive(Default)]
    struct Checkpoints(std::sync::atomic::AtomicUsize);

    impl crate::store::StoreObserver for Checkpoints {
        fn group(&self, _size: usize, _took: Duration, _ok: bool) {}
        fn stored(&self, _meta: &crate::store::EventMeta) {}
        fn failed(&self, _reason: &str) {}
        fn trouble(&self, _: crate::store::Trouble, _: &str, _: &dyn std::fmt::Display) {}
        fn checkpoint(&self, _took: Duration, _ok: bool) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Checkpoints made while callbacks trickle in for 1.5 s, `flush_interval` 100 ms.
    async fn checkpoints_under_a_trickle(durable: bool) -> usize {
        use crate::store::EventLog;
        let dir = tempfile::tempdir().unwrap();
        let seen = Arc::new(Checkpoints::default());
        let opts = EmbeddedOptions {
            flush_interval: Duration::from_millis(100),
            durable,
            observer: seen.clone(),
            ..testutil::options(Engine::Redb, dir.path())
        };
        let store = EmbeddedStore::open(&opts).unwrap();
        let opened = seen.0.load(Ordering::SeqCst);
        let mut ids = Vec::new();
        for n in 0..15 {
            let event = crate::store::fixtures::received("demo", "ActionCreated", n, "");
            ids.push(store.append(event).await.unwrap());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let made = seen.0.load(Ordering::SeqCst) - opened;
        for id in ids {
            assert!(store.event(id).await.unwrap().is_some(), "event {id:?} is not stored");
        }
        made
    }

    /// In `durable` mode each write is durable through the redo log, and a checkpoint
    /// holds every writer (acks included) while it runs: they come at most every
    /// `DURABLE_CHECKPOINT_PERIOD` (or per MiB logged), whatever `flush_interval` says.
    /// In `buffered` mode `flush_interval` is the promise, and is kept.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redb_checkpoints_stay_out_of_a_durable_relays_way_and_keep_a_buffered_ones_promise() {
        let durable = checkpoints_under_a_trickle(true).await;
        assert_eq!(durable, 0, "a durable store checkpointed {durable} times in 1.5 s");
        let buffered = checkpoints_under_a_trickle(false).await;
        assert!(buffered >= 5, "a buffered store checkpointed only {buffered} times in 1.5 s");
        assert_eq!(
            period(Engine::Sled, Duration::from_millis(100), true),
            Duration::from_millis(100)
        );
        assert_eq!(period(Engine::Redb, Duration::from_secs(60), true), Duration::from_secs(60));
    }
}
