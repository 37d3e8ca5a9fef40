//! The upstream simulator, as a real process: every rule of `upstream-api.md` it
//! implements, and the quirks of `upstream-notes.md` it can switch on.

use crate::common;

use std::time::Duration;

use common::sim::{Sim, JSON_API};
use common::sink::{closed_port, Mode, Sink};
use reqwest::Method;
use serde_json::{json, Value};

const ALICE: &str = "alice-token";
const BOB: &str = "bob-token";

fn users() -> String {
    format!(
        "callback_retries = 2\ncallback_retry_backoff = \"100ms\"\ncallback_timeout = \"2s\"\n{}",
        common::sim::USERS
    )
}

fn start() -> (tempfile::TempDir, Sim) {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), &users());
    (dir, sim)
}

fn error_detail(v: &Value) -> String {
    assert_eq!(v.as_object().map(|o| o.len()), Some(1), "only `errors` at the top: {v}");
    v["errors"][0]["detail"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn requests_without_a_valid_token_get_401_with_errors() {
    let (_dir, sim) = start();
    for token in [None, Some("nope")] {
        let (status, headers, v) = sim.api(Method::GET, "", token, None).await;
        assert_eq!(status, 401);
        assert_eq!(headers["content-type"], JSON_API);
        assert!(error_detail(&v).contains("token"));
        assert_eq!(v["errors"][0]["status"], "401");
    }
}

#[tokio::test]
async fn create_validates_and_answers_the_hook_as_a_get_would() {
    let (_dir, sim) = start();
    let body = json!({"resthooks": {"eventName": "ActionCreated", "targetUrl": "https://r.example.com/h"}});
    let (status, headers, v) = sim.api(Method::POST, "", Some(ALICE), Some(body)).await;
    assert_eq!((status, headers["content-type"].to_str().unwrap()), (200, JSON_API));
    let hook = &v["resthooks"];
    assert_eq!(hook["status"], "Active");
    assert_eq!(hook["triggeredCount"], 0);
    assert_eq!(hook["lastTriggered"], "");
    let id = hook["id"].as_str().unwrap();
    let (_, _, got) = sim.api(Method::GET, &format!("/{id}"), Some(ALICE), None).await;
    assert_eq!(got["resthooks"], *hook);

    for (body, needle) in [
        (
            json!({"resthooks": {"eventName": "ActionMoved", "targetUrl": "https://r.example.com/h"}}),
            "ActionMoved",
        ),
        (
            json!({"resthooks": {"eventName": "ActionCreated", "targetUrl": "not a url"}}),
            "absolute",
        ),
        (json!({"resthooks": {"eventName": "ActionCreated"}}), "targetUrl"),
    ] {
        let (status, _, v) = sim.api(Method::POST, "", Some(ALICE), Some(body)).await;
        assert_eq!(status, 400);
        assert!(error_detail(&v).contains(needle), "{v}");
    }
    let r = sim
        .client
        .post(sim.url("/api/rest/resthooks"))
        .bearer_auth(ALICE)
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
}

#[tokio::test]
async fn users_see_and_change_only_their_own_hooks() {
    let (_dir, sim) = start();
    let a = sim.create_hook(ALICE, "ActionCreated", "https://r.example.com/a").await;
    let b = sim.create_hook(BOB, "ActionCreated", "https://r.example.com/b").await;
    let (_, _, list) = sim.api(Method::GET, "", Some(ALICE), None).await;
    let ids: Vec<&str> =
        list["resthooks"].as_array().unwrap().iter().map(|h| h["id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec![a.as_str()]);
    assert_eq!(sim.api(Method::GET, &format!("/{b}"), Some(ALICE), None).await.0, 404);
    assert_eq!(sim.api(Method::DELETE, &format!("/{b}"), Some(ALICE), None).await.0, 404);
    let put = json!({"resthooks": {"targetUrl": "https://evil.example.com/"}});
    assert_eq!(sim.api(Method::PUT, &format!("/{b}"), Some(ALICE), Some(put.clone())).await.0, 404);
    let (status, _, v) = sim.api(Method::PUT, &format!("/{a}"), Some(ALICE), Some(put)).await;
    assert_eq!(status, 200);
    assert_eq!(v["resthooks"]["targetUrl"], "https://evil.example.com/");
    assert_eq!(sim.all_hooks().await.len(), 2, "bob's hook survived alice's attempts");
}

#[tokio::test]
async fn collections_page_and_ids_lists_work() {
    let (_dir, sim) = start();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            sim.create_hook(ALICE, "TaskCreated", &format!("https://r.example.com/{i}")).await,
        );
    }
    let mut seen = Vec::new();
    let mut page = Some(1u64);
    while let Some(p) = page {
        let (status, _, v) =
            sim.api(Method::GET, &format!("?page={p}&pageSize=2"), Some(ALICE), None).await;
        assert_eq!(status, 200);
        let paging = &v["meta"]["paging"]["resthooks"];
        assert_eq!(
            (paging["recordCount"].as_u64(), paging["pageCount"].as_u64()),
            (Some(5), Some(3))
        );
        assert_eq!(paging["page"].as_u64(), Some(p));
        seen.extend(
            v["resthooks"].as_array().unwrap().iter().map(|h| h["id"].as_str().unwrap().to_owned()),
        );
        page = paging["nextPage"].as_u64();
        if page.is_none() {
            assert!(paging["nextPage"].is_null() && v["links"]["next"].is_null());
        }
    }
    assert_eq!(seen, ids);
    let (status, _, v) = sim.api(Method::GET, "?pageSize=201", Some(ALICE), None).await;
    assert_eq!(status, 400, "{v}");
    assert!(error_detail(&v).contains("200"));

    let pair = format!("/{},{}", ids[0], ids[1]);
    let (_, _, v) = sim.api(Method::GET, &pair, Some(ALICE), None).await;
    assert_eq!(v["resthooks"].as_array().map(Vec::len), Some(2));
    let (status, _, _) = sim.api(Method::DELETE, &pair, Some(ALICE), None).await;
    assert_eq!(status, 204);
    let (_, _, v) = sim.api(Method::GET, "", Some(ALICE), None).await;
    assert_eq!(v["meta"]["paging"]["resthooks"]["recordCount"], 3);

    let (status, headers, _) = sim.api(Method::OPTIONS, "", Some(ALICE), None).await;
    assert_eq!(status, 200);
    assert!(headers["allow"].to_str().unwrap().contains("DELETE"));
    assert_eq!(sim.api(Method::PATCH, "", Some(ALICE), None).await.0, 405);
}

#[tokio::test]
async fn every_active_hook_is_called_once_per_occurrence_and_counts_it() {
    let (_dir, sim) = start();
    let sink = Sink::start().await;
    let target = sink.url();
    let a = sim.create_hook(ALICE, "ActionCreated", &target).await;
    let b = sim.create_hook(BOB, "ActionCreated", &target).await;
    sim.create_hook(BOB, "TaskCreated", &target).await;

    let report = sim
        .fire(json!({"event": "ActionCreated", "id": "5", "attributes": {"name": "Smith v Jones"}}))
        .await;
    let calls = report["occurrences"][0]["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{report}");
    assert!(calls.iter().all(|c| c["outcome"] == "delivered"));
    let got = sink.wait_for(2, Duration::from_secs(5)).await;
    assert_eq!(got.len(), 2);
    let bodies: Vec<Value> = got.iter().map(|r| serde_json::from_slice(&r.body).unwrap()).collect();
    assert_eq!(bodies[0]["data"], bodies[1]["data"], "same occurrence, same data");
    assert_eq!(bodies[0]["data"]["type"], "actions");
    assert_eq!(bodies[0]["data"]["attributes"]["name"], "Smith v Jones");
    let mut hook_ids: Vec<&str> =
        bodies.iter().map(|b| b["meta"]["debug"]["resthook"]["id"].as_str().unwrap()).collect();
    hook_ids.sort();
    assert_eq!(hook_ids, vec![a.as_str(), b.as_str()]);
    assert!(bodies.iter().all(|b| b["meta"]["debug"]["resthook"]["event_name"] == "ActionCreated"));

    let (_, _, v) = sim.api(Method::GET, &format!("/{a}"), Some(ALICE), None).await;
    assert_eq!(v["resthooks"]["triggeredCount"], 1);
    let last = v["resthooks"]["lastTriggered"].as_str().unwrap();
    assert!(last.len() >= 20 && last.ends_with("+00:00"), "{last}");
}

#[tokio::test]
async fn an_answer_other_than_200_disables_the_hook() {
    let (_dir, sim) = start();
    let sink = Sink::start().await;
    sink.set_mode(Mode::Status(500));
    let a = sim.create_hook(ALICE, "FileNoteCreated", &sink.url()).await;
    let report = sim.fire(json!({"event": "FileNoteCreated"})).await;
    let call = &report["occurrences"][0]["calls"][0];
    assert_eq!(
        (call["outcome"].as_str(), call["status"].as_u64(), call["attempts"].as_u64()),
        (Some("disabled"), Some(500), Some(1)),
        "no retry after an answer"
    );
    let (_, _, v) = sim.api(Method::GET, &format!("/{a}"), Some(ALICE), None).await;
    assert_eq!(v["resthooks"]["status"], "Disabled");

    sink.set_mode(Mode::Ok);
    let report = sim.fire(json!({"event": "FileNoteCreated"})).await;
    assert_eq!(report["occurrences"][0]["calls"].as_array().map(Vec::len), Some(0));
    assert_eq!(sink.count(), 1, "a Disabled hook is no longer called");
}

#[tokio::test]
async fn transient_network_errors_are_retried_and_do_not_disable() {
    let (_dir, sim) = start();
    let a = sim.create_hook(ALICE, "TaskUpdated", &format!("http://{}/gone", closed_port())).await;
    let report = sim.fire(json!({"event": "TaskUpdated"})).await;
    let call = &report["occurrences"][0]["calls"][0];
    assert_eq!(call["outcome"], "failed");
    assert_eq!(call["attempts"], 3, "1 + callback_retries");
    let (_, _, v) = sim.api(Method::GET, &format!("/{a}"), Some(ALICE), None).await;
    assert_eq!(
        (v["resthooks"]["status"].as_str(), v["resthooks"]["triggeredCount"].as_u64()),
        (Some("Active"), Some(1))
    );

    // A target that comes back within the retries gets the call.
    let port = closed_port();
    let b = sim.create_hook(BOB, "TaskCreated", &format!("http://{port}/hook")).await;
    let sim_fire = sim.fire(json!({"event": "TaskCreated"}));
    let late = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Sink::start_on(port).await
    };
    let (report, sink) = tokio::join!(sim_fire, late);
    let call = &report["occurrences"][0]["calls"][0];
    assert_eq!(call["outcome"], "delivered", "{report}");
    assert_eq!(sink.count(), 1);
    let (_, _, v) = sim.api(Method::GET, &format!("/{b}"), Some(BOB), None).await;
    assert_eq!(v["resthooks"]["status"], "Active");
}

#[tokio::test]
async fn quirks_change_the_shapes_as_the_real_service_does() {
    let (_dir, sim) = start();
    let sink = Sink::start().await;
    sim.create_hook(ALICE, "ActionUpdated", &sink.url()).await;
    let (_, _, v) = sim.api(Method::GET, "", Some(ALICE), None).await;
    assert!(v["resthooks"].is_array());
    assert_eq!(v["resthooks"][0]["lastTriggered"], "");

    sim.control(
        Method::PUT,
        "/sim/quirks",
        json!({"single_object": true, "triggered_last_timestamp": true}),
    )
    .await;
    let (_, _, v) = sim.api(Method::GET, "", Some(ALICE), None).await;
    assert!(v["resthooks"].is_object(), "one record: an object: {v}");
    assert!(v["resthooks"]["triggeredLastTimestamp"].is_null());
    assert!(v["resthooks"].get("lastTriggered").is_none());
    sim.fire(json!({"event": "ActionUpdated"})).await;
    let (_, _, v) = sim.api(Method::GET, "", Some(ALICE), None).await;
    assert!(v["resthooks"]["triggeredLastTimestamp"].as_str().is_some_and(|s| s.contains('T')));

    sim.create_hook(ALICE, "ActionUpdated", &sink.url()).await;
    let (_, _, v) = sim.api(Method::GET, "", Some(ALICE), None).await;
    assert_eq!(v["resthooks"].as_array().map(Vec::len), Some(2), "two records: an array");
}

#[tokio::test]
async fn throttling_answers_429_with_retry_after() {
    let (_dir, sim) = start();
    sim.control(Method::POST, "/sim/throttle", json!({"requests": 2, "retry_after": 3})).await;
    for _ in 0..2 {
        let (status, headers, v) = sim.api(Method::GET, "", Some(ALICE), None).await;
        assert_eq!((status, headers["retry-after"].to_str().unwrap()), (429, "3"));
        assert!(v["errors"].is_array());
    }
    assert_eq!(sim.api(Method::GET, "", Some(ALICE), None).await.0, 200);

    let dir = tempfile::tempdir().unwrap();
    let every = Sim::start(dir.path(), &format!("throttle_every = 3\n{}", users()));
    let statuses: Vec<u16> = {
        let mut s = Vec::new();
        for _ in 0..6 {
            s.push(every.api(Method::GET, "", Some(ALICE), None).await.0);
        }
        s
    };
    assert_eq!(statuses, vec![200, 200, 429, 200, 200, 429]);
}

#[tokio::test]
async fn oauth_refresh_rotates_tokens_and_expired_ones_get_401() {
    let (_dir, sim) = start();
    let refresh = |rt: &str, secret: &str| {
        sim.client.post(sim.url("/oauth/token")).form(&[
            ("grant_type", "refresh_token"),
            ("refresh_token", rt),
            ("client_id", "relay"),
            ("client_secret", secret),
        ])
    };
    assert_eq!(refresh("carol-rt-1", "wrong").send().await.unwrap().status(), 401);
    let r = refresh("carol-rt-1", "relay-secret").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let grant: Value = r.json().await.unwrap();
    assert_eq!(grant["api_endpoint"], sim.api_base());
    assert!(grant["expires_in"].as_u64().unwrap() > 0);
    let access = grant["access_token"].as_str().unwrap();
    assert_eq!(sim.api(Method::GET, "", Some(access), None).await.0, 200);
    let again = refresh("carol-rt-1", "relay-secret").send().await.unwrap();
    assert_eq!(again.status(), 400, "the used refresh token stopped working");
    assert_eq!(again.json::<Value>().await.unwrap()["error"], "invalid_grant");

    sim.control(Method::POST, "/sim/tokens/expire", json!({})).await;
    assert_eq!(sim.api(Method::GET, "", Some(access), None).await.0, 401);
    let rt = grant["refresh_token"].as_str().unwrap();
    let grant: Value = refresh(rt, "relay-secret").send().await.unwrap().json().await.unwrap();
    let access = grant["access_token"].as_str().unwrap();
    assert_eq!(sim.api(Method::GET, "", Some(access), None).await.0, 200);
}

#[tokio::test]
async fn fire_command_raises_events_and_the_cli_refuses_bad_setups() {
    let sim = Sim::start_args(&["--user", "alice:alice-token", "--quirk", "single-object"]);
    let sink = Sink::start().await;
    sim.create_hook(ALICE, "TimeEntryCreated", &sink.url()).await;
    let out = std::process::Command::new(common::binary())
        .args(["sim", "fire", "--url", &sim.url(""), "--event", "TimeEntryCreated", "--count", "3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["occurrences"].as_array().map(Vec::len), Some(3));
    assert_eq!(sink.count(), 3);
    let (_, _, v) = sim.api(Method::GET, "", Some(ALICE), None).await;
    assert!(v["resthooks"].is_object(), "--quirk single-object took effect");

    let bad = std::process::Command::new(common::binary())
        .args(["sim", "fire", "--url", &sim.url(""), "--event", "ActionMoved"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("ActionMoved"));

    let no_users = std::process::Command::new(common::binary())
        .args(["sim", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!no_users.status.success());
    assert!(String::from_utf8_lossy(&no_users.stderr).contains("--user"));

    // A port in use: which, and what to do, said once.
    let taken = std::process::Command::new(common::binary())
        .args(["sim", "--user", "a:b", "--listen", &sim.addr.to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&taken.stderr);
    assert!(!taken.status.success());
    assert!(err.contains("another process listens on") && err.contains("--listen"), "{err}");
    assert_eq!(err.matches("another process listens on").count(), 1, "{err}");
}

#[tokio::test]
async fn generated_load_raises_the_asked_number_of_events() {
    let (_dir, sim) = start();
    let sink = Sink::start().await;
    sim.create_hook(ALICE, "ParticipantUpdated", &sink.url()).await;
    let r = sim
        .client
        .post(sim.url("/sim/events"))
        .json(&json!({"event": "ParticipantUpdated", "rate": 200, "duration": "250ms"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    assert_eq!(r.json::<Value>().await.unwrap()["scheduled"], 50);
    sink.wait_for(50, Duration::from_secs(10)).await;
    // The sim counts a call once it has read the answer, a moment after the sink sent it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stats: Value =
            sim.client.get(sim.url("/sim/stats")).send().await.unwrap().json().await.unwrap();
        if stats["calls"]["delivered"] == 50 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the sim counted {stats}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
