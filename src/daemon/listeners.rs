//! The private listener, assembled: the probes and the admin API (`admin/`) and the
//! console (`console/`), two rooms that share only who may use them (`access/`).

use std::net::SocketAddr;
use std::time::Duration;

use actix_web::{web, App, HttpServer};

use crate::access::Access;
use crate::admin::AdminState;

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
