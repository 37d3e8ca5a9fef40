//! `GET /admin/destinations`, `POST /admin/destinations/{name}/pause|resume|preview`.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};

use super::events::store_error;
use super::views::age_seconds;
use super::{error, AdminState};
use crate::access::journal::Action;
use crate::api;
use crate::shape::program::{CompileError, Program};
use crate::shape::FilterVerdict;
use crate::store::QueueChange;
use crate::timefmt::format_admin;

/// Every destination with its state and queue (those of its scope, for a scoped
/// holder).
pub(super) async fn list(state: web::Data<AdminState>, who: super::Who) -> HttpResponse {
    let mut list = Vec::new();
    for d in state.destinations.load().iter().filter(|d| who.sees(&d.dest.name)) {
        let q = match state.store.queue_stats(&d.dest.name).await {
            Ok(q) => q,
            Err(e) => return store_error(&e),
        };
        let recent = d.activity();
        list.push(api::DestinationStatus {
            name: d.dest.name.clone(),
            kind: d.dest.kind.name().to_owned(),
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
                counting: q.counting,
            },
            oldest_age_seconds: q.oldest.map(age_seconds),
            deliveries_per_minute: recent.per_minute,
            last_error_at: recent.last_error.as_ref().map(|(_, at)| format_admin(*at)),
            last_error: recent.last_error.map(|(e, _)| e),
            recovered_at: recent.recovered.map(format_admin),
            circuit_since: recent.circuit_since.map(format_admin),
            max_concurrency: d.dest.max_concurrency as u64,
            fleet_share: d.share() as u64,
            sources: d.route.sources.clone(),
            events: d.route.events.clone(),
            ordering: d.route.ordering.into(),
        });
    }
    HttpResponse::Ok().json(api::DestinationList { destinations: list })
}

/// Pauses (`pause = true`) or resumes a destination: its deliveries wait, nothing is
/// dropped, and the pause survives restarts and reaches every relay on the store.
async fn set_paused(
    state: web::Data<AdminState>,
    who: super::Who,
    name: String,
    pause: bool,
) -> HttpResponse {
    let action = if pause { Action::Pause } else { Action::Resume };
    let target = serde_json::json!({ "destination": name });
    let destinations = state.destinations.load();
    if destinations.get(&name).is_none() {
        return error(StatusCode::NOT_FOUND, format!("no destination named {name:?}"));
    }
    let change = QueueChange::Pause { destination: name.clone(), paused: pause };
    match who.change(action, &target, change).await {
        Ok(_) => {
            destinations.paused_by(&name, pause, &who.name, &state.metrics);
            HttpResponse::Ok().json(api::Paused { name, paused: pause })
        }
        Err(e) => super::failed(&who, action, target, store_error(&e)).await,
    }
}

pub(super) async fn pause(
    state: web::Data<AdminState>,
    who: super::Who,
    name: web::Path<String>,
) -> HttpResponse {
    set_paused(state, who, name.into_inner(), true).await
}

pub(super) async fn resume(
    state: web::Data<AdminState>,
    who: super::Who,
    name: web::Path<String>,
) -> HttpResponse {
    set_paused(state, who, name.into_inner(), false).await
}

/// What the destination `name` would make of a stored event, with its own programs or
/// those given: the filter's verdict and the body it would send. Writes nothing.
pub(super) async fn preview(
    state: web::Data<AdminState>,
    name: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let request = match serde_json::from_slice::<api::PreviewRequest>(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("body: not a preview request ({e}); send {{\"event\": \"<id>\"}}, optionally with \"filter\" and \"transform\""),
            )
        }
    };
    let destinations = state.destinations.load();
    let Some(dest) = destinations.get(&name) else {
        return error(StatusCode::NOT_FOUND, format!("no destination named {:?}", name.as_str()));
    };
    // A program given replaces the configured one; "" means none.
    let filter = match tried(request.filter.as_deref(), &dest.dest.filter) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("filter: {e}")),
    };
    let transform = match tried(request.transform.as_deref(), &dest.dest.transform) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("transform: {e}")),
    };
    let id = request.event;
    let record = match state.store.event(id).await {
        Ok(Some(record)) => record,
        Ok(None) => return error(StatusCode::NOT_FOUND, format!("no event {id}")),
        Err(e) => return store_error(&e),
    };
    let stored = match state.store.body(id).await {
        Ok(Some(body)) => bytes::Bytes::from(body),
        Ok(None) => {
            return error(StatusCode::CONFLICT, format!("event {id} has no body (it was rejected)"))
        }
        Err(e) => return store_error(&e),
    };
    let (verdict, shaped) = state
        .shaper
        .preview(&dest.dest.name, filter.as_ref(), transform.as_ref(), id, &record.meta, &stored)
        .await;
    let (verdict, reason) = match verdict {
        FilterVerdict::Matched => ("matched", None),
        FilterVerdict::Filtered { reason, .. } => ("filtered", Some(reason)),
    };
    let (content_type, body, body_error) = match shaped {
        Ok((body, content_type)) => {
            (content_type, Some(String::from_utf8_lossy(&body).into_owned()), None)
        }
        Err(e) => (None, None, Some(e)),
    };
    HttpResponse::Ok().json(api::Preview {
        destination: name.into_inner(),
        event: id,
        verdict: verdict.into(),
        reason,
        filter: filter.map(|p| p.code().to_owned()),
        transform: transform.map(|p| p.code().to_owned()),
        content_type,
        body,
        body_error,
    })
}

/// The program a preview applies: the one `given` (none for `""`), else the
/// `configured` one.
fn tried(
    given: Option<&str>,
    configured: &Option<Arc<Program>>,
) -> Result<Option<Arc<Program>>, CompileError> {
    match given {
        None => Ok(configured.clone()),
        Some("") => Ok(None),
        Some(code) => Program::compile(code).map(|p| Some(Arc::new(p))),
    }
}
