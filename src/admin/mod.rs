//! The private listener: `/metrics`, `/healthz`, `/readyz` and the admin API.
//!
//! Health and metrics are open (probes and scrapers carry no token); everything under
//! `/admin` needs the bearer token of `admin.token`, and is refused when none is set.

mod auth;
mod dead_letters;
mod destinations;
mod events;
mod health;
mod hooks;
mod views;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::middleware::from_fn;
use actix_web::{web, App, HttpResponse, HttpServer};

use crate::config::Secret;
use crate::metrics::Metrics;
use crate::store::SharedStore;

pub(crate) use health::Readiness;

/// What the admin handlers share.
pub(crate) struct AdminState {
    pub(crate) destinations: Arc<crate::delivery::Destinations>,
    pub(crate) store: SharedStore,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) readiness: Arc<Readiness>,
    /// Below the free-space floor, the relay is not ready.
    pub(crate) space: Arc<crate::space::Space>,
    pub(crate) token: Option<Secret>,
    pub(crate) upstream: Arc<crate::upstream::Reconciler>,
}

/// Routes of the admin listener.
pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/healthz", web::get().to(health::healthz))
        .route("/readyz", web::get().to(health::readyz))
        .route("/metrics", web::get().to(health::metrics))
        .service(
            web::scope("/admin")
                .wrap(from_fn(auth::require_token))
                .route("/events", web::get().to(events::list))
                .route("/events/{id}", web::get().to(events::show))
                .route("/events/{id}/replay", web::post().to(events::replay))
                .route("/dead-letters", web::get().to(dead_letters::list))
                .route("/dead-letters", web::delete().to(dead_letters::delete))
                .route("/dead-letters/replay", web::post().to(dead_letters::replay))
                .route("/destinations", web::get().to(destinations::list))
                .route("/destinations/{name}/pause", web::post().to(destinations::pause))
                .route("/destinations/{name}/resume", web::post().to(destinations::resume))
                .route("/hooks", web::get().to(hooks::list))
                .route("/hooks/sync", web::post().to(hooks::sync))
                .default_service(web::to(|| async {
                    HttpResponse::NotFound()
                        .json(serde_json::json!({"error": "no such admin endpoint"}))
                })),
        );
}

/// Binds the admin listener (one worker: it serves people and scrapers).
pub(crate) fn server(
    listen: SocketAddr,
    grace: Duration,
    state: AdminState,
) -> std::io::Result<(actix_web::dev::Server, Vec<SocketAddr>)> {
    let state = web::Data::new(state);
    let server = HttpServer::new(move || App::new().app_data(state.clone()).configure(routes))
        .workers(1)
        .disable_signals()
        .shutdown_timeout(grace.as_secs().max(1))
        .bind(listen)?;
    let addrs = server.addrs();
    Ok((server.run(), addrs))
}

/// A JSON error answer: `{"error": "..."}`.
pub(crate) fn error(
    status: actix_web::http::StatusCode,
    message: impl Into<String>,
) -> HttpResponse {
    HttpResponse::build(status).json(serde_json::json!({ "error": message.into() }))
}
