//! The admin listener while the relay waits for its database (PostgreSQL not there yet
//! at start): it answers what a service manager and a scraper ask, and nothing else.
//!
//! Why not exit and let the service manager restart the relay: under Kubernetes a
//! process that exits at once is put in CrashLoopBackOff, restarted after ever longer
//! delays (up to five minutes), so the fleet came back minutes after its database
//! did. Waiting in-process, the relay is alive (`/healthz` 200), not ready and saying
//! why (`/readyz` 503), and ready within one backoff step of the database.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use actix_web::{web, App, HttpResponse, HttpServer};

use crate::metrics::Metrics;

/// What the waiting listener shows.
pub(crate) struct Waiting {
    /// Why the relay is not ready yet (the last error opening the store).
    pub(crate) why: Mutex<String>,
    pub(crate) metrics: Arc<Metrics>,
}

const TEXT: &str = "text/plain; charset=utf-8";

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type(TEXT).body("ok\n")
}

async fn readyz(state: web::Data<Waiting>) -> HttpResponse {
    let why = crate::lock::lock(&state.why).clone();
    HttpResponse::ServiceUnavailable().content_type(TEXT).body(format!("not ready: {why}\n"))
}

async fn metrics(state: web::Data<Waiting>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}

/// Any other request: the admin API needs the store.
async fn unavailable(state: web::Data<Waiting>) -> HttpResponse {
    let why = crate::lock::lock(&state.why).clone();
    super::error(
        actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
        format!("the relay is waiting for its database: {why}"),
    )
}

/// Binds the waiting listener on `listen`, or serves on `handed` (the socket the
/// service manager holds); stop it (its handle) before the real one starts.
pub(crate) fn server(
    listen: SocketAddr,
    handed: Option<std::net::TcpListener>,
    state: Arc<Waiting>,
) -> std::io::Result<actix_web::dev::Server> {
    let state = web::Data::from(state);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .route("/healthz", web::get().to(healthz))
            .route("/readyz", web::get().to(readyz))
            .route("/metrics", web::get().to(metrics))
            .default_service(web::to(unavailable))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1);
    let server = match handed {
        Some(listener) => server.listen(listener)?,
        None => server.bind(listen)?,
    };
    Ok(server.run())
}
