//! Who may use a pull destination's routes: the request's bearer token against the
//! destination's, in the relay's one count of wrong tokens per client
//! (`wrong_tokens.rs`): a wrong token and a name of no pull destination both count.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};

use super::{error, PullState};
use crate::api;
use crate::delivery::DestinationState;
use crate::internal_events::{InternalEvent, PullTokenRefused};
use crate::lock::lock;
use crate::wrong_tokens::Refused;

/// The pull destination `name` if the request carries its token; else the refusal
/// (its answer). A wrong token and a name that is no pull destination both count
/// against the client in the relay's one count of wrong tokens (`wrong_tokens.rs`);
/// a client past its limit is refused unread, 429 with `Retry-After`.
pub(super) fn authorized(
    state: &PullState,
    req: &HttpRequest,
    name: &str,
) -> Result<Arc<DestinationState>, Box<HttpResponse>> {
    let destinations = state.destinations.load();
    let found = destinations
        .get(name)
        .filter(|d| d.dest.kind == crate::config::DestinationKind::Pull)
        .cloned();
    let given = req
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let from = req.peer_addr().map(|a| a.ip());
    let now = crate::clock::unix_micros(std::time::SystemTime::now());
    let unknown = found.is_none();
    let taken = lock(&state.wrong_tokens).present(from, now, || {
        let found = found?;
        let right = match (&found.dest.pull_token, given) {
            (Some(token), Some(given)) => token.matches(given.trim().as_bytes()),
            _ => false,
        };
        right.then_some(found)
    });
    taken.map_err(|result| Box::new(refusal(state, name, result, unknown, from)))
}

/// The answer to a token or name refused, counted and logged.
fn refusal(
    state: &PullState,
    name: &str,
    result: Refused,
    unknown: bool,
    from: Option<std::net::IpAddr>,
) -> HttpResponse {
    PullTokenRefused { result, unknown_destination: unknown, from }.emit(&state.metrics);
    match result {
        Refused::Throttled(wait) => api::throttled(wait),
        Refused::Wrong if unknown => {
            error(StatusCode::NOT_FOUND, format!("no pull destination named {name:?}"))
        }
        Refused::Wrong => error(
            StatusCode::UNAUTHORIZED,
            format!(
                "no or wrong `Authorization: Bearer` token for pull destination {name:?} \
                     (its token, token_file or token_env)"
            ),
        ),
    }
}
