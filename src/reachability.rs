//! For a store on another machine (PostgreSQL): a round trip every second, so that the
//! relay turns unready while the database cannot be reached and ready again once it
//! can, by itself. Callbacks meanwhile get their connection closed by the ingress
//! (their store write fails), which the upstream retries. The same probe checks this
//! machine's clock against the database's (read at each fleet heartbeat): off by more
//! than [`crate::clock::MAX_SKEW`], the relay is not ready either, and says why.

use crate::internal_events::{ClockChecked, InternalEvent, StoreProbed};
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::Metrics;
use crate::readiness::Readiness;
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
    let (mut reachable, mut clock_off) = (true, false);
    loop {
        let probe = tokio::time::timeout(PROBE_TIMEOUT, store.ping()).await;
        let error = match probe {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {PROBE_TIMEOUT:?}")),
        };
        match (&error, reachable) {
            (Some(e), true) => StoreProbed::Lost(e).emit(&metrics),
            (Some(_), false) => StoreProbed::StillLost.emit(&metrics),
            (None, false) => StoreProbed::Back.emit(&metrics),
            (None, true) => StoreProbed::Reachable.emit(&metrics),
        }
        reachable = error.is_none();
        let skew = crate::clock::wall_skew();
        let problem = skew.and_then(crate::clock::skew_problem);
        if let Some(skew_us) = skew {
            ClockChecked { skew_us, problem: problem.as_deref(), was_off: clock_off }
                .emit(&metrics);
        }
        clock_off = problem.is_some();
        // The one writer of the passing reason: the database first, then the clock.
        readiness
            .set_degraded(error.map(|e| format!("the database is unreachable: {e}")).or(problem));
        tokio::select! {
            _ = tokio::time::sleep(INTERVAL) => {}
            _ = stop.wait() => return,
        }
    }
}
