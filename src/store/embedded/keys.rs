//! Key layouts of the delivery trees. All integers big-endian, so that sled's byte
//! order is numeric order. Destination names never contain 0x00 (validated), which
//! makes it a safe separator.

use crate::store::lifecycle::{DedupEntry, Queue};
use crate::store::EventId;

/// `deliveries`: `[event id: 8][destination name]` — all deliveries of an event are
/// one prefix scan.
pub(crate) fn delivery(event: EventId, destination: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + destination.len());
    k.extend_from_slice(&event.to_key());
    k.extend_from_slice(destination.as_bytes());
    k
}

/// Splits a `deliveries` (or `dead_letters`) key.
pub(crate) fn split_delivery(key: &[u8]) -> Option<(EventId, String)> {
    let (id, name) = key.split_at_checked(8)?;
    Some((EventId::from_key(id)?, String::from_utf8(name.to_vec()).ok()?))
}

/// `schedule`: `[destination name][0x00][due µs: 8][event id: 8]` — a destination's
/// queue is one prefix, in due-time order.
pub(crate) fn schedule(destination: &str, due_us: u64, event: EventId) -> Vec<u8> {
    let mut k = schedule_prefix(destination);
    k.extend_from_slice(&due_us.to_be_bytes());
    k.extend_from_slice(&event.to_key());
    k
}

/// The part of a `schedule` key shared by a destination's entries.
pub(crate) fn schedule_prefix(destination: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(destination.len() + 17);
    k.extend_from_slice(destination.as_bytes());
    k.push(0);
    k
}

/// Splits the tail of a `schedule` key (after the prefix) into due time and event.
pub(crate) fn split_schedule_tail(tail: &[u8]) -> Option<(u64, EventId)> {
    let (due, id) = tail.split_first_chunk::<8>()?;
    Some((u64::from_be_bytes(*due), EventId::from_key(id)?))
}

/// `outcomes`: an event's id (8 B), or `[0x01][resource][0x00][event id: 8]` for an
/// event about a resource, so that one resource's outcomes are one prefix: the
/// by-resource index of dispatched events, at no write of its own. Never 8 bytes long
/// (a resource has at least `a/b`), nor the cursor's key (which starts with `d`). A
/// resource never contains 0x00 (the ingress refuses control characters in it).
pub(crate) fn outcome(event: EventId, resource: Option<&str>) -> Vec<u8> {
    match resource {
        None => event.to_key().to_vec(),
        Some(resource) => {
            let mut k = by_resource_prefix(resource);
            k.extend_from_slice(&event.to_key());
            k
        }
    }
}

/// The part of the `outcomes` keys shared by one resource's events.
pub(crate) fn by_resource_prefix(resource: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(resource.len() + 10);
    k.push(1);
    k.extend_from_slice(resource.as_bytes());
    k.push(0);
    k
}

/// `ordering`: `[destination][0x00][resource: 16]` — the queue of one resource's
/// deliveries to one destination.
pub(crate) fn order(destination: &str, resource: &[u8; 16]) -> Vec<u8> {
    let mut k = schedule_prefix(destination);
    k.extend_from_slice(resource);
    k
}

/// Splits a whole `schedule` key into destination, due time and event (borrowed: the
/// count behind the open reads millions).
pub(crate) fn split_schedule(key: &[u8]) -> Option<(&str, u64, EventId)> {
    let zero = key.iter().position(|b| *b == 0)?;
    let dest = std::str::from_utf8(&key[..zero]).ok()?;
    let (due, event) = split_schedule_tail(&key[zero + 1..])?;
    Some((dest, due, event))
}

/// The destination of an `ordering` key.
pub(crate) fn split_order(key: &[u8]) -> Option<String> {
    let zero = key.iter().position(|b| *b == 0)?;
    std::str::from_utf8(&key[..zero]).ok().map(str::to_owned)
}

/// `ordering` value: `[head event: 8][tail event: 8][length: 8]`.
pub(crate) fn encode_order(q: &Queue) -> [u8; 24] {
    let mut v = [0u8; 24];
    v[..8].copy_from_slice(&q.head.to_key());
    v[8..16].copy_from_slice(&q.tail.to_key());
    v[16..].copy_from_slice(&q.len.to_be_bytes());
    v
}

pub(crate) fn decode_order(v: &[u8]) -> Option<Queue> {
    let v: &[u8; 24] = v.try_into().ok()?;
    Some(Queue {
        head: EventId::from_key(&v[..8])?,
        tail: EventId::from_key(&v[8..16])?,
        len: u64::from_be_bytes(v[16..].try_into().ok()?),
    })
}

/// A dedup bucket is about this share of what is left of its keys' window: narrow,
/// so that the bucket being filled is small and a checkpoint writes its few pages,
/// not a page per key scattered among a window's keys (`dedup.rs`).
const SLICES: u64 = 32;
/// The narrowest dedup bucket: 2^20 µs, about a second.
const NARROWEST_BUCKET: u64 = 1 << 20;
/// The widest: 2^37 µs, about 38 hours.
const WIDEST_BUCKET: u64 = 1 << 37;

/// The end of the bucket that files a dedup key whose window ends at `until_us`,
/// written at `now_us` (`dedup.rs`): the bucket is a [`SLICES`]th of what is left of
/// the window, rounded down to a power of two of µs (within a second and 38 hours),
/// and ends at the next multiple of its width after `until_us`. So the end is after
/// `until_us` (a bucket whose end has passed holds only expired keys), and one
/// window's keys fall into 33 to 65 buckets (more for a window over 50 days).
pub(crate) fn dedup_bucket_end(until_us: u64, now_us: u64) -> u64 {
    let slice = (until_us.saturating_sub(now_us) / SLICES).clamp(NARROWEST_BUCKET, WIDEST_BUCKET);
    let width = 1u64 << (63 - slice.leading_zeros());
    (until_us / width).saturating_add(1).saturating_mul(width)
}

/// `dedup` key (layout 3): `[bucket end µs: 8][hash: 16]`.
pub(crate) fn dedup(bucket_end: u64, hash: &[u8; 16]) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&bucket_end.to_be_bytes());
    k[8..].copy_from_slice(hash);
    k
}

/// The bucket end of a `dedup` key; `None` when it is not a layout-3 key.
pub(crate) fn dedup_bucket(key: &[u8]) -> Option<u64> {
    let key: &[u8; 24] = key.try_into().ok()?;
    Some(u64::from_be_bytes(key[..8].try_into().ok()?))
}

/// The hash of a `dedup` key; `None` when it is not a layout-3 key.
pub(crate) fn dedup_hash(key: &[u8]) -> Option<[u8; 16]> {
    let key: &[u8; 24] = key.try_into().ok()?;
    key[8..].try_into().ok()
}

/// `dedup` value: `[original event id: 8][window end µs: 8]`.
pub(crate) fn encode_dedup(e: &DedupEntry) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&e.original.to_key());
    v[8..].copy_from_slice(&e.until_us.to_be_bytes());
    v
}

pub(crate) fn decode_dedup(value: &[u8]) -> Option<DedupEntry> {
    let (id, until) = value.split_first_chunk::<8>()?;
    Some(DedupEntry {
        original: EventId::from_key(id)?,
        until_us: u64::from_be_bytes(until.try_into().ok()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_keys_sort_by_destination_then_due_time() {
        let a = schedule("a", 5, EventId::new(9));
        let b = schedule("a", 6, EventId::new(1));
        let c = schedule("a-b", 1, EventId::new(1));
        let d = schedule("ab", 0, EventId::new(0));
        assert!(a < b && b < c && c < d);
        let prefix = schedule_prefix("a");
        assert!(a.starts_with(&prefix) && !c.starts_with(&prefix));
        assert_eq!(split_schedule_tail(&b[prefix.len()..]), Some((6, EventId::new(1))));
    }

    #[test]
    fn order_and_dedup_values_round_trip() {
        let q = Queue { head: EventId::new(1), tail: EventId::new(9), len: 3 };
        assert_eq!(decode_order(&encode_order(&q)), Some(q));
        assert_eq!(decode_order(&encode_order(&q)[..23]), None);
        let d = DedupEntry { original: EventId::new(5), until_us: 77 };
        assert_eq!(decode_dedup(&encode_dedup(&d)), Some(d));
        let k = schedule("crm", 6, EventId::new(2));
        assert_eq!(split_schedule(&k), Some(("crm", 6, EventId::new(2))));
        assert_eq!(split_order(&order("crm", &[7; 16])).as_deref(), Some("crm"));
    }

    #[test]
    fn delivery_keys_round_trip() {
        let k = delivery(EventId::new(7), "crm");
        assert_eq!(split_delivery(&k), Some((EventId::new(7), "crm".to_owned())));
        assert_eq!(split_delivery(&k[..5]), None);
    }
}
