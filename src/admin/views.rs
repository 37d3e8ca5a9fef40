//! The admin API's bodies (`crate::api`) built from what the store holds.

use crate::api;
use crate::store::{Attempt, DeliveryRecord, EventId, EventRecord};

/// Microseconds since the epoch as RFC 3339.
pub(super) fn time(us: u64) -> String {
    crate::timefmt::format_admin_us(us)
}

/// A query's time parameter `name` (RFC 3339), if given, or what is wrong with it.
pub(super) fn query_time(
    name: &str,
    text: Option<&str>,
) -> Result<Option<std::time::SystemTime>, String> {
    match text.map(str::trim) {
        None => Ok(None),
        Some(t) => crate::timefmt::parse(t)
            .map(Some)
            .ok_or_else(|| format!("{name}: {t:?} is not a time such as 2026-06-12T13:23:34Z")),
    }
}

/// An event as listings show it.
/// The receive-time window of a listing's query: `since` (inclusive) and `until`
/// (exclusive), RFC 3339, as ids (an id is its receive time in µs); `until` narrows
/// the page cursor `after`. Returns `(after, since)`, or what is wrong.
pub(super) fn time_window(
    after: Option<EventId>,
    since: Option<&str>,
    until: Option<&str>,
) -> Result<(Option<EventId>, Option<EventId>), String> {
    let id = |at| EventId::new(crate::clock::unix_micros(at));
    let (since, until) = (query_time("since", since)?.map(id), query_time("until", until)?.map(id));
    let after = match (after, until) {
        (Some(a), Some(u)) => Some(a.min(u)),
        (a, u) => a.or(u),
    };
    Ok((after, since))
}

pub(super) fn event_summary(r: &EventRecord) -> api::EventSummary {
    let m = &r.meta;
    api::EventSummary {
        id: r.id,
        source: m.source.clone(),
        event: m.event.clone(),
        event_from: m.event_from,
        received_at: time(m.received_at_us),
        size: m.size,
        content_type: m.content_type.clone(),
        status: m.status,
        flags: m.flags.clone(),
        reason: m.reason.clone(),
        duplicate_of: m.duplicate_of,
        destinations: m.destinations.clone(),
        resource: m.resource.clone(),
        record: m.resource.clone(),
        deliveries: None,
        worst_delivery: None,
    }
}

/// The most urgent state among `deliveries` (the badge of an event in a listing):
/// what needs a hand first, then what is under way, then what is settled.
pub(super) fn worst(deliveries: &[DeliveryRecord]) -> Option<crate::store::DeliveryState> {
    use crate::store::DeliveryState as S;
    let rank = |s: S| match s {
        S::Dead => 0,
        S::Retrying => 1,
        S::Held => 2,
        S::Pending => 3,
        S::Delivered => 4,
        S::Discarded => 5,
        S::Superseded => 6,
        S::Filtered => 7,
    };
    deliveries.iter().map(|d| d.state).min_by_key(|s| rank(*s))
}

/// Where each of `deliveries` stands (a listing by resource).
pub(super) fn delivery_states(deliveries: &[DeliveryRecord]) -> Vec<api::DeliveryStatus> {
    deliveries
        .iter()
        .map(|d| api::DeliveryStatus { destination: d.destination.clone(), state: d.state })
        .collect()
}

fn attempt(a: &Attempt) -> api::Attempt {
    api::Attempt {
        at: time(a.at_us),
        duration_ms: a.duration_us as f64 / 1000.0,
        status: a.status,
        error: a.error.clone(),
        answer: a.answer.clone(),
    }
}

/// A delivery with its attempts.
pub(super) fn delivery(d: &DeliveryRecord) -> api::Delivery {
    let last = d.attempts.last();
    api::Delivery {
        event: d.event,
        destination: d.destination.clone(),
        state: d.state,
        created_at: time(d.created_us),
        next_attempt_at: d.next_attempt_us.map(time),
        delivered_at: d.delivered_us.map(time),
        total_attempts: d.total_attempts,
        last_status: last.and_then(|a| a.status),
        last_error: last.and_then(|a| a.error.clone()),
        last_response: d.last_response.clone(),
        reason: d.reason.clone(),
        attempts: d.attempts.iter().map(attempt).collect(),
    }
}

/// Seconds since the event with this id arrived (ids start from the receive time).
pub(super) fn age_seconds(id: EventId) -> f64 {
    let now = crate::clock::now_us();
    now.saturating_sub(id.raw()) as f64 / 1e6
}

/// Whether an event's body was dropped by retention by part: a stored event without
/// one (a rejected event never had one).
pub(super) fn body_pruned(meta: &crate::store::EventMeta, body: Option<&[u8]>) -> bool {
    body.is_none() && meta.status != crate::store::EventStatus::Rejected
}
