//! The callback endpoint, end to end: real relay process, real sockets, real sled.

use crate::common;

use common::{Relay, ADMIN_TOKEN, SOURCE, TOKEN};
use serde_json::Value;

const FILENOTE: &str = r#"{"jsonapi":{"version":"1.0"},"data":{"type":"filenotes","id":"259","attributes":{"text":"call with client"}},"meta":{"debug":{"time":"2026-06-12 13:23:35 +1200","resthook":{"id":"46","trigger_count":1,"event_name":"FileNoteCreated","resource_type":"filenotes","resource_id":"259"}}}}"#;

async fn start(extra: &str) -> (tempfile::TempDir, Relay) {
    let dir = tempfile::tempdir().unwrap();
    let text = common::config(&dir.path().join("data"), extra);
    let relay = Relay::start(dir.path(), &text).await;
    (dir, relay)
}

/// Stored and accepted: waiting in the inbox, or already dispatched (these tests
/// configure no destination, so dispatch marks events unrouted).
fn accepted(e: &Value) -> bool {
    matches!(e["status"].as_str(), Some("received" | "unrouted"))
}

/// Posts, expects 200 and an id, and returns the stored event as the admin API shows it.
async fn store(
    relay: &Relay,
    event: Option<&str>,
    content_type: &str,
    body: &'static [u8],
) -> Value {
    let r = relay.callback(event, content_type, body).await;
    assert_eq!(r.status(), 200);
    let ack: Value = r.json().await.unwrap();
    let id = ack["id"].as_str().expect("the answer carries the event id").to_owned();
    let (status, shown) = relay.admin_get(&format!("/admin/events/{id}")).await;
    assert_eq!(status, 200, "{shown}");
    shown
}

#[tokio::test]
async fn every_kind_of_body_is_stored_and_acknowledged() {
    let (_dir, relay) = start("").await;

    let e = store(&relay, None, "application/json", FILENOTE.as_bytes()).await;
    assert_eq!(e["source"], SOURCE);
    assert_eq!(e["event"], "FileNoteCreated");
    assert_eq!(e["event_from"], "body");
    assert!(accepted(&e), "{e}");
    assert_eq!(e["flags"], serde_json::json!([]));
    assert_eq!(e["body"], FILENOTE);
    assert_eq!(e["body_encoding"], "utf8");
    assert_eq!(e["size"], FILENOTE.len());
    assert_eq!(e["headers"]["content-type"], "application/json");

    // The path segment wins over the body.
    let e = store(&relay, Some("ActionUpdated"), "application/json", FILENOTE.as_bytes()).await;
    assert_eq!(
        (e["event"].as_str(), e["event_from"].as_str()),
        (Some("ActionUpdated"), Some("path"))
    );

    let e = store(&relay, None, "application/json", b"{\"data\": {\"id\": ").await;
    assert_eq!(e["flags"], serde_json::json!(["not_json"]));
    assert_eq!((e["event"].as_str(), e["event_from"].as_str()), (Some("unknown"), Some("unknown")));
    assert_eq!(e["body"], "{\"data\": {\"id\": ");

    let e =
        store(&relay, Some("TaskCreated"), "application/x-www-form-urlencoded", b"a=1&b=two").await;
    assert_eq!(e["flags"], serde_json::json!(["not_json"]));
    assert_eq!(e["content_type"], "application/x-www-form-urlencoded");
    assert_eq!(e["body"], "a=1&b=two");

    let e = store(&relay, Some("TaskUpdated"), "application/json", b"").await;
    assert_eq!(e["flags"], serde_json::json!(["empty"]));
    assert_eq!(e["body"], "");

    let e = store(&relay, None, "application/octet-stream", &[0xff, 0x00, 0xfe]).await;
    assert_eq!(e["body_encoding"], "base64");
    assert_eq!(e["body"], "/wD+");

    // Listing: newest first, paged.
    let (_, page) = relay.admin_get("/admin/events?limit=2").await;
    let events = page["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["content_type"], "application/octet-stream");
    assert_eq!(events[1]["event"], "TaskUpdated");
    let after = page["next_after"].as_str().unwrap();
    let (_, next) = relay.admin_get(&format!("/admin/events?limit=10&after={after}")).await;
    assert_eq!(next["events"].as_array().unwrap().len(), 4);
    assert_eq!(next["next_after"], Value::Null);
    assert_eq!(relay.all_event_ids().await.len(), 6);
    let (_, filtered) = relay.admin_get("/admin/events?event=FileNoteCreated").await;
    assert_eq!(filtered["events"].as_array().unwrap().len(), 1);

    let metrics = relay.metrics().await;
    assert!(
        metrics.contains(r#"hookrelay_ingress_requests_total{outcome="accepted",source="demo"} 6"#),
        "{metrics}"
    );
    assert!(
        metrics
            .contains(r#"hookrelay_events_stored_total{event="FileNoteCreated",source="demo"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"hookrelay_events_stored_total{event="other",source="demo"} 2"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn oversized_bodies_are_acknowledged_and_recorded_as_rejected() {
    let (_dir, relay) = start("max_body_bytes = 1024").await;
    let big: &'static [u8] = Box::leak(vec![b'x'; 5000].into_boxed_slice());
    let e = store(&relay, Some("ActionCreated"), "application/json", big).await;
    assert_eq!(e["status"], "rejected");
    assert_eq!(e["flags"], serde_json::json!(["oversized"]));
    assert_eq!(e["size"], 5000);
    assert_eq!(e["body"], Value::Null);
    assert_eq!(e["headers"]["content-length"], "5000");
    assert!(e["reason"].as_str().unwrap().contains("exceeds ingress.max_body_bytes (1024)"));

    // Exactly at the limit is fine.
    let at_limit: &'static [u8] = Box::leak(vec![b'y'; 1024].into_boxed_slice());
    let e = store(&relay, None, "text/plain", at_limit).await;
    assert!(accepted(&e), "{e}");
    assert_eq!(e["size"], 1024);

    // Chunked (no Content-Length) and over the limit: same outcome.
    let chunks =
        futures_util::stream::iter((0..8).map(|_| Ok::<_, std::io::Error>(vec![b'z'; 512])));
    let r = relay.callback(None, "application/json", reqwest::Body::wrap_stream(chunks)).await;
    assert_eq!(r.status(), 200);
    let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let (_, e) = relay.admin_get(&format!("/admin/events/{id}")).await;
    assert_eq!((e["status"].as_str(), e["size"].as_u64()), (Some("rejected"), Some(4096)));

    let metrics = relay.metrics().await;
    assert!(
        metrics.contains(r#"hookrelay_ingress_requests_total{outcome="rejected",source="demo"} 2"#),
        "{metrics}"
    );
    // Rejected events are never dispatched.
    let (_, rejected) = relay.admin_get("/admin/events?status=rejected").await;
    assert_eq!(rejected["events"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn wrong_sources_and_tokens_get_404_are_counted_and_never_logged() {
    let (_dir, relay) = start("").await;
    let wrong_token = "wrong-token-that-must-not-be-logged";
    for url in [
        format!("http://{}/hooks/{SOURCE}/{wrong_token}", relay.ingress),
        format!("http://{}/hooks/{SOURCE}/{wrong_token}/ActionCreated", relay.ingress),
        format!("http://{}/hooks/nosuchsource/{TOKEN}", relay.ingress),
        format!("http://{}/hooks/{SOURCE}/{}", relay.ingress, &TOKEN[..TOKEN.len() - 1]),
    ] {
        let r = relay.client.post(&url).body(FILENOTE).send().await.unwrap();
        assert_eq!(r.status(), 404, "{url}");
    }
    // Nothing but callbacks and /healthz on the public listener.
    let base = format!("http://{}", relay.ingress);
    assert_eq!(relay.client.get(format!("{base}/healthz")).send().await.unwrap().status(), 200);
    for path in ["/metrics", "/readyz", "/admin/events"] {
        let r = relay
            .client
            .get(format!("{base}{path}"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path}");
    }
    // A good callback to be sure the token appears nowhere even when used.
    assert_eq!(relay.callback(None, "application/json", FILENOTE).await.status(), 200);

    let metrics = relay.metrics().await;
    assert!(
        metrics.contains(
            r#"hookrelay_ingress_requests_total{outcome="unauthorized",source="demo"} 3"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"hookrelay_ingress_requests_total{outcome="unauthorized",source="unknown"} 1"#
        ),
        "{metrics}"
    );
    assert!(relay.all_event_ids().await.len() == 1);
    let logs = relay.logs();
    assert!(logs.contains("callback refused"), "{logs}");
    for secret in [wrong_token, TOKEN, ADMIN_TOKEN, "nosuchsource"] {
        assert!(!logs.contains(secret), "{secret} leaked into the logs:\n{logs}");
        assert!(!metrics.contains(secret), "{secret} leaked into the metrics");
    }
}

#[tokio::test]
async fn the_admin_api_needs_its_token() {
    let (_dir, relay) = start("").await;
    let url = format!("http://{}/admin/events", relay.admin);
    let none = relay.client.get(&url).send().await.unwrap();
    assert_eq!(none.status(), 401);
    assert!(none.headers().contains_key("www-authenticate"));
    let wrong = relay.client.get(&url).bearer_auth("nope").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let basic = relay.client.get(&url).basic_auth("admin", Some(ADMIN_TOKEN)).send().await.unwrap();
    assert_eq!(basic.status(), 401);
    assert_eq!(relay.admin_get("/admin/events").await.0, 200);
    assert_eq!(relay.admin_get("/admin/events/0000000000000001").await.0, 404);
    assert_eq!(relay.admin_get("/admin/events/nothex").await.0, 400);
    assert_eq!(relay.admin_get("/admin/events?limit=0").await.0, 400);
    assert_eq!(relay.admin_get("/admin/events?after=xyz").await.0, 400);
    assert_eq!(relay.admin_get("/admin/events?colour=red").await.0, 400);
    assert_eq!(relay.admin_get("/admin/nothing-here").await.0, 404);
    // Probes and metrics are open.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let r = relay.client.get(format!("http://{}{path}", relay.admin)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
}

#[tokio::test]
async fn without_an_admin_token_the_admin_api_is_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let text = common::config(&dir.path().join("data"), "")
        .replace(&format!("token = \"{ADMIN_TOKEN}\""), "");
    let relay = Relay::start(dir.path(), &text).await;
    let (status, body) = relay.admin_get("/admin/events").await;
    assert_eq!(status, 403);
    assert!(body["error"].as_str().unwrap().contains("set admin.token"), "{body}");
    assert!(relay.logs().contains("no admin token is set"), "{}", relay.logs());
}

#[tokio::test]
async fn broken_bodies_get_no_error_status_and_store_nothing() {
    let (_dir, relay) = start("").await;
    let path = format!("/hooks/{SOURCE}/{TOKEN}/ActionCreated");
    // The client gives up half-way through its body.
    let truncated =
        format!("POST {path} HTTP/1.1\r\nHost: relay\r\nContent-Length: 100\r\n\r\n{{\"data\":");
    let answer = relay.raw_exchange(truncated.as_bytes(), true).await;
    assert!(!answer.starts_with("HTTP/1.1 4") && !answer.starts_with("HTTP/1.1 5"), "{answer}");
    // A chunked body with a malformed chunk header, client still listening.
    let bad_chunk = format!(
        "POST {path} HTTP/1.1\r\nHost: relay\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n"
    );
    let answer = relay.raw_exchange(bad_chunk.as_bytes(), false).await;
    assert!(!answer.starts_with("HTTP/1.1 4") && !answer.starts_with("HTTP/1.1 5"), "{answer}");

    assert!(relay.all_event_ids().await.is_empty());
    let metrics = relay.metrics().await;
    assert!(
        metrics
            .contains(r#"hookrelay_ingress_requests_total{outcome="incomplete",source="demo"} 2"#),
        "{metrics}"
    );
}

/// Anyone can send wrong-token requests: each is counted, but the log gets one line
/// per source a minute, not one per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_floods_are_counted_but_not_logged_one_by_one() {
    let (_dir, relay) = start("").await;
    let url =
        relay.hook_url(Some("ActionCreated")).replace(common::TOKEN, "wrong-token-0123456789");
    for _ in 0..300 {
        let r = relay.client.post(&url).body("{}").send().await.unwrap();
        assert_eq!(r.status(), 404);
    }
    let metrics = relay.metrics().await;
    assert!(
        metrics.contains(
            r#"hookrelay_ingress_requests_total{outcome="unauthorized",source="demo"} 300"#
        ),
        "{metrics}"
    );
    let lines = relay.logs().matches("callback refused").count();
    assert!((1..=2).contains(&lines), "{lines} log lines for 300 refused requests");
}

/// `..` (or any segment without a letter) is no event name: the callback is stored,
/// named from its body or `unknown`, never refused.
#[tokio::test]
async fn a_dot_dot_event_segment_is_stored_under_another_name() {
    let (_dir, relay) = start("").await;
    // Raw TCP: an HTTP client would normalise `..` away before sending.
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(relay.ingress).unwrap();
    let request = format!(
        "POST /hooks/{}/{}/.. HTTP/1.1\r\nhost: relay\r\ncontent-type: application/json\r\n\
         content-length: 2\r\nconnection: close\r\n\r\n{{}}",
        common::SOURCE,
        common::TOKEN
    );
    tcp.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let id =
        serde_json::from_str::<serde_json::Value>(body).unwrap()["id"].as_str().unwrap().to_owned();
    let (status, event) = relay.admin_get(&format!("/admin/events/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(event["event"], "unknown", "{event}");
}

/// A body trickled in slower than `ingress.body_timeout` gets its connection closed
/// (no answer, nothing stored, counted); a slow body within the bound is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_is_cut_off_and_a_slow_one_within_the_bound_is_stored() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let (_dir, relay) = start("body_timeout = \"2s\"").await;
    let head = |len: usize| {
        format!(
            "POST /hooks/{}/{}/ActionCreated HTTP/1.1\r\nhost: relay\r\n\
             content-type: application/json\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n",
            common::SOURCE,
            common::TOKEN
        )
    };
    let addr = relay.ingress;
    // One byte every 500 ms of a 40-byte body: 20 s if let be.
    let trickle = tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        tcp.write_all(head(40).as_bytes()).unwrap();
        let started = Instant::now();
        for _ in 0..40 {
            if tcp.write_all(b" ").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
            if started.elapsed() > Duration::from_secs(8) {
                break;
            }
        }
        let mut answer = Vec::new();
        let _ = tcp.read_to_end(&mut answer);
        (started.elapsed(), String::from_utf8_lossy(&answer).into_owned())
    });
    // Three bytes 300 ms apart: within the bound.
    let slow = tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(addr).unwrap();
        tcp.write_all(head(2).as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        tcp.write_all(b"{").unwrap();
        std::thread::sleep(Duration::from_millis(300));
        tcp.write_all(b"}").unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).unwrap();
        answer
    });
    let answer = slow.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let (took, answer) = trickle.await.unwrap();
    assert!(!answer.contains("HTTP/1.1"), "a trickled body got an answer: {answer}");
    assert!(took < Duration::from_secs(8), "the trickle was not cut off: {took:?}");
    let metrics = relay.metrics().await;
    assert!(
        metrics.contains(
            r#"hookrelay_ingress_requests_total{outcome="body_timeout",source="demo"} 1"#
        ),
        "{metrics}"
    );
    assert_eq!(relay.all_event_ids().await.len(), 1, "only the slow one within the bound");
}
