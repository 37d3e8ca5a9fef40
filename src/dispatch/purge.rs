//! The dedup index kept to one window's traffic: expired keys removed now and then, by
//! one relay of a fleet, within the free-space budget.

use std::sync::Arc;
use std::time::Duration;

use crate::internal_events::taxonomy::{self, ErrorType, Stage};
use crate::internal_events::{DedupKeysCounted, DedupKeysPurged, InternalEvent};
use crate::metrics::Metrics;
use crate::shutdown::Stop;
use crate::store::SharedStore;

/// How often expired dedup keys are purged.
const PURGE_INTERVAL: Duration = Duration::from_secs(60);
/// Keys one step of a pass removes, in one write: a few pages of the dedup index,
/// about a millisecond of the writer. A burst leaves a whole bucket to expire at once
/// (millions of keys after a fast fill): in steps, a pass shows its progress
/// (`hookrelay_dedup_keys_purged_total`) and ends at the stop after the step it is in,
/// where one call held the stop back until the bucket was gone. Pausing between steps
/// was measured and did not shorten the acks' tail during a purge (BENCHMARKS.md,
/// "The 10 M tail: not the purge, not the pacing's state").
const PURGE_STEP: usize = 512;
/// What one purge of expired dedup keys writes, about (sled logs each delete).
const PURGE_BYTES: u64 = 256 << 10;
/// The purge's clock. The dedup verdict compares receive times (a key holds against
/// copies received before its window ends), so a key may go only once its window
/// ended before the receive time of every event still waiting in the inbox, not
/// merely before now: with a backlog older than the window, a copy received inside
/// the window was otherwise dispatched after its key was purged, and delivered twice.
async fn purge_cutoff(store: &SharedStore, now_us: u64) -> Result<u64, crate::store::StoreError> {
    let oldest = store.pending(1).await?.first().map(|p| p.meta.received_at_us);
    Ok(oldest.map_or(now_us, |received| received.min(now_us)))
}

/// Removes expired dedup keys now and then, so that the index stays bounded by the
/// traffic of one dedup window.
pub(super) async fn purge_dedup(
    store: SharedStore,
    metrics: Arc<Metrics>,
    space: Arc<crate::space::Space>,
    mut stop: Stop,
) {
    loop {
        // One relay of a fleet purges (and reports the fleet's count) for all; below
        // the free-space floor nobody does (deletes append to sled's log too).
        // Its deletes are writes too: out of the free-space budget first.
        let room = !space.below_floor() && space.admit(PURGE_BYTES).await;
        let leads = if room { store.lead("dedup-purge").await } else { Ok(false) };
        match leads {
            Ok(true) => {
                let now = crate::clock::now_us();
                let purged = match purge_cutoff(&store, now).await {
                    Ok(cutoff) => purge_pass(&store, &metrics, &space, cutoff, &stop).await,
                    Err(e) => Err(e),
                };
                match purged {
                    Ok(n) if n > 0 => tracing::debug!(purged = n, "expired dedup keys removed"),
                    Ok(_) => {}
                    Err(e) => taxonomy::failed(
                        &metrics,
                        Stage::Dispatch,
                        ErrorType::Storage,
                        "dedup purge failed; trying again at the next purge",
                        &e,
                    ),
                }
                match store.dedup_len().await {
                    Ok(n) => DedupKeysCounted(n).emit(&metrics),
                    Err(e) => taxonomy::failed(
                        &metrics,
                        Stage::Dispatch,
                        ErrorType::Storage,
                        "cannot count dedup keys",
                        &e,
                    ),
                }
            }
            Ok(false) => {}
            Err(e) => taxonomy::failed(
                &metrics,
                Stage::Dispatch,
                ErrorType::Storage,
                "cannot tell which relay purges dedup keys",
                &e,
            ),
        }
        tokio::select! {
            _ = tokio::time::sleep(PURGE_INTERVAL) => {}
            _ = stop.wait() => return,
        }
    }
}

/// One pass: steps of [`PURGE_STEP`] keys until a step finds fewer (nothing more to
/// purge at `cutoff`, or keys renewed meanwhile, which the next pass takes). Ends early
/// at the stop or below the free-space floor; returns the keys removed.
async fn purge_pass(
    store: &SharedStore,
    metrics: &Metrics,
    space: &crate::space::Space,
    cutoff: u64,
    stop: &Stop,
) -> Result<usize, crate::store::StoreError> {
    let mut purged = 0;
    loop {
        let removed = store.purge_dedup(cutoff, PURGE_STEP).await?;
        DedupKeysPurged(removed).emit(metrics);
        purged += removed;
        if removed < PURGE_STEP || space.below_floor() || stop.is_stopped() {
            return Ok(purged);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::purge_cutoff;
    use crate::store::fixtures::{plan, received};
    use crate::store::memory::MemoryStore;
    use crate::store::{DispatchVerdict, EventStatus, SharedStore};

    const S: u64 = 1_000_000;

    /// An original dispatched, its copy received 10 s later but still in the inbox
    /// behind a backlog when the window (600 s) has passed by the wall clock: the
    /// purge keeps the key, and the copy is found a duplicate.
    #[tokio::test]
    async fn a_copy_waiting_in_the_inbox_keeps_its_key_from_the_purge() {
        let store: SharedStore = Arc::new(MemoryStore::default());
        let original =
            store.append(received("demo", "ActionCreated", 100 * S, "{}")).await.unwrap();
        store.dispatch(vec![plan(original, 7, &["a"])], 100 * S).await.unwrap();
        let copy = store.append(received("demo", "ActionCreated", 110 * S, "{}")).await.unwrap();
        let now = 2_000 * S;
        let cutoff = purge_cutoff(&store, now).await.unwrap();
        assert_eq!(cutoff, 110 * S, "the oldest receive time waiting, not the wall clock");
        store.purge_dedup(cutoff, usize::MAX).await.unwrap();
        let outcome = store.dispatch(vec![plan(copy, 7, &["a"])], now).await.unwrap();
        assert!(matches!(outcome[..], [DispatchVerdict::Duplicate { .. }]), "{outcome:?}");
        assert_eq!(store.event(copy).await.unwrap().unwrap().meta.status, EventStatus::Duplicate);
        // With the inbox empty, the wall clock: the key (window ended at 700 s) goes.
        assert_eq!(purge_cutoff(&store, now).await.unwrap(), now);
        assert_eq!(store.purge_dedup(now, usize::MAX).await.unwrap(), 1);
    }

    /// A pass removes every expired key in steps of [`super::PURGE_STEP`],
    /// counted as it goes, and leaves the live ones; at the stop it ends after the step
    /// it is in, leaving the rest to the next start.
    #[tokio::test]
    async fn a_purge_pass_goes_in_steps_and_ends_at_the_stop() {
        use super::{purge_pass, PURGE_STEP};
        let metrics = Arc::new(crate::metrics::Metrics::new().unwrap());
        let space = crate::space::Space::remote(metrics.clone());
        let store: SharedStore = Arc::new(MemoryStore::default());
        // 1,300 keys whose windows (600 s) end at 700 s, and 5 that end an hour on.
        let mut plans = Vec::new();
        for n in 0..1_305u32 {
            let at = if n < 1_300 { 100 * S } else { 3_600 * S };
            let id = store.append(received("demo", "ActionCreated", at, "{}")).await.unwrap();
            let mut p = plan(id, 0, &["a"]);
            let mut hash = [0u8; 16];
            hash[..4].copy_from_slice(&n.to_be_bytes());
            p.dedup = Some(crate::store::DedupKey { hash, window_us: 600 * S });
            plans.push((p, at));
        }
        for (p, at) in plans {
            store.dispatch(vec![p], at).await.unwrap();
        }
        let (trigger, stop) = crate::shutdown::StopTrigger::new();
        trigger.stop();
        let first = purge_pass(&store, &metrics, &space, 2_000 * S, &stop).await.unwrap();
        assert_eq!(first, PURGE_STEP, "a stopped pass ends after its step");
        let (_running, stop) = crate::shutdown::StopTrigger::new();
        let rest = purge_pass(&store, &metrics, &space, 2_000 * S, &stop).await.unwrap();
        assert_eq!(rest, 1_300 - PURGE_STEP);
        assert_eq!(store.dedup_len().await.unwrap(), 5, "the live keys stay");
        assert_eq!(metrics.dispatch.dedup_keys_purged.get(), 1_300, "counted step by step");
    }
}
