//! JSON shapes of the admin API.

use serde::Serialize;

use crate::store::{
    unix_micros, Attempt, DeliveryRecord, DeliveryState, EventFlag, EventId, EventNameOrigin,
    EventRecord, EventStatus,
};

/// Microseconds since the epoch as RFC 3339.
pub(super) fn time(us: u64) -> String {
    crate::timefmt::format_admin(std::time::UNIX_EPOCH + std::time::Duration::from_micros(us))
}

/// An event in listings.
#[derive(Serialize)]
pub(super) struct EventView<'a> {
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
    #[serde(skip_serializing_if = "Option::is_none")]
    duplicate_of: Option<EventId>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    destinations: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    record: Option<&'a str>,
    /// Each delivery's state, in a listing by record.
    #[serde(skip_serializing_if = "Option::is_none")]
    deliveries: Option<Vec<DeliveryStateView<'a>>>,
}

/// Where one delivery of an event stands (a listing by record).
#[derive(Serialize)]
struct DeliveryStateView<'a> {
    destination: &'a str,
    state: DeliveryState,
}

impl<'a> EventView<'a> {
    /// The view with the states of `deliveries` (the event's), when given.
    pub(super) fn with_deliveries(mut self, deliveries: Option<&'a Vec<DeliveryRecord>>) -> Self {
        self.deliveries = deliveries.map(|d| {
            d.iter()
                .map(|d| DeliveryStateView { destination: &d.destination, state: d.state })
                .collect()
        });
        self
    }
}

impl<'a> From<&'a EventRecord> for EventView<'a> {
    fn from(r: &'a EventRecord) -> Self {
        let m = &r.meta;
        Self {
            id: r.id,
            source: &m.source,
            event: &m.event,
            event_from: m.event_from,
            received_at: time(m.received_at_us),
            size: m.size,
            content_type: m.content_type.as_deref(),
            status: m.status,
            flags: &m.flags,
            reason: m.reason.as_deref(),
            duplicate_of: m.duplicate_of,
            destinations: &m.destinations,
            record: m.record.as_deref(),
            deliveries: None,
        }
    }
}

#[derive(Serialize)]
struct AttemptView<'a> {
    at: String,
    duration_ms: f64,
    status: Option<u16>,
    error: Option<&'a str>,
}

impl<'a> From<&'a Attempt> for AttemptView<'a> {
    fn from(a: &'a Attempt) -> Self {
        Self {
            at: time(a.at_us),
            duration_ms: a.duration_us as f64 / 1000.0,
            status: a.status,
            error: a.error.as_deref(),
        }
    }
}

/// A delivery with its attempts.
#[derive(Serialize)]
pub(super) struct DeliveryView<'a> {
    event: EventId,
    destination: &'a str,
    state: DeliveryState,
    created_at: String,
    next_attempt_at: Option<String>,
    delivered_at: Option<String>,
    total_attempts: u32,
    last_status: Option<u16>,
    last_error: Option<&'a str>,
    last_response: Option<&'a str>,
    attempts: Vec<AttemptView<'a>>,
}

impl<'a> From<&'a DeliveryRecord> for DeliveryView<'a> {
    fn from(d: &'a DeliveryRecord) -> Self {
        let last = d.attempts.last();
        Self {
            event: d.event,
            destination: &d.destination,
            state: d.state,
            created_at: time(d.created_us),
            next_attempt_at: d.next_attempt_us.map(time),
            delivered_at: d.delivered_us.map(time),
            total_attempts: d.total_attempts,
            last_status: last.and_then(|a| a.status),
            last_error: last.and_then(|a| a.error.as_deref()),
            last_response: d.last_response.as_deref(),
            attempts: d.attempts.iter().map(AttemptView::from).collect(),
        }
    }
}

/// Seconds since the event with this id arrived (ids start from the receive time).
pub(super) fn age_seconds(id: EventId) -> f64 {
    let now = unix_micros(std::time::SystemTime::now());
    now.saturating_sub(id.raw()) as f64 / 1e6
}
