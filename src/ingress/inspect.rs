//! A quick look into a callback body: is it JSON, and which event does it name.
//!
//! The body is opaque to the ingress: whatever this finds, the body is stored as is.

use serde::de::IgnoredAny;
use serde::Deserialize;

use crate::store::EventFlag;

/// What the body says about itself.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Inspection {
    /// `meta.debug.resthook.event_name`, when present (see upstream-notes.md).
    pub(super) event_name: Option<String>,
    /// The resource: `type/id` of the body's `data`, when both are plain (see
    /// [`resource_of`]).
    pub(super) resource: Option<String>,
    pub(super) flags: Vec<EventFlag>,
}

#[derive(Deserialize)]
struct Probe {
    meta: Option<ProbeMeta>,
    data: Option<ProbeData>,
}
#[derive(Deserialize)]
struct ProbeMeta {
    debug: Option<ProbeDebug>,
}
#[derive(Deserialize)]
struct ProbeDebug {
    resthook: Option<ProbeHook>,
}
#[derive(Deserialize)]
struct ProbeHook {
    event_name: Option<String>,
}

/// Looks at `body` in a single pass; only a body that fails that pass (or is not an
/// object with a string `event_name`) is parsed a second time, to tell "valid JSON of
/// another shape" from "not JSON".
pub(super) fn inspect(body: &[u8]) -> Inspection {
    if body.is_empty() {
        return Inspection { flags: vec![EventFlag::Empty], ..Inspection::default() };
    }
    match serde_json::from_slice::<Probe>(body) {
        Ok(probe) => Inspection {
            event_name: probe
                .meta
                .and_then(|m| m.debug)
                .and_then(|d| d.resthook)
                .and_then(|h| h.event_name)
                .filter(|n| !n.is_empty()),
            resource: probe.data.and_then(|d| resource_of(d.kind?, d.id?)),
            flags: Vec::new(),
        },
        Err(_) if serde_json::from_slice::<IgnoredAny>(body).is_ok() => Inspection::default(),
        Err(_) => Inspection { flags: vec![EventFlag::NotJson], ..Inspection::default() },
    }
}

/// The longest `type` or `id` indexed: anything longer names no resource.
const MAX_RESOURCE_PART: usize = 128;

/// `kind/id`, if both look like a resource's type and id: non-empty, at most
/// [`MAX_RESOURCE_PART`] bytes, no control characters, and no `/` in the type (so that
/// `type/id` splits one way). The body is arbitrary input: anything else is simply
/// not indexed.
pub(crate) fn resource_of(kind: String, id: String) -> Option<String> {
    let plain =
        |s: &str| (1..=MAX_RESOURCE_PART).contains(&s.len()) && !s.chars().any(char::is_control);
    (plain(&kind) && plain(&id) && !kind.contains('/')).then(|| format!("{kind}/{id}"))
}

/// `data` of a JSON:API body: the resource the event is about. Any other shape of
/// `data` is skipped, never an error: it must not cost the body its event name.
#[derive(Default)]
struct ProbeData {
    kind: Option<String>,
    id: Option<String>,
}

impl<'de> Deserialize<'de> for ProbeData {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = ProbeData;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<ProbeData, A::Error> {
                let mut data = ProbeData::default();
                while let Some(key) = a.next_key::<Field>()? {
                    match key {
                        Field::Type => data.kind = a.next_value::<Scalar>()?.0,
                        Field::Id => data.id = a.next_value::<Scalar>()?.0,
                        Field::Other => {
                            a.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(data)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<ProbeData, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(ProbeData::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<ProbeData, E> {
                Ok(ProbeData::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<ProbeData, E> {
                Ok(ProbeData::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<ProbeData, E> {
                Ok(ProbeData::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<ProbeData, E> {
                Ok(ProbeData::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<ProbeData, E> {
                Ok(ProbeData::default())
            }
            fn visit_unit<E>(self) -> Result<ProbeData, E> {
                Ok(ProbeData::default())
            }
        }
        d.deserialize_any(Visit)
    }
}

/// The keys of `data` that name its resource (matched without allocating).
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Field {
    Type,
    Id,
    #[serde(other)]
    Other,
}

/// A string or a number, as text (`"5"` and `5` name the same resource); any other
/// JSON value (skipped without building it) is `None`.
struct Scalar(Option<String>);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Scalar;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(Some(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Scalar, E> {
                Ok(Scalar(Some(v)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(Some(v.to_string())))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(Some(v.to_string())))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Scalar, E> {
                Ok(Scalar(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Scalar, E> {
                Ok(Scalar(None))
            }
            fn visit_unit<E>(self) -> Result<Scalar, E> {
                Ok(Scalar(None))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Scalar, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar(None))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Scalar, A::Error> {
                while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar(None))
            }
        }
        d.deserialize_any(Visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_event_name_in_the_debug_block() {
        let body = br#"{"jsonapi":{"version":"1.0"},"data":{"type":"filenotes","id":"259"},
            "meta":{"debug":{"resthook":{"id":"46","event_name":"FileNoteCreated"}}}}"#;
        assert_eq!(
            inspect(body),
            Inspection {
                event_name: Some("FileNoteCreated".into()),
                resource: Some("filenotes/259".into()),
                flags: vec![]
            }
        );
    }

    #[test]
    fn names_the_resource_when_type_and_id_are_plain() {
        let resource = |body: &str| inspect(body.as_bytes()).resource;
        assert_eq!(resource(r#"{"data":{"id":5,"type":"actions"}}"#).as_deref(), Some("actions/5"));
        assert_eq!(
            resource(r#"{"data":{"type":"actions","id":"a/b"}}"#).as_deref(),
            Some("actions/a/b")
        );
        for body in [
            r#"{"data":{"type":"actions"}}"#,
            r#"{"data":{"type":"actions","id":null}}"#,
            r#"{"data":{"type":"actions","id":{"x":[1,2]}}}"#,
            r#"{"data":{"type":"actions","id":[5]}}"#,
            r#"{"data":{"type":"actions","id":1.5}}"#,
            r#"{"data":{"type":"","id":"5"}}"#,
            r#"{"data":{"type":"a/b","id":"5"}}"#,
            r#"{"data":{"type":"actions","id":"5\n"}}"#,
            r#"{"data":[{"type":"actions","id":"5"}]}"#,
        ] {
            assert_eq!(resource(body), None, "{body}");
        }
        let long = format!(r#"{{"data":{{"type":"actions","id":"{}"}}}}"#, "9".repeat(129));
        assert_eq!(resource(&long), None);
        // A `data` of another shape costs the body neither its event name nor its
        // standing as JSON.
        for data in [r#"[1]"#, r#""x""#, "7", "null", "true", r#"{"type":{"a":1},"id":"5"}"#] {
            let body = format!(
                r#"{{"data":{data},"meta":{{"debug":{{"resthook":{{"event_name":"ActionUpdated"}}}}}}}}"#
            );
            let seen = inspect(body.as_bytes());
            assert_eq!(seen.event_name.as_deref(), Some("ActionUpdated"), "{body}");
            assert!(seen.flags.is_empty() && seen.resource.is_none(), "{body}");
        }
    }

    #[test]
    fn other_shapes_are_json_without_a_name() {
        for body in [
            &br#"{"actions":[{"id":"5"}]}"#[..],
            b"[1,2]",
            b"\"x\"",
            br#"{"meta":{"debug":{"resthook":{"event_name":7}}}}"#,
        ] {
            assert_eq!(inspect(body), Inspection::default(), "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn flags_empty_and_non_json_bodies() {
        assert_eq!(inspect(b"").flags, [EventFlag::Empty]);
        assert_eq!(inspect(b"a=1&b=2").flags, [EventFlag::NotJson]);
        assert_eq!(inspect(b"{\"data\":").flags, [EventFlag::NotJson]);
        assert_eq!(inspect(&[0xff, 0xfe, 0x00]).flags, [EventFlag::NotJson]);
    }
}
