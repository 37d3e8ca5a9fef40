//! Spans as an OTLP `ExportTraceServiceRequest`, in protobuf's binary encoding: the
//! body of an OTLP/HTTP export (`application/x-protobuf`, the protocol's default and
//! the one every receiver takes).
//!
//! Written by hand: the messages are five, stable since OTLP 1.0, and the encoding
//! is a page; the SDK crates would bring their own span model (in-process spans,
//! which a callback's trace is not) and a generated protobuf stack to every build.
//! The tests decode what this writes with the OpenTelemetry project's own generated
//! types (`tests/integration/traces.rs`).
//!
//! Field numbers from `opentelemetry/proto/trace/v1/trace.proto`,
//! `common/v1/common.proto`, `resource/v1/resource.proto` and
//! `collector/trace/v1/trace_service.proto`.

use super::trace::{Span, Value};

/// Who made the spans: the resource's attributes (`service.name` and the like).
pub(crate) type Resource = Vec<(&'static str, Value)>;

/// The request that exports `spans` made by `resource`.
pub(crate) fn export_request(resource: &Resource, spans: &[Span]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + spans.len() * 256);
    // ExportTraceServiceRequest.resource_spans = 1
    message(&mut out, 1, |rs| {
        // ResourceSpans.resource = 1 { Resource.attributes = 1 }
        message(rs, 1, |r| {
            for (key, value) in resource {
                key_value(r, 1, key, value);
            }
        });
        // ResourceSpans.scope_spans = 2
        message(rs, 2, |ss| {
            // ScopeSpans.scope = 1 { name = 1, version = 2 }
            message(ss, 1, |scope| {
                string(scope, 1, "hookrelay");
                string(scope, 2, env!("CARGO_PKG_VERSION"));
            });
            for span in spans {
                // ScopeSpans.spans = 2
                message(ss, 2, |s| encode_span(s, span));
            }
        });
    });
    out
}

fn encode_span(s: &mut Vec<u8>, span: &Span) {
    bytes(s, 1, &span.trace); // trace_id
    bytes(s, 2, &span.span); // span_id
    if let Some(parent) = &span.parent {
        bytes(s, 4, parent); // parent_span_id
    }
    string(s, 5, span.name); // name
    varint_field(s, 6, span.kind as u64); // kind
    fixed64(s, 7, span.start_ns); // start_time_unix_nano
    fixed64(s, 8, span.end_ns); // end_time_unix_nano
    for (key, value) in &span.attributes {
        key_value(s, 9, key, value); // attributes
    }
    for link in &span.links {
        // links = 13 { trace_id = 1, span_id = 2, attributes = 4 }
        message(s, 13, |l| {
            bytes(l, 1, &link.trace);
            bytes(l, 2, &link.span);
            key_value(l, 4, "hookrelay.link", &Value::Str(link.why.to_owned()));
        });
    }
    if let Some(error) = &span.error {
        // status = 15 { message = 2, code = 3 (STATUS_CODE_ERROR = 2) }
        message(s, 15, |st| {
            string(st, 2, error);
            varint_field(st, 3, 2);
        });
    }
}

/// A `KeyValue { key = 1, value = 2: AnyValue }` as field `field`.
fn key_value(out: &mut Vec<u8>, field: u32, key: &str, value: &Value) {
    message(out, field, |kv| {
        string(kv, 1, key);
        message(kv, 2, |any| match value {
            Value::Str(s) => string(any, 1, s), // string_value
            // int_value (int64: two's complement in a varint)
            Value::Int(n) => varint_field(any, 3, *n as u64),
        });
    });
}

/// Protobuf's wire types.
const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag(out: &mut Vec<u8>, field: u32, wire: u32) {
    varint(out, u64::from((field << 3) | wire));
}

fn varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, VARINT);
    varint(out, v);
}

fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, FIXED64);
    out.extend_from_slice(&v.to_le_bytes());
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    tag(out, field, LEN);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn string(out: &mut Vec<u8>, field: u32, s: &str) {
    bytes(out, field, s.as_bytes());
}

/// A nested message: written after its length, which is known once it is written.
fn message(out: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    write(&mut inner);
    bytes(out, field, &inner);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::trace::{Kind, Link};

    #[test]
    fn varints_are_protobufs() {
        let enc = |v| {
            let mut out = Vec::new();
            varint(&mut out, v);
            out
        };
        assert_eq!(enc(0), [0]);
        assert_eq!(enc(1), [1]);
        assert_eq!(enc(150), [0x96, 0x01], "the protobuf documentation's example");
        assert_eq!(enc(u64::MAX).len(), 10);
        let mut kv = Vec::new();
        key_value(&mut kv, 9, "a", &Value::Int(-1));
        // 9<<3|2, len, (1<<3|2, 1, 'a'), (2<<3|2, len, (3<<3|0, ten bytes of -1))
        assert_eq!(kv[..5], [0x4a, 16, 0x0a, 1, b'a']);
        assert_eq!(kv[5..8], [0x12, 11, 0x18]);
        assert_eq!(kv.len(), 18);
    }

    /// The encoding is checked against the OpenTelemetry project's decoder in
    /// `tests/integration/traces.rs`; here, that a span's bytes are where they belong.
    #[test]
    fn a_span_carries_its_ids_times_and_status() {
        let span = Span {
            trace: [1; 16],
            span: [2; 8],
            parent: Some([3; 8]),
            name: "attempt",
            kind: Kind::Client,
            start_ns: 0x0102_0304_0506_0708,
            end_ns: 9,
            attributes: vec![("k", Value::Str("v".into()))],
            links: vec![Link { trace: [4; 16], span: [5; 8], why: "original" }],
            error: Some("HTTP 503".into()),
        };
        let body = export_request(&vec![("service.name", Value::Str("hookrelay".into()))], &[span]);
        let find = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
        assert!(find(&[0x0a, 16, 1, 1, 1]), "trace_id");
        assert!(find(&[0x12, 8, 2, 2]), "span_id");
        assert!(find(&[0x22, 8, 3, 3]), "parent_span_id");
        assert!(find(&[0x30, 3]), "kind CLIENT");
        assert!(find(&[0x39, 8, 7, 6, 5, 4, 3, 2, 1]), "start, fixed64 little-endian");
        assert!(find(b"HTTP 503") && find(&[0x18, 2]), "status ERROR with its message");
        assert!(find(b"hookrelay") && find(b"original"));
    }
}
