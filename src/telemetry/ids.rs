//! Trace and span ids, and the W3C `traceparent` that carries them.
//!
//! Every id of a callback's trace but the attempts' is derived from the event's id and
//! the store's salt: the relay that stores the callback, the one that dispatches it and
//! the one that attempts it a day later all name the same trace and the same parents
//! without storing or passing a context. The salt (random, kept in the store, so one
//! per fleet) keeps two relays on different stores, whose event ids are both receive
//! times, from naming the same traces.

use sha2::{Digest, Sha256};

use crate::store::{hex, EventId};

/// A trace's id: 16 bytes, never all zero.
pub(crate) type TraceId = [u8; 16];
/// A span's id: 8 bytes, never all zero.
pub(crate) type SpanId = [u8; 8];

/// Where the salt is kept in the store's shared state.
pub(crate) const SALT_KEY: &str = "telemetry/trace_salt";

/// The store's salt of derived ids.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Salt([u8; 16]);

impl Salt {
    /// A new salt, for a store that has none yet.
    pub(crate) fn random() -> Self {
        let (a, b) = (fastrand::u64(..), fastrand::u64(..));
        let mut bytes = [0; 16];
        bytes[..8].copy_from_slice(&a.to_be_bytes());
        bytes[8..].copy_from_slice(&b.to_be_bytes());
        Self(bytes)
    }

    /// The salt as stored, if it is one.
    pub(crate) fn from_stored(bytes: &[u8]) -> Option<Self> {
        <[u8; 16]>::try_from(bytes).ok().map(Self)
    }

    /// The bytes to store.
    pub(crate) fn stored(self) -> Vec<u8> {
        self.0.to_vec()
    }

    /// One derivation: `what` names the id, so that no two ids of an event coincide.
    fn digest(self, what: &[u8], event: EventId) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.0);
        h.update(what);
        h.update(event.raw().to_be_bytes());
        h.finalize().into()
    }

    /// The trace of the event's callback.
    pub(crate) fn trace(self, event: EventId) -> TraceId {
        let d = self.digest(b"trace", event);
        nonzero(d[..16].try_into().unwrap_or([1; 16]))
    }

    /// The callback's span: the trace's root.
    pub(crate) fn callback_span(self, event: EventId) -> SpanId {
        span_of(self.digest(b"callback", event))
    }

    /// The dispatch's span: the parent of every attempt.
    pub(crate) fn dispatch_span(self, event: EventId) -> SpanId {
        span_of(self.digest(b"dispatch", event))
    }
}

impl std::fmt::Debug for Salt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Salt(..)")
    }
}

fn span_of(d: [u8; 32]) -> SpanId {
    nonzero(d[..8].try_into().unwrap_or([1; 8]))
}

/// All-zero ids are invalid (W3C): one that comes out so (one in 2^64) gets a 1.
fn nonzero<const N: usize>(mut id: [u8; N]) -> [u8; N] {
    if id.iter().all(|b| *b == 0) {
        id[N - 1] = 1;
    }
    id
}

/// A fresh span id, for a span that nobody needs to derive (an attempt's: the only
/// one to know it is the consumer, told by the attempt's `traceparent`).
pub(crate) fn random_span() -> SpanId {
    nonzero(fastrand::u64(..).to_be_bytes())
}

/// A W3C trace context (<https://www.w3.org/TR/trace-context/>): the `traceparent`
/// header sent with each attempt, and read from a callback that brings one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TraceParent {
    pub(crate) trace: TraceId,
    pub(crate) span: SpanId,
    /// Whether the trace is recorded (exported) by the side that sent it.
    pub(crate) sampled: bool,
}

impl TraceParent {
    /// The header's value: `00-{trace}-{span}-{flags}`.
    pub(crate) fn header(&self) -> String {
        format!("00-{}-{}-{:02x}", hex(&self.trace), hex(&self.span), u8::from(self.sampled))
    }

    /// Reads a `traceparent` as the W3C recommendation says a receiver does: version
    /// 00 exactly, a later version by its first four fields; ids lower-case hex and not
    /// all zero. Anything else is no context.
    pub(crate) fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        let mut fields = value.splitn(5, '-');
        let (version, trace, span, flags) =
            (fields.next()?, fields.next()?, fields.next()?, fields.next()?);
        let rest = fields.next();
        let version = parse_hex::<1>(version)?[0];
        if version == 0xff || (version == 0 && rest.is_some()) {
            return None;
        }
        let (trace, span) = (parse_hex::<16>(trace)?, parse_hex::<8>(span)?);
        if trace.iter().all(|b| *b == 0) || span.iter().all(|b| *b == 0) {
            return None;
        }
        let flags = parse_hex::<1>(flags)?[0];
        Some(Self { trace, span, sampled: flags & 1 == 1 })
    }
}

/// Exactly `N` bytes written as `2N` lower-case hex digits.
fn parse_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_stable_distinct_and_salted() {
        let (salt, other) = (Salt([7; 16]), Salt([8; 16]));
        let (a, b) = (EventId::new(1_700_000_000_000_000), EventId::new(1_700_000_000_000_001));
        assert_eq!(salt.trace(a), salt.trace(a), "any relay derives the same trace");
        assert_ne!(salt.trace(a), salt.trace(b));
        assert_ne!(salt.trace(a), other.trace(a), "another store, another trace");
        assert_ne!(salt.callback_span(a), salt.dispatch_span(a));
        assert_eq!(salt.dispatch_span(a), salt.dispatch_span(a));
        let stored = Salt::from_stored(&salt.stored()).unwrap();
        assert_eq!(stored.trace(a), salt.trace(a), "the salt survives its storage");
        assert!(Salt::from_stored(b"short").is_none());
        assert_ne!(Salt::random(), Salt::random());
        assert_eq!(nonzero([0u8; 8]), [0, 0, 0, 0, 0, 0, 0, 1]);
        assert!(!format!("{salt:?}").contains('7'), "the salt is not printed");
    }

    #[test]
    fn traceparent_round_trips_and_refuses_what_w3c_refuses() {
        let tp = TraceParent { trace: [0xab; 16], span: [0x01; 8], sampled: true };
        let header = tp.header();
        assert_eq!(header, "00-abababababababababababababababab-0101010101010101-01");
        assert_eq!(TraceParent::parse(&header), Some(tp));
        let unsampled = TraceParent { sampled: false, ..tp };
        assert!(unsampled.header().ends_with("-00"));
        assert_eq!(TraceParent::parse(&unsampled.header()), Some(unsampled));
        // A later version: its first four fields, whatever follows.
        let later = "01-abababababababababababababababab-0101010101010101-03-what-ever";
        assert_eq!(TraceParent::parse(later).map(|t| t.sampled), Some(true));
        for bad in [
            "",
            "00-abababababababababababababababab-0101010101010101",
            "00-abababababababababababababababab-0101010101010101-01-extra",
            "ff-abababababababababababababababab-0101010101010101-01",
            "00-00000000000000000000000000000000-0101010101010101-01",
            "00-abababababababababababababababab-0000000000000000-01",
            "00-ABABABABABABABABABABABABABABABAB-0101010101010101-01",
            "00-abab-0101010101010101-01",
            "00-abababababababababababababababab-01010101010101zz-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        assert_ne!(random_span(), [0; 8]);
    }
}
