//! `GET /admin/dead-letters` and `POST /admin/dead-letters/replay`.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde::Deserialize;

use super::events::store_error;
use super::{error, views, AdminState, Who};
use crate::access::journal::Action;
use crate::api;
use crate::store::{DeadLetterFilter, DeliveryState, EventId};

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
    /// Only dead letters of events received at or after this time (RFC 3339).
    since: Option<String>,
    /// Only dead letters of events received before this time (RFC 3339).
    until: Option<String>,
    limit: Option<usize>,
}

/// The store filter of a query, or what is wrong with the query (400), or that it
/// names a destination outside the holder's scope (403).
fn filter(
    query: Result<web::Query<Query>, actix_web::Error>,
    who: &Who,
    default_limit: usize,
    max_limit: usize,
) -> Result<DeadLetterFilter, (StatusCode, String)> {
    let bad = |m: String| (StatusCode::BAD_REQUEST, m);
    let q = query.map_err(|e| bad(format!("bad query: {e}")))?.into_inner();
    if let Some(why) = q.destination.as_deref().and_then(|d| who.refuse_destination(d)) {
        return Err((StatusCode::FORBIDDEN, why));
    }
    let after = q
        .after
        .as_deref()
        .map(str::parse::<EventId>)
        .transpose()
        .map_err(|e| bad(format!("after: {e}")))?;
    let (after, since) =
        views::time_window(after, q.since.as_deref(), q.until.as_deref()).map_err(bad)?;
    let limit = q.limit.unwrap_or(default_limit);
    if !(1..=max_limit).contains(&limit) {
        return Err(bad(format!("limit: must be between 1 and {max_limit}")));
    }
    Ok(DeadLetterFilter {
        source: q.source,
        event: q.event,
        destination: q.destination,
        after,
        since,
        limit,
    })
}

/// Dead deliveries, newest event first, with their last status, error and answer.
/// A scoped holder sees those of its destinations (a page may then be short; its
/// `next_after` still goes on).
pub(super) async fn list(
    state: web::Data<AdminState>,
    who: Who,
    query: Result<web::Query<Query>, actix_web::Error>,
) -> HttpResponse {
    let filter = match filter(query, &who, DEFAULT_LIMIT, MAX_LIMIT) {
        Ok(f) => f,
        Err((status, message)) => return error(status, message),
    };
    let limit = filter.limit;
    let store = state.store.clone();
    match store.dead_letters(filter).await {
        Ok(records) => {
            let next_after =
                (records.len() == limit).then(|| records.last().map(|r| r.event)).flatten();
            let dead_letters =
                records.iter().filter(|r| who.sees(&r.destination)).map(views::delivery).collect();
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

/// Applies `op` to the dead letters matching the query, newest first: those older
/// than `after` if it is given, and at most `limit` (1 to 1,000) of them if it is given,
/// else all.
/// A cursor walks the dead letters from newest to oldest and only moves older, so a
/// dead letter is met once even if it dies again at once (a consumer answering 4xx
/// immediately): the request ends. Returns the destinations of those handled.
async fn bulk(
    state: &web::Data<AdminState>,
    who: &Who,
    query: Result<web::Query<Query>, actix_web::Error>,
    op: Bulk,
) -> Result<Vec<String>, HttpResponse> {
    // `limit` (1 to 1,000, as the API document says) caps the whole operation;
    // without it, every match is handled.
    let cap = query.as_ref().ok().and_then(|q| q.limit);
    let mut filter =
        filter(query, who, MAX_LIMIT, MAX_LIMIT).map_err(|(status, m)| error(status, m))?;
    let store = &state.store;
    let mut handled = Vec::new();
    let now = crate::clock::now_us();
    // One dead letter: `(done, destination)`. A destination no longer configured is
    // not replayed: its dead letters stay until it is back. Those outside a scoped
    // holder's destinations are left alone.
    let handle = |event: EventId, dest: String| async move {
        if !who.sees(&dest) {
            return Ok((false, dest));
        }
        one(state, op, event, &dest, now)
            .await
            .map(|done| (done, dest))
            .map_err(|e| store_error(&e))
    };
    loop {
        let left = cap.map_or(usize::MAX, |c| c.saturating_sub(handled.len()));
        if left == 0 {
            return Ok(handled);
        }
        filter.limit = left.min(MAX_LIMIT);
        let page = store.dead_letters(filter.clone()).await.map_err(|e| store_error(&e))?;
        let Some(last) = page.last().map(|r| r.event) else { return Ok(handled) };
        let full = page.len() == filter.limit;
        let mut seen_last = Vec::new();
        for record in page {
            if record.event == last {
                seen_last.push(record.destination.clone());
            }
            if let (true, dest) = handle(record.event, record.destination).await? {
                handled.push(dest);
            }
        }
        if full {
            // The page may have cut the last event's dead letters short; the cursor
            // moves past the event, so the rest of it is handled here.
            let rest = store.deliveries_of(last).await.map_err(|e| store_error(&e))?;
            for d in rest {
                let wanted = filter.destination.as_ref().is_none_or(|f| *f == d.destination);
                let fits = cap.is_none_or(|c| handled.len() < c);
                if d.state == DeliveryState::Dead
                    && wanted
                    && fits
                    && !seen_last.contains(&d.destination)
                {
                    if let (true, dest) = handle(last, d.destination).await? {
                        handled.push(dest);
                    }
                }
            }
        }
        filter.after = Some(last);
    }
}

/// Replays every dead letter matching the filters.
pub(super) async fn replay(
    state: web::Data<AdminState>,
    who: Who,
    req: actix_web::HttpRequest,
    query: Result<web::Query<Query>, actix_web::Error>,
) -> HttpResponse {
    let target = serde_json::json!({ "dead_letters": "matching", "query": req.query_string() });
    let destinations = match bulk(&state, &who, query, Bulk::Replay).await {
        Ok(d) => d,
        Err(resp) => return super::failed(&who, Action::Replay, target, resp).await,
    };
    who.record(Action::Replay, target, destinations.len() as u64, Ok(())).await;
    let woken: std::collections::BTreeSet<&str> = destinations.iter().map(String::as_str).collect();
    for d in woken {
        state.destinations.load().wake(d);
    }
    tracing::info!(by = %who.name, replayed = destinations.len(), "dead letters replayed");
    HttpResponse::Ok().json(api::Replayed { replayed: destinations.len() })
}

/// What a selection names, for the journal (the body as sent, if it is JSON).
fn chosen(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body).unwrap_or(serde_json::Value::Null)
}

/// Most dead letters one selection may name.
const MAX_SELECTION: usize = 1_000;

/// The chosen dead letters, or what is wrong with the request.
fn selection(body: &[u8]) -> Result<Vec<api::DeliveryRef>, String> {
    let s: api::Selection = serde_json::from_slice(body).map_err(|e| {
        format!("body: {e}; send {{\"dead_letters\": [{{\"event\": ID, \"destination\": NAME}}]}}")
    })?;
    if s.dead_letters.len() > MAX_SELECTION {
        return Err(format!("dead_letters: at most {MAX_SELECTION} at once (filters handle more)"));
    }
    Ok(s.dead_letters)
}

/// Applies `op` to one dead letter; whether it was done. A destination no longer
/// configured is not replayed: its dead letters stay until it is back.
async fn one(
    state: &AdminState,
    op: Bulk,
    event: EventId,
    dest: &str,
    now: u64,
) -> Result<bool, crate::store::StoreError> {
    match op {
        Bulk::Replay if state.destinations.load().get(dest).is_none() => Ok(false),
        Bulk::Replay => state.store.replay(event, vec![dest.to_owned()], now).await.map(|n| n > 0),
        Bulk::Delete => state.store.discard(event, dest).await,
    }
}

/// Applies `op` to the chosen dead letters that are still dead (one replayed or
/// discarded meanwhile is left alone); how many it handled. A choice outside a scoped
/// holder's destinations refuses the whole request (403), before anything is done.
async fn selected(
    state: &AdminState,
    who: &Who,
    body: &[u8],
    op: Bulk,
) -> Result<usize, HttpResponse> {
    let chosen = selection(body).map_err(|m| error(StatusCode::BAD_REQUEST, m))?;
    if let Some(why) = chosen.iter().find_map(|d| who.refuse_destination(&d.destination)) {
        return Err(error(StatusCode::FORBIDDEN, why));
    }
    let now = crate::clock::now_us();
    let mut done = 0;
    for d in chosen {
        let all = state.store.deliveries_of(d.event).await.map_err(|e| store_error(&e))?;
        if !all.iter().any(|r| r.destination == d.destination && r.state == DeliveryState::Dead) {
            continue;
        }
        if one(state, op, d.event, &d.destination, now).await.map_err(|e| store_error(&e))? {
            done += 1;
            if matches!(op, Bulk::Replay) {
                state.destinations.load().wake(&d.destination);
            }
        }
    }
    Ok(done)
}

/// `POST /admin/dead-letters/selection/replay`: replays the chosen dead letters.
pub(super) async fn replay_selected(
    state: web::Data<AdminState>,
    who: Who,
    body: web::Bytes,
) -> HttpResponse {
    let target = chosen(&body);
    match selected(&state, &who, &body, Bulk::Replay).await {
        Err(resp) => super::failed(&who, Action::Replay, target, resp).await,
        Ok(replayed) => {
            who.record(Action::Replay, target, replayed as u64, Ok(())).await;
            tracing::info!(by = %who.name, replayed, "chosen dead letters replayed");
            HttpResponse::Ok().json(api::Replayed { replayed })
        }
    }
}

/// `POST /admin/dead-letters/selection/discard`: discards the chosen dead letters
/// (they become `discarded`).
pub(super) async fn discard_selected(
    state: web::Data<AdminState>,
    who: Who,
    body: web::Bytes,
) -> HttpResponse {
    let target = chosen(&body);
    match selected(&state, &who, &body, Bulk::Delete).await {
        Err(resp) => super::failed(&who, Action::Discard, target, resp).await,
        Ok(deleted) => {
            who.record(Action::Discard, target, deleted as u64, Ok(())).await;
            tracing::info!(by = %who.name, deleted, "chosen dead letters discarded");
            HttpResponse::Ok().json(api::Deleted { deleted })
        }
    }
}

/// Deletes every dead letter matching the filters: the deliveries become `discarded`
/// (never retried; their events can then be pruned).
pub(super) async fn delete(
    state: web::Data<AdminState>,
    who: Who,
    req: actix_web::HttpRequest,
    query: Result<web::Query<Query>, actix_web::Error>,
) -> HttpResponse {
    let target = serde_json::json!({ "dead_letters": "matching", "query": req.query_string() });
    match bulk(&state, &who, query, Bulk::Delete).await {
        Err(resp) => super::failed(&who, Action::Discard, target, resp).await,
        Ok(deleted) => {
            who.record(Action::Discard, target, deleted.len() as u64, Ok(())).await;
            tracing::info!(by = %who.name, deleted = deleted.len(), "dead letters deleted");
            HttpResponse::Ok().json(api::Deleted { deleted: deleted.len() })
        }
    }
}
