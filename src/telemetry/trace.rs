//! The spans of a callback's trace, and the one rule of who is whose parent:
//!
//! ```text
//! callback  (SERVER: the request, from its arrival to its 200)      the root
//! └─ dispatch  (INTERNAL: dedup and routing, one per event)
//!    ├─ attempt  (CLIENT: one HTTP request to one destination)
//!    └─ attempt  ... every attempt, by any relay, replays included
//! ```
//!
//! The relay's own events (`hookrelay.HookGap`) have no callback: their dispatch is
//! the root. A callback that brought a `traceparent` links to it; a duplicate's
//! dispatch links to the callback of the copy that was delivered.
//!
//! Attributes name the event, its source, event name and destination, and what
//! happened; never a token, a URL (it may hold a password), a header value or a body.

use super::ids::{Salt, SpanId, TraceId, TraceParent};
use crate::store::lifecycle::AttemptVerdict;
use crate::store::{DispatchVerdict, EventId, EventMeta, EventNameOrigin};

/// What a span stands for, as OTLP says it (`Span.SpanKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Internal = 1,
    Server = 2,
    Client = 3,
}

/// An attribute's value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Str(String),
    Int(i64),
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Self::Str(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Self::Str(s)
    }
}

impl From<u64> for Value {
    fn from(n: u64) -> Self {
        Self::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

/// A span of another trace, or of another part of this one.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Link {
    pub(crate) trace: TraceId,
    pub(crate) span: SpanId,
    /// Why it is linked (the `hookrelay.link` attribute).
    pub(crate) why: &'static str,
}

/// A finished span, ready to export.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Span {
    pub(crate) trace: TraceId,
    pub(crate) span: SpanId,
    pub(crate) parent: Option<SpanId>,
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    /// Nanoseconds since the Unix epoch.
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    pub(crate) attributes: Vec<(&'static str, Value)>,
    pub(crate) links: Vec<Link>,
    /// `Some(message)`: the span's work failed (OTLP's `STATUS_CODE_ERROR`).
    pub(crate) error: Option<String>,
}

/// µs (the store's times) to ns (OTLP's).
pub(crate) fn ns(us: u64) -> u64 {
    us.saturating_mul(1_000)
}

/// The attributes every span of an event carries.
fn event_attributes(id: EventId, meta: &EventMeta) -> Vec<(&'static str, Value)> {
    vec![
        ("hookrelay.event_id", id.to_string().into()),
        ("hookrelay.source", meta.source.as_str().into()),
        ("hookrelay.event", meta.event.as_str().into()),
    ]
}

/// The callback of `meta`, stored as `id`: received at `meta.received_at_us`,
/// answered at `end_us`.
pub(crate) fn callback(salt: Salt, id: EventId, meta: &EventMeta, end_us: u64) -> Span {
    let mut attributes = event_attributes(id, meta);
    attributes.extend([
        ("http.request.method", "POST".into()),
        // The route, never the path: the path holds the source's token.
        ("http.route", "/hooks/{source}/{token}/{eventName}".into()),
        ("http.response.status_code", 200u64.into()),
        ("hookrelay.status", meta.status.as_str().into()),
        ("hookrelay.body_bytes", meta.size.into()),
    ]);
    let incoming = meta
        .headers
        .iter()
        .find(|(name, _)| name == "traceparent")
        .and_then(|(_, value)| TraceParent::parse(value));
    Span {
        trace: salt.trace(id),
        span: salt.callback_span(id),
        parent: None,
        name: "callback",
        kind: Kind::Server,
        start_ns: ns(meta.received_at_us),
        end_ns: ns(end_us.max(meta.received_at_us)),
        attributes,
        links: incoming
            .map(|tp| Link { trace: tp.trace, span: tp.span, why: "upstream" })
            .into_iter()
            .collect(),
        error: None,
    }
}

/// The dispatch of `id`, which took from `start_us` to `end_us` (its batch's time).
pub(crate) fn dispatch(
    salt: Salt,
    id: EventId,
    meta: &EventMeta,
    verdict: &DispatchVerdict,
    start_us: u64,
    end_us: u64,
) -> Span {
    let mut attributes = event_attributes(id, meta);
    let mut links = Vec::new();
    let outcome = match verdict {
        DispatchVerdict::Dispatched { deliveries, .. } => {
            attributes.push(("hookrelay.deliveries", (*deliveries as u64).into()));
            "dispatched"
        }
        DispatchVerdict::Duplicate { original } => {
            attributes.push(("hookrelay.duplicate_of", original.to_string().into()));
            links.push(Link {
                trace: salt.trace(*original),
                span: salt.callback_span(*original),
                why: "original",
            });
            "duplicate"
        }
        DispatchVerdict::Unrouted => "unrouted",
        DispatchVerdict::Gone => "gone",
    };
    attributes.push(("hookrelay.outcome", outcome.into()));
    let own = meta.event_from == EventNameOrigin::Internal;
    // A batch's clock was read before its events were taken: one that arrived
    // meanwhile starts its dispatch when it arrived, not before its callback.
    let start_us = start_us.max(meta.received_at_us);
    Span {
        trace: salt.trace(id),
        span: salt.dispatch_span(id),
        parent: (!own).then(|| salt.callback_span(id)),
        name: "dispatch",
        kind: Kind::Internal,
        start_ns: ns(start_us),
        end_ns: ns(end_us.max(start_us)),
        attributes,
        links,
        error: None,
    }
}

/// What one attempt was and how it ended.
pub(crate) struct AttemptSpan<'a> {
    pub(crate) event: EventId,
    pub(crate) meta: &'a EventMeta,
    /// The id its `traceparent` told the destination.
    pub(crate) span: SpanId,
    pub(crate) destination: &'a str,
    /// The destination's host (`server.address`), never its URL.
    pub(crate) host: Option<&'a str>,
    /// 1 for the first.
    pub(crate) number: u32,
    pub(crate) start_us: u64,
    pub(crate) end_us: u64,
    /// Whether a request went out (not when the destination's transform failed).
    pub(crate) sent: bool,
    /// The answer's status, if one came.
    pub(crate) status: Option<u16>,
    /// Why it failed, in a few words (`HTTP 503`, `timeout: ...`), if it did.
    pub(crate) error: Option<&'a str>,
    /// What the store made of it; `None` when the record was refused (the delivery
    /// moved meanwhile).
    pub(crate) verdict: Option<AttemptVerdict>,
}

/// The span of one attempt, a child of the event's dispatch.
pub(crate) fn attempt(salt: Salt, a: &AttemptSpan<'_>) -> Span {
    let mut attributes = event_attributes(a.event, a.meta);
    attributes.extend([
        ("hookrelay.destination", a.destination.into()),
        ("hookrelay.attempt", u64::from(a.number).into()),
        ("http.request.method", "POST".into()),
    ]);
    if let Some(host) = a.host {
        attributes.push(("server.address", host.into()));
    }
    if let Some(status) = a.status {
        attributes.push(("http.response.status_code", u64::from(status).into()));
    }
    let outcome = a.verdict.map_or("not_recorded", AttemptVerdict::label);
    attributes.push(("hookrelay.outcome", outcome.into()));
    // A request not sent says so, not why: a transform's error may quote the body.
    let error = match (a.sent, a.error) {
        (false, _) => Some("not sent"),
        (true, error) => error,
    };
    if error.is_some() {
        let kind = match (a.sent, a.status) {
            (false, _) => "not_sent".to_owned(),
            (true, Some(status)) => status.to_string(),
            (true, None) => "request".to_owned(),
        };
        attributes.push(("error.type", kind.into()));
    }
    Span {
        trace: salt.trace(a.event),
        span: a.span,
        parent: Some(salt.dispatch_span(a.event)),
        name: "attempt",
        kind: Kind::Client,
        start_ns: ns(a.start_us),
        end_ns: ns(a.end_us.max(a.start_us)),
        attributes,
        links: Vec::new(),
        error: error.map(str::to_owned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fixtures::received;

    fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
        span.attributes.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    #[test]
    fn one_trace_per_callback_with_dispatch_and_attempts_under_it() {
        let salt = Salt::random();
        let id = EventId::new(1_700_000_000_000_000);
        let mut meta = received("demo", "ActionCreated", 1_700_000_000_000_000, "{}").meta;
        meta.headers.push((
            "traceparent".into(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
        ));
        let cb = callback(salt, id, &meta, 1_700_000_000_000_900);
        assert_eq!((cb.parent, cb.kind, cb.name), (None, Kind::Server, "callback"));
        assert_eq!(cb.end_ns - cb.start_ns, 900_000);
        assert_eq!(cb.links.len(), 1, "the upstream's trace is linked, not joined");
        assert_eq!(cb.links[0].span, [0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31]);

        let verdict = DispatchVerdict::Dispatched { deliveries: 2, superseded: Vec::new() };
        let d = dispatch(salt, id, &meta, &verdict, 1_700_000_000_001_000, 1_700_000_000_001_500);
        assert_eq!((d.trace, d.parent), (cb.trace, Some(cb.span)));
        assert_eq!(attribute(&d, "hookrelay.outcome"), Some(&"dispatched".into()));

        let a = AttemptSpan {
            event: id,
            meta: &meta,
            span: crate::telemetry::ids::random_span(),
            destination: "crm",
            host: Some("crm.example"),
            number: 2,
            start_us: 1_700_000_000_002_000,
            end_us: 1_700_000_000_001_000,
            sent: true,
            status: Some(503),
            error: Some("HTTP 503"),
            verdict: Some(AttemptVerdict::Retry),
        };
        let at = attempt(salt, &a);
        assert_eq!((at.trace, at.parent, at.kind), (cb.trace, Some(d.span), Kind::Client));
        assert_eq!(at.end_ns, at.start_ns, "a clock step back never makes a span end first");
        assert_eq!(at.error.as_deref(), Some("HTTP 503"));
        assert_eq!(attribute(&at, "error.type"), Some(&"503".into()));
        assert_eq!(attribute(&at, "hookrelay.outcome"), Some(&"retry".into()));

        let failed = "filter failed: $.password is \"p4ss\"";
        let not_sent =
            attempt(salt, &AttemptSpan { sent: false, status: None, error: Some(failed), ..a });
        assert_eq!(not_sent.error.as_deref(), Some("not sent"), "never the transform's words");
        assert_eq!(attribute(&not_sent, "error.type"), Some(&"not_sent".into()));
    }

    #[test]
    fn own_events_are_roots_and_duplicates_link_their_original() {
        let salt = Salt::random();
        let (id, original) = (EventId::new(20), EventId::new(10));
        let mut meta = received("demo", crate::event_names::HOOK_GAP, 20, "{}").meta;
        meta.event_from = EventNameOrigin::Internal;
        let d = dispatch(salt, id, &meta, &DispatchVerdict::Unrouted, 30, 40);
        assert_eq!(d.parent, None, "no callback: the dispatch is the root");

        meta.event_from = EventNameOrigin::Path;
        let d = dispatch(salt, id, &meta, &DispatchVerdict::Duplicate { original }, 30, 40);
        assert_eq!(d.parent, Some(salt.callback_span(id)));
        assert_eq!(d.links[0].trace, salt.trace(original));
        assert_eq!(d.links[0].span, salt.callback_span(original));
    }

    #[test]
    fn no_secret_reaches_an_attribute() {
        let salt = Salt::random();
        let mut meta = received("demo", "ActionCreated", 5, r#"{"password":"p4ss"}"#).meta;
        meta.headers.push(("authorization".into(), "Bearer s3cret".into()));
        let cb = callback(salt, EventId::new(5), &meta, 6);
        let text = format!("{cb:?}");
        for secret in ["s3cret", "p4ss", "Bearer"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(
            attribute(&cb, "http.route"),
            Some(&"/hooks/{source}/{token}/{eventName}".into())
        );
    }
}
