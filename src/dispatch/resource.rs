//! The record an event is about, for per-resource ordering: source, `data.type` and
//! `data.id` (JSON:API). `ActionCreated` and `ActionUpdated` of matter 5 share it.

use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

#[derive(Deserialize)]
struct Probe {
    data: Option<Data>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "type")]
    kind: Option<Value>,
    id: Option<Value>,
}

/// The resource key, or `None` when the body does not name a record (such events
/// are not held back by, and do not hold back, any other).
pub(crate) fn key(source: &str, body: &[u8]) -> Option<[u8; 16]> {
    let data = serde_json::from_slice::<Probe>(body).ok()?.data?;
    let text = |v: Value| match v {
        Value::String(s) => Some(s),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    let (kind, id) = (text(data.kind?)?, text(data.id?)?);
    let mut h = Sha256::new();
    for part in [source, &kind, &id] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize()[..16]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_record_same_key() {
        let created = br#"{"data":{"type":"actions","id":"5","attributes":{"a":1}},"meta":{}}"#;
        let updated = br#"{"data":{"id":"5","type":"actions","attributes":{"a":2}}}"#;
        assert_eq!(key("s", created), key("s", updated));
        assert!(key("s", created).is_some());
        assert_ne!(key("s", created), key("t", created));
        assert_ne!(key("s", created), key("s", br#"{"data":{"type":"actions","id":"6"}}"#));
        assert_eq!(
            key("s", br#"{"data":{"type":"actions","id":5}}"#),
            key("s", br#"{"data":{"type":"actions","id":"5"}}"#)
        );
    }

    #[test]
    fn no_record_no_key() {
        assert_eq!(key("s", b"a=1"), None);
        assert_eq!(key("s", br#"{"actions":[{"id":"5"}]}"#), None);
        assert_eq!(key("s", br#"{"data":{"type":"actions"}}"#), None);
        assert_eq!(key("s", br#"{"data":[1]}"#), None);
    }
}
