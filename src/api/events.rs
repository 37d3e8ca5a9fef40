//! The events and dead letters as the admin API lists and shows them.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Timestamp;
use crate::store::{DeliveryState, EventFlag, EventId, EventNameOrigin, EventStatus};

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
