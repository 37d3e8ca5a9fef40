//! Deduplication keys: which callbacks are copies of the same occurrence.
//!
//! When N users register a hook for the same event and URL, one occurrence arrives N
//! times: the bodies share `data` but differ in `meta` (hook id, trigger count, debug
//! times). The key hashes the source, the event name and the configured JSON
//! pointers' values (canonical: key order and whitespace do not matter); a body that is
//! not JSON, or lacks a pointer, is keyed by its raw bytes.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The 16-byte dedup key of a callback.
pub(crate) fn key(source: &str, event: &str, body: &[u8], pointers: &[String]) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    h.update([0]);
    h.update(event.as_bytes());
    h.update([0]);
    let parsed = serde_json::from_slice::<Value>(body).ok();
    let parts: Option<Vec<&Value>> = match &parsed {
        Some(v) if !pointers.is_empty() => pointers.iter().map(|p| v.pointer(p)).collect(),
        _ => None,
    };
    match parts {
        Some(parts) => {
            h.update(b"json\0");
            let mut buf = Vec::with_capacity(body.len());
            for part in parts {
                buf.clear();
                canonical(part, &mut buf);
                h.update(&buf);
                h.update([0]);
            }
        }
        None => {
            h.update(b"raw\0");
            h.update(body);
        }
    }
    let digest = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&digest[..16]);
    out
}

/// Compact JSON with object keys sorted, whatever order the map keeps them in.
/// Written straight into `out` (no string per key or scalar): it runs for every
/// callback dispatched, and its output is part of stored dedup keys, so it must stay
/// byte for byte what it was (`tests::the_canonical_form_is_unchanged`).
fn canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            out.push(b'{');
            // serde_json's map is sorted unless a dependency turns on `preserve_order`.
            if map.keys().is_sorted() {
                entries(map.iter(), out);
            } else {
                let mut sorted: Vec<(&String, &Value)> = map.iter().collect();
                sorted.sort_by(|a, b| a.0.cmp(b.0));
                entries(sorted.into_iter(), out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(v, out);
            }
            out.push(b']');
        }
        scalar => compact(scalar, out),
    }
}

/// An object's entries, in the order given, as `"key":value` separated by commas.
fn entries<'a>(entries: impl Iterator<Item = (&'a String, &'a Value)>, out: &mut Vec<u8>) {
    for (i, (k, v)) in entries.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        compact(k, out);
        out.push(b':');
        canonical(v, out);
    }
}

/// `value`'s compact JSON appended to `out`.
fn compact(value: &(impl serde::Serialize + ?Sized), out: &mut Vec<u8>) {
    // Writing to a Vec cannot fail, nor can serialising a string or a JSON scalar.
    let _ = serde_json::to_writer(&mut *out, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> Vec<String> {
        vec!["/data".to_owned()]
    }

    #[test]
    fn copies_with_different_meta_share_a_key() {
        let a =
            br#"{"data":{"type":"actions","id":"5","attributes":{"name":"X","status":"Active"}},
                     "meta":{"debug":{"resthook":{"id":"46","trigger_count":1}}}}"#;
        let b = br#"{"meta":{"debug":{"resthook":{"id":"47","trigger_count":9}}},
                     "data":{"attributes":{"status":"Active","name":"X"},"id":"5","type":"actions"}}"#;
        assert_eq!(key("s", "ActionUpdated", a, &data()), key("s", "ActionUpdated", b, &data()));
    }

    #[test]
    fn different_occurrences_source_or_event_differ() {
        let a = br#"{"data":{"type":"actions","id":"5","attributes":{"name":"X"}}}"#;
        let changed = br#"{"data":{"type":"actions","id":"5","attributes":{"name":"Y"}}}"#;
        let k = key("s", "ActionUpdated", a, &data());
        assert_ne!(k, key("s", "ActionUpdated", changed, &data()));
        assert_ne!(k, key("t", "ActionUpdated", a, &data()));
        assert_ne!(k, key("s", "ActionCreated", a, &data()));
    }

    #[test]
    fn non_json_or_missing_pointers_fall_back_to_raw_bytes() {
        assert_eq!(key("s", "e", b"a=1", &data()), key("s", "e", b"a=1", &data()));
        assert_ne!(key("s", "e", b"a=1", &data()), key("s", "e", b"a=2", &data()));
        // No /data: the whole body counts, so meta differences matter.
        let a = br#"{"actions":[{"id":"5"}],"meta":1}"#;
        let b = br#"{"actions":[{"id":"5"}],"meta":2}"#;
        assert_ne!(key("s", "e", a, &data()), key("s", "e", b, &data()));
        // Several pointers: all must be present.
        let ptrs = vec!["/data/id".to_owned(), "/data/type".to_owned()];
        let c = br#"{"data":{"id":"5","type":"x","other":1}}"#;
        let d = br#"{"data":{"id":"5","type":"x","other":2}}"#;
        assert_eq!(key("s", "e", c, &ptrs), key("s", "e", d, &ptrs));
    }

    /// The canonical form as first written (a string per key and scalar): the oracle
    /// for the one in use, since stored dedup keys depend on every byte.
    fn canonical_as_first_written(value: &Value, out: &mut Vec<u8>) {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                out.push(b'{');
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(serde_json::to_string(k).unwrap().as_bytes());
                    out.push(b':');
                    canonical_as_first_written(v, out);
                }
                out.push(b'}');
            }
            Value::Array(items) => {
                out.push(b'[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    canonical_as_first_written(v, out);
                }
                out.push(b']');
            }
            scalar => out.extend_from_slice(scalar.to_string().as_bytes()),
        }
    }

    /// Any JSON value: every scalar kind (floats, negatives, large integers), strings
    /// with escapes, control characters and non-ASCII, nested objects and arrays.
    fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            any::<String>().prop_map(Value::from),
            "[\\\"\\u{0}-\\u{1f}a-z~/é😀]{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(6, 64, 8, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map("[\\\"a-z\\u{0}-\\u{7f}é]{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn the_canonical_form_is_unchanged(value in any_json()) {
            let (mut now, mut first) = (Vec::new(), Vec::new());
            canonical(&value, &mut now);
            canonical_as_first_written(&value, &mut first);
            proptest::prop_assert_eq!(String::from_utf8_lossy(&now), String::from_utf8_lossy(&first));
            // And it is JSON.
            proptest::prop_assert!(serde_json::from_slice::<Value>(&now).is_ok());
        }
    }

    #[test]
    fn canonical_form_sorts_nested_keys() {
        let v: Value = serde_json::from_str(r#"{"b":[{"y":1,"x":2}],"a":"\"q\""}"#).unwrap();
        let mut out = Vec::new();
        canonical(&v, &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), r#"{"a":"\"q\"","b":[{"x":2,"y":1}]}"#);
    }
}
