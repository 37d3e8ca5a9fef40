//! The listeners, assembled and owned: the private listener (the probes and the admin
//! API (`admin/`) beside the console (`console/`), two rooms that share only who may
//! use them (`access/`)), the ingress, and how each stops.

use std::net::SocketAddr;
use std::time::Duration;

use actix_web::{web, App, HttpServer};

use tokio::task::JoinHandle;

use crate::access::Access;
use crate::admin::AdminState;
use crate::config::Config;
use crate::ingress::{self, IngressState};

/// Binds the private listener (one worker: it serves people and scrapers).
pub(super) fn private(
    listen: SocketAddr,
    handed: Option<std::net::TcpListener>,
    grace: Duration,
    state: AdminState,
    access: web::Data<Access>,
) -> std::io::Result<(actix_web::dev::Server, Vec<SocketAddr>)> {
    let state = web::Data::new(state);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .app_data(access.clone())
            .configure(crate::console::routes)
            .configure(crate::admin::routes)
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(grace.as_secs().max(1));
    let server = match handed {
        Some(listener) => server.listen(listener)?,
        None => server.bind(listen)?,
    };
    let addrs = server.addrs();
    Ok((server.run(), addrs))
}

/// A listener and the task serving it.
pub(super) struct Listener {
    handle: actix_web::dev::ServerHandle,
    pub(super) task: JoinHandle<std::io::Result<()>>,
    /// How long a graceful stop waits between accepting no more and stopping.
    handover: Duration,
}

impl Listener {
    /// Serves `server`; `handed`: on a socket the service manager holds (what it does
    /// not accept waits for the next start, so the stop waits longer to accept none).
    fn spawn(server: actix_web::dev::Server, handed: bool) -> Self {
        let handover = if handed { HANDED_OVER } else { HANDOVER };
        Self { handle: server.handle(), task: tokio::spawn(server), handover }
    }

    /// Stops it: in-flight requests finish (`graceful`) or are cut. Gracefully, it
    /// first stops accepting and gives the connections already accepted a moment to
    /// reach a worker: actix drops those still queued for one when it stops, and
    /// under socket activation they would be reset instead of waiting in the kernel's
    /// queue for the next start.
    pub(super) async fn stop(&self, graceful: bool) {
        if graceful {
            self.handle.pause().await;
            tokio::time::sleep(self.handover).await;
        }
        self.handle.stop(graceful).await;
    }
}

/// How long a listener that stopped accepting waits for the connections it accepted to
/// reach its workers (a thread hop: microseconds; this is ample).
const HANDOVER: Duration = Duration::from_millis(100);

/// The same on a socket the service manager holds: actix's accept thread takes the
/// pause when it next runs, and until then may still accept (a burst of what queued);
/// on a starved 2-core machine CI saw connections accepted after the workers stopped,
/// and dropped. A connection not accepted waits for the next start; one accepted late
/// is lost: the stop waits longer.
const HANDED_OVER: Duration = Duration::from_millis(500);

/// Binds the private listener (admin API and console) and the ingress, or serves on
/// the sockets handed over (socket activation), and starts both: (admin, ingress).
pub(super) fn start(
    config: &Config,
    sockets: crate::activation::Sockets,
    admin: AdminState,
    access: web::Data<Access>,
    ingress_state: web::Data<IngressState>,
    pull: web::Data<crate::pull::PullState>,
) -> anyhow::Result<(Listener, Listener)> {
    let grace = config.shutdown.grace;
    let any_token = access.enabled();
    let handed = (sockets.ingress.is_some(), sockets.admin.is_some());
    let (admin_server, admin_addrs) =
        private(config.admin.listen, sockets.admin, grace, admin, access)
            .map_err(|e| crate::bind::error(e, "admin.listen", config.admin.listen))?;
    let (ingress_server, ingress_addrs) = ingress::server(
        config.ingress.listen,
        sockets.ingress,
        config.ingress.workers,
        grace,
        ingress_state,
        // The pull destinations' consumers fetch on the public listener too.
        move |cfg: &mut web::ServiceConfig| {
            cfg.app_data(pull.clone());
            crate::pull::routes(cfg);
        },
    )
    .map_err(|e| crate::bind::error(e, "ingress.listen", config.ingress.listen))?;
    // `handed`: the socket came from the service manager (ingress.listen or
    // admin.listen is then not read), and stays open while the relay restarts.
    for addr in &ingress_addrs {
        tracing::info!(listener = "ingress", %addr, handed = handed.0, "listening");
    }
    for addr in &admin_addrs {
        tracing::info!(listener = "admin", %addr, handed = handed.1, "listening");
    }
    if !any_token {
        tracing::warn!(
            "no admin token is set (admin.token or admin.tokens): the admin API refuses every \
             request"
        );
    }
    Ok((Listener::spawn(admin_server, handed.1), Listener::spawn(ingress_server, handed.0)))
}
