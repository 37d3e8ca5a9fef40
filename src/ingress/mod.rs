//! The public listener: authenticates callbacks, stores them durably, answers 200.
//!
//! Nothing else is served here but `GET /healthz`: the admin API and metrics live on
//! their own listener so they are never exposed with the callback endpoint.

mod abort;
mod auth;
mod body;
mod callback;
mod inspect;
pub(crate) mod mask;
mod throttle;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};

use crate::config::SourceConfig;
use crate::metrics::Metrics;
use crate::store::SharedStore;

pub(crate) use auth::{Sources, UNKNOWN_SOURCE};
#[cfg(test)]
pub(crate) use inspect::resource_of;

/// The resource `body` is about, as the ingress stores it (tests of the rules built on
/// it: the dispatcher's resource key).
#[cfg(test)]
pub(crate) fn inspect_resource(body: &[u8]) -> Option<String> {
    inspect::inspect(body).resource
}

/// What every ingress worker shares.
pub(crate) struct IngressState {
    /// Who may call and what they may send: replaced whole by a reload.
    pub(crate) gate: crate::lock::Current<Gate>,
    /// Appends are grouped by the store (group commit).
    pub(crate) store: SharedStore,
    pub(crate) metrics: Arc<Metrics>,
    /// Free-space admission.
    pub(crate) space: Arc<crate::space::Space>,
    /// Throttles the log line of refused callbacks.
    refusals: throttle::Throttle,
    /// Each stored callback's span (the root of its event's trace).
    pub(crate) tracer: Arc<crate::telemetry::Tracer>,
}

impl IngressState {
    pub(crate) fn new(
        gate: Gate,
        store: SharedStore,
        metrics: Arc<Metrics>,
        space: Arc<crate::space::Space>,
        tracer: Arc<crate::telemetry::Tracer>,
    ) -> Self {
        Self {
            gate: crate::lock::Current::new(gate),
            store,
            metrics,
            space,
            refusals: throttle::Throttle::default(),
            tracer,
        }
    }
}

/// What a reload replaces at the ingress: the sources and their tokens, the secrets
/// masked out of bodies, and the limits on a body. A callback keeps the gate it was
/// let in by until it is answered.
pub(crate) struct Gate {
    pub(crate) sources: Sources,
    pub(crate) max_body_bytes: u64,
    /// Longest wait for a body once the headers are in.
    pub(crate) body_timeout: std::time::Duration,
    /// The relay's secrets, masked out of every body before it is stored.
    pub(crate) masker: mask::Masker,
}

impl Gate {
    /// The gate of `config`: its sources, the limits of `[ingress]`, and every secret
    /// the relay knows masked (the sources' tokens and the admin tokens).
    pub(crate) fn of(config: &crate::config::Config) -> Self {
        let admin = config.admin.resolved_tokens().map(|t| t.expose().as_bytes().to_vec());
        Self::new(
            &config.sources,
            admin.collect(),
            config.ingress.max_body_bytes,
            config.ingress.body_timeout,
        )
    }

    /// The gate of `sources`, masking their tokens and `secrets`.
    pub(crate) fn new(
        sources: &[SourceConfig],
        secrets: Vec<Vec<u8>>,
        max_body_bytes: u64,
        body_timeout: std::time::Duration,
    ) -> Self {
        let sources = Sources::from_config(sources);
        let own = sources.secrets().map(|s| s.expose().as_bytes().to_vec());
        let masker = mask::Masker::new(own.chain(secrets));
        Self { sources, max_body_bytes, body_timeout, masker }
    }
}

/// Routes of the public listener.
pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/hooks/{source}/{token}", web::post().to(callback::callback))
        .route("/hooks/{source}/{token}/{event}", web::post().to(callback::callback))
        .route("/healthz", web::get().to(|| async { HttpResponse::Ok().body("ok\n") }));
}

/// Binds the public listener, with `more` routes beside the callbacks' (the pull
/// API). Signals are handled by the daemon, which stops the
/// server gracefully, giving in-flight callbacks up to `grace` to finish.
pub(crate) fn server(
    listen: SocketAddr,
    handed: Option<std::net::TcpListener>,
    workers: usize,
    grace: Duration,
    state: web::Data<IngressState>,
    more: impl Fn(&mut web::ServiceConfig) + Clone + Send + 'static,
) -> std::io::Result<(actix_web::dev::Server, Vec<SocketAddr>)> {
    let mut server = HttpServer::new(move || {
        App::new().app_data(state.clone()).configure(routes).configure(more.clone())
    })
    .on_connect(abort::remember_socket)
    .disable_signals()
    .shutdown_timeout(grace.as_secs().max(1));
    if workers > 0 {
        server = server.workers(workers);
    }
    let server = match handed {
        Some(listener) => server.listen(listener)?,
        None => server.bind(listen)?,
    };
    let addrs = server.addrs();
    Ok((server.run(), addrs))
}

#[cfg(test)]
mod tests;
