//! For a store on another machine (PostgreSQL): a round trip every second, so that the
//! relay turns unready while the database cannot be reached and ready again once it
//! can, by itself. Callbacks meanwhile get their connection closed by the ingress
//! (their store write fails), which the upstream retries.

use crate::internal_events::{InternalEvent, StoreProbed};
use std::sync::Arc;
use std::time::Duration;

use crate::admin::Readiness;
use crate::metrics::Metrics;
use crate::shutdown::Stop;
use crate::store::SharedStore;

/// Time between two probes.
const INTERVAL: Duration = Duration::from_secs(1);
/// A probe slower than this counts as a failure.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Probes `store` until `stop`.
pub(crate) async fn watch(
    store: SharedStore,
    readiness: Arc<Readiness>,
    metrics: Arc<Metrics>,
    mut stop: Stop,
) {
    let mut reachable = true;
    loop {
        let probe = tokio::time::timeout(PROBE_TIMEOUT, store.ping()).await;
        let error = match probe {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {PROBE_TIMEOUT:?}")),
        };
        match (&error, reachable) {
            (Some(e), true) => {
                StoreProbed::Lost(e).emit(&metrics);
                readiness.set_degraded(Some(format!("the database is unreachable: {e}")));
                reachable = false;
            }
            (Some(_), false) => StoreProbed::StillLost.emit(&metrics),
            (None, false) => {
                StoreProbed::Back.emit(&metrics);
                readiness.set_degraded(None);
                reachable = true;
            }
            (None, true) => StoreProbed::Reachable.emit(&metrics),
        }
        tokio::select! {
            _ = tokio::time::sleep(INTERVAL) => {}
            _ = stop.wait() => return,
        }
    }
}
