#!/usr/bin/env python3
"""Decodes OTLP/HTTP trace exports with the OpenTelemetry project's own generated
types (the opentelemetry-proto package), for tests/integration/traces.rs.

Usage: otlp_decode.py FILE...
Prints one JSON object per file: its spans, with ids in hex, and whether the
request re-encodes to the very bytes received ("canonical": no field the
official schema does not know, none misplaced).
"""
import json
import sys

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status


def value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def attributes(key_values):
    return {kv.key: value(kv.value) for kv in key_values}


def span(s):
    return {
        "trace_id": s.trace_id.hex(),
        "span_id": s.span_id.hex(),
        "parent_span_id": s.parent_span_id.hex(),
        "name": s.name,
        "kind": Span.SpanKind.Name(s.kind),
        "start": s.start_time_unix_nano,
        "end": s.end_time_unix_nano,
        "attributes": attributes(s.attributes),
        "links": [
            {"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex(),
             "attributes": attributes(l.attributes)}
            for l in s.links
        ],
        "status": {"code": Status.StatusCode.Name(s.status.code), "message": s.status.message},
    }


for path in sys.argv[1:]:
    with open(path, "rb") as f:
        data = f.read()
    request = ExportTraceServiceRequest()
    request.ParseFromString(data)
    out = {"canonical": request.SerializeToString() == data, "resources": []}
    for rs in request.resource_spans:
        out["resources"].append({
            "attributes": attributes(rs.resource.attributes),
            "scopes": [
                {"name": ss.scope.name, "version": ss.scope.version,
                 "spans": [span(s) for s in ss.spans]}
                for ss in rs.scope_spans
            ],
        })
    print(json.dumps(out))
