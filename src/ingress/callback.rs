//! `POST /hooks/{source}/{token}[/{eventName}]`: the callback endpoint.

use std::time::{Instant, SystemTime};

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use tracing::Instrument;

use super::auth::{Auth, UNKNOWN_SOURCE};
use super::body::{self, Body};
use super::inspect::{inspect, Inspection};
use super::{abort, Gate, IngressState};
use crate::clock::unix_micros;
use crate::event_names;
use crate::internal_events::{
    CallbackClosed, CallbackNotStored, CallbackRefused, CallbackStored, Closed, InternalEvent,
};
use crate::store::{EventFlag, EventMeta, EventNameOrigin, EventStatus, NewEvent};
use crate::telemetry::trace;

/// Request headers worth keeping with an event. Never credentials or cookies.
const KEPT_HEADERS: [&str; 8] = [
    "content-type",
    "content-length",
    "user-agent",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-real-ip",
    "x-request-id",
    "traceparent",
];

/// What an event's record, indexes and inbox entry add to its body, about.
const RECORD_BYTES: u64 = 512;

/// Event name used when neither the path nor the body names one.
const UNKNOWN_EVENT: &str = "unknown";

#[derive(Deserialize)]
pub(super) struct CallbackPath {
    source: String,
    token: String,
    event: Option<String>,
}

/// Authenticates, reads, stores, and only then answers 200.
pub(super) async fn callback(
    req: HttpRequest,
    path: web::Path<CallbackPath>,
    payload: web::Payload,
    state: web::Data<IngressState>,
) -> HttpResponse {
    let started = Instant::now();
    let received_at = crate::clock::now();
    let m = &state.metrics;
    let path = path.into_inner();

    // The gate this callback is let in by, kept until it is answered (a reload may
    // put another in force meanwhile).
    let gate = state.gate.load();
    let source = match gate.sources.authenticate(&path.source, &path.token) {
        Auth::Valid(name) => name,
        refused => {
            let label = match refused {
                Auth::WrongToken(name) => name,
                _ => UNKNOWN_SOURCE,
            };
            // Neither the token nor an unconfigured source name is logged: both are
            // arbitrary (and possibly secret) input. Anyone can send these: one line
            // per source a minute, with how many were held back.
            let logged = state.refusals.admit(label, Instant::now());
            CallbackRefused {
                source: label,
                peer: req.peer_addr(),
                logged,
                took: started.elapsed(),
            }
            .emit(m);
            return HttpResponse::NotFound().finish();
        }
    };

    if state.space.below_floor() {
        // Refused before the store sees a full disk: the upstream retries a closed
        // connection (the crossing of the floor is logged once, not per callback).
        CallbackClosed { source, why: Closed::NoSpace, took: started.elapsed() }.emit(m);
        return abort::no_answer(&req, m).await;
    }

    // Everything from here on is about one event of a known source: one span, so its
    // lines can be found by event id, source or event name. Debug-level, as
    // docs/operations.md says: at the default `info` it is disabled and costs nothing
    // (at info it cost 3-4% of held ingest's CPU, its fields formatted as JSON at
    // creation and at each `record`); the lines that matter at info name their event
    // themselves.
    let span = tracing::debug_span!(
        "callback",
        source,
        event = tracing::field::Empty,
        id = tracing::field::Empty
    );
    store(req, source, path.event, payload, &state, &gate, started, received_at)
        .instrument(span)
        .await
}

/// Reads, stores and answers a callback of `source` (authenticated by `gate`).
#[allow(clippy::too_many_arguments)]
async fn store(
    req: HttpRequest,
    source: &str,
    path_event: Option<String>,
    payload: web::Payload,
    state: &IngressState,
    gate: &Gate,
    started: Instant,
    received_at: SystemTime,
) -> HttpResponse {
    let m = &state.metrics;
    let size_hint = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let read = body::read(payload, gate.max_body_bytes, size_hint);
    let body = match tokio::time::timeout(gate.body_timeout, read).await {
        // The relay's secrets never reach the store, and so no consumer (mask.rs).
        Ok(Ok(Body::Complete(bytes))) => Body::Complete(gate.masker.mask(bytes)),
        Ok(Ok(body)) => body,
        Err(_) => {
            // A trickled body would hold the connection for ever; a status would
            // disable the hook: close, and the upstream retries.
            let why = Closed::BodyTimeout(gate.body_timeout);
            CallbackClosed { source, why, took: started.elapsed() }.emit(m);
            return abort::no_answer(&req, m).await;
        }
        Ok(Err(e)) => {
            // Usually the client went away mid-body; if it is still there (say, a
            // malformed chunked body), a 4xx would disable its hook: close instead.
            CallbackClosed { source, why: Closed::Incomplete(&e), took: started.elapsed() }.emit(m);
            return abort::no_answer(&req, m).await;
        }
    };

    // The bytes it will write, out of the free-space budget (`space/`): a fast fill of
    // large bodies cannot cross the floor between two looks.
    let writes = match &body {
        Body::Complete(bytes) => bytes.len() as u64 + RECORD_BYTES,
        Body::TooLarge { .. } => RECORD_BYTES,
    };
    if !state.space.admit(writes).await {
        CallbackClosed { source, why: Closed::NoSpace, took: started.elapsed() }.emit(m);
        return abort::no_answer(&req, m).await;
    }
    let event =
        new_event(&req, source, path_event.as_deref(), received_at, body, gate.max_body_bytes);
    let status = event.meta.status;
    let event_name = event.meta.event.clone();
    tracing::Span::current().record("event", event_name.as_str());
    // The callback's span is made once its answer is known (kept only if exported).
    let traced = state.tracer.exporting().then(|| event.meta.clone());
    match state.store.append(event).await {
        Ok(id) => {
            tracing::Span::current().record("id", tracing::field::display(id));
            if let Some(meta) = traced {
                let end = crate::clock::now_us();
                state.tracer.record(|salt| trace::callback(salt, id, &meta, end));
            }
            let rejected = status == EventStatus::Rejected;
            CallbackStored { id, source, event: &event_name, rejected, took: started.elapsed() }
                .emit(m);
            // Both values are plain ASCII tokens: no JSON escaping needed.
            HttpResponse::Ok()
                .content_type("application/json")
                .body(format!(r#"{{"id":"{id}","status":"{}"}}"#, status.as_str()))
        }
        Err(e) => {
            let took = started.elapsed();
            CallbackNotStored { source, event: &event_name, error: &e, took }.emit(m);
            abort::no_answer(&req, m).await
        }
    }
}

/// Builds the record of a callback: a stored event, or a rejected one if too large.
fn new_event(
    req: &HttpRequest,
    source: &str,
    path_event: Option<&str>,
    received_at: SystemTime,
    body: Body,
    limit: u64,
) -> NewEvent {
    let headers = req.headers();
    let kept_headers = KEPT_HEADERS
        .iter()
        .filter_map(|name| {
            let value = headers.get(*name)?.to_str().ok()?;
            Some(((*name).to_owned(), value.to_owned()))
        })
        .collect();
    let content_type =
        headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);

    let (body, size, seen, status, reason) = match body {
        Body::Complete(bytes) => {
            let seen = inspect(&bytes);
            let size = bytes.len() as u64;
            (Some(bytes), size, seen, EventStatus::Received, None)
        }
        Body::TooLarge { size } => {
            let reason = format!("body of {size} bytes exceeds ingress.max_body_bytes ({limit})");
            (None, size, Inspection::default(), EventStatus::Rejected, Some(reason))
        }
    };
    let (mut flags, body_event) = (seen.flags, seen.event_name);
    if status == EventStatus::Rejected {
        flags.push(EventFlag::Oversized);
    }
    // One rule for a name from the path or the body; `hookrelay.*` names are the
    // relay's own events: a callback cannot claim one.
    let taken = |n: &str| event_names::is_plausible(n) && !event_names::is_internal(n);
    let body_event = body_event.filter(|n| taken(n));
    let path_event = path_event.filter(|n| taken(n));
    let (event, event_from) = match (path_event, body_event) {
        (Some(name), _) => (name.to_owned(), EventNameOrigin::Path),
        (None, Some(name)) => (name, EventNameOrigin::Body),
        (None, None) => (UNKNOWN_EVENT.to_owned(), EventNameOrigin::Unknown),
    };
    NewEvent {
        meta: EventMeta {
            source: source.to_owned(),
            event,
            event_from,
            received_at_us: unix_micros(received_at),
            size,
            content_type,
            headers: kept_headers,
            remote_addr: req.peer_addr().map(|a| a.to_string()),
            status,
            flags,
            reason,
            duplicate_of: None,
            destinations: Vec::new(),
            resource: seen.resource,
        },
        body,
    }
}
