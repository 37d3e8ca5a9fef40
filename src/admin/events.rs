//! `GET /admin/events` and `GET /admin/events/{id}`.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use base64::Engine;
use serde::{Deserialize, Serialize};

use super::{error, AdminState};
use crate::store::{EventFilter, EventFlag, EventId, EventNameOrigin, EventRecord, EventStatus};

const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 1000;

/// Query of the event listing.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    source: Option<String>,
    event: Option<String>,
    status: Option<EventStatus>,
    /// Continue after this id: the listing is newest first, so older events follow.
    after: Option<String>,
    limit: Option<usize>,
}

/// An event as the admin API shows it.
#[derive(Serialize)]
struct EventView<'a> {
    id: EventId,
    source: &'a str,
    event: &'a str,
    event_from: EventNameOrigin,
    received_at: String,
    size: u64,
    content_type: Option<&'a str>,
    status: EventStatus,
    flags: &'a [EventFlag],
    reason: Option<&'a str>,
}

impl<'a> From<&'a EventRecord> for EventView<'a> {
    fn from(r: &'a EventRecord) -> Self {
        let m = &r.meta;
        Self {
            id: r.id,
            source: &m.source,
            event: &m.event,
            event_from: m.event_from,
            received_at: humantime::format_rfc3339_micros(m.received_at()).to_string(),
            size: m.size,
            content_type: m.content_type.as_deref(),
            status: m.status,
            flags: &m.flags,
            reason: m.reason.as_deref(),
        }
    }
}

/// Lists events, newest first, with `next_after` to fetch the following page.
pub(super) async fn list(
    state: web::Data<AdminState>,
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
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return error(StatusCode::BAD_REQUEST, format!("limit: must be between 1 and {MAX_LIMIT}"));
    }
    let filter = EventFilter {
        source: query.source,
        event: query.event,
        status: query.status,
        after,
        limit,
    };
    let store = state.store.clone();
    match web::block(move || store.list_events(&filter)).await {
        Ok(Ok(records)) => {
            let next_after =
                (records.len() == limit).then(|| records.last().map(|r| r.id)).flatten();
            let events: Vec<EventView<'_>> = records.iter().map(EventView::from).collect();
            HttpResponse::Ok()
                .json(serde_json::json!({ "events": events, "next_after": next_after }))
        }
        Ok(Err(e)) => store_error(&e),
        Err(e) => store_error(&e),
    }
}

/// One event with its headers and body (UTF-8 text as is, anything else in base64).
pub(super) async fn show(state: web::Data<AdminState>, id: web::Path<String>) -> HttpResponse {
    let id = match id.parse::<EventId>() {
        Ok(id) => id,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("id: {e}")),
    };
    let store = state.store.clone();
    let found =
        web::block(move || Ok::<_, crate::store::StoreError>((store.event(id)?, store.body(id)?)))
            .await;
    let (record, body) = match found {
        Ok(Ok((Some(record), body))) => (record, body),
        Ok(Ok((None, _))) => return error(StatusCode::NOT_FOUND, format!("no event {id}")),
        Ok(Err(e)) => return store_error(&e),
        Err(e) => return store_error(&e),
    };
    let (body, encoding) = match body {
        None => (None, None),
        Some(bytes) => match String::from_utf8(bytes) {
            Ok(text) => (Some(text), Some("utf8")),
            Err(e) => (
                Some(base64::engine::general_purpose::STANDARD.encode(e.as_bytes())),
                Some("base64"),
            ),
        },
    };
    let mut view = serde_json::to_value(EventView::from(&record)).unwrap_or_default();
    if let Some(obj) = view.as_object_mut() {
        let headers: serde_json::Map<String, serde_json::Value> = record
            .meta
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str())))
            .collect();
        obj.insert("headers".into(), headers.into());
        obj.insert("remote_addr".into(), record.meta.remote_addr.clone().into());
        obj.insert("body".into(), body.into());
        obj.insert("body_encoding".into(), encoding.into());
    }
    HttpResponse::Ok().json(view)
}

fn store_error(e: &dyn std::fmt::Display) -> HttpResponse {
    tracing::error!(error = %e, "admin API: store read failed");
    error(StatusCode::INTERNAL_SERVER_ERROR, format!("store read failed: {e}"))
}
