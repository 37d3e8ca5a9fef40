//! `GET /admin/overview`: the callbacks per source, the storage and the fleet, as the
//! console's overview shows them beside the destinations and the accounts.

use actix_web::{web, HttpResponse};

use super::AdminState;
use crate::api;
use crate::metrics::ingress_outcome as outcome;

/// The overview, from this relay's counters and its last look at the disk.
pub(super) async fn show(state: web::Data<AdminState>) -> HttpResponse {
    let m = &state.metrics;
    let requests = m.sums("hookrelay_ingress_requests_total", "source", "outcome");
    let duplicates = m.sums("hookrelay_events_deduplicated_total", "source", "event");
    let stored = m.sums("hookrelay_events_stored_total", "source", "event");
    let missing = m.sums("hookrelay_upstream_callbacks_missing", "source", "event");
    let mut names: Vec<&String> = requests.keys().chain(duplicates.keys()).collect();
    names.sort();
    names.dedup();
    let sources = names
        .into_iter()
        .map(|source| {
            let by = requests.get(source);
            let n = |o: &str| by.and_then(|b| b.get(o)).copied().unwrap_or(0);
            let closed = [
                outcome::STORE_FAILED,
                outcome::INCOMPLETE,
                outcome::NO_SPACE,
                outcome::BODY_TIMEOUT,
            ];
            api::SourceCounts {
                source: source.clone(),
                received: n(outcome::ACCEPTED) + n(outcome::REJECTED),
                rejected: n(outcome::REJECTED),
                unauthorized: n(outcome::UNAUTHORIZED),
                closed: closed.iter().map(|o| n(o)).sum(),
                duplicates: duplicates.get(source).map_or(0, |d| d.values().sum()),
                events: stored.get(source).cloned().unwrap_or_default(),
                missing: missing.get(source).cloned().unwrap_or_default(),
            }
        })
        // A source nothing was counted for yet still shows (every label is created
        // at start, at zero): only `unknown` is left out while nothing was refused.
        .filter(|s| s.source != crate::ingress::UNKNOWN_SOURCE || s.unauthorized > 0)
        .collect();
    let space = &state.space;
    let storage = api::Storage {
        backend: state.backend.name().into(),
        free_bytes: space.free(),
        floor_bytes: space.is_local().then(|| space.floor()),
        below_floor: space.below_floor(),
        store_bytes: match state.store.size_on_disk().await {
            Ok(size) => Some(size),
            Err(e) => {
                let what = "cannot read the store size for the overview; shown without it";
                crate::internal_events::taxonomy::degraded(
                    m,
                    crate::internal_events::taxonomy::Stage::Admin,
                    crate::internal_events::taxonomy::ErrorType::Storage,
                    what,
                    &e,
                );
                None
            }
        },
    };
    let relays = u64::try_from(m.relay.fleet_relays.get()).unwrap_or(0);
    HttpResponse::Ok().json(api::Overview { sources, storage, relays })
}
