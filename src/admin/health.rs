//! Liveness, readiness and the metrics scrape.

use actix_web::{web, HttpResponse};

use super::AdminState;
use crate::internal_events::taxonomy::{degraded, ErrorType, Stage};

/// The probes answer plain text (and say so: the OpenAPI document promises it).
const TEXT: &str = "text/plain; charset=utf-8";

/// The process is up and serving HTTP.
pub(super) async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type(TEXT).body("ok\n")
}

/// 200 once ready, 503 before that and while shutting down. A stalled destination
/// is said, but keeps the answer 200: readiness steers callbacks to the relay, and
/// taking it out of rotation for a delivery problem would only make the upstream's
/// callbacks fail (and disable hooks) without delivering anything sooner.
pub(super) async fn readyz(state: web::Data<AdminState>) -> HttpResponse {
    match not_ready(&state) {
        None => {
            let mut said = match stalled(&state) {
                None => "ready\n".to_owned(),
                Some(names) => format!(
                    "ready, degraded: destination {names} stalled (deliveries due, no attempt \
                     started; the worker is restarted at most 3 times an hour; see \
                     hookrelay_destination_stalled and docs/runbook.md). Callbacks are still \
                     taken\n"
                ),
            };
            for line in unreachable_brokers(&state) {
                said.push_str(&line);
            }
            HttpResponse::Ok().content_type(TEXT).body(said)
        }
        Some(reason) => HttpResponse::ServiceUnavailable()
            .content_type(TEXT)
            .body(format!("not ready: {reason}\n")),
    }
}

/// A line for each broker destination whose circuit is open, with its last error
/// (an unreachable broker, refused credentials, a missing stream or exchange): said,
/// not a reason to refuse callbacks, which wait in the store for it.
fn unreachable_brokers(state: &AdminState) -> Vec<String> {
    let destinations = state.destinations.load();
    destinations
        .iter()
        .filter(|d| d.dest.kind != crate::config::DestinationKind::Http)
        .filter(|d| d.phase() != crate::delivery::Phase::Closed)
        .map(|d| {
            let why = d.activity().last_error.map_or_else(|| "failing".into(), |(e, _)| e);
            format!(
                "destination {} ({}) failing, its deliveries wait: {why}\n",
                d.dest.name,
                d.dest.kind.name()
            )
        })
        .collect()
}

/// The destinations the progress watchdog finds stalled, if any.
fn stalled(state: &AdminState) -> Option<String> {
    let destinations = state.destinations.load();
    let names: Vec<&str> =
        destinations.iter().filter(|d| d.is_stalled()).map(|d| d.dest.name.as_str()).collect();
    (!names.is_empty()).then(|| names.join(", "))
}

/// Why the relay should get no traffic now, if it should not: the one verdict behind
/// `/readyz` and `hookrelay_ready`.
fn not_ready(state: &AdminState) -> Option<String> {
    if state.space.below_floor() {
        return Some(state.space.describe());
    }
    if state.readiness.get() {
        return None;
    }
    Some(state.readiness.failure().unwrap_or_else(|| "starting or stopping".into()))
}

/// Prometheus text exposition; store gauges are refreshed on each scrape.
pub(super) async fn metrics(state: web::Data<AdminState>) -> HttpResponse {
    let m = &state.metrics;
    let store = &state.store;
    // The store's size, the inbox and the queues are the fleet's, not this relay's:
    // with several relays on one database, one of them reports them, so that a
    // dashboard's `sum` counts them once (a single-process store always reports).
    let reports_fleet = match store.lead("fleet-gauges").await {
        Ok(leads) => leads,
        Err(e) => {
            let what = "cannot tell which relay reports the fleet's gauges; this scrape leaves \
                        them out";
            degraded(m, Stage::Admin, ErrorType::Storage, what, &e);
            false
        }
    };
    if reports_fleet {
        match store.size_on_disk().await {
            Ok(size) => m.store.store_size.set(i64::try_from(size).unwrap_or(i64::MAX)),
            Err(e) => {
                let what = "cannot read the store size for /metrics; the last one is shown";
                degraded(m, Stage::Admin, ErrorType::Storage, what, &e);
            }
        }
        match store.inbox().await {
            // Still counted behind a restart: no number rather than a low one.
            Ok(inbox) if inbox.counting => m.store.inbox_events.reset(),
            Ok(inbox) => m.store.inbox().set(i64::try_from(inbox.events).unwrap_or(i64::MAX)),
            Err(e) => {
                let what = "cannot count the inbox for /metrics; the last count is shown";
                degraded(m, Stage::Admin, ErrorType::Storage, what, &e);
            }
        }
    } else {
        m.store.store_size.set(0);
        m.store.inbox().set(0);
        m.delivery.queue_depth.reset();
        m.delivery.queue_oldest_age.reset();
    }
    m.relay.ready.set(i64::from(not_ready(&state).is_none()));
    let destinations = state.destinations.load();
    for d in destinations.iter() {
        let name = d.dest.name.as_str();
        if reports_fleet {
            match store.queue_stats(name).await {
                // Still counted behind a restart: no number rather than a low one
                // (a gauge that climbs to the backlog would read as a flood).
                Ok(q) if q.counting => {}
                Ok(q) => {
                    let depth = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                    m.delivery
                        .queue_depth
                        .with_label_values(&[name, "pending"])
                        .set(depth(q.pending));
                    m.delivery.queue_depth.with_label_values(&[name, "held"]).set(depth(q.held));
                    m.delivery
                        .queue_depth
                        .with_label_values(&[name, "retrying"])
                        .set(depth(q.retrying));
                    m.delivery.queue_depth.with_label_values(&[name, "dead"]).set(depth(q.dead));
                    m.delivery
                        .queue_oldest_age
                        .with_label_values(&[name])
                        .set(q.oldest.map_or(0.0, super::views::age_seconds));
                }
                Err(e) => {
                    let what = format!(
                        "cannot read the queue of {name} for /metrics; the last counts are shown"
                    );
                    degraded(m, Stage::Admin, ErrorType::Storage, &what, &e);
                }
            }
        }
        m.delivery.destination_paused.with_label_values(&[name]).set(i64::from(d.is_paused()));
        m.delivery
            .circuit_open
            .with_label_values(&[name])
            .set(i64::from(d.phase() != crate::delivery::Phase::Closed));
    }
    HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(m.render())
}
