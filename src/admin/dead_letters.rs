//! `GET /admin/dead-letters` and `POST /admin/dead-letters/replay`.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde::Deserialize;

use super::events::store_error;
use super::{error, views, AdminState, Who};
use crate::access::journal::Action;
use crate::api;
use std::collections::BTreeSet;

use crate::store::lifecycle::Managed;
use crate::store::{DeadLetterFilter, DeliveryState, EventId, QueueChange};

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

/// What a bulk operation does to the dead letters it names.
#[derive(Clone, Copy)]
enum Bulk {
    Replay,
    Delete,
}

impl Bulk {
    /// The journal's word for it.
    fn action(self) -> Action {
        match self {
            Bulk::Replay => Action::Replay,
            Bulk::Delete => Action::Discard,
        }
    }

    /// The lifecycle's rule for each dead letter: one replayed or discarded since it
    /// was listed is left alone.
    fn how(self) -> Managed {
        match self {
            Bulk::Replay => Managed::ReplayDead,
            Bulk::Delete => Managed::Discard,
        }
    }
}

/// Whether `op` takes the dead letter of `dest`: one outside a scoped holder's
/// destinations is left alone, and one of a destination no longer configured is not
/// replayed (its dead letters stay until it is back).
fn takes(state: &AdminState, who: &Who, op: Bulk, dest: &str) -> bool {
    who.sees(dest) && (matches!(op, Bulk::Delete) || state.destinations.load().get(dest).is_some())
}

/// The dead letters matching the query that `op` takes, newest first: those older
/// than `after` if it is given, and at most `limit` (1 to 1,000) of them if it is
/// given, else all. A cursor walks the dead letters from newest to oldest and only
/// moves older, so each is met once.
async fn matching(
    state: &AdminState,
    who: &Who,
    query: Result<web::Query<Query>, actix_web::Error>,
    op: Bulk,
) -> Result<Vec<(EventId, String)>, HttpResponse> {
    // `limit` (1 to 1,000, as the API document says) caps the whole operation;
    // without it, every match is handled.
    let cap = query.as_ref().ok().and_then(|q| q.limit);
    let mut filter =
        filter(query, who, MAX_LIMIT, MAX_LIMIT).map_err(|(status, m)| error(status, m))?;
    let store = &state.store;
    let mut chosen = Vec::new();
    loop {
        let left = cap.map_or(usize::MAX, |c| c.saturating_sub(chosen.len()));
        if left == 0 {
            return Ok(chosen);
        }
        filter.limit = left.min(MAX_LIMIT);
        let page = store.dead_letters(filter.clone()).await.map_err(|e| store_error(&e))?;
        let Some(last) = page.last().map(|r| r.event) else { return Ok(chosen) };
        let full = page.len() == filter.limit;
        let mut seen_last = Vec::new();
        for record in page {
            if record.event == last {
                seen_last.push(record.destination.clone());
            }
            if takes(state, who, op, &record.destination) {
                chosen.push((record.event, record.destination));
            }
        }
        if full {
            // The page may have cut the last event's dead letters short; the cursor
            // moves past the event, so the rest of it is taken here.
            let rest = store.deliveries_of(last).await.map_err(|e| store_error(&e))?;
            for d in rest {
                let wanted = filter.destination.as_ref().is_none_or(|f| *f == d.destination);
                let fits = cap.is_none_or(|c| chosen.len() < c);
                if d.state == DeliveryState::Dead
                    && wanted
                    && fits
                    && !seen_last.contains(&d.destination)
                    && takes(state, who, op, &d.destination)
                {
                    chosen.push((last, d.destination));
                }
            }
        }
        filter.after = Some(last);
    }
}

/// Applies `op` to `chosen` in one transaction with its journal entry (on `target`);
/// how many it changed. A replay wakes the destinations concerned.
async fn apply(
    state: &AdminState,
    who: &Who,
    op: Bulk,
    target: &serde_json::Value,
    chosen: Vec<(EventId, String)>,
) -> Result<usize, HttpResponse> {
    let woken: BTreeSet<String> = chosen.iter().map(|(_, d)| d.clone()).collect();
    let now_us = crate::clock::now_us();
    let change = QueueChange::Deliveries { each: chosen, how: op.how(), now_us };
    let changed = who.change(op.action(), target, change).await.map_err(|e| store_error(&e))?;
    if matches!(op, Bulk::Replay) {
        let destinations = state.destinations.load();
        for d in &woken {
            destinations.wake(d);
        }
    }
    Ok(usize::try_from(changed).unwrap_or(usize::MAX))
}

/// `op` on the dead letters matching the query; how many it changed.
async fn bulk(
    state: &AdminState,
    who: &Who,
    query: Result<web::Query<Query>, actix_web::Error>,
    op: Bulk,
    target: &serde_json::Value,
) -> Result<usize, HttpResponse> {
    let chosen = matching(state, who, query, op).await?;
    apply(state, who, op, target, chosen).await
}

/// Replays every dead letter matching the filters.
pub(super) async fn replay(
    state: web::Data<AdminState>,
    who: Who,
    req: actix_web::HttpRequest,
    query: Result<web::Query<Query>, actix_web::Error>,
) -> HttpResponse {
    let target = serde_json::json!({ "dead_letters": "matching", "query": req.query_string() });
    match bulk(&state, &who, query, Bulk::Replay, &target).await {
        Err(resp) => super::failed(&who, Action::Replay, target, resp).await,
        Ok(replayed) => {
            tracing::info!(by = %who.name, replayed, "dead letters replayed");
            HttpResponse::Ok().json(api::Replayed { replayed })
        }
    }
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

/// Applies `op` to the chosen dead letters that are still dead (one replayed or
/// discarded meanwhile is left alone); how many it changed. A choice outside a scoped
/// holder's destinations refuses the whole request (403), before anything is done.
async fn selected(
    state: &AdminState,
    who: &Who,
    body: &[u8],
    op: Bulk,
    target: &serde_json::Value,
) -> Result<usize, HttpResponse> {
    let chosen = selection(body).map_err(|m| error(StatusCode::BAD_REQUEST, m))?;
    if let Some(why) = chosen.iter().find_map(|d| who.refuse_destination(&d.destination)) {
        return Err(error(StatusCode::FORBIDDEN, why));
    }
    let chosen = chosen
        .into_iter()
        .filter(|d| takes(state, who, op, &d.destination))
        .map(|d| (d.event, d.destination))
        .collect();
    apply(state, who, op, target, chosen).await
}

/// `POST /admin/dead-letters/selection/replay`: replays the chosen dead letters.
pub(super) async fn replay_selected(
    state: web::Data<AdminState>,
    who: Who,
    body: web::Bytes,
) -> HttpResponse {
    let target = chosen(&body);
    match selected(&state, &who, &body, Bulk::Replay, &target).await {
        Err(resp) => super::failed(&who, Action::Replay, target, resp).await,
        Ok(replayed) => {
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
    match selected(&state, &who, &body, Bulk::Delete, &target).await {
        Err(resp) => super::failed(&who, Action::Discard, target, resp).await,
        Ok(deleted) => {
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
    match bulk(&state, &who, query, Bulk::Delete, &target).await {
        Err(resp) => super::failed(&who, Action::Discard, target, resp).await,
        Ok(deleted) => {
            tracing::info!(by = %who.name, deleted, "dead letters deleted");
            HttpResponse::Ok().json(api::Deleted { deleted })
        }
    }
}
