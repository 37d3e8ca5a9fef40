//! OpenTelemetry traces: a real relay exports over OTLP/HTTP to a receiver in the test,
//! and what it receives is decoded by the OpenTelemetry project's own generated types
//! (the `opentelemetry-proto` Python package, `scripts/otlp_decode.py`): one trace per
//! callback, its dispatch and every attempt under it, the attempts' ids those the
//! consumer got in its `traceparent`, and no secret in any of it.

use crate::common;
use common::FAST_RETRY;

use std::process::Command;
use std::time::{Duration, Instant};

use common::sink::{Mode, Sink};
use common::{Relay, ADMIN_TOKEN, TOKEN};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

/// A relay exporting to `receiver`, delivering to `sink`.
async fn start(receiver: &Sink, sink: &Sink) -> (tempfile::TempDir, Relay) {
    let dir = tempfile::tempdir().unwrap();
    // The receiver's base URL: the relay appends /v1/traces.
    let telemetry = format!("[telemetry]\notlp_endpoint = \"http://{}\"\n", receiver.addr);
    let tail = format!(
        "\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n{FAST_RETRY}\n{telemetry}",
        sink.url()
    );
    let text = common::config_with(&dir.path().join("data"), "", &tail);
    let relay = Relay::start(dir.path(), &text).await;
    (dir, relay)
}

/// Decodes export bodies with the official types; one JSON object per body.
fn decode(bodies: &[Vec<u8>]) -> Vec<Value> {
    if bodies.is_empty() {
        return Vec::new();
    }
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<_> = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            let file = dir.path().join(format!("{i}.pb"));
            std::fs::write(&file, body).unwrap();
            file
        })
        .collect();
    // scripts/test.sh installs opentelemetry-proto in a virtualenv of its own.
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/target/otlp/bin/python3");
    assert!(
        std::path::Path::new(python).exists(),
        "{python} is missing: run ./scripts/test.sh, which installs opentelemetry-proto there"
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/otlp_decode.py");
    let out = Command::new(python).arg(script).args(&files).output().expect("python3");
    assert!(out.status.success(), "decoder: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every span the receiver got in its answered-200 exports, decoded; each export
/// checked to re-encode to its own bytes and to name the relay as its service.
fn spans(receiver: &Sink) -> Vec<Value> {
    let bodies: Vec<Vec<u8>> = receiver
        .received()
        .into_iter()
        .filter(|r| r.status == 200)
        .inspect(|r| {
            assert_eq!(r.header("content-type"), Some("application/x-protobuf"));
            for secret in [TOKEN, ADMIN_TOKEN] {
                let found = r.body.windows(secret.len()).any(|w| w == secret.as_bytes());
                assert!(!found, "a token in an export");
            }
        })
        .map(|r| r.body)
        .collect();
    let mut all = Vec::new();
    for export in decode(&bodies) {
        assert_eq!(export["canonical"], true, "not the official encoding: {export}");
        for resource in export["resources"].as_array().unwrap() {
            assert_eq!(resource["attributes"]["service.name"], "hookrelay");
            for scope in resource["scopes"].as_array().unwrap() {
                assert_eq!(scope["name"], "hookrelay");
                all.extend(scope["spans"].as_array().unwrap().iter().cloned());
            }
        }
    }
    all
}

/// The spans of event `id`, once `done` says they are all there.
async fn spans_of(receiver: &Sink, id: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let mine: Vec<Value> = spans(receiver)
            .into_iter()
            .filter(|s| s["attributes"]["hookrelay.event_id"] == id)
            .collect();
        if done(&mine) {
            return mine;
        }
        assert!(Instant::now() < deadline, "the spans of {id} after {WAIT:?}: {mine:#?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

/// Posts a callback about action `n` (distinct `n`, distinct occurrences).
async fn send(relay: &Relay, n: u32, traceparent: Option<&str>) -> String {
    let mut req = relay
        .client
        .post(relay.hook_url(Some("ActionCreated")))
        .header("content-type", "application/json")
        .body(format!(r#"{{"data":{{"type":"actions","id":"{n}"}}}}"#));
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_is_one_trace_with_its_dispatch_and_every_attempt_under_it() {
    let (receiver, sink) = (Sink::start().await, Sink::start().await);
    sink.set_mode(Mode::Status(503));
    let (_dir, relay) = start(&receiver, &sink).await;

    let upstream = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let id = send(&relay, 1, Some(upstream)).await;
    sink.wait_for(1, WAIT).await;
    sink.set_mode(Mode::Ok);
    // The retry's backoff is jittered: a second 503 may come before the switch. Every
    // attempt but the last is a 503, the last a 200, however many there were.
    let delivered = |s: &[Value]| {
        named(s, "attempt").iter().any(|a| a["attributes"]["hookrelay.outcome"] == "success")
    };
    let spans = spans_of(&receiver, &id, delivered).await;
    let got = sink.received();
    let (callback, dispatch, attempts) =
        (named(&spans, "callback"), named(&spans, "dispatch"), named(&spans, "attempt"));
    assert_eq!((callback.len(), dispatch.len()), (1, 1), "{spans:#?}");
    assert!(attempts.len() >= 2, "a 503 then a 200: {spans:#?}");
    assert_eq!(got.len(), attempts.len(), "one span per request the consumer got: {spans:#?}");
    let (callback, dispatch) = (callback[0], dispatch[0]);
    let trace = callback["trace_id"].as_str().unwrap();
    assert!(spans.iter().all(|s| s["trace_id"] == trace), "one trace: {spans:#?}");

    // The callback: the root, the upstream's own trace linked.
    assert_eq!(callback["kind"], "SPAN_KIND_SERVER");
    assert_eq!(callback["parent_span_id"], "");
    assert_eq!(callback["attributes"]["hookrelay.source"], "demo");
    assert_eq!(callback["attributes"]["hookrelay.event"], "ActionCreated");
    assert_eq!(callback["attributes"]["http.response.status_code"], 200);
    assert_eq!(callback["links"][0]["trace_id"], "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(callback["links"][0]["span_id"], "b7ad6b7169203331");

    // Dispatch under it, the attempts under dispatch.
    assert_eq!(dispatch["parent_span_id"], callback["span_id"]);
    assert_eq!(dispatch["attributes"]["hookrelay.outcome"], "dispatched");
    let mut attempts = attempts;
    attempts.sort_by_key(|a| a["attributes"]["hookrelay.attempt"].as_u64().unwrap());
    for (n, a) in attempts.iter().enumerate() {
        assert_eq!(a["attributes"]["hookrelay.attempt"], n as u64 + 1, "{spans:#?}");
        assert_eq!(a["parent_span_id"], dispatch["span_id"]);
        assert_eq!(a["kind"], "SPAN_KIND_CLIENT");
        assert_eq!(a["attributes"]["hookrelay.destination"], "crm");
        assert_eq!(a["attributes"]["server.address"], "127.0.0.1");
        assert!(a["start"].as_u64().unwrap() >= dispatch["start"].as_u64().unwrap());
        assert!(dispatch["start"].as_u64().unwrap() >= callback["start"].as_u64().unwrap());
    }
    let (last, failed) = attempts.split_last().unwrap();
    for first in failed {
        assert_eq!(first["attributes"]["http.response.status_code"], 503);
        assert_eq!(first["attributes"]["hookrelay.outcome"], "retry");
        assert_eq!(first["status"]["code"], "STATUS_CODE_ERROR");
        assert_eq!(first["status"]["message"], "HTTP 503");
    }
    assert_eq!(last["attributes"]["http.response.status_code"], 200);
    assert_eq!(last["attributes"]["hookrelay.outcome"], "success");
    assert_eq!(last["status"]["code"], "STATUS_CODE_UNSET");

    // The consumer got each attempt's own context: its spans join this trace.
    for (request, span) in got.iter().zip(&attempts) {
        let tp = request.header("traceparent").expect("a traceparent on every delivery");
        let expected = format!("00-{trace}-{}-01", span["span_id"].as_str().unwrap());
        assert_eq!(tp, expected);
    }
    let text = serde_json::to_string(&spans).unwrap();
    for secret in [TOKEN, ADMIN_TOKEN, "/hooks/demo/"] {
        assert!(!text.contains(secret), "{secret} in a span: {text}");
    }
    let metrics = relay.metrics().await;
    let exported =
        common::metric(&metrics, "hookrelay_trace_spans_total", &[("outcome", "exported")]);
    assert!(exported.unwrap_or(0.0) >= 4.0, "{metrics}");
}

/// A receiver that fails (503, then refused connections) costs spans, never events:
/// every callback is delivered within the bound meanwhile, the failure is logged once,
/// and the traces of callbacks after it comes back arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_receiver_loses_spans_never_events_and_traces_resume() {
    let (receiver, sink) = (Sink::start().await, Sink::start().await);
    receiver.set_mode(Mode::Status(503));
    let (_dir, relay) = start(&receiver, &sink).await;

    let started = Instant::now();
    for n in 0..20 {
        send(&relay, n, None).await;
    }
    sink.wait_for(20, Duration::from_secs(10)).await;
    let delivered_in = started.elapsed();
    // The relay's failures to export are counted once three tries failed.
    let deadline = Instant::now() + WAIT;
    loop {
        let metrics = relay.metrics().await;
        let failed =
            common::metric(&metrics, "hookrelay_trace_spans_total", &[("outcome", "failed")]);
        if failed.unwrap_or(0.0) >= 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "no failed export counted:\n{metrics}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logs = relay.logs();
    assert_eq!(logs.matches("cannot export traces").count(), 1, "once a minute:\n{logs}");
    assert!(delivered_in < Duration::from_secs(10), "{delivered_in:?}");

    // The receiver back: the next callback's trace arrives whole.
    receiver.set_mode(Mode::Ok);
    let id = send(&relay, 20, None).await;
    sink.wait_for(21, WAIT).await;
    let spans = spans_of(&receiver, &id, |s| s.len() >= 3).await;
    assert_eq!(spans.len(), 3, "callback, dispatch, attempt: {spans:#?}");
    let logs = relay.logs();
    assert!(logs.contains("traces are exported again"), "{logs}");
}
