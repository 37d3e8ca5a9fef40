//! The operator console at `/console/` on the admin listener: one page and a small
//! script, embedded in the binary, that read and drive the admin API itself (so the
//! console cannot drift from the API, and needs no network, no CDN and no Node).
//!
//! Sign-in is the admin token, typed once into a password field and exchanged for a
//! session cookie (`access/session.rs`: signed, `HttpOnly`, `SameSite=Strict`, gone
//! with the browser); the admin API accepts that cookie besides the bearer token, and
//! every change made with it carries the session's CSRF token (`access/guard.rs`).
//! Wrong tokens are throttled (`wrong_tokens.rs`). A room beside the admin API: it
//! shares only [`Access`] with it, and the daemon mounts both on the private listener. Every answer under `/console/` carries a
//! strict Content-Security-Policy (no inline script or style), refuses framing and
//! sends no referrer.

use std::net::IpAddr;

use actix_web::http::{header, Method, StatusCode};
use actix_web::middleware::DefaultHeaders;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use crate::access::journal::Action;
use crate::access::session::{self, COOKIE};
use crate::access::{throttled, Access, Principal, Refused};
use crate::api::error;
use crate::internal_events::{ConsoleSignIn, InternalEvent, SignIn};
use serde_json::json;

/// The strict policy every console answer carries: scripts, styles and requests from
/// this origin only, nothing inline, no framing, no plugins.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; \
    frame-ancestors 'none'";

/// The embedded files: name, content type, bytes.
const ASSETS: &[(&str, &str, &str)] = &[
    ("console.js", "text/javascript; charset=utf-8", include_str!("assets/console.js")),
    ("console.css", "text/css; charset=utf-8", include_str!("assets/console.css")),
];

/// The page every console path answers with; the script shows what the path names,
/// so a deep link (`/console/events/{id}`) survives a reload.
const SHELL: &str = include_str!("assets/index.html");

/// Routes under `/console`.
pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/console").to(|| async {
        HttpResponse::PermanentRedirect().insert_header((header::LOCATION, "/console/")).finish()
    }))
    .service(
        web::scope("/console")
            .wrap(
                DefaultHeaders::new()
                    .add((header::CONTENT_SECURITY_POLICY, CSP))
                    .add((header::X_FRAME_OPTIONS, "DENY"))
                    .add((header::REFERRER_POLICY, "no-referrer"))
                    .add((header::X_CONTENT_TYPE_OPTIONS, "nosniff")),
            )
            .service(
                web::resource("/session")
                    .route(web::get().to(current))
                    .route(web::post().to(sign_in))
                    .route(web::delete().to(sign_out)),
            )
            .service(web::resource("/assets/{name}").route(web::get().to(asset)))
            .default_service(web::to(shell)),
    );
}

/// `GET /console/...`: the page (never with data in it: the script fetches that).
async fn shell(req: HttpRequest) -> HttpResponse {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return error(StatusCode::METHOD_NOT_ALLOWED, "the console's pages are read with GET");
    }
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(SHELL)
}

/// `GET /console/assets/{name}`.
async fn asset(name: web::Path<String>) -> HttpResponse {
    match ASSETS.iter().find(|(n, _, _)| *n == name.as_str()) {
        Some((_, kind, body)) => HttpResponse::Ok()
            .content_type(*kind)
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            .body(*body),
        None => error(StatusCode::NOT_FOUND, "no such console asset"),
    }
}

/// `GET /console/session`: whether the browser is signed in, with the session's CSRF
/// token if it is (200 either way: not being signed in is the page's first question,
/// not an error).
async fn current(req: HttpRequest, access: web::Data<Access>) -> HttpResponse {
    if !access.enabled() {
        return disabled();
    }
    let body = match access.session_of(&req) {
        Some((s, who)) => signed_in(&s, &who),
        None => serde_json::json!({ "signed_in": false }),
    };
    HttpResponse::Ok().insert_header((header::CACHE_CONTROL, "no-store")).json(body)
}

/// The sign-in's body, as the console's script sends it.
#[derive(Deserialize)]
struct SignInForm {
    token: String,
}

/// `POST /console/session`: exchanges the admin token for a session cookie.
async fn sign_in(req: HttpRequest, access: web::Data<Access>, body: web::Bytes) -> HttpResponse {
    if !access.enabled() {
        return disabled();
    }
    let from: Option<IpAddr> = req.peer_addr().map(|a| a.ip());
    // Only the console's own script signs in: JSON (which a page of another site can
    // send only after a CORS preflight this relay never grants), from this origin.
    // Else any page an operator has open could spend the operator's tries.
    if !is_json(&req) {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send the admin token as JSON: Content-Type: application/json, {\"token\": \"...\"}",
        );
    }
    if let Some(origin) = foreign_origin(&req) {
        return error(
            StatusCode::FORBIDDEN,
            format!("a sign-in from the page of another origin ({origin}) is refused: sign in on this relay's /console/"),
        );
    }
    let Some(form) = serde_json::from_slice::<SignInForm>(&body).ok() else {
        return error(StatusCode::BAD_REQUEST, "send the admin token as {\"token\": \"...\"}");
    };
    let who = match access.check(from, &form.token) {
        Ok(who) => who,
        Err(Refused::Throttled(wait)) => {
            // Counted, not journalled: a flood of them would be a flood of writes.
            ConsoleSignIn { result: SignIn::Throttled, from }.emit(&access.metrics);
            return throttled(wait);
        }
        Err(Refused::Wrong) => {
            ConsoleSignIn { result: SignIn::WrongToken, from }.emit(&access.metrics);
            let why = Err("wrong token".to_owned());
            access.journal.record("", from, Action::SignInFailed, json!({}), 0, why).await;
            return error(
                StatusCode::UNAUTHORIZED,
                "wrong admin token: use the relay's admin.token (or the file of \
                 admin.token_file, or the variable named by admin.token_env); the environment \
                 variable HOOKRELAY__ADMIN__TOKEN overrides the config file; or one of \
                 admin.tokens",
            );
        }
    };
    ConsoleSignIn { result: SignIn::Ok, from }.emit(&access.metrics);
    let Some(s) = access.sign_in(&who) else { return disabled() };
    access.journal.record(&who.name, from, Action::SignIn, json!({}), 1, Ok(())).await;
    let cookie = format!("{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict", s.cookie);
    let mut resp = HttpResponse::Ok().json(signed_in(&s, &who));
    if let Ok(v) = header::HeaderValue::from_str(&cookie) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp.headers_mut().insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
    resp
}

/// `DELETE /console/session`: signs out (the cookie is cleared; it needs the CSRF
/// token, so another site cannot sign an operator out either).
async fn sign_out(req: HttpRequest, access: web::Data<Access>) -> HttpResponse {
    let Some((s, who)) = access.session_of(&req) else {
        return error(StatusCode::UNAUTHORIZED, "not signed in");
    };
    let given = req.headers().get(session::CSRF_HEADER).and_then(|v| v.to_str().ok());
    if !given.is_some_and(|g| access.csrf_matches(&s, g)) {
        return error(StatusCode::FORBIDDEN, "missing or wrong CSRF token");
    }
    let from = req.peer_addr().map(|a| a.ip());
    access.journal.record(&who.name, from, Action::SignOut, json!({}), 1, Ok(())).await;
    let mut resp = HttpResponse::NoContent().finish();
    let gone = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    if let Ok(v) = header::HeaderValue::from_str(&gone) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

/// What the console's script is told of a session: its CSRF token, and who it is
/// (the token's name, role and scope), so that it shows what the role allows.
fn signed_in(s: &session::Session, who: &Principal) -> serde_json::Value {
    serde_json::json!({
        "signed_in": true,
        "csrf": s.csrf,
        "name": who.name,
        "role": who.role.name(),
        "destinations": who.destinations,
        "sees_bodies": who.sees_bodies(),
    })
}

/// Whether the request body is JSON (`application/json`, parameters allowed).
fn is_json(req: &HttpRequest) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

/// The `Origin` of a request sent by a page of another origin than this relay (the
/// scheme and host the request was sent to), if it was. A browser sends `Origin` on
/// every cross-origin POST; a client that is no browser sends none, and is let on.
fn foreign_origin(req: &HttpRequest) -> Option<String> {
    let origin = req.headers().get(header::ORIGIN)?.to_str().unwrap_or("?");
    let info = req.connection_info();
    let ours = format!("{}://{}", info.scheme(), info.host());
    (!origin.eq_ignore_ascii_case(&ours)).then(|| origin.chars().take(200).collect())
}

/// 403 with what to do when the console is off (no admin token).
fn disabled() -> HttpResponse {
    error(
        StatusCode::FORBIDDEN,
        "the console is disabled: set admin.token or admin.tokens (docs/security.md)",
    )
}
