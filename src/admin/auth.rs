//! Guard of the `/admin` scope: the bearer token, or the console's session cookie
//! (with its CSRF token on every change). Wrong bearer tokens count against their
//! client in the console's throttle (`console/throttle.rs`), as wrong sign-ins do.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{header, Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::web;

use super::{error, AdminState};
use crate::console::session::CSRF_HEADER;
use crate::internal_events::{AdminTokenRefused, InternalEvent};
use crate::lock::lock;

/// Lets a request through only with `Authorization: Bearer <admin.token>`, from a
/// client that has not given too many wrong tokens lately.
pub(super) async fn require_token<B: MessageBody>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let token = req.app_data::<web::Data<AdminState>>().and_then(|s| s.token.clone());
    let refusal = match token {
        None => Some(error(
            StatusCode::FORBIDDEN,
            "the admin API is disabled: set admin.token (or admin.token_file / admin.token_env)",
        )),
        Some(token) => {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            match given {
                Some(given) => bearer_refusal(&req, &token, given),
                None => console_refusal(&req),
            }
        }
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
    token: &crate::config::Secret,
    given: &str,
) -> Option<actix_web::HttpResponse> {
    let state = req.app_data::<web::Data<AdminState>>()?;
    let from = req.peer_addr().map(|a| a.ip());
    let now = crate::clock::unix_micros(std::time::SystemTime::now());
    // The check and the count under one lock: concurrent wrong tokens from one client
    // are let through no more than the limit, however they interleave.
    let mut throttle = lock(&state.console.throttle);
    if let Err(wait) = throttle.check(from, now) {
        drop(throttle);
        AdminTokenRefused { throttled: true, from }.emit(&state.metrics);
        return Some(crate::console::throttled(wait));
    }
    if token.matches(given.trim().as_bytes()) {
        return None;
    }
    throttle.failed(from, now);
    drop(throttle);
    AdminTokenRefused { throttled: false, from }.emit(&state.metrics);
    Some(unauthorized("missing or wrong bearer token"))
}

/// Why a request without a bearer token is refused, if it is: it needs the console's
/// session cookie, and a change (any method but GET and HEAD) the session's CSRF token
/// in `X-CSRF-Token` (a form of another site can send the cookie, never the header).
fn console_refusal(req: &ServiceRequest) -> Option<actix_web::HttpResponse> {
    let state = req.app_data::<web::Data<AdminState>>()?;
    let Some(session) = state.console.session_of(req.request()) else {
        return Some(unauthorized("missing or wrong bearer token"));
    };
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return None;
    }
    let given = req.headers().get(CSRF_HEADER).and_then(|v| v.to_str().ok());
    let sessions = state.console.sessions.as_ref()?;
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
