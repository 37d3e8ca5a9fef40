//! `GET /admin/dead-letters` and `POST /admin/dead-letters/replay`.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde::Deserialize;

use super::events::store_error;
use super::{error, views, AdminState};
use crate::api;
use crate::store::{unix_micros, DeadLetterFilter, EventId};

const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 1000;

/// Filters of both endpoints.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct Query {
    source: Option<String>,
    event: Option<String>,
    destination: Option<String>,
    after: Option<String>,
    limit: Option<usize>,
}

/// The store filter of a query, or what is wrong with the query.
fn filter(
    query: Result<web::Query<Query>, actix_web::Error>,
    default_limit: usize,
    max_limit: usize,
) -> Result<DeadLetterFilter, String> {
    let q = query.map_err(|e| format!("bad query: {e}"))?.into_inner();
    let after = q
        .after
        .as_deref()
        .map(str::parse::<EventId>)
        .transpose()
        .map_err(|e| format!("after: {e}"))?;
    let limit = q.limit.unwrap_or(default_limit);
    if !(1..=max_limit).contains(&limit) {
        return Err(format!("limit: must be between 1 and {max_limit}"));
    }
    Ok(DeadLetterFilter {
        source: q.source,
        event: q.event,
        destination: q.destination,
        after,
        limit,
    })
}

/// Dead deliveries, newest event first, with their last status, error and answer.
pub(super) async fn list(
    state: web::Data<AdminState>,
    query: Result<web::Query<Query>, actix_web::Error>,
) -> HttpResponse {
    let filter = match filter(query, DEFAULT_LIMIT, MAX_LIMIT) {
        Ok(f) => f,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let limit = filter.limit;
    let store = state.store.clone();
    match store.dead_letters(filter).await {
        Ok(records) => {
            let next_after =
                (records.len() == limit).then(|| records.last().map(|r| r.event)).flatten();
            let dead_letters = records.iter().map(views::delivery).collect();
            HttpResponse::Ok().json(api::DeadLetterPage { dead_letters, next_after })
        }
        Err(e) => store_error(&e),
    }
}

/// What a bulk operation does to one dead letter.
#[derive(Clone, Copy)]
enum Bulk {
    Replay,
    Delete,
}

/// Applies `op` to every dead letter matching the query, page by page. Each one
/// leaves the dead letters as it is handled, so every page starts from the top again
/// (`after` only narrows the first). Returns the destinations of those handled.
async fn bulk(
    state: &web::Data<AdminState>,
    query: Result<web::Query<Query>, actix_web::Error>,
    op: Bulk,
) -> Result<Vec<String>, HttpResponse> {
    let mut filter =
        filter(query, MAX_LIMIT, MAX_LIMIT).map_err(|m| error(StatusCode::BAD_REQUEST, m))?;
    let store = &state.store;
    let mut handled = Vec::new();
    loop {
        let page = store.dead_letters(filter.clone()).await.map_err(|e| store_error(&e))?;
        if page.is_empty() {
            return Ok(handled);
        }
        let now = unix_micros(std::time::SystemTime::now());
        let before = handled.len();
        for record in &page {
            let (event, dest) = (record.event, &record.destination);
            let done = match op {
                Bulk::Replay => store.replay(event, vec![dest.clone()], now).await.map(|n| n > 0),
                Bulk::Delete => store.discard(event, dest).await,
            }
            .map_err(|e| store_error(&e))?;
            if done {
                handled.push(dest.clone());
            }
        }
        if handled.len() == before {
            // Nothing on this page could be handled: stop rather than loop on it.
            return Ok(handled);
        }
        filter.after = None;
    }
}

/// Replays every dead letter matching the filters.
pub(super) async fn replay(
    state: web::Data<AdminState>,
    query: Result<web::Query<Query>, actix_web::Error>,
) -> HttpResponse {
    let destinations = match bulk(&state, query, Bulk::Replay).await {
        Ok(d) => d,
        Err(resp) => return resp,
    };
    let woken: std::collections::BTreeSet<&str> = destinations.iter().map(String::as_str).collect();
    for d in woken {
        state.destinations.wake(d);
    }
    tracing::info!(replayed = destinations.len(), "dead letters replayed");
    HttpResponse::Ok().json(api::Replayed { replayed: destinations.len() })
}

/// Deletes every dead letter matching the filters: the deliveries become `discarded`
/// (never retried; their events can then be pruned).
pub(super) async fn delete(
    state: web::Data<AdminState>,
    query: Result<web::Query<Query>, actix_web::Error>,
) -> HttpResponse {
    match bulk(&state, query, Bulk::Delete).await {
        Ok(deleted) => {
            tracing::info!(deleted = deleted.len(), "dead letters deleted");
            HttpResponse::Ok().json(api::Deleted { deleted: deleted.len() })
        }
        Err(resp) => resp,
    }
}
