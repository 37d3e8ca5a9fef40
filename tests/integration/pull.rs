//! Pull destinations end to end: a consumer leases its deliveries on the public
//! listener, acknowledges or nacks them; each resource's next delivery is leased only
//! once the previous one is acknowledged; a consumer killed while holding a lease gets
//! its deliveries back when the lease expires, and its late ack is refused.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{self, Relay};

const PULL_TOKEN: &str = "pull-token-0123456789abcdef";

async fn start() -> (tempfile::TempDir, Relay) {
    let dir = tempfile::tempdir().unwrap();
    let tail = format!(
        r#"
[[destinations]]
name = "feed"
kind = "pull"
token = "{PULL_TOKEN}"
ordering = "per-resource"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwRv5D8XT7Qm8="
transform = '{{resource: .body.data.id, seq: .body.data.attributes.seq}}'
"#
    );
    let text = common::config_with(&dir.path().join("data"), "", &tail);
    let relay = Relay::start(dir.path(), &text).await;
    (dir, relay)
}

fn body(resource: u64, seq: u64) -> String {
    json!({"data": {"type": "actions", "id": resource.to_string(), "attributes": {"seq": seq}}})
        .to_string()
}

/// `POST /pull/feed/{what}` with the token (or `token`); status and JSON.
async fn pull(relay: &Relay, what: &str, token: &str, body: Option<Value>) -> (u16, Value) {
    let mut req =
        relay.client.post(format!("http://{}/pull/feed/{what}", relay.ingress)).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("pull request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn lease(relay: &Relay, query: &str) -> Vec<Value> {
    let (status, v) = pull(relay, &format!("lease?{query}"), PULL_TOKEN, None).await;
    assert_eq!(status, 200, "{v}");
    v["deliveries"].as_array().unwrap().clone()
}

fn ids(leased: &[Value]) -> Value {
    json!({ "ids": leased.iter().map(|d| d["id"].clone()).collect::<Vec<_>>() })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_leases_and_acks_each_resource_in_order() {
    let (_dir, relay) = start().await;
    for seq in 0..10u64 {
        for resource in [1u64, 2] {
            let r = relay
                .callback(Some("ActionUpdated"), "application/json", body(resource, seq))
                .await;
            assert_eq!(r.status(), 200);
        }
    }
    let mut got: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.values().map(Vec::len).sum::<usize>() < 20 {
        if Instant::now() > deadline {
            let (_, dead) = relay.admin_get("/admin/dead-letters").await;
            panic!("not all leased: {got:?}; dead letters: {dead}");
        }
        let leased = lease(&relay, "max=100&lease=30s").await;
        // Only each resource's head: the next waits for this one's ack.
        assert!(leased.len() <= 2, "{leased:?}");
        for d in &leased {
            let h = &d["headers"];
            assert_eq!(h["webhook-id"], d["delivery_id"]);
            assert!(h["webhook-signature"].as_str().unwrap().starts_with("v1,"), "{d}");
            assert_eq!(h["hookrelay-event"], "ActionUpdated");
            let shaped: Value = serde_json::from_str(d["body"].as_str().unwrap()).unwrap();
            let resource = shaped["resource"].as_str().unwrap().to_owned();
            got.entry(resource).or_default().push(shaped["seq"].as_u64().unwrap());
        }
        if leased.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let (status, v) = pull(&relay, "ack", PULL_TOKEN, Some(ids(&leased))).await;
        assert_eq!((status, v["settled"].as_u64()), (200, Some(leased.len() as u64)), "{v}");
    }
    let expected: Vec<u64> = (0..10).collect();
    assert_eq!(got.len(), 2);
    for (resource, seqs) in &got {
        assert_eq!(seqs, &expected, "resource {resource}");
    }
    assert!(lease(&relay, "max=10").await.is_empty(), "each delivered once");
    let (_, dests) = relay.admin_get("/admin/destinations").await;
    assert_eq!(dests["destinations"][0]["kind"], "pull");
    assert_eq!(dests["destinations"][0]["queue"]["pending"], 0, "{dests}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_comes_back_and_its_late_ack_is_refused() {
    let (_dir, relay) = start().await;
    let r = relay.callback(Some("ActionUpdated"), "application/json", body(7, 1)).await;
    let event = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    // A consumer leases for a second and dies holding it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        let leased = lease(&relay, "max=5&lease=1s").await;
        if !leased.is_empty() {
            break leased;
        }
        assert!(Instant::now() < deadline, "never leased");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(first.len(), 1);
    assert!(lease(&relay, "max=5").await.is_empty(), "leased twice at once");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // Its late ack is refused, saying why; the delivery comes back to the next lease.
    let (status, v) = pull(&relay, "ack", PULL_TOKEN, Some(ids(&first))).await;
    assert_eq!(status, 409, "{v}");
    assert!(v["refused"][0]["why"].as_str().unwrap().contains("the lease expired"), "{v}");
    let again = lease(&relay, "max=5&lease=30s").await;
    assert_eq!(again.len(), 1, "the delivery is due again after its lease");
    assert_eq!(again[0]["delivery_id"], first[0]["delivery_id"]);
    assert_ne!(again[0]["id"], first[0]["id"], "a lease of its own");
    // A nack with a delay: not leased before it, leased after.
    let (status, v) =
        pull(&relay, "nack", PULL_TOKEN, Some(json!({"ids": [again[0]["id"]], "delay": "2s"})))
            .await;
    assert_eq!((status, v["settled"].as_u64()), (200, Some(1)), "{v}");
    assert!(lease(&relay, "max=5").await.is_empty(), "due again only after the delay");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let third = lease(&relay, "max=5").await;
    assert_eq!(third.len(), 1);
    let (status, _) = pull(&relay, "ack", PULL_TOKEN, Some(ids(&third))).await;
    assert_eq!(status, 200);
    let (_, e) = relay.admin_get(&format!("/admin/events/{event}")).await;
    assert_eq!(e["deliveries"][0]["state"], "delivered", "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pull_api_refuses_wrong_tokens_names_and_bodies_clearly() {
    let (_dir, relay) = start().await;
    let (status, v) = pull(&relay, "lease", "wrong-token-0123456789", None).await;
    assert_eq!(status, 401);
    assert!(v["error"].as_str().unwrap().contains("wrong `Authorization: Bearer` token"), "{v}");
    let r = relay
        .client
        .post(format!("http://{}/pull/nosuch/lease", relay.ingress))
        .bearer_auth(PULL_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    for (what, body, needle) in [
        ("lease?max=0", None, "max: must be between 1 and 1000"),
        ("lease?lease=forever", None, "lease: "),
        ("ack", Some(json!({"nope": 1})), "send {\"ids\""),
        ("ack", Some(json!({"ids": [], "delay": "1s"})), "only a nack"),
    ] {
        let (status, v) = pull(&relay, what, PULL_TOKEN, body).await;
        assert_eq!(status, 400, "{what}: {v}");
        assert!(v["error"].as_str().unwrap().contains(needle), "{what}: {v}");
    }
    let (status, v) = pull(&relay, "ack", PULL_TOKEN, Some(json!({"ids": ["forged"]}))).await;
    assert_eq!(status, 409);
    assert_eq!(v["refused"][0]["why"], "not an id a lease gave");
    assert!(!relay.logs().contains(PULL_TOKEN), "the token was logged");
}

/// A flood of wrong tokens and unknown names from one client: five are answered (401,
/// 404), everything after is refused unread (429, `Retry-After`), the right token
/// from that client included; a consumer at another address leases and acks every
/// delivery meanwhile, within 20 s, and the token is never logged. The count is the
/// relay's one count of wrong tokens per client: the admin API refuses that client too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_wrong_pull_tokens_is_throttled_per_client_and_the_consumer_goes_on() {
    let (_dir, relay) = start().await;
    let mut events = Vec::new();
    for seq in 0..20u64 {
        let r = relay.callback(Some("ActionUpdated"), "application/json", body(seq % 4, seq)).await;
        assert_eq!(r.status(), 200);
        events.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned());
    }
    // 400 requests at once from 127.0.0.1: random tokens, and names of no destination.
    let mut flood = tokio::task::JoinSet::new();
    for n in 0..400u32 {
        let (client, at) = (relay.client.clone(), relay.ingress);
        flood.spawn(async move {
            let (name, token) = if n % 2 == 0 {
                ("feed".to_owned(), format!("guess-{:016x}", fastrand::u64(..)))
            } else {
                (format!("feed{n}"), PULL_TOKEN.to_owned())
            };
            let r = client
                .post(format!("http://{at}/pull/{name}/lease"))
                .bearer_auth(token)
                .send()
                .await
                .expect("a flood request");
            (r.status().as_u16(), r.headers().contains_key("retry-after"))
        });
    }
    let mut answered = BTreeMap::<u16, usize>::new();
    while let Some(done) = flood.join_next().await {
        let (status, retry_after) = done.unwrap();
        assert!(status != 429 || retry_after, "a 429 without Retry-After");
        *answered.entry(status).or_default() += 1;
    }
    let read = answered.get(&401).unwrap_or(&0) + answered.get(&404).unwrap_or(&0);
    assert_eq!(read, 5, "wrong tokens read beyond the limit: {answered:?}");
    assert_eq!(answered.get(&429), Some(&395), "{answered:?}");
    // The right token from the throttled client is refused unread too.
    let (status, v) = pull(&relay, "lease", PULL_TOKEN, None).await;
    assert_eq!(status, 429, "{v}");
    assert!(v["error"].as_str().unwrap().contains("try again in"), "{v}");
    // A consumer at another address is not held back: it takes everything.
    let other = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut acked = 0;
    while acked < events.len() {
        assert!(Instant::now() < deadline, "{acked} of {} acked within 20 s", events.len());
        let url = format!("http://{}/pull/feed/lease?max=100", relay.ingress);
        let r = other.post(url).bearer_auth(PULL_TOKEN).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let leased = r.json::<Value>().await.unwrap()["deliveries"].as_array().unwrap().clone();
        if leased.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let url = format!("http://{}/pull/feed/ack", relay.ingress);
        let r = other.post(url).bearer_auth(PULL_TOKEN).json(&ids(&leased)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        acked += leased.len();
    }
    let (status, _) = relay.admin_get("/admin/events").await;
    assert_eq!(status, 429, "one count of wrong tokens per client, whichever token");
    for id in &events {
        let url = format!("http://{}/admin/events/{id}", relay.admin);
        let r = other.get(url).bearer_auth(common::ADMIN_TOKEN).send().await.unwrap();
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["deliveries"][0]["state"], "delivered", "{e}");
    }
    // Counted as answered: the five read (wrong tokens or unknown names, in whatever
    // order the flood arrived), and every one refused unread.
    let metrics = relay.metrics().await;
    let count = |result: &str| -> f64 {
        let line = format!("hookrelay_pull_token_refusals_total{{result=\"{result}\"}}");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    assert_eq!(count("wrong_token") + count("unknown_destination"), 5.0, "{metrics}");
    assert_eq!(count("throttled"), 396.0, "{metrics}");
    assert!(!relay.logs().contains(PULL_TOKEN), "the token was logged");
}

/// The example consumer of docs/ (Python's standard library only) leases, handles and
/// acknowledges: every delivery ends delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_example_consumer_delivers_everything() {
    let (_dir, relay) = start().await;
    let mut events = Vec::new();
    for seq in 0..5u64 {
        let r = relay.callback(Some("ActionUpdated"), "application/json", body(3, seq)).await;
        events.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned());
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/examples/pull_consumer.py");
    let mut consumer = std::process::Command::new("python3")
        .arg(script)
        .arg("feed")
        .env("HOOKRELAY_URL", format!("http://{}", relay.ingress))
        .env("HOOKRELAY_PULL_TOKEN", PULL_TOKEN)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("python3 runs the example consumer");
    for id in &events {
        relay
            .admin_until(&format!("/admin/events/{id}"), Duration::from_secs(30), |e| {
                e["deliveries"][0]["state"] == "delivered"
            })
            .await;
    }
    let _ = consumer.kill();
    let _ = consumer.wait();
}

/// Four consumers lease and acknowledge at once while callbacks arrive: each delivery
/// is leased by exactly one of them, once, each resource's in order, all within 60 s.
/// (The store's own race, a claim taken after its record was read, is narrower than an
/// HTTP round trip: `store/conformance/races.rs` provokes it; this checks the whole
/// path with real consumers.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_leasing_at_once_each_get_a_delivery_once_and_in_order() {
    const RESOURCES: u64 = 40;
    const SEQS: u64 = 5;
    let total = (RESOURCES * SEQS) as usize;
    let (_dir, relay) = start().await;
    let relay = std::sync::Arc::new(relay);
    let sender = {
        let relay = relay.clone();
        tokio::spawn(async move {
            for seq in 0..SEQS {
                for resource in 0..RESOURCES {
                    let r = relay
                        .callback(Some("ActionUpdated"), "application/json", body(resource, seq))
                        .await;
                    assert_eq!(r.status(), 200);
                }
            }
        })
    };
    // Every lease any consumer got: (resource, seq), in the order they were leased.
    let got: std::sync::Arc<std::sync::Mutex<Vec<(String, u64)>>> = Default::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    let consumers: Vec<_> = (0..4)
        .map(|_| {
            let (relay, got) = (relay.clone(), got.clone());
            tokio::spawn(async move {
                while got.lock().unwrap().len() < total && Instant::now() < deadline {
                    let leased = lease(&relay, "max=4&lease=30s").await;
                    if leased.is_empty() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    for d in &leased {
                        let shaped: Value =
                            serde_json::from_str(d["body"].as_str().unwrap()).unwrap();
                        let resource = shaped["resource"].as_str().unwrap().to_owned();
                        got.lock().unwrap().push((resource, shaped["seq"].as_u64().unwrap()));
                    }
                    let (status, v) = pull(&relay, "ack", PULL_TOKEN, Some(ids(&leased))).await;
                    assert_eq!(status, 200, "{v}");
                    assert_eq!(v["settled"].as_u64(), Some(leased.len() as u64), "{v}");
                }
            })
        })
        .collect();
    sender.await.unwrap();
    for c in consumers {
        c.await.unwrap();
    }
    let got = got.lock().unwrap().clone();
    let mut per_resource: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (resource, seq) in &got {
        per_resource.entry(resource.clone()).or_default().push(*seq);
    }
    let expected: Vec<u64> = (0..SEQS).collect();
    for (resource, seqs) in &per_resource {
        assert_eq!(seqs, &expected, "resource {resource}: leased once each, in order");
    }
    assert_eq!((per_resource.len(), got.len()), (RESOURCES as usize, total), "within 60 s");
    assert!(lease(&relay, "max=10").await.is_empty(), "nothing left to lease");
}
