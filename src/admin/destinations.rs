//! `GET /admin/destinations`, `POST /admin/destinations/{name}/pause|resume`.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};

use super::events::store_error;
use super::views::age_seconds;
use super::{error, AdminState};
use crate::api;
use crate::timefmt::format_admin;

/// Every destination with its state and queue.
pub(super) async fn list(state: web::Data<AdminState>) -> HttpResponse {
    let mut list = Vec::new();
    for d in state.destinations.iter() {
        let q = match state.store.queue_stats(&d.dest.name).await {
            Ok(q) => q,
            Err(e) => return store_error(&e),
        };
        let recent = d.activity();
        list.push(api::DestinationStatus {
            name: d.dest.name.clone(),
            url: d.dest.display_url(),
            paused: d.is_paused(),
            circuit: d.phase(),
            stalled: d.is_stalled(),
            in_flight: d.in_flight() as u64,
            queue: api::Queue {
                pending: q.pending,
                held: q.held,
                retrying: q.retrying,
                dead: q.dead,
            },
            oldest_age_seconds: q.oldest.map(age_seconds),
            deliveries_per_minute: recent.per_minute,
            last_error_at: recent.last_error.as_ref().map(|(_, at)| format_admin(*at)),
            last_error: recent.last_error.map(|(e, _)| e),
            circuit_since: recent.circuit_since.map(format_admin),
            max_concurrency: d.dest.max_concurrency as u64,
            fleet_share: d.share() as u64,
            sources: d.route.sources.clone(),
            events: d.route.events.clone(),
            ordering: if d.route.per_resource { "per-resource" } else { "none" }.into(),
        });
    }
    HttpResponse::Ok().json(api::DestinationList { destinations: list })
}

/// Pauses (`pause = true`) or resumes a destination: its deliveries wait, nothing is
/// dropped, and the pause survives restarts and reaches every relay on the store.
async fn set_paused(state: web::Data<AdminState>, name: String, pause: bool) -> HttpResponse {
    match state.destinations.set_paused(&name, pause).await {
        Ok(true) => HttpResponse::Ok().json(api::Paused { name, paused: pause }),
        Ok(false) => error(StatusCode::NOT_FOUND, format!("no destination named {name:?}")),
        Err(e) => store_error(&e),
    }
}

pub(super) async fn pause(state: web::Data<AdminState>, name: web::Path<String>) -> HttpResponse {
    set_paused(state, name.into_inner(), true).await
}

pub(super) async fn resume(state: web::Data<AdminState>, name: web::Path<String>) -> HttpResponse {
    set_paused(state, name.into_inner(), false).await
}
