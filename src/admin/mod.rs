//! The private listener: `/metrics`, `/healthz`, `/readyz` and the admin API.
//!
//! Health and metrics are open (probes and scrapers carry no token); everything under
//! `/admin` needs the bearer token of `admin.token`, and is refused when none is set.

mod audit;
mod backup;
mod dead_letters;
mod destinations;
mod events;
mod health;
pub(crate) mod history;
mod hooks;
mod journal;
mod overview;
pub(crate) mod reload;
mod views;
pub(crate) mod waiting;

use std::sync::Arc;

use actix_web::middleware::from_fn;
use actix_web::{web, HttpResponse};

use crate::metrics::Metrics;
use crate::store::SharedStore;

pub(crate) use crate::api::error;
pub(crate) use backup::Backups;

use crate::readiness::Readiness;

/// What the admin handlers share.
pub(crate) struct AdminState {
    /// The destinations in force (a reload replaces them).
    pub(crate) destinations: Arc<crate::lock::Current<crate::delivery::Destinations>>,
    pub(crate) store: SharedStore,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) readiness: Arc<Readiness>,
    /// Below the free-space floor, the relay is not ready.
    pub(crate) space: Arc<crate::space::Space>,
    /// What holds the store, as the configuration names it (`storage.backend`).
    pub(crate) backend: crate::config::StorageBackend,
    /// The reconciler in force (a reload that changes the sources replaces it).
    pub(crate) upstream: Arc<crate::lock::Current<crate::upstream::Reconciler>>,
    /// Where previews and a replay's filters run.
    pub(crate) shaper: Arc<crate::shape::Shaper>,
    /// Where `POST /admin/reload` asks the daemon for a reload.
    pub(crate) reloads: reload::Reloads,
    /// The destinations' last hour (the console's charts).
    pub(crate) history: Arc<history::History>,
    /// The backups being streamed, ended by the relay's stop.
    pub(crate) backups: Arc<Backups>,
}

/// Who is asking: the holder the guard (`access/guard.rs`) put in the request, with
/// where to record its changes.
pub(crate) type Who = web::ReqData<crate::access::journal::Caller>;

/// A change that failed on the relay's side (5xx) is journalled with its status, as
/// far as it went; a refused request (4xx) changed nothing and is not. Returns `resp`.
pub(super) async fn failed(
    who: &Who,
    action: crate::access::journal::Action,
    target: serde_json::Value,
    resp: HttpResponse,
) -> HttpResponse {
    if resp.status().is_server_error() {
        who.record(action, target, 0, Err(format!("failed: {}", resp.status()))).await;
    }
    resp
}

/// Routes of the admin listener. Each path answers its own methods; any other gets
/// 405 with `Allow` (not 404: the path exists).
pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    use actix_web::http::Method;
    let get = || Method::GET;
    cfg.service(resource("/healthz", vec![(get(), web::to(health::healthz))]))
        .service(resource("/readyz", vec![(get(), web::to(health::readyz))]))
        .service(resource("/metrics", vec![(get(), web::to(health::metrics))]))
        .service(
            web::scope("/admin")
                .wrap(from_fn(crate::access::guard::require_token))
                .service(resource("/openapi.json", vec![(get(), web::to(openapi))]))
                .service(resource("/events", vec![(get(), web::to(events::list))]))
                .service(resource("/events/{id}", vec![(get(), web::to(events::show))]))
                .service(resource(
                    "/events/{id}/replay",
                    vec![(Method::POST, web::to(events::replay))],
                ))
                .service(resource(
                    "/dead-letters",
                    vec![
                        (get(), web::to(dead_letters::list)),
                        (Method::DELETE, web::to(dead_letters::delete)),
                    ],
                ))
                .service(resource(
                    "/dead-letters/replay",
                    vec![(Method::POST, web::to(dead_letters::replay))],
                ))
                .service(resource(
                    "/dead-letters/selection/replay",
                    vec![(Method::POST, web::to(dead_letters::replay_selected))],
                ))
                .service(resource(
                    "/dead-letters/selection/discard",
                    vec![(Method::POST, web::to(dead_letters::discard_selected))],
                ))
                .service(resource("/audit", vec![(get(), web::to(audit::show))]))
                .service(resource("/overview", vec![(get(), web::to(overview::show))]))
                .service(resource("/destinations", vec![(get(), web::to(destinations::list))]))
                .service(resource("/destinations/history", vec![(get(), web::to(history::show))]))
                .service(resource(
                    "/destinations/{name}/pause",
                    vec![(Method::POST, web::to(destinations::pause))],
                ))
                .service(resource(
                    "/destinations/{name}/resume",
                    vec![(Method::POST, web::to(destinations::resume))],
                ))
                .service(resource(
                    "/destinations/{name}/preview",
                    vec![(Method::POST, web::to(destinations::preview))],
                ))
                .service(resource("/hooks", vec![(get(), web::to(hooks::list))]))
                .service(resource("/journal", vec![(get(), web::to(journal::list))]))
                .service(resource("/hooks/sync", vec![(Method::POST, web::to(hooks::sync))]))
                .service(resource("/reload", vec![(Method::POST, web::to(reload::reload))]))
                .service(resource("/backup", vec![(get(), web::to(backup::download))]))
                .default_service(web::to(|| async {
                    error(
                        actix_web::http::StatusCode::NOT_FOUND,
                        "no such admin endpoint (GET /admin/openapi.json lists them)",
                    )
                })),
        );
}

/// A path with its methods; any other method is answered 405 with `Allow`.
fn resource(
    path: &str,
    methods: Vec<(actix_web::http::Method, actix_web::Route)>,
) -> actix_web::Resource {
    let allow: Vec<String> = methods.iter().map(|(m, _)| m.to_string()).collect();
    let allow = allow.join(", ");
    let mut r = web::resource(path);
    for (method, route) in methods {
        r = r.route(route.method(method));
    }
    r.default_service(web::to(move || {
        let allow = allow.clone();
        async move {
            let mut resp = error(
                actix_web::http::StatusCode::METHOD_NOT_ALLOWED,
                format!("method not allowed here; allowed: {allow}"),
            );
            if let Ok(value) = actix_web::http::header::HeaderValue::from_str(&allow) {
                resp.headers_mut().insert(actix_web::http::header::ALLOW, value);
            }
            resp
        }
    }))
}

/// `GET /admin/openapi.json`: the OpenAPI document of this listener.
async fn openapi() -> HttpResponse {
    HttpResponse::Ok().json(crate::api::openapi::document())
}
