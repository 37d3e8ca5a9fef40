//! The dedup index kept to one window's traffic: expired keys removed now and then, by
//! one relay of a fleet, within the free-space budget.

use std::sync::Arc;
use std::time::Duration;

use crate::internal_events::taxonomy::{self, ErrorType, Stage};
use crate::internal_events::{DedupKeysCounted, InternalEvent};
use crate::metrics::Metrics;
use crate::shutdown::Stop;
use crate::store::SharedStore;

/// How often expired dedup keys are purged.
const PURGE_INTERVAL: Duration = Duration::from_secs(60);
/// What one purge of expired dedup keys writes, about (sled logs each delete).
const PURGE_BYTES: u64 = 256 << 10;
/// The purge's clock. The dedup verdict compares receive times (a key holds against
/// copies received before its window ends), so a key may go only once its window
/// ended before the receive time of every event still waiting in the inbox, not
/// merely before now: with a backlog older than the window, a copy received inside
/// the window was otherwise dispatched after its key was purged, and delivered twice.
pub(super) async fn purge_cutoff(
    store: &SharedStore,
    now_us: u64,
) -> Result<u64, crate::store::StoreError> {
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
                    Ok(cutoff) => store.purge_dedup(cutoff).await,
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
