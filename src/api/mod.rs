//! The admin API's contract: every request and response body, shared by the server
//! (`admin/`, which builds them) and the CLI (`cli/`, which reads them), so that the
//! two cannot drift apart, and described by the OpenAPI document generated from these
//! very types (`openapi.rs`, served at `GET /admin/openapi.json`, committed as
//! `docs/openapi.json`).

mod audit;
mod destinations;
mod events;
mod journal;
pub(crate) mod openapi;
mod overview;
mod pull;
mod replay;

pub(crate) use audit::{AuditReport, DestinationAudit, EventAudit};
pub(crate) use destinations::{
    DestinationHistory, DestinationList, DestinationSeries, DestinationStatus, HistoryPoint,
    Paused, Queue,
};
pub(crate) use events::{
    Attempt, BodyEncoding, DeadLetterPage, Delivery, DeliveryStatus, EventDetail, EventPage,
    EventSummary,
};
pub(crate) use journal::{JournalEntry, JournalPage, Reloaded};
pub(crate) use overview::{Accounts, Overview, SourceCounts, Storage};
pub(crate) use pull::{Leased, LeasedDelivery, Refused, Settle, Settled};
pub(crate) use replay::{
    Deleted, DeliveryRef, EventReplayed, FilteredReplay, Preview, PreviewRequest, ReplayRequest,
    Replayed, Selection,
};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Every error answer: what went wrong, in words meant for the operator.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApiError {
    pub(crate) error: String,
}

/// A JSON error answer, `{"error": "..."}`: the one shape of every refusal of the
/// admin API and the console.
pub(crate) fn error(
    status: actix_web::http::StatusCode,
    message: impl Into<String>,
) -> actix_web::HttpResponse {
    actix_web::HttpResponse::build(status).json(ApiError { error: message.into() })
}

/// 429 for a client with too many wrong tokens lately (`wrong_tokens.rs`), with when
/// to try again: one answer for the admin API, the console and the pull API.
pub(crate) fn throttled(wait: std::time::Duration) -> actix_web::HttpResponse {
    use actix_web::http::header;
    let secs = wait.as_secs().max(1);
    let mut resp = error(
        actix_web::http::StatusCode::TOO_MANY_REQUESTS,
        format!("too many wrong tokens from this address: try again in {secs} s"),
    );
    resp.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
    resp
}

/// An RFC 3339 time in UTC with microseconds, as every time of this API.
#[derive(JsonSchema)]
#[schemars(transform = date_time)]
#[allow(dead_code)]
struct Timestamp(String);

/// Marks a string schema as an RFC 3339 time.
fn date_time(schema: &mut schemars::Schema) {
    schema.insert("format".into(), "date-time".into());
}
