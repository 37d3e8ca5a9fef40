//! Retention: finished events are deleted after `retention.delivered`; dead letters
//! and anything still scheduled are kept.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::config::RetentionConfig;
use crate::metrics::Metrics;
use crate::shutdown::Stop;
use crate::store::{unix_micros, SharedStore};

/// Events deleted per store call, so one pass never holds the store for long.
const CHUNK: usize = 1000;

/// Prunes every `interval` until `stop`.
pub(crate) async fn run(
    store: SharedStore,
    config: RetentionConfig,
    metrics: Arc<Metrics>,
    space: Arc<crate::space::Space>,
    mut stop: Stop,
) {
    loop {
        let cutoff = SystemTime::now().checked_sub(config.delivered).map_or(0, unix_micros);
        // One relay of a fleet prunes for all; another takes over if it dies.
        // Below the free-space floor no pass: on sled a delete appends to the log
        // before any space comes back (see space.rs).
        let leads = match if space.below_floor() {
            Ok(false)
        } else {
            store.lead("retention").await
        } {
            Ok(leads) => leads,
            Err(e) => {
                tracing::error!(error = %e, "cannot tell which relay prunes; skipping this pass");
                false
            }
        };
        while leads && !stop.is_stopped() {
            match store.prune(cutoff, CHUNK).await {
                Ok(n) => {
                    metrics.events_pruned.inc_by(n as u64);
                    if n > 0 {
                        tracing::info!(pruned = n, "finished events past retention deleted");
                    }
                    if n < CHUNK {
                        break;
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "pruning failed");
                    break;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(config.interval.max(Duration::from_secs(1))) => {}
            _ = stop.wait() => return,
        }
    }
}
