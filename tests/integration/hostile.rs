//! The hostile-input suite: bodies generated at random (depth, size, huge numbers, long
//! strings, invalid UTF-8, duplicate keys, every JSON type at the top, truncations)
//! and the corpus of bodies that once broke something, sent through ingress, dispatch,
//! shaping and delivery with filters and transforms configured, on redb and on sled.
//! The promise, not the example: every one is answered 200, the relay stays up and
//! nothing panics, and within the bound every acknowledged callback is delivered,
//! filtered or dead with a reason at every destination, with the audit balanced.
//!
//! The seed is printed; `HOOKRELAY_HOSTILE_SEED=<seed>` replays a run.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::sink::Sink;
use crate::common::{self, Relay};

/// Everything acknowledged is settled within this bound after the last callback.
const BOUND: Duration = Duration::from_secs(60);
/// Random bodies per run, beside the corpus.
const RANDOM: usize = 120;

/// The bodies that once broke something, by what they broke.
fn corpus() -> Vec<(&'static str, Vec<u8>)> {
    let nested = |n: usize| format!("{{\"data\":{}{}}}", "[".repeat(n), "]".repeat(n)).into_bytes();
    vec![
        // Issue 40: a jq filter's parse of it overflowed the stack, in a crash loop.
        ("200,000 nested arrays", nested(200_000)),
        (
            "nested objects",
            format!("{}1{}", "{\"a\":".repeat(50_000), "}".repeat(50_000)).into_bytes(),
        ),
        ("unclosed nesting", "[".repeat(100_000).into_bytes()),
        ("serde_json's limit exactly", nested(126)),
        ("one past it", nested(128)),
        (
            "a number past f64",
            b"{\"data\":{\"id\":1e400,\"n\":123456789012345678901234567890}}".to_vec(),
        ),
        ("duplicate keys", br#"{"data":{"id":"1","id":"2"},"data":null}"#.to_vec()),
        ("invalid UTF-8", b"{\"data\":{\"id\":\"\xff\xfe\xc3\x28\"}}".to_vec()),
        ("a NUL and a BOM", b"\xef\xbb\xbf{\"data\":{\"id\":\"a\x00b\"}}".to_vec()),
        ("a lone surrogate escape", br#"{"data":{"id":"\ud800"}}"#.to_vec()),
        ("empty", Vec::new()),
        ("top-level null", b"null".to_vec()),
        ("top-level string", b"\"ActionCreated\"".to_vec()),
        ("top-level number", b"-0.0e-0".to_vec()),
        (
            "a long string",
            format!("{{\"data\":{{\"id\":\"{}\"}}}}", "x".repeat(2 << 20)).into_bytes(),
        ),
        ("many keys", {
            let keys: Vec<String> = (0..50_000).map(|i| format!("\"k{i}\":{i}")).collect();
            format!("{{\"data\":{{{}}}}}", keys.join(",")).into_bytes()
        }),
    ]
}

/// One random body from `rng`.
fn random_body(rng: &mut fastrand::Rng) -> Vec<u8> {
    fn value(rng: &mut fastrand::Rng, depth: usize, out: &mut String) {
        let kind = if depth > 40 { rng.u8(0..5) } else { rng.u8(0..8) };
        match kind {
            0 => out.push_str("null"),
            1 => out.push_str(if rng.bool() { "true" } else { "false" }),
            2 => out.push_str(&match rng.u8(0..4) {
                0 => rng.i64(..).to_string(),
                1 => format!("{}e{}", rng.i32(..), rng.i16(..)),
                2 => "1".repeat(rng.usize(1..400)),
                _ => format!("{}", rng.f64()),
            }),
            3 | 4 => {
                out.push('"');
                for _ in 0..rng.usize(0..64) {
                    match rng.u8(0..6) {
                        0 => out.push_str("\\u0000"),
                        1 => out.push_str("\\\""),
                        2 => out.push(char::from_u32(rng.u32(0x80..0x2FFFF)).unwrap_or('é')),
                        _ => out.push(rng.alphanumeric()),
                    }
                }
                out.push('"');
            }
            5 => {
                out.push('[');
                for i in 0..rng.usize(0..6) {
                    if i > 0 {
                        out.push(',');
                    }
                    value(rng, depth + 1, out);
                }
                out.push(']');
            }
            _ => {
                out.push('{');
                for i in 0..rng.usize(0..6) {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(if rng.bool() { "\"id\":" } else { "\"data\":" });
                    value(rng, depth + 1, out);
                }
                out.push('}');
            }
        }
    }
    let mut text = String::new();
    match rng.u8(0..6) {
        // Deep: far past what any program is given.
        0 => {
            let n = rng.usize(100..20_000);
            text = format!("{{\"data\":{}{}}}", "[".repeat(n), "]".repeat(n));
        }
        // Large: up to a MiB of one string.
        1 => text = format!("{{\"data\":{{\"id\":\"{}\"}}}}", "y".repeat(rng.usize(1..1 << 20))),
        _ => value(rng, 0, &mut text),
    }
    let mut bytes = text.into_bytes();
    // Now and then, broken: cut short, or a stray invalid byte.
    match rng.u8(0..10) {
        0 if !bytes.is_empty() => bytes.truncate(rng.usize(0..bytes.len())),
        1 => {
            let at = rng.usize(0..=bytes.len());
            bytes.insert(at, 0xff);
        }
        _ => {}
    }
    bytes
}

async fn hostile_run(backend: &str) {
    let seed: u64 = std::env::var("HOOKRELAY_HOSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("hostile {backend}: HOOKRELAY_HOSTILE_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let (plain, filtered, shaped) = (Sink::start().await, Sink::start().await, Sink::start().await);
    let dir = tempfile::tempdir().unwrap();
    let tail = format!(
        "\n[[destinations]]\nname = \"plain\"\nurl = \"{}\"\n\n[[destinations]]\nname = \"filtered\"\nurl = \"{}\"\nfilter = '.body.data.id != null'\n\n[[destinations]]\nname = \"shaped\"\nurl = \"{}\"\ntransform = '{{event, id: .body.data.id, size: (.body | tostring | length), kind: (.body | type)}}'\n",
        plain.url(),
        filtered.url(),
        shaped.url()
    );
    let text = common::config_with(&dir.path().join("data"), "max_body_bytes = 8388608", &tail)
        .replace("[storage]", &format!("[storage]\nbackend = \"{backend}\""));
    let mut relay = Relay::start(dir.path(), &text).await;
    let mut bodies = corpus();
    for _ in 0..RANDOM {
        bodies.push(("random", random_body(&mut rng)));
    }
    let mut acked = Vec::new();
    for (what, body) in bodies {
        let content_type = if rng.bool() { "application/json" } else { "text/plain" };
        let event = if rng.bool() { Some("ActionCreated") } else { None };
        let r = relay.callback(event, content_type, body.clone()).await;
        assert_eq!(r.status(), 200, "{what} ({} bytes): seed {seed}", body.len());
        let v: Value = r.json().await.unwrap();
        acked.push((what, v["id"].as_str().unwrap().to_owned()));
        assert!(relay.exited().is_none(), "the relay stopped after {what}: seed {seed}");
    }
    // Every acknowledged callback settled at every destination, with a reason where
    // it was not delivered.
    // (A body equal to an earlier one, as random short ones can be, is a duplicate
    // of it: settled, with no deliveries of its own.)
    let deadline = Instant::now() + BOUND;
    let mut duplicates = 0;
    for (what, id) in &acked {
        loop {
            let (_, v) = relay.admin_get(&format!("/admin/events/{id}")).await;
            if v["status"] == "duplicate" && v["duplicate_of"].is_string() {
                duplicates += 1;
                break;
            }
            let deliveries = v["deliveries"].as_array().cloned().unwrap_or_default();
            let settled = v["status"] != "received"
                && deliveries.len() == 3
                && deliveries.iter().all(|d| {
                    matches!(d["state"].as_str(), Some("delivered" | "filtered" | "dead"))
                });
            if settled {
                for d in &deliveries {
                    if d["state"] != "delivered" {
                        let why = d["reason"].as_str().or(d["last_error"].as_str());
                        assert!(why.is_some_and(|w| !w.is_empty()), "{what}: no reason: {d}");
                    }
                }
                assert_eq!(
                    deliveries.iter().find(|d| d["destination"] == "plain").unwrap()["state"],
                    "delivered",
                    "{what}: the destination without programs gets everything: seed {seed}"
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{what} ({id}) not settled within {BOUND:?}: {v:#}; seed {seed}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(plain.count(), acked.len() - duplicates, "seed {seed}");
    assert!(duplicates < acked.len() / 4, "{duplicates} duplicates: the bodies are too alike");
    let audit = relay.admin_until("/admin/audit", BOUND, |v| v["balanced"].is_boolean()).await;
    assert_eq!(audit["balanced"], true, "{audit:#}; seed {seed}");
    let logs = relay.logs();
    assert!(!logs.contains("panicked"), "a panic: seed {seed}");
    assert!(relay.exited().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bodies_through_every_stage_on_redb() {
    hostile_run("redb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bodies_through_every_stage_on_sled() {
    hostile_run("sled").await;
}
