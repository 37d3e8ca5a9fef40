//! Liveness, readiness and the metrics scrape.

use std::sync::atomic::{AtomicBool, Ordering};

use actix_web::{web, HttpResponse};

use super::AdminState;

/// Whether the relay should receive traffic: false until the store is open and
/// recovery has finished, and again from the moment shutdown begins.
#[derive(Default)]
pub(crate) struct Readiness(AtomicBool);

impl Readiness {
    pub(crate) fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    pub(crate) fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The process is up and serving HTTP.
pub(super) async fn healthz() -> HttpResponse {
    HttpResponse::Ok().body("ok\n")
}

/// 200 once ready, 503 before that and while shutting down.
pub(super) async fn readyz(state: web::Data<AdminState>) -> HttpResponse {
    if state.readiness.get() {
        HttpResponse::Ok().body("ready\n")
    } else {
        HttpResponse::ServiceUnavailable().body("not ready\n")
    }
}

/// Prometheus text exposition; store gauges are refreshed on each scrape.
pub(super) async fn metrics(state: web::Data<AdminState>) -> HttpResponse {
    let m = &state.metrics;
    let store = state.store.clone();
    if let Ok((size, inbox)) = web::block(move || (store.size_on_disk(), store.inbox_len())).await {
        if let Ok(size) = size {
            m.store_size.set(i64::try_from(size).unwrap_or(i64::MAX));
        }
        m.inbox_events.set(i64::try_from(inbox).unwrap_or(i64::MAX));
    }
    m.ready.set(i64::from(state.readiness.get()));
    let st = state.clone();
    let queues = web::block(move || {
        st.destinations
            .iter()
            .map(|d| st.store.queue_stats(&d.dest.name).map(|q| (d.clone(), q)))
            .collect::<Result<Vec<_>, _>>()
    })
    .await;
    if let Ok(Ok(queues)) = queues {
        for (d, q) in queues {
            let name = d.dest.name.as_str();
            let depth = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            m.queue_depth.with_label_values(&[name, "pending"]).set(depth(q.pending));
            m.queue_depth.with_label_values(&[name, "held"]).set(depth(q.held));
            m.queue_depth.with_label_values(&[name, "retrying"]).set(depth(q.retrying));
            m.queue_depth.with_label_values(&[name, "dead"]).set(depth(q.dead));
            m.queue_oldest_age
                .with_label_values(&[name])
                .set(q.oldest.map_or(0.0, super::views::age_seconds));
            m.destination_paused.with_label_values(&[name]).set(i64::from(d.is_paused()));
            m.circuit_open.with_label_values(&[name]).set(i64::from(d.circuit.is_open()));
        }
    }
    HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(m.render())
}
