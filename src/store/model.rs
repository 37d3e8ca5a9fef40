//! What the store keeps about an event.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Identifies a stored event. Ids are strictly increasing in commit order and start
/// from the receive time in microseconds, so the 8-byte big-endian key sorts a sled
/// scan by time, and the id alone tells roughly when an event arrived.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct EventId(u64);

impl EventId {
    pub(crate) const fn new(raw: u64) -> Self {
        Self(raw)
    }

    pub(crate) fn raw(self) -> u64 {
        self.0
    }

    /// The id of an event received at `received_at_us` when `last` was the last id
    /// handed out: the receive time, always above `last` (ids increase even when the
    /// clock steps back, or many events arrive in one µs). Every backend allocates
    /// with it; PostgreSQL's insert then raises a group above the ids other relays
    /// stored (`postgres/mod.rs`).
    pub(crate) fn allocate(last: u64, received_at_us: u64) -> Self {
        Self(received_at_us.max(last.saturating_add(1)))
    }

    /// The sled key: big-endian, so byte order is numeric order.
    pub(crate) fn to_key(self) -> [u8; 8] {
        self.0.to_be_bytes()
    }

    pub(crate) fn from_key(key: &[u8]) -> Option<Self> {
        <[u8; 8]>::try_from(key).ok().map(|b| Self(u64::from_be_bytes(b)))
    }
}

/// Sixteen lower-case hex digits: fixed width, so text order is id order too.
impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// In the admin API's schema: the sixteen hex digits of [`fmt::Display`].
impl schemars::JsonSchema for EventId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "EventId".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^[0-9a-f]{16}$",
            "description": "An event id: its receive time in microseconds, as 16 hex digits."
        })
    }
}

/// Why a string is not an event id.
#[derive(Debug, thiserror::Error)]
#[error("not an event id (expected 16 hex digits)")]
pub(crate) struct BadEventId;

impl FromStr for EventId {
    type Err = BadEventId;
    fn from_str(s: &str) -> Result<Self, BadEventId> {
        if s.len() != 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(BadEventId);
        }
        u64::from_str_radix(s, 16).map(Self).map_err(|_| BadEventId)
    }
}

impl Serialize for EventId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EventId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Where an event stands. The ingress writes `received` or `rejected`; dispatch moves
/// `received` events on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EventStatus {
    /// Stored and waiting in the inbox for dispatch.
    Received,
    /// Acknowledged but not stored (see `reason`): never dispatched.
    Rejected,
    /// Deliveries were created for the destinations in `destinations`.
    Dispatched,
    /// Another copy of the same occurrence (see `duplicate_of`): not delivered.
    Duplicate,
    /// No destination wants it.
    Unrouted,
}

impl EventStatus {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Received => "received",
            Self::Rejected => "rejected",
            Self::Dispatched => "dispatched",
            Self::Duplicate => "duplicate",
            Self::Unrouted => "unrouted",
        }
    }
}

/// Where the event name came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EventNameOrigin {
    /// The `/hooks/{source}/{token}/{eventName}` path segment.
    Path,
    /// The body's `meta.debug.resthook.event_name`.
    Body,
    /// Neither: the event name is `unknown`.
    Unknown,
    /// Raised by the relay itself (`hookrelay.HookGap`).
    Internal,
}

/// Something unusual about a callback, kept for inspection (the event is stored anyway).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EventFlag {
    /// The body was empty.
    Empty,
    /// The body is not valid JSON (form-encoded, truncated, binary...).
    NotJson,
    /// The body exceeded `ingress.max_body_bytes` and was discarded.
    Oversized,
}

/// Everything about an event but its id and body. Stored as JSON under the event's key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct EventMeta {
    pub(crate) source: String,
    pub(crate) event: String,
    pub(crate) event_from: EventNameOrigin,
    /// Receive time, microseconds since the Unix epoch.
    pub(crate) received_at_us: u64,
    pub(crate) size: u64,
    pub(crate) content_type: Option<String>,
    /// Selected request headers (never credentials), in arrival order.
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) remote_addr: Option<String>,
    pub(crate) status: EventStatus,
    pub(crate) flags: Vec<EventFlag>,
    /// Why the event was rejected, when it was.
    pub(crate) reason: Option<String>,
    /// The event this one duplicates, when it is a duplicate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) duplicate_of: Option<EventId>,
    /// Destinations it was routed to, once dispatched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) destinations: Vec<String>,
    /// The resource the event is about, `type/id` from the body's `data` (JSON:API):
    /// `actions/5`. Indexed, so that "did the update of matter 5 reach the CRM?" is
    /// answered without a scan (`EventFilter::resource`). Stored as `record`, the
    /// name of the first builds, so that every stored event and every relay of a
    /// fleet being upgraded reads it.
    #[serde(rename = "record", default, skip_serializing_if = "Option::is_none")]
    pub(crate) resource: Option<String>,
}

impl EventMeta {
    pub(crate) fn received_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(self.received_at_us)
    }
}

/// A stored event's record.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct EventRecord {
    pub(crate) id: EventId,
    pub(crate) meta: EventMeta,
}

/// An event the ingress hands to the committer: its id is assigned at commit.
#[derive(Clone, Debug)]
pub(crate) struct NewEvent {
    pub(crate) meta: EventMeta,
    /// The raw body; `None` for rejected events.
    pub(crate) body: Option<bytes::Bytes>,
}

impl NewEvent {
    /// An event the relay raises itself (`hookrelay.*`), with its JSON `body`, about
    /// `resource`, received at `now`.
    pub(crate) fn internal(
        source: &str,
        event: &str,
        body: String,
        resource: Option<String>,
        now: SystemTime,
    ) -> Self {
        Self {
            meta: EventMeta {
                source: source.to_owned(),
                event: event.to_owned(),
                event_from: EventNameOrigin::Internal,
                received_at_us: crate::clock::unix_micros(now),
                size: body.len() as u64,
                content_type: Some("application/json".to_owned()),
                headers: Vec::new(),
                remote_addr: None,
                status: EventStatus::Received,
                flags: Vec::new(),
                reason: None,
                duplicate_of: None,
                destinations: Vec::new(),
                resource,
            },
            body: Some(bytes::Bytes::from(body)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_like_ids_and_text_sorts_like_keys() {
        let ids = [0u64, 1, 255, 256, 1 << 40, u64::MAX].map(EventId::new);
        for pair in ids.windows(2) {
            assert!(pair[0].to_key() < pair[1].to_key());
            assert!(pair[0].to_string() < pair[1].to_string());
        }
        for id in ids {
            assert_eq!(EventId::from_key(&id.to_key()), Some(id));
            assert_eq!(id.to_string().parse::<EventId>().unwrap(), id);
        }
    }

    #[test]
    fn rejects_malformed_ids() {
        for bad in ["", "123", "zzzzzzzzzzzzzzzz", "00000000000000000", "+000000000000001"] {
            assert!(bad.parse::<EventId>().is_err(), "{bad}");
        }
        assert_eq!(EventId::from_key(&[1, 2, 3]), None);
    }
}
