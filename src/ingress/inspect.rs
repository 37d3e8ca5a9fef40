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
    pub(super) flags: Vec<EventFlag>,
}

#[derive(Deserialize)]
struct Probe {
    meta: Option<ProbeMeta>,
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
        return Inspection { event_name: None, flags: vec![EventFlag::Empty] };
    }
    match serde_json::from_slice::<Probe>(body) {
        Ok(probe) => Inspection {
            event_name: probe
                .meta
                .and_then(|m| m.debug)
                .and_then(|d| d.resthook)
                .and_then(|h| h.event_name)
                .filter(|n| !n.is_empty()),
            flags: Vec::new(),
        },
        Err(_) if serde_json::from_slice::<IgnoredAny>(body).is_ok() => Inspection::default(),
        Err(_) => Inspection { event_name: None, flags: vec![EventFlag::NotJson] },
    }
}

/// The event name in the URL, if it is a plausible one: `[A-Za-z0-9_.-]`, with at
/// least one letter (so not `..`). The segment is arbitrary input, so anything long or
/// odd is ignored (the body is asked instead, then `unknown`); never refused.
pub(super) fn path_event_name(segment: Option<&str>) -> Option<&str> {
    segment.filter(|s| {
        (1..=128).contains(&s.len())
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            && s.bytes().any(|b| b.is_ascii_alphabetic())
    })
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
            Inspection { event_name: Some("FileNoteCreated".into()), flags: vec![] }
        );
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

    #[test]
    fn path_segments_must_look_like_event_names() {
        assert_eq!(path_event_name(Some("ActionCreated")), Some("ActionCreated"));
        assert_eq!(path_event_name(Some("hookrelay.HookGap")), Some("hookrelay.HookGap"));
        assert_eq!(path_event_name(Some("")), None);
        assert_eq!(path_event_name(Some("a b")), None);
        assert_eq!(path_event_name(Some("..")), None);
        assert_eq!(path_event_name(Some(".")), None);
        assert_eq!(path_event_name(Some("-_.9")), None);
        assert_eq!(path_event_name(Some(&"A".repeat(129))), None);
        assert_eq!(path_event_name(None), None);
    }
}
