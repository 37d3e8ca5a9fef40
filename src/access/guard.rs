//! Guard of the `/admin` scope: who is asking (the bearer token, or the console's
//! session cookie with its CSRF token on every change), then whether their role and
//! scope allow the route (`rules.rs`). The holder goes into the request for the
//! handlers (what they show, what they act on). Wrong bearer tokens count against
//! their client in the same throttle as wrong sign-ins (`wrong_tokens.rs`).

use std::sync::Arc;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{header, Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage, HttpResponse};

use super::session::CSRF_HEADER;
use super::{rules, throttled, Access, Principal, Refused};
use crate::api::error;
use crate::internal_events::{AdminTokenRefused, InternalEvent};

/// An answer refusing the request (boxed: it is the rare path).
type Refusal = Box<HttpResponse>;

/// Lets a request through only from a known holder (`Authorization: Bearer <token>`
/// from a client that has not given too many wrong tokens lately, or the console's
/// session) whose role and scope allow the route.
pub(crate) async fn require_token<B: MessageBody>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let Some(access) = req.app_data::<web::Data<Access>>().filter(|a| a.enabled()).cloned() else {
        let off = error(
            StatusCode::FORBIDDEN,
            "the admin API is disabled: set admin.token or admin.tokens (docs/security.md)",
        );
        return Ok(req.into_response(off).map_into_right_body());
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let who = match given {
        Some(given) => bearer(&req, &access, given),
        None => console(&req, &access),
    };
    match who.and_then(|principal| allowed(&req, principal)) {
        Ok(principal) => {
            let from = req.peer_addr().map(|a| a.ip());
            let journal = access.journal.clone();
            req.extensions_mut().insert(super::journal::Caller { principal, from, journal });
            next.call(req).await.map(ServiceResponse::map_into_left_body)
        }
        Err(resp) => Ok(req.into_response(*resp).map_into_right_body()),
    }
}

/// The holder of a bearer token, or why it is refused: its client is throttled
/// (refused unread, 429), or the token is wrong (counted against the client).
fn bearer(req: &ServiceRequest, access: &Access, given: &str) -> Result<Arc<Principal>, Refusal> {
    let from = req.peer_addr().map(|a| a.ip());
    match access.check(from, given) {
        Ok(principal) => Ok(principal),
        Err(Refused::Throttled(wait)) => {
            AdminTokenRefused { throttled: true, from }.emit(&access.metrics);
            Err(Box::new(throttled(wait)))
        }
        Err(Refused::Wrong) => {
            AdminTokenRefused { throttled: false, from }.emit(&access.metrics);
            Err(Box::new(unauthorized("missing or wrong bearer token")))
        }
    }
}

/// The holder of the console's session, or why a request without a bearer token is
/// refused: it needs the session cookie, and a change (any method but GET and HEAD)
/// the session's CSRF token in `X-CSRF-Token` (a form of another site can send the
/// cookie, never the header).
fn console(req: &ServiceRequest, access: &Access) -> Result<Arc<Principal>, Refusal> {
    let Some((session, principal)) = access.session_of(req.request()) else {
        return Err(Box::new(unauthorized("missing or wrong bearer token")));
    };
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return Ok(principal);
    }
    let given = req.headers().get(CSRF_HEADER).and_then(|v| v.to_str().ok());
    if given.is_some_and(|g| access.csrf_matches(&session, g)) {
        Ok(principal)
    } else {
        Err(Box::new(error(
            StatusCode::FORBIDDEN,
            "a change made with the console's session needs its CSRF token (X-CSRF-Token)",
        )))
    }
}

/// `principal`, if its role and scope allow the route; else 403 saying what is
/// needed.
fn allowed(req: &ServiceRequest, principal: Arc<Principal>) -> Result<Arc<Principal>, Refusal> {
    let path = req.path().strip_prefix("/admin").unwrap_or(req.path());
    let (rule, destination) = rules::rule_of(req.method(), path);
    if !principal.may(rule.role) {
        return Err(Box::new(error(
            StatusCode::FORBIDDEN,
            format!(
                "{} {} needs the {} role; token {:?} is a{} {} (admin.tokens[].role)",
                req.method(),
                req.path(),
                rule.role.name(),
                principal.name,
                if principal.role == crate::config::Role::Operator { "n" } else { "" },
                principal.role.name()
            ),
        )));
    }
    if let Some(why) = destination.and_then(|d| principal.refuse_destination(d)) {
        return Err(Box::new(error(StatusCode::FORBIDDEN, why)));
    }
    Ok(principal)
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
