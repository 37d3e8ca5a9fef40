//! Who may use the private listener: the admin tokens, each named and with a role
//! (`principal.rs`), given as a bearer token to the API or exchanged at the console's
//! sign-in for a session cookie (`session.rs`); the role each route needs
//! (`rules.rs`); and the throttle of wrong tokens (`wrong_tokens.rs`, shared with the
//! pull routes). A room of its own,
//! below both the admin API and the console, so that neither has to reach into the
//! other: the daemon builds one [`Access`] and hands it to both.

pub(crate) mod guard;
pub(crate) mod journal;
pub(crate) mod principal;
pub(crate) mod rules;
pub(crate) mod session;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use actix_web::http::header;
use actix_web::HttpRequest;

pub(crate) use crate::api::throttled;
use crate::config::{AdminConfig, Role, Secret};
use crate::lock::{lock, Current};
use crate::metrics::Metrics;
pub(crate) use crate::wrong_tokens::Refused;
use crate::wrong_tokens::WrongTokens;
pub(crate) use principal::Principal;
use session::{Session, Sessions, COOKIE};

/// What the private listener's guard and the console's sign-in share.
pub(crate) struct Access {
    /// Every token's holder; none: the API and the console are off. A reload replaces
    /// them whole: a session outlives it when its holder's token did not change.
    holders: Current<Vec<Holder>>,
    /// Wrong tokens per client: shared with the pull routes (one count per client,
    /// whichever token it tried), its limit set by `admin.wrong_tokens_per_minute`.
    throttle: Arc<Mutex<WrongTokens>>,
    /// Where changes and sign-ins are recorded.
    pub(crate) journal: Arc<journal::Recorder>,
    pub(crate) metrics: Arc<Metrics>,
}

/// One token, whom it names, and the sessions signed under it.
struct Holder {
    token: Secret,
    principal: Arc<Principal>,
    sessions: Sessions,
}

impl Access {
    /// The access of the tokens of `admin` (validated: `admin.token` as the admin
    /// named `admin`, then `admin.tokens`), `admin.wrong_tokens_per_minute` a minute
    /// allowed per client.
    pub(crate) fn new(
        admin: &AdminConfig,
        journal: Arc<journal::Recorder>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let throttle = Arc::new(Mutex::new(WrongTokens::new(admin.wrong_tokens_per_minute)));
        Self { holders: Current::new(holders(admin)), throttle, journal, metrics }
    }

    /// Puts the tokens and roles of `admin` in force (a reload). Each request is
    /// checked against the holders in force when it came; the throttle keeps its count.
    pub(crate) fn reload(&self, admin: &AdminConfig) {
        lock(&self.throttle).set_limit(admin.wrong_tokens_per_minute);
        self.holders.replace(holders(admin));
    }

    /// The count of wrong tokens per client, for the pull routes to share.
    pub(crate) fn wrong_tokens(&self) -> Arc<Mutex<WrongTokens>> {
        self.throttle.clone()
    }

    /// Whether any admin token is set (else the API and the console refuse everything).
    pub(crate) fn enabled(&self) -> bool {
        !self.holders.load().is_empty()
    }

    /// Checks `given` against every admin token for the client at `from`: the check
    /// and the count under one lock, so that concurrent wrong tokens from one client
    /// are let through no more than the limit, however they interleave. One rule for
    /// the bearer token and the console's sign-in. Every token is compared (each in
    /// constant time), so the time taken does not tell which one came close.
    pub(crate) fn check(
        &self,
        from: Option<IpAddr>,
        given: &str,
    ) -> Result<Arc<Principal>, Refused> {
        let now = crate::clock::unix_micros(std::time::SystemTime::now());
        let given = given.trim().as_bytes();
        lock(&self.throttle).present(from, now, || {
            let mut found = None;
            for holder in self.holders.load().iter() {
                if holder.token.matches(given) && found.is_none() {
                    found = Some(holder.principal.clone());
                }
            }
            found
        })
    }

    /// A new console session for `principal`.
    pub(crate) fn sign_in(&self, principal: &Principal) -> Option<Session> {
        let holders = self.holders.load();
        let holder = holders.iter().find(|h| h.principal.name == principal.name)?;
        let now = crate::clock::unix_micros(std::time::SystemTime::now());
        Some(holder.sessions.issue(&principal.name, now))
    }

    /// The valid session of `req`'s cookie, and whose it is, if any.
    pub(crate) fn session_of(&self, req: &HttpRequest) -> Option<(Session, Arc<Principal>)> {
        let cookie = cookie(req, COOKIE)?;
        let name = Sessions::claimed(cookie)?;
        let holders = self.holders.load();
        let holder = holders.iter().find(|h| h.principal.name == name)?;
        let now = crate::clock::unix_micros(std::time::SystemTime::now());
        let session = holder.sessions.verify(name, cookie, now)?;
        Some((session, holder.principal.clone()))
    }

    /// Whether `given` is the CSRF token of `session`, compared in constant time.
    pub(crate) fn csrf_matches(&self, session: &Session, given: &str) -> bool {
        Sessions::csrf_matches(session, given)
    }
}

/// The holders of the tokens of `admin` (validated: `admin.token` as the admin named
/// `admin`, then `admin.tokens`).
fn holders(admin: &AdminConfig) -> Vec<Holder> {
    let named = admin.resolved_token.iter().map(|token| {
        let principal = Principal {
            name: crate::config::ADMIN_NAME.into(),
            role: Role::Admin,
            destinations: None,
        };
        (token.clone(), principal)
    });
    let listed = admin.tokens.iter().filter_map(|t| {
        let principal =
            Principal { name: t.name.clone(), role: t.role, destinations: t.destinations.clone() };
        Some((t.resolved.clone()?, principal))
    });
    named
        .chain(listed)
        .map(|(token, principal)| Holder {
            sessions: Sessions::new(&token),
            token,
            principal: Arc::new(principal),
        })
        .collect()
}

/// The value of the cookie `name` of `req` (the `Cookie` headers, `a=1; b=2`).
fn cookie<'r>(req: &'r HttpRequest, name: &str) -> Option<&'r str> {
    req.headers()
        .get_all(header::COOKIE)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(name)?.strip_prefix('='))
}
