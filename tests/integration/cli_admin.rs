//! `hookrelay events|dead-letters|destinations` against a running relay.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::sink::{Mode, Sink};
use common::Relay;
use serde_json::Value;

/// Runs the CLI against `relay`; returns (exit code, stdout, stderr).
fn cli(relay: &Relay, dir: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    relay.cli(dir, args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_commands_list_show_replay_pause_and_resume() {
    let sink = Sink::start().await;
    sink.set_mode(Mode::Status(422));
    let dir = tempfile::tempdir().unwrap();
    let tail = format!("\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n", sink.url());
    let relay =
        Relay::start(dir.path(), &common::config_with(&dir.path().join("data"), "", &tail)).await;
    let r =
        relay.callback(Some("ActionCreated"), "application/json", r#"{"data":{"id":"7"}}"#).await;
    let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    relay
        .admin_until("/admin/dead-letters", Duration::from_secs(15), |v| {
            v["dead_letters"].as_array().unwrap().len() == 1
        })
        .await;
    let d = dir.path();

    let (code, out, err) = cli(&relay, d, &["events", "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("ID")
            && out.contains(&id)
            && out.contains("ActionCreated")
            && out.contains("dispatched"),
        "{out}"
    );

    let (code, out, _) = cli(&relay, d, &["events", "list", "--json", "--status", "dispatched"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["events"][0]["id"], id.as_str());

    let (code, out, _) = cli(&relay, d, &["events", "show", &id]);
    assert_eq!(code, 0);
    assert!(
        out.contains("crm")
            && out.contains("dead")
            && out.contains("422")
            && out.contains(r#"{"data":{"id":"7"}}"#),
        "{out}"
    );

    let (code, out, _) = cli(&relay, d, &["dead-letters", "list", "--destination", "crm"]);
    assert_eq!(code, 0);
    assert!(out.contains(&id) && out.contains("HTTP 422"), "{out}");

    sink.set_mode(Mode::Ok);
    let (code, out, _) = cli(&relay, d, &["dead-letters", "replay"]);
    assert_eq!((code, out.as_str()), (0, "1 dead letters replayed\n"));
    sink.wait_for(2, Duration::from_secs(15)).await;

    let (code, out, _) = cli(&relay, d, &["destinations", "pause", "crm"]);
    assert_eq!((code, out.as_str()), (0, "crm paused\n"));
    let (code, out, _) = cli(&relay, d, &["destinations", "list"]);
    assert_eq!(code, 0);
    assert!(out.lines().next().unwrap().contains("PENDING  HELD  RETRYING"), "{out}");
    assert!(out.contains("crm") && out.contains("paused") && out.contains("closed"), "{out}");
    let (code, _, _) = cli(&relay, d, &["events", "replay", &id, "--destination", "crm"]);
    assert_eq!(code, 0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(sink.count(), 2, "paused: the replay waits");
    let (code, _, _) = cli(&relay, d, &["destinations", "resume", "crm"]);
    assert_eq!(code, 0);
    sink.wait_for(3, Duration::from_secs(15)).await;

    // Deleting a dead letter: it is never retried and leaves the list.
    sink.set_mode(Mode::Status(422));
    let r = relay.callback(Some("TaskCreated"), "application/json", r#"{"data":{"id":"8"}}"#).await;
    let id2 = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    relay
        .admin_until("/admin/dead-letters", Duration::from_secs(15), |v| {
            v["dead_letters"].as_array().unwrap().len() == 1
        })
        .await;
    let (code, out, _) = cli(&relay, d, &["dead-letters", "delete", "--event", "TaskCreated"]);
    assert_eq!((code, out.as_str()), (0, "1 dead letters deleted\n"));
    let (_, out, _) = cli(&relay, d, &["dead-letters", "list"]);
    assert!(out.contains("(none)"), "{out}");
    let (_, out, _) = cli(&relay, d, &["events", "show", &id2]);
    assert!(out.contains("discarded"), "{out}");

    // Errors are reported, with a non-zero exit code.
    let (code, _, err) = cli(&relay, d, &["destinations", "pause", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("404") && err.contains("no destination named"), "{err}");
    let (code, _, err) = cli(&relay, d, &["events", "show", "zz"]);
    assert_eq!(code, 1);
    assert!(err.contains("400"), "{err}");
    let out = Command::new(common::binary())
        .args([
            "events",
            "list",
            "--config",
            "/nonexistent.toml",
            "--admin-url",
            &format!("http://{}", relay.admin),
        ])
        .env_remove("HOOKRELAY_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "no token without the config");
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));
    // A wrong token: where it came from, and that the relay's environment may override
    // its file.
    let out = std::process::Command::new(common::binary())
        .args(["events", "list", "--admin-url", &format!("http://{}", relay.admin)])
        .args(["--config", "/nonexistent.toml"])
        .env("HOOKRELAY_ADMIN_TOKEN", "not-the-relays-token-0123")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("401") && err.contains("HOOKRELAY__ADMIN__TOKEN"), "{err}");
    assert!(err.contains("--admin-token or HOOKRELAY_ADMIN_TOKEN"), "{err}");
    assert!(!err.contains("not-the-relays-token-0123"), "never the token itself: {err}");
}

/// `hooks sync` with the upstream unreachable: says which account failed and why, and
/// exits non-zero so that a script notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_sync_exits_non_zero_when_an_account_fails() {
    let dir = tempfile::tempdir().unwrap();
    let closed = common::sink::refused_port();
    let tail = format!(
        "events = [\"ActionCreated\"]\n[[sources.accounts]]\nname = \"alice\"\n\
         api_base = \"http://{closed}\"\ntoken = \"alice-token\"\n\
         [upstream]\npublic_url = \"http://127.0.0.1:1\"\nreconcile_interval = \"1h\"\n\
         initial_backoff = \"10ms\"\nmax_backoff = \"10ms\"\nmax_retries = 1\n"
    );
    let relay =
        Relay::start(dir.path(), &common::config_with(&dir.path().join("data"), "", &tail)).await;
    let (code, out, err) = cli(&relay, dir.path(), &["hooks", "sync"]);
    assert_ne!(code, 0, "a failed sync exited 0: {out}{err}");
    assert!(out.contains("FAILING"), "{out}");
    // The failure says where (the URL), why (the system's cause) and what to check.
    assert!(out.contains(&format!("http://{closed}/rest/resthooks")), "{out}");
    assert!(out.to_lowercase().contains("refused"), "{out}");
    assert!(out.contains("check the account's api_base"), "{out}");
    assert!(err.contains("could not be reconciled"), "{err}");
}

/// "Did the update of matter 5 reach the CRM?": the events about one resource, from
/// the admin API and the CLI, with where each delivery stands; `record`, the word of
/// the first builds, still works in the query, the answer and the CLI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_about_one_resource_with_their_deliveries() {
    let sink = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let tail = format!("\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n", sink.url());
    let relay =
        Relay::start(dir.path(), &common::config_with(&dir.path().join("data"), "", &tail)).await;
    let body = |kind: &str, id: &str, n: u32| {
        format!(r#"{{"data":{{"type":"{kind}","id":{id},"attributes":{{"n":{n}}}}}}}"#)
    };
    let mut about_5 = Vec::new();
    for (kind, id, n) in
        [("actions", "\"5\"", 1), ("actions", "6", 2), ("actions", "5", 3), ("tasks", "\"5\"", 4)]
    {
        let r = relay.callback(Some("ActionUpdated"), "application/json", body(kind, id, n)).await;
        let id_of = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
        if kind == "actions" && id.trim_matches('"') == "5" {
            about_5.push(id_of);
        }
    }
    sink.wait_for(4, Duration::from_secs(15)).await;
    // The deliveries are recorded just after the sink answers.
    let v = relay
        .admin_until("/admin/events?resource=actions/5", Duration::from_secs(15), |v| {
            v["events"]
                .as_array()
                .unwrap()
                .iter()
                .all(|e| e["deliveries"][0]["state"] == "delivered")
        })
        .await;
    let events = v["events"].as_array().unwrap();
    let ids: Vec<&str> = events.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [about_5[1].as_str(), about_5[0].as_str()],
        "newest first, both spellings of the id"
    );
    assert_eq!(events[0]["resource"], "actions/5");
    assert_eq!(events[0]["record"], "actions/5", "the deprecated name, same value");
    let (status, old) = relay.admin_get("/admin/events?record=actions/5").await;
    assert_eq!(status, 200, "{old}");
    assert_eq!(old["events"], v["events"], "`record` is an alias of `resource`");
    assert_eq!(
        events[0]["deliveries"],
        serde_json::json!([{"destination": "crm", "state": "delivered"}])
    );
    // A plain listing carries the resource but not the deliveries.
    let (_, all) = relay.admin_get("/admin/events").await;
    assert_eq!(all["events"][0]["resource"], "tasks/5");
    assert!(all["events"][0].get("deliveries").is_none());
    for query in ["resource=actions", "record=actions"] {
        let (status, bad) = relay.admin_get(&format!("/admin/events?{query}")).await;
        assert_eq!(status, 400, "{query}");
        assert!(bad["error"].as_str().unwrap().contains("type/id"), "{query}: {bad}");
    }

    let d = dir.path();
    for flag in ["--resource", "--record"] {
        let (code, out, err) = cli(&relay, d, &["events", "list", flag, "actions/5"]);
        assert_eq!(code, 0, "{flag}: {err}");
        assert!(out.lines().next().unwrap().ends_with("DELIVERIES"), "{flag}: {out}");
        assert_eq!(out.matches("crm=delivered").count(), 2, "{flag}: {out}");
        assert!(out.contains(&about_5[0]) && out.contains(&about_5[1]), "{flag}: {out}");
    }
    let (code, out, _) = cli(&relay, d, &["events", "list", "--resource", "orders/1"]);
    assert_eq!(code, 0);
    assert!(out.contains("(none)"), "{out}");
}

/// A callback whose body carries its own target URL (as the upstream's does, in
/// `meta.debug.resthook.target`, and once more with JSON's escaped slashes) and the
/// admin token: the consumer gets it with both masked (signed as masked: the
/// signature verifies over what arrives), and the admin API and `hookrelay events
/// show` show it masked. The duplicate from a second user still dedups on `data`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relays_secrets_in_a_body_are_masked_before_it_is_stored() {
    let sink = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let tail = format!(
        "\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwRv5D8XT7Qm8=\"\n",
        sink.url()
    );
    let relay =
        Relay::start(dir.path(), &common::config_with(&dir.path().join("data"), "", &tail)).await;
    let target = relay.hook_url(None);
    let body = |hook: u32| {
        format!(
            r#"{{"data":{{"type":"actions","id":"5"}},"meta":{{"debug":{{"resthook":{{"id":"{hook}","target":"{target}","event_name":"ActionCreated"}},"copy":"{}","admin":"{}"}}}}}}"#,
            target.replace('/', "\\/"),
            common::ADMIN_TOKEN
        )
    };
    assert!(body(1).contains(common::TOKEN));
    let mut ids = Vec::new();
    for hook in [1, 2] {
        let r = relay.callback(None, "application/json", body(hook)).await;
        assert_eq!(r.status(), 200);
        ids.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned());
    }
    let got = sink.wait_for(1, Duration::from_secs(15)).await;
    let sent = String::from_utf8(got[0].body.clone()).unwrap();
    for secret in [common::TOKEN, common::ADMIN_TOKEN] {
        assert!(!sent.contains(secret), "{sent}");
    }
    assert!(sent.contains(&format!("/hooks/{}/***", common::SOURCE)), "{sent}");
    assert!(sent.contains(&format!("\\/hooks\\/{}\\/***", common::SOURCE)), "{sent}");
    serde_json::from_str::<Value>(&sent).unwrap();
    assert!(got[0].header("webhook-signature").is_some());
    let (_, shown) = relay.admin_get(&format!("/admin/events/{}", ids[0])).await;
    let stored = shown["body"].as_str().unwrap();
    assert!(!stored.contains(common::TOKEN) && stored.contains("***"), "{stored}");
    let (code, out, _) = cli(&relay, dir.path(), &["events", "show", &ids[0]]);
    assert_eq!(code, 0);
    assert!(!out.contains(common::TOKEN) && out.contains("***"), "{out}");
    // The second user's copy: a duplicate, by `data`.
    let copy = relay
        .admin_until(&format!("/admin/events/{}", ids[1]), Duration::from_secs(15), |v| {
            v["status"] != "received"
        })
        .await;
    assert_eq!(copy["status"], "duplicate", "{copy}");
    assert_eq!(sink.count(), 1);
}

/// On a production host the CLI needs only the `[admin]` section of a config, and takes
/// the token from `HOOKRELAY__ADMIN__TOKEN` (as the service's environment file sets it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_only_config_and_the_token_from_the_environment_suffice() {
    let dir = tempfile::tempdir().unwrap();
    let relay = Relay::start(dir.path(), &common::config(&dir.path().join("data"), "")).await;
    let admin_only = dir.path().join("admin-only.toml");
    std::fs::write(&admin_only, "[admin]\nlisten = \"127.0.0.1:8079\"\n").unwrap();
    let run = |token: Option<&str>| {
        let mut cmd = Command::new(common::binary());
        cmd.args(["events", "list", "--config"])
            .arg(&admin_only)
            .arg("--admin-url")
            .arg(format!("http://{}", relay.admin))
            .env_remove("HOOKRELAY_ADMIN_TOKEN")
            .env_remove("HOOKRELAY__ADMIN__TOKEN");
        if let Some(token) = token {
            cmd.env("HOOKRELAY__ADMIN__TOKEN", token);
        }
        let out = cmd.output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, err) = run(Some(common::ADMIN_TOKEN));
    assert!(ok, "{err}");
    let (ok, err) = run(None);
    assert!(!ok && err.contains("401"), "without a token the API refuses, and says so: {err}");
}
