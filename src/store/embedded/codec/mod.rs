//! Byte layout of stored event values.
//!
//! An event is written **once**, at ingest, as one `records` value, so that
//! acknowledging a callback costs one sled insert and its body enters sled's log once:
//! `[flags: u8][meta length: u32 BE]([resource length: u16 BE][resource])?[meta][raw body]`,
//! the resource (`type/id`, [`EventMeta::resource`]) present when the flag
//! [`RESOURCE`] is set. Dispatch never rewrites it: its decision goes into a small
//! `outcomes` value ([`DispatchRecord`]) that readers lay over the meta, keyed by the
//! resource when there is one (`keys::outcome`), which makes the outcomes the
//! by-resource index at no extra write. The resource sits in the header so that
//! finding an event's outcome key needs no meta parsing.
//!
//! The meta is binary (`encode_meta`: about half the bytes of its JSON, which was
//! mostly field names), or the JSON of a version-1 store's migrated events, told apart
//! by its first byte (`{`):
//!
//! ```text
//! [version = 1][source: str][event: str][event_from: u8][received µs: u64][size: var]
//! [content type: opt str][header count: var]([name: str][value: str])*
//! [remote address: opt str][status: u8][flag count: var]([flag: u8])*[reason: opt str]
//! [duplicate of: opt u64][destination count: var]([destination: str])*
//! ```

use serde::{Deserialize, Serialize};

use super::bin::{Reader, Writer};
use crate::store::{EventFlag, EventId, EventMeta, EventNameOrigin, EventStatus, StoreError};

/// Flag: the event was stored as `received`, so dispatch owes it an outcome.
const RECEIVED: u8 = 0x01;
/// Flag: a body is stored (a rejected event has none, which is not an empty body).
const HAS_BODY: u8 = 0x02;
/// Flag: a resource (`type/id`) follows the header.
const RESOURCE: u8 = 0x04;
/// Bytes before the meta (or the resource).
const HEADER: usize = 5;

/// Encodes an event as ingest stores it.
pub(crate) fn encode_record(meta: &EventMeta, body: Option<&[u8]>) -> Result<Vec<u8>, StoreError> {
    encode_raw(
        meta.status == EventStatus::Received,
        meta.resource.as_deref(),
        &encode_meta(meta),
        body,
    )
}

/// Encodes a record from its encoded meta (the v1 migration holds its JSON).
pub(crate) fn encode_raw(
    received: bool,
    resource: Option<&str>,
    meta: &[u8],
    body: Option<&[u8]>,
) -> Result<Vec<u8>, StoreError> {
    let too_long = |what: &str| StoreError::Corrupt {
        table: super::RECORDS,
        key: String::new(),
        reason: format!("{what} too long to store"),
    };
    let len = u32::try_from(meta.len()).map_err(|_| too_long("meta"))?;
    let resource_len = match resource {
        Some(r) => Some(u16::try_from(r.len()).map_err(|_| too_long("resource"))?),
        None => None,
    };
    let body_len = body.map_or(0, <[u8]>::len);
    let mut out =
        Vec::with_capacity(HEADER + 2 + resource.map_or(0, str::len) + meta.len() + body_len);
    let mut flags = 0;
    if received {
        flags |= RECEIVED;
    }
    if body.is_some() {
        flags |= HAS_BODY;
    }
    if resource.is_some() {
        flags |= RESOURCE;
    }
    out.push(flags);
    out.extend_from_slice(&len.to_be_bytes());
    if let (Some(resource), Some(resource_len)) = (resource, resource_len) {
        out.extend_from_slice(&resource_len.to_be_bytes());
        out.extend_from_slice(resource.as_bytes());
    }
    out.extend_from_slice(meta);
    out.extend_from_slice(body.unwrap_or_default());
    Ok(out)
}

/// A record's parts, borrowed from its value.
pub(crate) struct RecordRef<'a> {
    pub(crate) meta: &'a [u8],
    pub(crate) body: Option<&'a [u8]>,
    /// What the event is about (`type/id`), when the body named it.
    pub(crate) resource: Option<&'a str>,
}

/// Splits a record without parsing its meta.
pub(crate) fn split_record(value: &[u8]) -> Result<RecordRef<'_>, String> {
    let (&flags, rest) = value.split_first().ok_or("empty record")?;
    let (len, mut rest) = rest.split_first_chunk::<4>().ok_or("record shorter than its header")?;
    let len = u32::from_be_bytes(*len) as usize;
    let mut resource = None;
    if flags & RESOURCE != 0 {
        let (n, tail) = rest.split_first_chunk::<2>().ok_or("resource length missing")?;
        let n = u16::from_be_bytes(*n) as usize;
        let (text, tail) = tail.split_at_checked(n).ok_or("resource exceeds the value")?;
        resource = Some(std::str::from_utf8(text).map_err(|e| format!("resource: {e}"))?);
        rest = tail;
    }
    if rest.len() < len {
        return Err(format!("meta length {len} exceeds the record"));
    }
    let (meta, body) = rest.split_at(len);
    Ok(RecordRef { meta, body: (flags & HAS_BODY != 0).then_some(body), resource })
}

/// The record without its body (retention by part), or `None` when it has none: the
/// header, resource and meta as they were, [`HAS_BODY`] cleared.
pub(crate) fn strip_body(value: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let Some(body) = split_record(value)?.body else { return Ok(None) };
    let mut out = value[..value.len() - body.len()].to_vec();
    out[0] &= !HAS_BODY;
    Ok(Some(out))
}

/// The key of a stored event's outcome (`keys::outcome`), from its `records` key
/// and value, without parsing its meta.
pub(crate) fn outcome_key(key: &[u8], value: &[u8]) -> Result<Vec<u8>, String> {
    let id = EventId::from_key(key).ok_or("key is not 8 bytes")?;
    Ok(super::keys::outcome(id, split_record(value)?.resource))
}

/// Whether a record still waits for dispatch's outcome, read from its first byte.
pub(crate) fn awaits_outcome(value: &[u8]) -> bool {
    value.first().is_some_and(|f| f & RECEIVED != 0)
}

/// Parses a record's meta as stored (with its resource), without the outcome laid
/// over it.
pub(crate) fn decode_meta(value: &[u8]) -> Result<EventMeta, String> {
    let parts = split_record(value)?;
    let mut meta = parse_meta(parts.meta)?;
    if parts.resource.is_some() {
        meta.resource = parts.resource.map(str::to_owned);
    }
    Ok(meta)
}

const META_VERSION: u8 = 1;

/// The binary form of a meta (see the module's doc).
pub(crate) fn encode_meta(m: &EventMeta) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(64 + m.headers.len() * 32));
    w.u8(META_VERSION);
    w.str(&m.source);
    w.str(&m.event);
    w.u8(match m.event_from {
        EventNameOrigin::Path => 0,
        EventNameOrigin::Body => 1,
        EventNameOrigin::Unknown => 2,
        EventNameOrigin::Internal => 3,
    });
    w.u64(m.received_at_us);
    w.var(m.size);
    w.opt_str(m.content_type.as_deref());
    w.var(m.headers.len() as u64);
    for (name, value) in &m.headers {
        w.str(name);
        w.str(value);
    }
    w.opt_str(m.remote_addr.as_deref());
    w.u8(status_byte(m.status));
    w.var(m.flags.len() as u64);
    for flag in &m.flags {
        w.u8(match flag {
            EventFlag::Empty => 0,
            EventFlag::NotJson => 1,
            EventFlag::Oversized => 2,
        });
    }
    w.opt_str(m.reason.as_deref());
    w.opt_u64(m.duplicate_of.map(EventId::raw));
    w.var(m.destinations.len() as u64);
    for d in &m.destinations {
        w.str(d);
    }
    w.0
}

fn status_byte(s: EventStatus) -> u8 {
    match s {
        EventStatus::Received => 0,
        EventStatus::Rejected => 1,
        EventStatus::Dispatched => 2,
        EventStatus::Duplicate => 3,
        EventStatus::Unrouted => 4,
    }
}

fn status_of(b: u8) -> Result<EventStatus, String> {
    Ok(match b {
        0 => EventStatus::Received,
        1 => EventStatus::Rejected,
        2 => EventStatus::Dispatched,
        3 => EventStatus::Duplicate,
        4 => EventStatus::Unrouted,
        _ => return Err(format!("unknown event status {b}")),
    })
}

/// Parses a stored meta: binary, or the JSON of a migrated version-1 event.
pub(crate) fn parse_meta(bytes: &[u8]) -> Result<EventMeta, String> {
    match bytes.first() {
        Some(b'{') => return serde_json::from_slice(bytes).map_err(|e| e.to_string()),
        Some(&META_VERSION) => {}
        Some(v) => return Err(format!("unknown meta version {v}")),
        None => return Err("empty meta".into()),
    }
    let mut r = Reader(&bytes[1..]);
    let source = r.str()?;
    let event = r.str()?;
    let event_from = match r.u8()? {
        0 => EventNameOrigin::Path,
        1 => EventNameOrigin::Body,
        2 => EventNameOrigin::Unknown,
        3 => EventNameOrigin::Internal,
        b => return Err(format!("unknown event name origin {b}")),
    };
    let received_at_us = r.u64()?;
    let size = r.var()?;
    let content_type = r.opt_str()?;
    let n = r.count()?;
    let mut headers = Vec::with_capacity(n);
    for _ in 0..n {
        headers.push((r.str()?, r.str()?));
    }
    let remote_addr = r.opt_str()?;
    let status = status_of(r.u8()?)?;
    let n = r.count()?;
    let mut flags = Vec::with_capacity(n);
    for _ in 0..n {
        flags.push(match r.u8()? {
            0 => EventFlag::Empty,
            1 => EventFlag::NotJson,
            2 => EventFlag::Oversized,
            b => return Err(format!("unknown event flag {b}")),
        });
    }
    let reason = r.opt_str()?;
    let duplicate_of = r.opt_u64()?.map(EventId::new);
    let n = r.count()?;
    let mut destinations = Vec::with_capacity(n);
    for _ in 0..n {
        destinations.push(r.str()?);
    }
    r.end()?;
    Ok(EventMeta {
        source,
        event,
        event_from,
        received_at_us,
        size,
        content_type,
        headers,
        remote_addr,
        status,
        flags,
        reason,
        duplicate_of,
        destinations,
        resource: None,
    })
}

/// What dispatch decided for a received event: the only fields of its meta that
/// dispatch changes (see `lifecycle::dispatch`).
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct DispatchRecord {
    #[serde(rename = "s")]
    pub(crate) status: EventStatus,
    #[serde(rename = "o", default, skip_serializing_if = "Option::is_none")]
    pub(crate) duplicate_of: Option<EventId>,
    #[serde(rename = "d", default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) destinations: Vec<String>,
}

impl DispatchRecord {
    /// The outcome part of a dispatched meta.
    pub(crate) fn of(meta: &EventMeta) -> Self {
        Self {
            status: meta.status,
            duplicate_of: meta.duplicate_of,
            destinations: meta.destinations.clone(),
        }
    }

    /// Lays the outcome over the meta stored at ingest.
    pub(crate) fn apply_to(self, meta: &mut EventMeta) {
        meta.status = self.status;
        meta.duplicate_of = self.duplicate_of;
        meta.destinations = self.destinations;
    }
}

#[cfg(test)]
mod tests;
