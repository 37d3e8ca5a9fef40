//! `GET /admin/destinations`, `POST /admin/destinations/{name}/pause|resume`.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};

use super::events::store_error;
use super::views::age_seconds;
use super::{error, AdminState};

/// Every destination with its state and queue.
pub(super) async fn list(state: web::Data<AdminState>) -> HttpResponse {
    let st = state.clone();
    let result = web::block(move || {
        st.destinations
            .iter()
            .map(|d| {
                let q = st.store.queue_stats(&d.dest.name)?;
                Ok(serde_json::json!({
                    "name": d.dest.name,
                    "url": d.dest.display_url(),
                    "paused": d.is_paused(),
                    "circuit": d.circuit.describe(),
                    "in_flight": d.in_flight(),
                    "queue": { "pending": q.pending, "held": q.held, "retrying": q.retrying, "dead": q.dead },
                    "oldest_age_seconds": q.oldest.map(age_seconds),
                }))
            })
            .collect::<Result<Vec<_>, crate::store::StoreError>>()
    })
    .await;
    match result {
        Ok(Ok(list)) => HttpResponse::Ok().json(serde_json::json!({ "destinations": list })),
        Ok(Err(e)) => store_error(&e),
        Err(e) => store_error(&e),
    }
}

/// Pauses (`pause = true`) or resumes a destination: its deliveries wait, nothing is
/// dropped, and the pause survives restarts.
async fn set_paused(state: web::Data<AdminState>, name: String, pause: bool) -> HttpResponse {
    let st = state.clone();
    let n = name.clone();
    match web::block(move || st.destinations.set_paused(&n, pause)).await {
        Ok(Ok(true)) => {
            HttpResponse::Ok().json(serde_json::json!({ "name": name, "paused": pause }))
        }
        Ok(Ok(false)) => error(StatusCode::NOT_FOUND, format!("no destination named {name:?}")),
        Ok(Err(e)) => store_error(&e),
        Err(e) => store_error(&e),
    }
}

pub(super) async fn pause(state: web::Data<AdminState>, name: web::Path<String>) -> HttpResponse {
    set_paused(state, name.into_inner(), true).await
}

pub(super) async fn resume(state: web::Data<AdminState>, name: web::Path<String>) -> HttpResponse {
    set_paused(state, name.into_inner(), false).await
}
