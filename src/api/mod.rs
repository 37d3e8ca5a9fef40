//! The admin API's contract: every request and response body, shared by the server
//! (`admin/`, which builds them) and the CLI (`cli/`, which reads them), so that the
//! two cannot drift apart, and described by the OpenAPI document generated from these
//! very types (`openapi.rs`, served at `GET /admin/openapi.json`, committed as
//! `docs/openapi.json`).

mod audit;
pub(crate) mod openapi;
mod pull;

pub(crate) use audit::{AuditReport, DestinationAudit, EventAudit};
pub(crate) use pull::{Leased, LeasedDelivery, Refused, Settle, Settled};

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::delivery::Phase;
use crate::store::{DeliveryState, EventFlag, EventId, EventNameOrigin, EventStatus};
use crate::upstream::AccountStatus;

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

/// An event as listings show it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct EventSummary {
    pub(crate) id: EventId,
    pub(crate) source: String,
    pub(crate) event: String,
    pub(crate) event_from: EventNameOrigin,
    /// RFC 3339, UTC, microseconds (as every time of this API).
    #[schemars(with = "Timestamp")]
    pub(crate) received_at: String,
    pub(crate) size: u64,
    pub(crate) content_type: Option<String>,
    pub(crate) status: EventStatus,
    pub(crate) flags: Vec<EventFlag>,
    /// Why it was rejected, when it was.
    pub(crate) reason: Option<String>,
    /// The event this one duplicates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) duplicate_of: Option<EventId>,
    /// Where dispatch routed it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) destinations: Vec<String>,
    /// The resource it is about: `type/id` of the body's `data`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) resource: Option<String>,
    /// Deprecated: the same as `resource`, under its name of the first builds, kept
    /// for clients written against them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("deprecated" = true))]
    pub(crate) record: Option<String>,
    /// Where each delivery stands: in a listing by resource only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) deliveries: Option<Vec<DeliveryStatus>>,
    /// The most urgent state among its deliveries (those the caller sees): `dead`, then
    /// `retrying`, `held`, `pending`, `delivered`, `discarded`, `superseded`,
    /// `filtered`; absent when it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) worst_delivery: Option<crate::store::DeliveryState>,
}

/// Where one delivery of an event stands.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DeliveryStatus {
    pub(crate) destination: String,
    pub(crate) state: DeliveryState,
}

/// `GET /admin/events`: one page, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct EventPage {
    pub(crate) events: Vec<EventSummary>,
    /// Pass as `after` for the next page; none when this was the last.
    pub(crate) next_after: Option<EventId>,
}

/// How a body is carried in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BodyEncoding {
    /// The body is UTF-8 text, as is.
    Utf8,
    /// Anything else, in standard base64.
    Base64,
}

/// `GET /admin/events/{id}`: the event with its headers, body and deliveries.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct EventDetail {
    #[serde(flatten)]
    pub(crate) summary: EventSummary,
    /// The request headers kept (never credentials).
    pub(crate) headers: BTreeMap<String, String>,
    pub(crate) remote_addr: Option<String>,
    /// None for a rejected event (its body was not kept).
    pub(crate) body: Option<String>,
    pub(crate) body_encoding: Option<BodyEncoding>,
    /// The body was dropped by `retention.delivered_bodies` (the record, its
    /// deliveries and attempts stay); such an event can no longer be replayed.
    pub(crate) body_pruned: bool,
    /// The body and the headers are left out: they need the admin role (the token
    /// asking is a viewer or an operator).
    #[serde(default)]
    pub(crate) redacted: bool,
    #[serde(rename = "deliveries")]
    pub(crate) delivery_records: Vec<Delivery>,
}

/// One attempt of a delivery.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Attempt {
    #[schemars(with = "Timestamp")]
    pub(crate) at: String,
    pub(crate) duration_ms: f64,
    /// The HTTP status, when there was an answer.
    pub(crate) status: Option<u16>,
    /// Why there was no (good) answer.
    pub(crate) error: Option<String>,
    /// The start of the answer's body (up to 512 bytes), kept for the latest ten
    /// attempts of a delivery.
    #[serde(default)]
    pub(crate) answer: Option<String>,
}

/// A delivery with its attempts.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Delivery {
    pub(crate) event: EventId,
    pub(crate) destination: String,
    pub(crate) state: DeliveryState,
    #[schemars(with = "Timestamp")]
    pub(crate) created_at: String,
    #[schemars(with = "Option<Timestamp>")]
    pub(crate) next_attempt_at: Option<String>,
    #[schemars(with = "Option<Timestamp>")]
    pub(crate) delivered_at: Option<String>,
    pub(crate) total_attempts: u32,
    pub(crate) last_status: Option<u16>,
    pub(crate) last_error: Option<String>,
    /// The start of the destination's last answer.
    pub(crate) last_response: Option<String>,
    /// Why it ended without an answer: the filter's verdict, for `filtered`.
    #[serde(default)]
    pub(crate) reason: Option<String>,
    /// The latest attempts, oldest first.
    pub(crate) attempts: Vec<Attempt>,
}

/// `GET /admin/dead-letters`: one page, newest event first.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DeadLetterPage {
    pub(crate) dead_letters: Vec<Delivery>,
    pub(crate) next_after: Option<EventId>,
}

/// `POST /admin/events/{id}/replay`: which destinations (default: those the event
/// was routed to).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplayRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) destinations: Option<Vec<String>>,
}

/// The answer to `POST /admin/events/{id}/replay`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct EventReplayed {
    pub(crate) event: EventId,
    /// Deliveries scheduled again.
    pub(crate) replayed: usize,
    pub(crate) destinations: Vec<String>,
    /// Destinations asked for whose filter, as configured now, does not match the
    /// event: not replayed, with the reason.
    #[serde(default)]
    pub(crate) filtered: Vec<FilteredReplay>,
}

/// `POST /admin/destinations/{name}/preview`: a stored event, and optionally jq
/// programs to try instead of the destination's own.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PreviewRequest {
    pub(crate) event: EventId,
    /// A filter to try instead of the configured one (`""`: none).
    #[serde(default)]
    pub(crate) filter: Option<String>,
    /// A transform to try instead of the configured one (`""`: none).
    #[serde(default)]
    pub(crate) transform: Option<String>,
}

/// What a destination would make of a stored event: nothing is written or sent.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Preview {
    pub(crate) destination: String,
    pub(crate) event: EventId,
    /// `matched` (it would be delivered) or `filtered`.
    pub(crate) verdict: String,
    /// Why it is filtered.
    pub(crate) reason: Option<String>,
    /// The filter applied (the configured one or the one tried), if any.
    pub(crate) filter: Option<String>,
    /// The transform applied, if any.
    pub(crate) transform: Option<String>,
    /// The content type of the body sent.
    pub(crate) content_type: Option<String>,
    /// The body that would be sent (as text; the transform's output is JSON).
    pub(crate) body: Option<String>,
    /// Why there would be no body: the transform failed (the delivery would be dead).
    pub(crate) body_error: Option<String>,
}

/// A destination a replay left out because its filter does not match.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct FilteredReplay {
    pub(crate) destination: String,
    pub(crate) reason: String,
}

/// `POST /admin/dead-letters/selection/replay|discard`: the dead letters chosen.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Selection {
    /// At most 1,000.
    pub(crate) dead_letters: Vec<DeliveryRef>,
}

/// One delivery: its event and destination.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeliveryRef {
    pub(crate) event: EventId,
    pub(crate) destination: String,
}

/// One change made through the admin API or the console, as the journal keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct JournalEntry {
    /// Its place in the journal: `before` of the next page takes it.
    pub(crate) id: String,
    #[schemars(with = "Timestamp")]
    pub(crate) at: String,
    /// The admin token's name (`admin` for `admin.token`); empty for a failed sign-in;
    /// `SIGHUP` for a reload the service manager asked (`systemctl reload`).
    pub(crate) who: String,
    /// The client's address.
    pub(crate) from: Option<String>,
    /// `replay`, `discard`, `pause`, `resume`, `hook_sync`, `reload`, `backup`,
    /// `sign_in`, `sign_out` or `sign_in_failed`.
    pub(crate) action: String,
    /// On what: event ids and destinations, a dead-letter query, a selection, accounts.
    pub(crate) target: serde_json::Value,
    /// How many deliveries, events, destinations or hooks it changed.
    pub(crate) count: u64,
    /// `ok`, or why it failed.
    pub(crate) result: String,
}

/// A page of the journal, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct JournalPage {
    pub(crate) entries: Vec<JournalEntry>,
    /// Pass as `before` for the next (older) page; absent on the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) next_before: Option<String>,
}

/// The answer to `POST /admin/reload`: what the configuration read again put in force.
/// A reload refused (a key only a restart changes) or failed (the file does not load)
/// is answered 409 and changes nothing.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Reloaded {
    /// `reloaded`, or `unchanged` when the file says what runs already.
    pub(crate) result: String,
    /// Destinations new in the file: their workers started.
    pub(crate) added: Vec<String>,
    /// Destinations whose settings changed: each takes them once its attempts in flight
    /// (made under the old ones) are recorded.
    pub(crate) changed: Vec<String>,
    /// Destinations gone from the file: their pending deliveries are held (made dead
    /// after `retention.removed_destinations` unless the destination comes back).
    pub(crate) removed: Vec<String>,
    /// Whether the sources or the upstream accounts changed (the reconciler started
    /// again on them).
    pub(crate) sources: bool,
    /// Whether the admin tokens or roles changed.
    pub(crate) tokens: bool,
    /// The fingerprint of the configuration in force (hex; the gauge
    /// `hookrelay_config_fingerprint` shows it as a number).
    pub(crate) fingerprint: String,
}

/// The answer to `POST /admin/dead-letters/replay`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Replayed {
    pub(crate) replayed: usize,
}

/// The answer to `DELETE /admin/dead-letters`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Deleted {
    pub(crate) deleted: usize,
}

/// A destination's queue.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Queue {
    pub(crate) pending: u64,
    pub(crate) held: u64,
    pub(crate) retrying: u64,
    pub(crate) dead: u64,
    /// The relay is still counting this queue after a restart (the embedded store
    /// counts a large backlog behind the open: seconds per million deliveries). The
    /// numbers are a lower bound until it is done.
    #[serde(default)]
    pub(crate) counting: bool,
}

/// One destination as `GET /admin/destinations` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DestinationStatus {
    pub(crate) name: String,
    /// How deliveries reach it: `http`, `nats`, `amqp`, `redis-stream` or `pull`.
    #[serde(default)]
    pub(crate) kind: String,
    /// Without any password.
    pub(crate) url: String,
    pub(crate) paused: bool,
    pub(crate) circuit: Phase,
    /// The progress watchdog finds deliveries due and no attempt starting on this
    /// relay (see `hookrelay_destination_stalled`).
    pub(crate) stalled: bool,
    /// Requests in flight from this relay.
    pub(crate) in_flight: u64,
    pub(crate) queue: Queue,
    /// Age of the oldest pending or retrying delivery's event.
    pub(crate) oldest_age_seconds: Option<f64>,
    /// Deliveries made by this relay in the last minute.
    #[serde(default)]
    pub(crate) deliveries_per_minute: u64,
    /// The last failed attempt's error (or HTTP status) on this relay.
    #[serde(default)]
    pub(crate) last_error: Option<String>,
    /// When that attempt was recorded.
    #[serde(default)]
    #[schemars(with = "Option<Timestamp>")]
    pub(crate) last_error_at: Option<String>,
    /// When a delivery first succeeded after that error (absent while the destination
    /// still fails): the error is history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Timestamp>")]
    pub(crate) recovered_at: Option<String>,
    /// When the circuit last opened or closed on this relay; none: closed since the
    /// relay started.
    #[serde(default)]
    #[schemars(with = "Option<Timestamp>")]
    pub(crate) circuit_since: Option<String>,
    /// Requests at once across the fleet (`max_concurrency`).
    #[serde(default)]
    pub(crate) max_concurrency: u64,
    /// This relay's share of them (the relays divide it; 0 while a relay joins).
    #[serde(default)]
    pub(crate) fleet_share: u64,
    /// The sources it takes (`*` globs; empty: all).
    #[serde(default)]
    pub(crate) sources: Vec<String>,
    /// The event names it takes (`*` globs; empty: all).
    #[serde(default)]
    pub(crate) events: Vec<String>,
    /// `per-resource` or `none`.
    #[serde(default)]
    pub(crate) ordering: String,
}

/// `GET /admin/destinations`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DestinationList {
    pub(crate) destinations: Vec<DestinationStatus>,
}

/// `GET /admin/destinations/history`: what each destination did over the last hour,
/// sampled by this relay (the console's charts).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DestinationHistory {
    /// Seconds between two samples.
    pub(crate) interval_seconds: u64,
    pub(crate) destinations: Vec<DestinationSeries>,
}

/// One destination's samples, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DestinationSeries {
    pub(crate) name: String,
    pub(crate) points: Vec<HistoryPoint>,
}

/// One sample of a destination.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct HistoryPoint {
    #[schemars(with = "Timestamp")]
    pub(crate) at: String,
    /// Deliveries not settled yet: pending, held and retrying (every relay's).
    pub(crate) backlog: u64,
    /// How long the oldest of them has waited, in seconds (none: nothing waits).
    pub(crate) oldest_pending_seconds: Option<u64>,
    /// Deliveries this relay made in the minute before the sample.
    pub(crate) per_minute: u64,
}

/// The answer to pausing or resuming a destination.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Paused {
    pub(crate) name: String,
    pub(crate) paused: bool,
}

/// `GET /admin/overview`: what the console's overview shows beside the destinations
/// and the accounts: the callbacks per source, the storage, the fleet.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Overview {
    /// Per source, counted by this relay since it started.
    pub(crate) sources: Vec<SourceCounts>,
    pub(crate) storage: Storage,
    /// Relays sharing the store, as this relay last read it (1 on sled).
    pub(crate) relays: u64,
}

/// One source's callbacks, counted by this relay since it started.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct SourceCounts {
    /// The configured name, or `unknown` for paths naming no source.
    pub(crate) source: String,
    /// Stored (answered 200), rejected ones included.
    pub(crate) received: u64,
    /// Stored as rejected (too large).
    pub(crate) rejected: u64,
    /// Refused: wrong source or token (404).
    pub(crate) unauthorized: u64,
    /// Closed unanswered (store failure, no space, body timeout, client gone): the
    /// upstream retries them.
    pub(crate) closed: u64,
    /// Copies of an occurrence already dispatched (dropped by dedup).
    pub(crate) duplicates: u64,
    /// Stored callbacks by event name (`other` for names outside the upstream's list).
    #[serde(default)]
    pub(crate) events: BTreeMap<String, u64>,
    /// Per event, calls the upstream counted on the relay's hooks that no callback
    /// stored answers (`hookrelay_upstream_callbacks_missing`; sources with accounts).
    #[serde(default)]
    pub(crate) missing: BTreeMap<String, u64>,
}

/// Where the data lives and how much room it has.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Storage {
    /// The store's backend: `redb` or `sled` (a local directory), or `postgres`.
    pub(crate) backend: String,
    /// Free bytes on the data directory's filesystem (local backends only).
    pub(crate) free_bytes: Option<u64>,
    /// Below this, callbacks are refused (local backends only).
    pub(crate) floor_bytes: Option<u64>,
    /// Free space is below the floor now.
    pub(crate) below_floor: bool,
    /// The store's size (none when it could not be read).
    pub(crate) store_bytes: Option<u64>,
}

/// `GET /admin/hooks` and `POST /admin/hooks/sync`: every upstream account.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Accounts {
    pub(crate) accounts: Vec<AccountStatus>,
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
