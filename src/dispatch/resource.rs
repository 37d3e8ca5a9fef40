//! The resource key of an event, for per-resource ordering: a hash of its source and
//! the resource it is about (`type/id`, as the ingress found it in the body's `data`:
//! `ingress::inspect::resource_of` is the one rule). `ActionCreated` and
//! `ActionUpdated` of matter 5 share it; an event ordered by a resource is also found
//! by it (`?resource=`), and one that is not found by a resource is not ordered.

use sha2::{Digest, Sha256};

/// The resource key of an event of `source` about `resource` (`type/id`; the type has
/// no `/`). Events without a resource are not held back by, and do not hold back, any
/// other.
pub(crate) fn key(source: &str, resource: &str) -> [u8; 16] {
    // type and id hashed apart (as before the resource was stored): keys of queues
    // stored by an earlier build stay the same.
    let (kind, id) = resource.split_once('/').unwrap_or((resource, ""));
    let mut h = Sha256::new();
    for part in [source, kind, id] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize()[..16]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingress::resource_of;

    /// The key of a body as the ingress and the dispatcher see it, end to end.
    fn of(source: &str, body: &[u8]) -> Option<[u8; 16]> {
        crate::ingress::inspect_resource(body).map(|r| key(source, &r))
    }

    #[test]
    fn same_resource_same_key() {
        let created = br#"{"data":{"type":"actions","id":"5","attributes":{"a":1}},"meta":{}}"#;
        let updated = br#"{"data":{"id":"5","type":"actions","attributes":{"a":2}}}"#;
        assert_eq!(of("s", created), of("s", updated));
        assert!(of("s", created).is_some());
        assert_ne!(of("s", created), of("t", created));
        assert_ne!(of("s", created), of("s", br#"{"data":{"type":"actions","id":"6"}}"#));
        assert_eq!(
            of("s", br#"{"data":{"type":"actions","id":5}}"#),
            of("s", br#"{"data":{"type":"actions","id":"5"}}"#)
        );
    }

    #[test]
    fn no_resource_no_key() {
        assert_eq!(of("s", b"a=1"), None);
        assert_eq!(of("s", br#"{"actions":[{"id":"5"}]}"#), None);
        assert_eq!(of("s", br#"{"data":{"type":"actions"}}"#), None);
        assert_eq!(of("s", br#"{"data":[1]}"#), None);
    }

    /// Ordered by a resource exactly when found by it: a float id, an id too long or
    /// with a control character names no resource for either.
    #[test]
    fn ordered_exactly_when_searchable() {
        let long = format!(r#"{{"data":{{"type":"actions","id":"{}"}}}}"#, "9".repeat(129));
        for body in [
            br#"{"data":{"type":"actions","id":5.5}}"#.as_slice(),
            br#"{"data":{"type":"actions","id":"a\u0001"}}"#.as_slice(),
            long.as_bytes(),
        ] {
            assert_eq!(of("s", body), None, "{}", String::from_utf8_lossy(body));
        }
        assert_eq!(resource_of("actions".into(), "5".into()).as_deref(), Some("actions/5"));
    }

    /// The key is the one an earlier build computed from the body's type and id, so
    /// ordering queues stored before an upgrade go on.
    #[test]
    fn keys_are_those_of_earlier_builds() {
        let mut h = Sha256::new();
        for part in ["s", "actions", "5"] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        assert_eq!(key("s", "actions/5"), h.finalize()[..16]);
    }
}
