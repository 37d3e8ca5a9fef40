//! Closing a connection without an answer.
//!
//! When the store cannot take a callback, any HTTP status would be wrong: 200 would
//! lose the event, anything else disables the upstream hook. What the upstream retries
//! is a transient network error, so the relay shuts the socket down mid-request. actix
//! has no API for that; the socket's descriptor is noted when the connection opens.

use std::any::Any;
use std::os::fd::{AsRawFd, RawFd};

use actix_web::dev::Extensions;
use actix_web::HttpRequest;

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
/// end-of-stream instead of a response. Returns false if that was not possible.
pub(super) fn close_without_answer(req: &HttpRequest) -> bool {
    let Some(fd) = req.conn_data::<ConnFd>() else {
        return false;
    };
    // SAFETY: the descriptor belongs to the connection this request arrived on. actix
    // keeps that connection (and so the descriptor) open until the request's handler
    // has finished or been dropped, and we are inside that handler. shutdown(2) does
    // not close or otherwise invalidate the descriptor.
    let rc = unsafe { libc::shutdown(fd.0, libc::SHUT_RDWR) };
    rc == 0
}
