//! Byte layout of stored values.
//!
//! An inbox entry carries a whole received event, so that acknowledging a callback
//! costs one sled insert: `[meta length: u32 BE][meta JSON][raw body]`.

use crate::store::{EventMeta, StoreError};

/// Encodes a received event for the inbox.
pub(crate) fn encode_pending(meta: &EventMeta, body: &[u8]) -> Result<Vec<u8>, StoreError> {
    let meta = serde_json::to_vec(meta)?;
    let len = u32::try_from(meta.len()).map_err(|_| StoreError::Corrupt {
        table: "inbox",
        key: String::new(),
        reason: "meta over 4 GiB".into(),
    })?;
    let mut out = Vec::with_capacity(4 + meta.len() + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&meta);
    out.extend_from_slice(body);
    Ok(out)
}

/// Splits an inbox entry into its meta (parsed) and its body (borrowed).
pub(crate) fn decode_pending(value: &[u8]) -> Result<(EventMeta, &[u8]), String> {
    let (len, rest) = value.split_first_chunk::<4>().ok_or("entry shorter than its header")?;
    let len = u32::from_be_bytes(*len) as usize;
    if rest.len() < len {
        return Err(format!("meta length {len} exceeds the entry"));
    }
    let (meta, body) = rest.split_at(len);
    let meta = serde_json::from_slice(meta).map_err(|e| e.to_string())?;
    Ok((meta, body))
}

/// The body of an inbox entry, without parsing its meta.
pub(crate) fn body_of(value: &[u8]) -> Result<&[u8], String> {
    let (len, rest) = value.split_first_chunk::<4>().ok_or("entry shorter than its header")?;
    let len = u32::from_be_bytes(*len) as usize;
    rest.get(len..).ok_or_else(|| format!("meta length {len} exceeds the entry"))
}

/// Parses the meta part of an inbox entry without touching the body.
pub(crate) fn decode_meta(value: &[u8]) -> Result<EventMeta, String> {
    decode_pending(value).map(|(meta, _)| meta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{EventFlag, EventNameOrigin, EventStatus};

    #[test]
    fn round_trips_and_rejects_truncation() {
        let meta = EventMeta {
            source: "demo".into(),
            event: "ActionCreated".into(),
            event_from: EventNameOrigin::Body,
            received_at_us: 42,
            size: 3,
            content_type: None,
            headers: vec![("user-agent".into(), "x".into())],
            remote_addr: None,
            status: EventStatus::Received,
            flags: vec![EventFlag::NotJson],
            reason: None,
            duplicate_of: None,
            destinations: Vec::new(),
        };
        let bytes = encode_pending(&meta, b"a\0b").unwrap();
        let (back, body) = decode_pending(&bytes).unwrap();
        assert_eq!((back, body), (meta.clone(), &b"a\0b"[..]));
        let empty = encode_pending(&meta, b"").unwrap();
        assert_eq!(decode_pending(&empty).unwrap().1, b"");
        assert_eq!(body_of(&bytes).unwrap(), b"a\0b");
        assert!(body_of(&bytes[..10]).is_err());
        assert!(decode_pending(&bytes[..3]).is_err());
        assert!(decode_pending(&bytes[..10]).is_err());
    }
}
