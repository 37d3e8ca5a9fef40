//! Who may use the private listener: the admin token, given as a bearer token to the
//! API or exchanged at the console's sign-in for a session cookie (`session.rs`), and
//! the throttle of wrong tokens (`throttle.rs`). A room of its own, below both the
//! admin API and the console, so that neither has to reach into the other: the daemon
//! builds one [`Access`] and hands it to both.

pub(crate) mod guard;
pub(crate) mod session;
pub(crate) mod throttle;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::http::{header, StatusCode};
use actix_web::{HttpRequest, HttpResponse};

use crate::api::error;
use crate::config::Secret;
use crate::lock::lock;
use crate::metrics::Metrics;
use session::{Session, Sessions, COOKIE};
use throttle::SignInThrottle;

/// What the private listener's guard and the console's sign-in share.
pub(crate) struct Access {
    /// `None` when no admin token is set: the API and the console are off.
    token: Option<Secret>,
    /// The console's sessions, keyed by the token (`None` with it).
    sessions: Option<Sessions>,
    throttle: Mutex<SignInThrottle>,
    pub(crate) metrics: Arc<Metrics>,
}

/// Why a presented token was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Its client gave too many wrong tokens lately: refused unread, for this long.
    Throttled(Duration),
    /// The token is wrong (counted against its client).
    Wrong,
}

impl Access {
    /// The access of admin token `token`, `wrong_tokens` a minute allowed per client.
    pub(crate) fn new(token: Option<Secret>, wrong_tokens: u32, metrics: Arc<Metrics>) -> Self {
        let throttle = Mutex::new(SignInThrottle::new(wrong_tokens));
        Self { sessions: token.as_ref().map(Sessions::new), token, throttle, metrics }
    }

    /// Whether an admin token is set (else the API and the console refuse everything).
    pub(crate) fn enabled(&self) -> bool {
        self.token.is_some()
    }

    /// The console's sessions, when an admin token is set.
    pub(crate) fn sessions(&self) -> Option<&Sessions> {
        self.sessions.as_ref()
    }

    /// Checks `given` against the admin token for the client at `from`: the check and
    /// the count under one lock, so that concurrent wrong tokens from one client are
    /// let through no more than the limit, however they interleave. One rule for the
    /// bearer token and the console's sign-in.
    pub(crate) fn check(&self, from: Option<IpAddr>, given: &str) -> Result<(), Refused> {
        let Some(token) = &self.token else { return Err(Refused::Wrong) };
        let now = crate::clock::unix_micros(std::time::SystemTime::now());
        let mut throttle = lock(&self.throttle);
        throttle.check(from, now).map_err(Refused::Throttled)?;
        if token.matches(given.trim().as_bytes()) {
            return Ok(());
        }
        throttle.failed(from, now);
        Err(Refused::Wrong)
    }

    /// The valid session of `req`'s cookie, if any.
    pub(crate) fn session_of(&self, req: &HttpRequest) -> Option<Session> {
        let cookie = cookie(req, COOKIE)?;
        self.sessions
            .as_ref()?
            .verify(cookie, crate::clock::unix_micros(std::time::SystemTime::now()))
    }
}

/// The value of the cookie `name` of `req` (the `Cookie` headers, `a=1; b=2`).
fn cookie<'r>(req: &'r HttpRequest, name: &str) -> Option<&'r str> {
    req.headers()
        .get_all(header::COOKIE)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(name)?.strip_prefix('='))
}

/// 429 for a client with too many wrong tokens lately, with when to try again.
pub(crate) fn throttled(wait: Duration) -> HttpResponse {
    let secs = wait.as_secs().max(1);
    let mut resp = error(
        StatusCode::TOO_MANY_REQUESTS,
        format!("too many wrong admin tokens from this address: try again in {secs} s"),
    );
    if let Ok(v) = header::HeaderValue::from_str(&secs.to_string()) {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}
