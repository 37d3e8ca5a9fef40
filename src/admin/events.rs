//! `GET /admin/events` and `GET /admin/events/{id}`.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use base64::Engine;
use serde::Deserialize;

use super::{error, views, AdminState, Who};
use crate::access::journal::Action;
use crate::api;
use crate::store::lifecycle::Managed;
use crate::store::{EventFilter, EventId, EventStatus, QueueChange, StoreError};

const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 1000;

/// Query of the event listing.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    source: Option<String>,
    event: Option<String>,
    status: Option<EventStatus>,
    /// Only events about this resource, `type/id` (`actions/5`), each with its
    /// deliveries' states. `record` is its name of the first builds, still accepted.
    #[serde(alias = "record")]
    resource: Option<String>,
    /// Continue after this id: the listing is newest first, so older events follow.
    after: Option<String>,
    /// Only events received at or after this time (RFC 3339).
    since: Option<String>,
    /// Only events received before this time (RFC 3339).
    until: Option<String>,
    /// Only events whose most urgent delivery state is this one (`dead`, `retrying`...).
    delivery: Option<crate::store::DeliveryState>,
    limit: Option<usize>,
}

/// Events read at most for one page filtered by delivery state (a page may then hold
/// fewer than `limit`: follow `next_after`).
const DELIVERY_SCAN: usize = 10_000;

/// Lists events, newest first, with `next_after` to fetch the following page.
pub(super) async fn list(
    state: web::Data<AdminState>,
    who: Who,
    query: Result<web::Query<ListQuery>, actix_web::Error>,
) -> HttpResponse {
    let query = match query {
        Ok(q) => q.into_inner(),
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad query: {e}")),
    };
    let after = match query.after.as_deref().map(str::parse::<EventId>).transpose() {
        Ok(after) => after,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("after: {e}")),
    };
    let (after, since) =
        match views::time_window(after, query.since.as_deref(), query.until.as_deref()) {
            Ok(w) => w,
            Err(e) => return error(StatusCode::BAD_REQUEST, e),
        };
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return error(StatusCode::BAD_REQUEST, format!("limit: must be between 1 and {MAX_LIMIT}"));
    }
    if let Some(resource) = &query.resource {
        if !resource.split_once('/').is_some_and(|(kind, id)| !kind.is_empty() && !id.is_empty()) {
            return error(
                StatusCode::BAD_REQUEST,
                format!("resource: {resource:?} is not type/id, such as actions/5 (the `type` and `id` of the callback's `data`)"),
            );
        }
    }
    let by_resource = query.resource.is_some();
    let mut filter = EventFilter {
        source: query.source,
        event: query.event,
        status: query.status,
        resource: query.resource,
        after,
        since,
        limit,
    };
    let store = &state.store;
    let (mut events, mut scanned) = (Vec::new(), 0);
    let next_after = 'pages: loop {
        let records = match store.list_events(filter.clone()).await {
            Ok(records) => records,
            Err(e) => return store_error(&e),
        };
        scanned += records.len();
        let last = (records.len() == limit).then(|| records.last().map(|r| r.id)).flatten();
        for r in &records {
            // Each event's deliveries: its badge, and by resource their states ("did
            // it reach them").
            let mut deliveries = match store.deliveries_of(r.id).await {
                Ok(d) => d,
                Err(e) => return store_error(&e),
            };
            deliveries.retain(|d| who.sees(&d.destination));
            let worst = views::worst(&deliveries);
            if query.delivery.is_some_and(|wanted| worst != Some(wanted)) {
                continue;
            }
            events.push(api::EventSummary {
                deliveries: by_resource.then(|| views::delivery_states(&deliveries)),
                worst_delivery: worst,
                ..views::event_summary(r)
            });
            // A page filtered by delivery state is full: the next one starts after it.
            if query.delivery.is_some() && events.len() == limit {
                break 'pages Some(r.id);
            }
        }
        // Unfiltered, one page; by delivery state, pages until this one is full (or
        // enough was read for one answer).
        match last {
            Some(id)
                if query.delivery.is_some() && events.len() < limit && scanned < DELIVERY_SCAN =>
            {
                filter.after = Some(id);
            }
            _ => break last,
        }
    };
    HttpResponse::Ok().json(api::EventPage { events, next_after })
}

/// One event with its headers and body (UTF-8 text as is, anything else in base64).
/// A holder without the admin role gets neither (`redacted`), and sees only the
/// deliveries of its destinations.
pub(super) async fn show(
    state: web::Data<AdminState>,
    who: Who,
    id: web::Path<String>,
) -> HttpResponse {
    let id = match id.parse::<EventId>() {
        Ok(id) => id,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("id: {e}")),
    };
    let store = &state.store;
    let found = async {
        Ok::<_, StoreError>((
            store.event(id).await?,
            store.body(id).await?,
            store.deliveries_of(id).await?,
        ))
    }
    .await;
    let (record, body, mut deliveries) = match found {
        Ok((Some(record), body, deliveries)) => (record, body, deliveries),
        Ok((None, _, _)) => return error(StatusCode::NOT_FOUND, format!("no event {id}")),
        Err(e) => return store_error(&e),
    };
    let body_pruned = views::body_pruned(&record.meta, body.as_deref());
    deliveries.retain(|d| who.sees(&d.destination));
    let redacted = !who.sees_bodies();
    let body = if redacted { None } else { body };
    let (body, body_encoding) = match body {
        None => (None, None),
        Some(bytes) => match String::from_utf8(bytes) {
            Ok(text) => (Some(text), Some(api::BodyEncoding::Utf8)),
            Err(e) => (
                Some(base64::engine::general_purpose::STANDARD.encode(e.as_bytes())),
                Some(api::BodyEncoding::Base64),
            ),
        },
    };
    HttpResponse::Ok().json(api::EventDetail {
        summary: views::event_summary(&record),
        headers: if redacted {
            Default::default()
        } else {
            record.meta.headers.iter().cloned().collect()
        },
        remote_addr: record.meta.remote_addr.clone(),
        body,
        body_encoding,
        body_pruned,
        redacted,
        delivery_records: deliveries.iter().map(views::delivery).collect(),
    })
}

pub(super) fn store_error(e: &dyn std::fmt::Display) -> HttpResponse {
    tracing::error!(error = %e, "admin API: store read failed");
    error(StatusCode::INTERNAL_SERVER_ERROR, format!("store read failed: {e}"))
}

/// Schedules the event again for all or some destinations, whatever their state.
/// A holder scoped to some destinations replays to those only: naming another is
/// refused (403), naming none means its own among the event's.
pub(super) async fn replay(
    state: web::Data<AdminState>,
    who: Who,
    id: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let id = match id.parse::<EventId>() {
        Ok(id) => id,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("id: {e}")),
    };
    // No body means the default; a body that is not a ReplayRequest is refused (it
    // was once taken for no body, and replayed to every destination).
    let requested = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        match serde_json::from_slice::<api::ReplayRequest>(&body) {
            Ok(request) => request.destinations,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("body: not a replay request ({e}); send {{\"destinations\": [\"name\", ...]}} or no body"),
                )
            }
        }
    };
    let record = match state.store.event(id).await {
        Ok(Some(record)) => record,
        Ok(None) => return error(StatusCode::NOT_FOUND, format!("no event {id}")),
        Err(e) => return store_error(&e),
    };
    if matches!(record.meta.status, EventStatus::Received | EventStatus::Rejected) {
        return error(
            StatusCode::CONFLICT,
            format!(
                "event {id} is {}: only dispatched events can be replayed",
                record.meta.status.as_str()
            ),
        );
    }
    match state.store.body(id).await {
        Ok(body) if views::body_pruned(&record.meta, body.as_deref()) => {
            return error(
                StatusCode::CONFLICT,
                format!(
                    "event {id}'s body was dropped by retention.delivered_bodies: there is \
                     nothing left to send (its record stays, for the audit and the search)"
                ),
            )
        }
        Ok(_) => {}
        Err(e) => return store_error(&e),
    }
    if let Some(why) = requested.iter().flatten().find_map(|d| who.refuse_destination(d)) {
        return error(StatusCode::FORBIDDEN, why);
    }
    let mut targets = requested.unwrap_or_else(|| record.meta.destinations.clone());
    targets.retain(|d| who.sees(d));
    let destinations = state.destinations.load();
    if targets.is_empty() {
        return error(
            StatusCode::CONFLICT,
            format!("event {id} was not routed anywhere: name the destinations to replay it to"),
        );
    }
    if let Some(unknown) = targets.iter().find(|d| destinations.get(d).is_none()) {
        return error(StatusCode::BAD_REQUEST, format!("no destination named {unknown:?}"));
    }
    // A replay asks each destination's filter again, as configured now: a filter
    // fixed since dispatch decides anew, and a replay never sends what it refuses.
    let (targets, filtered) = match refiltered(&state, &record, targets).await {
        Ok(split) => split,
        Err(response) => return response,
    };
    if targets.is_empty() {
        return HttpResponse::Ok().json(api::EventReplayed {
            event: id,
            replayed: 0,
            destinations: targets,
            filtered,
        });
    }
    let now = crate::clock::now_us();
    let target = serde_json::json!({ "event": id, "destinations": targets });
    let each = targets.iter().map(|d| (id, d.clone())).collect();
    let change = QueueChange::Deliveries { each, how: Managed::Replay, now_us: now };
    match who.change(Action::Replay, &target, change).await {
        Ok(n) => {
            for d in &targets {
                destinations.wake(d);
            }
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            tracing::info!(by = %who.name, %id, destinations = ?targets, "event replayed");
            HttpResponse::Ok().json(api::EventReplayed {
                event: id,
                replayed: n,
                destinations: targets,
                filtered,
            })
        }
        Err(e) => super::failed(&who, Action::Replay, target, store_error(&e)).await,
    }
}

/// Splits `targets` into those whose filter (as configured now) matches the event
/// `record` or that have none, and those it leaves out, with the reason.
async fn refiltered(
    state: &AdminState,
    record: &crate::store::EventRecord,
    targets: Vec<String>,
) -> Result<(Vec<String>, Vec<api::FilteredReplay>), HttpResponse> {
    let destinations = state.destinations.load();
    let filters: Vec<_> = targets
        .iter()
        .filter_map(|d| Some((d.clone(), destinations.get(d)?.dest.filter.clone()?)))
        .collect();
    if filters.is_empty() {
        return Ok((targets, Vec::new()));
    }
    let body = match state.store.body(record.id).await {
        Ok(body) => bytes::Bytes::from(body.unwrap_or_default()),
        Err(e) => return Err(store_error(&e)),
    };
    let event = crate::shape::ToFilter { id: record.id, meta: record.meta.clone(), body, filters };
    let left_out: Vec<api::FilteredReplay> = state
        .shaper
        .filtered_out(vec![event])
        .await
        .into_iter()
        .flatten()
        .map(|f| api::FilteredReplay { destination: f.destination, reason: f.reason })
        .collect();
    let kept =
        targets.into_iter().filter(|t| left_out.iter().all(|f| &f.destination != t)).collect();
    Ok((kept, left_out))
}
