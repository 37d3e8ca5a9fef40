//! Guard of the `/admin` scope: the bearer token, or the console's session cookie
//! (with its CSRF token on every change). Wrong bearer tokens count against their
//! client in the same throttle as wrong sign-ins (`throttle.rs`).

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{header, Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::web;

use super::session::CSRF_HEADER;
use super::{throttled, Access, Refused};
use crate::api::error;
use crate::internal_events::{AdminTokenRefused, InternalEvent};

/// Lets a request through only with `Authorization: Bearer <admin.token>`, from a
/// client that has not given too many wrong tokens lately, or with the console's
/// session.
pub(crate) async fn require_token<B: MessageBody>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let refusal = match req.app_data::<web::Data<Access>>() {
        Some(access) if access.enabled() => {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            match given {
                Some(given) => bearer_refusal(&req, access, given),
                None => console_refusal(&req, access),
            }
        }
        _ => Some(error(
            StatusCode::FORBIDDEN,
            "the admin API is disabled: set admin.token (or admin.token_file / admin.token_env)",
        )),
    };
    match refusal {
        None => next.call(req).await.map(ServiceResponse::map_into_left_body),
        Some(resp) => Ok(req.into_response(resp).map_into_right_body()),
    }
}

/// Why a request with a bearer token is refused, if it is: its client is throttled
/// (refused unread, 429), or the token is wrong (counted against the client).
fn bearer_refusal(
    req: &ServiceRequest,
    access: &Access,
    given: &str,
) -> Option<actix_web::HttpResponse> {
    let from = req.peer_addr().map(|a| a.ip());
    match access.check(from, given) {
        Ok(()) => None,
        Err(Refused::Throttled(wait)) => {
            AdminTokenRefused { throttled: true, from }.emit(&access.metrics);
            Some(throttled(wait))
        }
        Err(Refused::Wrong) => {
            AdminTokenRefused { throttled: false, from }.emit(&access.metrics);
            Some(unauthorized("missing or wrong bearer token"))
        }
    }
}

/// Why a request without a bearer token is refused, if it is: it needs the console's
/// session cookie, and a change (any method but GET and HEAD) the session's CSRF token
/// in `X-CSRF-Token` (a form of another site can send the cookie, never the header).
fn console_refusal(req: &ServiceRequest, access: &Access) -> Option<actix_web::HttpResponse> {
    let Some(session) = access.session_of(req.request()) else {
        return Some(unauthorized("missing or wrong bearer token"));
    };
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return None;
    }
    let given = req.headers().get(CSRF_HEADER).and_then(|v| v.to_str().ok());
    let sessions = access.sessions()?;
    if given.is_some_and(|g| sessions.csrf_matches(&session, g)) {
        None
    } else {
        Some(error(
            StatusCode::FORBIDDEN,
            "a change made with the console's session needs its CSRF token (X-CSRF-Token)",
        ))
    }
}

/// 401 with the challenge.
fn unauthorized(message: &str) -> actix_web::HttpResponse {
    let mut resp = error(StatusCode::UNAUTHORIZED, message);
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer realm=\"hookrelay\""),
    );
    resp
}
