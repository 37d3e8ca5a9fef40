//! Pull destinations: a consumer that accepts no inbound connection fetches its
//! deliveries on the public listener, with the destination's token.
//!
//! - `POST /pull/{destination}/lease?max=100&lease=30s` claims up to `max` due
//!   deliveries for `lease`, as a worker claims them for an attempt (the same claim,
//!   so a lease is an attempt in flight: per-resource order holds, and a lease that
//!   expires makes the delivery due again for the next lease);
//! - `POST /pull/{destination}/ack` records the leased ones as delivered;
//! - `POST /pull/{destination}/nack` records them as failed attempts, due again
//!   after `delay` (or the backoff), dead once the retry policy gives up.
//!
//! A lease's `id` carries its claim (event, due time, token, expiry, attempt), so any
//! relay sharing the store takes its ack; the store checks the claim's token. An ack
//! after the lease expired is refused: the delivery may be leased to another
//! consumer by then.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};

mod auth;
mod receipt;

use crate::api;
use crate::delivery::{DestinationState, Destinations};
use crate::destinations::{AnswerClass, Request};
use crate::internal_events::{AttemptRecorded, InternalEvent};
use crate::lock::Current;
use crate::metrics::Metrics;
use crate::store::lifecycle::AttemptReport;
use crate::store::{Attempt, AttemptWrite, Claim, DeliveryRecord, EventId, SharedStore};
use crate::wrong_tokens::WrongTokens;
use auth::authorized;
use receipt::Receipt;

/// Most deliveries one lease takes, and its default.
const MAX_LEASE: usize = 1_000;
const DEFAULT_LEASE_MAX: usize = 100;
/// A lease's bounds and default.
const DEFAULT_LEASE: Duration = Duration::from_secs(30);
const MAX_LEASE_TIME: Duration = Duration::from_secs(3600);

/// What the pull routes share: the destinations in force and the store.
pub(crate) struct PullState {
    pub(crate) destinations: Arc<Current<Destinations>>,
    pub(crate) store: SharedStore,
    pub(crate) shaper: Arc<crate::shape::Shaper>,
    pub(crate) metrics: Arc<Metrics>,
    /// The `traceparent` each lease carries.
    pub(crate) tracer: Arc<crate::telemetry::Tracer>,
    /// This relay's name on its claims.
    pub(crate) owner: String,
    /// The relay's one count of wrong tokens per client (`Access` shares it).
    pub(crate) wrong_tokens: Arc<Mutex<WrongTokens>>,
}

/// The pull routes, mounted on the public listener; any other method is 405 with
/// `Allow: POST`.
pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    let post_only = || {
        web::to(|| async {
            HttpResponse::MethodNotAllowed()
                .insert_header((actix_web::http::header::ALLOW, "POST"))
                .json(api::ApiError { error: "the pull API takes POST only".into() })
        })
    };
    cfg.service(
        web::resource("/pull/{destination}/lease")
            .route(web::post().to(lease))
            .default_service(post_only()),
    )
    .service(
        web::resource("/pull/{destination}/ack")
            .route(web::post().to(ack))
            .default_service(post_only()),
    )
    .service(
        web::resource("/pull/{destination}/nack")
            .route(web::post().to(nack))
            .default_service(post_only()),
    );
}

fn error(status: StatusCode, message: String) -> HttpResponse {
    api::error(status, message)
}

/// The query of a lease.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseQuery {
    max: Option<usize>,
    lease: Option<String>,
}

/// `POST /pull/{destination}/lease`.
async fn lease(
    state: web::Data<PullState>,
    req: HttpRequest,
    name: web::Path<String>,
    query: Result<web::Query<LeaseQuery>, actix_web::Error>,
) -> HttpResponse {
    let dest = match authorized(&state, &req, &name) {
        Ok(d) => d,
        Err(refused) => return *refused,
    };
    let query = match query {
        Ok(q) => q.into_inner(),
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad query: {e}")),
    };
    let max = query.max.unwrap_or(DEFAULT_LEASE_MAX);
    if !(1..=MAX_LEASE).contains(&max) {
        return error(StatusCode::BAD_REQUEST, format!("max: must be between 1 and {MAX_LEASE}"));
    }
    let length = match query.lease.as_deref().map(humantime::parse_duration).transpose() {
        Ok(l) => l.unwrap_or(DEFAULT_LEASE),
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("lease: {e} (say 30s or 5m)")),
    };
    if length < Duration::from_secs(1) || length > MAX_LEASE_TIME {
        return error(StatusCode::BAD_REQUEST, "lease: between 1s and 1h".into());
    }
    let now_us = crate::clock::now_us();
    let expires_us = now_us + crate::clock::micros(length);
    let lease_expires_at = crate::timefmt::format_admin_us(expires_us);
    if dest.is_paused() {
        return HttpResponse::Ok().json(api::Leased { deliveries: vec![], lease_expires_at });
    }
    let claims =
        match state.store.claim_due(&dest.dest.name, &state.owner, now_us, length, max).await {
            Ok(c) => c,
            Err(e) => {
                return error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("the store cannot lease now ({e}); try again shortly"),
                )
            }
        };
    let mut deliveries = Vec::new();
    for claim in claims {
        match leased(&state, &dest, &claim).await {
            Ok(Some(item)) => deliveries.push(item),
            Ok(None) => {}
            Err(e) => {
                return error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("the store cannot lease now ({e}); try again shortly"),
                )
            }
        }
    }
    HttpResponse::Ok().json(api::Leased { deliveries, lease_expires_at })
}

/// The leased delivery of `claim`; `None` when there is nothing to send (its event
/// is gone, or its transform failed), recorded as a failed attempt as a worker would.
async fn leased(
    state: &PullState,
    dest: &DestinationState,
    claim: &Claim,
) -> Result<Option<api::LeasedDelivery>, crate::store::StoreError> {
    let d = &dest.dest;
    let attempt = claim.record.total_attempts + 1;
    let (Some(meta), Some(body)) = (&claim.meta, &claim.body) else {
        let why = "the event (or its body) is no longer stored";
        let report = AttemptReport::not_sent(crate::clock::now_us(), why.into());
        record(state, dest, vec![(claim.clone(), attempt, report)]).await?;
        return Ok(None);
    };
    let shaped =
        state.shaper.body_sent(&d.name, d.transform.as_ref(), claim.event, meta, body).await;
    let (body, content_type) = match shaped {
        Ok(made) => made,
        Err(reason) => {
            let report = AttemptReport::not_sent(crate::clock::now_us(), reason);
            record(state, dest, vec![(claim.clone(), attempt, report)]).await?;
            return Ok(None);
        }
    };
    let webhook_id = d.delivery_id(claim.event);
    let span = crate::telemetry::ids::random_span();
    let traceparent = state.tracer.traceparent(claim.event, span).header();
    let message = d.message(Request {
        webhook_id: &webhook_id,
        source: &meta.source,
        event: &meta.event,
        resource: meta.resource.as_deref(),
        content_type: content_type.as_deref(),
        body,
        attempt,
        traceparent: &traceparent,
    });
    let headers = message
        .headers
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    let body = String::from_utf8_lossy(&message.body).into_owned();
    let receipt = Receipt {
        event: claim.event,
        due_us: claim.due_us,
        token: claim.token,
        expires_us: claim.expires_us,
        attempt,
    };
    Ok(Some(api::LeasedDelivery {
        id: receipt.encode(),
        delivery_id: webhook_id,
        event: meta.event.clone(),
        source: meta.source.clone(),
        attempt,
        headers,
        body,
    }))
}

/// Records each `(claim, attempt number, report)` in one store call; what became of
/// each, in order.
async fn record(
    state: &PullState,
    dest: &DestinationState,
    attempts: Vec<(Claim, u32, AttemptReport)>,
) -> Result<Vec<AttemptWrite>, crate::store::StoreError> {
    let numbers: Vec<u32> = attempts.iter().map(|(_, n, _)| *n).collect();
    let errors: Vec<Option<String>> =
        attempts.iter().map(|(_, _, r)| r.attempt.error.clone()).collect();
    let claims: Vec<(Claim, AttemptReport)> =
        attempts.into_iter().map(|(c, _, r)| (c, r)).collect();
    let events: Vec<(EventId, Option<crate::store::EventMeta>)> =
        claims.iter().map(|(c, _)| (c.event, c.meta.clone())).collect();
    let recorded = state.store.record_attempts(claims, &dest.dest.retry, None).await?;
    for (i, write) in recorded.writes.iter().enumerate() {
        if let AttemptWrite::Done(verdict) = write {
            AttemptRecorded {
                event: events[i].0,
                meta: events[i].1.as_ref(),
                destination: &dest.dest.name,
                attempt: numbers[i],
                status: None,
                error: errors[i].as_deref(),
                verdict: *verdict,
            }
            .emit(&state.metrics);
        }
    }
    Ok(recorded.writes)
}

/// What an ack or a nack records for each id.
async fn settle(
    state: web::Data<PullState>,
    req: HttpRequest,
    name: web::Path<String>,
    body: web::Bytes,
    ack: bool,
) -> HttpResponse {
    let dest = match authorized(&state, &req, &name) {
        Ok(d) => d,
        Err(refused) => return *refused,
    };
    let settle: api::Settle = match serde_json::from_slice(&body) {
        Ok(s) => s,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("body: {e}; send {{\"ids\": [ID, ...]}} with the ids a lease gave"),
            )
        }
    };
    if settle.ids.len() > MAX_LEASE {
        return error(StatusCode::BAD_REQUEST, format!("ids: at most {MAX_LEASE} at once"));
    }
    let delay = match (ack, settle.delay.as_deref()) {
        (true, Some(_)) => {
            return error(StatusCode::BAD_REQUEST, "delay: only a nack takes one".into())
        }
        (_, Some(text)) => match humantime::parse_duration(text) {
            Ok(d) => Some(d),
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("delay: {e} (say 30s)")),
        },
        _ => None,
    };
    let mut refused = Vec::new();
    let mut taken = Vec::new();
    let now_us = crate::clock::now_us();
    for id in settle.ids {
        let Some(receipt) = Receipt::decode(&id) else {
            refused.push(api::Refused { id, why: "not an id a lease gave".into() });
            continue;
        };
        if now_us >= receipt.expires_us {
            let when = crate::timefmt::format_admin_us(receipt.expires_us);
            let why = format!(
                "the lease expired at {when}: the delivery is due again and is leased anew \
                 (nothing recorded); lease for longer if handling takes this long"
            );
            refused.push(api::Refused { id, why });
            continue;
        }
        let claim = Claim {
            event: receipt.event,
            destination: dest.dest.name.clone(),
            due_us: receipt.due_us,
            owner: state.owner.clone(),
            token: receipt.token,
            expires_us: receipt.expires_us,
            record: DeliveryRecord::new(receipt.event, &dest.dest.name, receipt.due_us),
            meta: None,
            body: None,
        };
        let (class, said) = if ack {
            (AnswerClass::Success, None)
        } else {
            (AnswerClass::Retry { retry_after: delay }, Some("nacked by the consumer".to_owned()))
        };
        let report = AttemptReport {
            attempt: Attempt {
                at_us: now_us,
                duration_us: 0,
                status: None,
                error: said.clone(),
                answer: said,
            },
            class,
            jitter: fastrand::f64(),
        };
        taken.push((id, (claim, receipt.attempt, report)));
    }
    // Every id taken in one store call (one transaction), not one each.
    let (ids, attempts): (Vec<String>, Vec<_>) = taken.into_iter().unzip();
    let writes = match record(&state, &dest, attempts).await {
        Ok(w) => w,
        Err(e) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the store cannot record now ({e}); nothing recorded, send them again"),
            )
        }
    };
    let mut settled = 0;
    for (id, write) in ids.into_iter().zip(writes) {
        match write {
            AttemptWrite::Done(_) => settled += 1,
            AttemptWrite::ClaimLost | AttemptWrite::Stale => refused.push(api::Refused {
                id,
                why: "the lease is no longer held (it expired and the delivery was leased \
                      again, or it was replayed meanwhile): nothing recorded"
                    .into(),
            }),
        }
    }
    let status = if refused.is_empty() { StatusCode::OK } else { StatusCode::CONFLICT };
    HttpResponse::build(status).json(api::Settled { settled, refused })
}

/// `POST /pull/{destination}/ack`.
async fn ack(
    state: web::Data<PullState>,
    req: HttpRequest,
    name: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    settle(state, req, name, body, true).await
}

/// `POST /pull/{destination}/nack`.
async fn nack(
    state: web::Data<PullState>,
    req: HttpRequest,
    name: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    settle(state, req, name, body, false).await
}
