//! Closing a connection without an answer.
//!
//! When the store cannot take a callback, any HTTP status would be wrong: 200 would
//! lose the event, anything else disables the upstream hook. What the upstream retries
//! is a transient network error, so the relay shuts the socket down mid-request. actix
//! has no API for that; the socket's descriptor is noted when the connection opens.

use std::any::Any;
use std::os::fd::{AsRawFd, RawFd};

use actix_web::dev::Extensions;
use actix_web::{HttpRequest, HttpResponse};

use crate::metrics::Metrics;

/// The descriptor of the connection a request came in on.
#[derive(Clone, Copy)]
struct ConnFd(RawFd);

/// `HttpServer::on_connect` hook: remembers each TCP connection's descriptor.
pub(super) fn remember_socket(conn: &dyn Any, ext: &mut Extensions) {
    if let Some(stream) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
        ext.insert(ConnFd(stream.as_raw_fd()));
    }
}

/// Shuts the request's connection down in both directions, so that the client reads
/// end-of-stream instead of a response.
fn shut(req: &HttpRequest) -> std::io::Result<()> {
    let Some(fd) = req.conn_data::<ConnFd>() else {
        return Err(std::io::Error::other("no socket noted for this connection"));
    };
    // SAFETY: the descriptor belongs to the connection this request arrived on. actix
    // keeps that connection (and so the descriptor) open until the request's handler
    // has finished or been dropped, and we are inside that handler. shutdown(2) does
    // not close or otherwise invalidate the descriptor.
    if unsafe { libc::shutdown(fd.0, libc::SHUT_RDWR) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Ends a callback without an answer, at every site that must (store failure, full
/// disk, trickled or broken body): the socket is shut, and the status returned for
/// actix's sake is written to nobody. If the socket cannot be shut (and the peer is
/// not already gone), the request is held until the client gives up, which it also
/// treats as transient: a status would reach the upstream and disable its hook.
pub(super) async fn no_answer(req: &HttpRequest, metrics: &Metrics) -> HttpResponse {
    match shut(req) {
        Ok(()) => HttpResponse::ServiceUnavailable().finish(),
        // Not connected: the peer is gone, nobody reads what is written.
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            HttpResponse::ServiceUnavailable().finish()
        }
        Err(e) => {
            crate::internal_events::taxonomy::degraded(
                metrics,
                crate::internal_events::taxonomy::Stage::Ingress,
                crate::internal_events::taxonomy::ErrorType::Unreachable,
                "cannot shut a callback's connection; holding it without an answer until the \
                 client gives up",
                &e,
            );
            std::future::pending().await
        }
    }
}

#[cfg(test)]
mod tests {
    /// Without a socket to shut, nothing is answered (a 503 here disabled hooks).
    #[actix_web::test]
    async fn a_connection_that_cannot_be_shut_gets_no_answer() {
        let req = actix_web::test::TestRequest::default().to_http_request();
        let m = crate::metrics::Metrics::new().unwrap();
        let answer =
            tokio::time::timeout(std::time::Duration::from_millis(200), super::no_answer(&req, &m));
        assert!(answer.await.is_err(), "an answer went out");
        let counted = m.relay.errors.with_label_values(&["ingress", "unreachable"]).get();
        assert_eq!(counted, 1, "the connection that could not be shut is counted");
    }
}
