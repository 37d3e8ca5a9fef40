//! Key layouts of the delivery trees. All integers big-endian, so that sled's byte
//! order is numeric order. Destination names never contain 0x00 (validated), which
//! makes it a safe separator.

use super::EventId;

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

/// `ordering`: `[destination][0x00][resource: 16]` — the queue of one record's
/// deliveries to one destination.
pub(crate) fn order(destination: &str, resource: &[u8; 16]) -> Vec<u8> {
    let mut k = schedule_prefix(destination);
    k.extend_from_slice(resource);
    k
}

/// `ordering` value: `[head event: 8][tail event: 8][length: 8]`.
pub(crate) fn encode_order(head: EventId, tail: EventId, len: u64) -> [u8; 24] {
    let mut v = [0u8; 24];
    v[..8].copy_from_slice(&head.to_key());
    v[8..16].copy_from_slice(&tail.to_key());
    v[16..].copy_from_slice(&len.to_be_bytes());
    v
}

pub(crate) fn decode_order(v: &[u8]) -> Option<(EventId, EventId, u64)> {
    let v: &[u8; 24] = v.try_into().ok()?;
    Some((
        EventId::from_key(&v[..8])?,
        EventId::from_key(&v[8..16])?,
        u64::from_be_bytes(v[16..].try_into().ok()?),
    ))
}

/// Hex form of a resource key, as kept in delivery records.
pub(crate) fn resource_hex(resource: &[u8; 16]) -> String {
    resource.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses [`resource_hex`] back.
pub(crate) fn resource_from_hex(text: &str) -> Option<[u8; 16]> {
    if text.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
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
    fn order_values_and_resources_round_trip() {
        let v = encode_order(EventId::new(1), EventId::new(9), 3);
        assert_eq!(decode_order(&v), Some((EventId::new(1), EventId::new(9), 3)));
        assert_eq!(decode_order(&v[..23]), None);
        let r = [0xab; 16];
        assert_eq!(resource_from_hex(&resource_hex(&r)), Some(r));
        assert_eq!(resource_from_hex("zz"), None);
    }

    #[test]
    fn delivery_keys_round_trip() {
        let k = delivery(EventId::new(7), "crm");
        assert_eq!(split_delivery(&k), Some((EventId::new(7), "crm".to_owned())));
        assert_eq!(split_delivery(&k[..5]), None);
    }
}
