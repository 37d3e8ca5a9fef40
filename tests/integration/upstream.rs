//! Hook lifecycle against the simulator: the relay and `hookrelay sim` as real
//! processes on loopback, a forwarding proxy as the relay's public address.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::sim::Sim;
use common::sink::Sink;
use common::{metric, Relay, SOURCE, TOKEN};
use reqwest::Method;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(20);

fn sim_config() -> String {
    format!("callback_retries = 1\ncallback_retry_backoff = \"50ms\"\n{}", common::sim::USERS)
}

/// The relay's config: `accounts` (TOML of `[[sources.accounts]]` tables) for the
/// source, `[upstream]` pointing at `proxy`, and `destinations`.
fn relay_config(
    dir: &Path,
    proxy: &Proxy,
    events: &str,
    accounts: &str,
    destinations: &str,
) -> String {
    let tail = format!(
        r#"events = {events}
{accounts}
[upstream]
public_url = "{public}"
reconcile_interval = "1h"
initial_backoff = "100ms"
max_backoff = "5s"
max_retries = 3

[delivery]
max_concurrency = 4
{destinations}
"#,
        public = proxy.url(),
    );
    common::config_with(dir, "", &tail)
}

fn account(name: &str, sim: &Sim, auth: &str, extra: &str) -> String {
    format!(
        "[[sources.accounts]]\nname = \"{name}\"\napi_base = \"{}\"\n{auth}\n{extra}\n",
        sim.api_base()
    )
}

fn destination(name: &str, url: &str, events: &str) -> String {
    format!("[[destinations]]\nname = \"{name}\"\nurl = \"{url}\"\nevents = {events}\n")
}

struct Setup {
    _dir: tempfile::TempDir,
    sim: Sim,
    proxy: Proxy,
    relay: Relay,
}

async fn setup(sim_extra: &str, config: impl FnOnce(&Path, &Sim, &Proxy) -> String) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), &format!("{sim_extra}\n{}", sim_config()));
    let proxy = Proxy::start().await;
    let text = config(dir.path(), &sim, &proxy);
    let relay = Relay::start(dir.path(), &text).await;
    proxy.forward_to(relay.ingress);
    Setup { _dir: dir, sim, proxy, relay }
}

async fn sync(relay: &Relay) -> Vec<Value> {
    let (status, v) = relay.admin_post("/admin/hooks/sync", None).await;
    assert_eq!(status, 200, "{v}");
    v["accounts"].as_array().unwrap().clone()
}

fn find<'a>(accounts: &'a [Value], name: &str) -> &'a Value {
    accounts
        .iter()
        .find(|a| a["account"] == name)
        .unwrap_or_else(|| panic!("no {name} in {accounts:?}"))
}

async fn wait_until<F: std::future::Future<Output = bool>>(
    what: &str,
    mut check: impl FnMut() -> F,
) {
    let deadline = Instant::now() + WAIT;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_registers_hooks_for_two_accounts_and_their_callbacks_are_delivered_once() {
    let sink = Sink::start().await;
    let s = setup("", |dir, sim, proxy| {
        let token_file = dir.join("bob.token");
        std::fs::write(&token_file, "bob-token\n").unwrap();
        let accounts = account("alice", sim, "token = \"alice-token\"", "")
            + &account(
                "bob",
                sim,
                &format!("token_file = {:?}", token_file.display().to_string()),
                "",
            );
        relay_config(
            dir,
            proxy,
            r#"["ActionCreated", "TaskCreated"]"#,
            &accounts,
            &destination("crm", &sink.url(), r#"["*"]"#),
        )
    })
    .await;

    let accounts = sync(&s.relay).await;
    for name in ["alice", "bob"] {
        let a = find(&accounts, name);
        assert_eq!(a["ok"], true, "{a}");
        let mut events: Vec<&str> =
            a["hooks"].as_array().unwrap().iter().map(|h| h["event"].as_str().unwrap()).collect();
        events.sort();
        assert_eq!(events, ["ActionCreated", "TaskCreated"], "{a}");
        let shown = a["hooks"][0]["target"].as_str().unwrap();
        assert!(
            !shown.contains(TOKEN) && shown.contains("********"),
            "source token masked: {shown}"
        );
    }
    let hooks = s.sim.all_hooks().await;
    assert_eq!(hooks.len(), 4);
    for h in &hooks {
        let want = format!(
            "{}/hooks/{SOURCE}/{TOKEN}/{}",
            s.proxy.url(),
            h["eventName"].as_str().unwrap()
        );
        assert_eq!(h["targetUrl"], want);
    }
    // A second sync changes nothing.
    let again = sync(&s.relay).await;
    assert!(again.iter().all(|a| a["changes"].as_array().unwrap().is_empty()), "{again:?}");
    assert_eq!(s.sim.all_hooks().await.len(), 4);

    let report = s.sim.fire(json!({"event": "ActionCreated", "id": "77"})).await;
    let calls = report["occurrences"][0]["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "one call per user's hook: {report}");
    assert!(calls.iter().all(|c| c["outcome"] == "delivered"), "{report}");
    sink.wait_for(1, WAIT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sink.count(), 1, "two callbacks, one delivery");

    sync(&s.relay).await;
    let m = s.relay.metrics().await;
    for name in ["alice", "bob"] {
        let l = [("account", name), ("event", "ActionCreated")];
        assert_eq!(
            metric(&m, "hookrelay_upstream_hooks", &[l[0], l[1], ("status", "Active")]),
            Some(1.0),
            "{m}"
        );
        assert_eq!(metric(&m, "hookrelay_upstream_hook_triggered_total", &l), Some(1.0));
        assert!(
            metric(&m, "hookrelay_upstream_hook_last_triggered_timestamp_seconds", &l).unwrap()
                > 1.7e9
        );
        let created = [l[0], l[1], ("from", "none"), ("to", "Active")];
        assert_eq!(metric(&m, "hookrelay_upstream_hook_transitions_total", &created), Some(1.0));
        assert_eq!(metric(&m, "hookrelay_upstream_account_up", &[l[0]]), Some(1.0));
    }
    assert_eq!(
        metric(&m, "hookrelay_upstream_callbacks_missing", &[("event", "ActionCreated")]),
        Some(0.0),
        "{m}"
    );
    assert!(
        metric(&m, "hookrelay_upstream_requests_total", &[("method", "POST"), ("outcome", "ok")])
            .unwrap()
            >= 2.0
    );
    assert!(m.contains("hookrelay_upstream_reconcile_duration_seconds_count{account=\"alice\""));

    let out = std::process::Command::new(common::binary())
        .args(["hooks", "list", "--admin-url", &format!("http://{}", s.relay.admin)])
        .env("HOOKRELAY_ADMIN_TOKEN", common::ADMIN_TOKEN)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("demo/alice  ok") && text.contains("demo/bob  ok"), "{text}");
    assert!(text.contains("ActionCreated") && !text.contains(TOKEN), "{text}");
    assert!(!s.relay.logs().contains(TOKEN) && !s.relay.logs().contains("alice-token"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_hook_is_recreated_and_its_gap_reported() {
    let (crm, gaps) = (Sink::start().await, Sink::start().await);
    let s = setup("", |dir, sim, proxy| {
        let dests = destination("crm", &crm.url(), r#"["*"]"#)
            + &destination("gaps", &gaps.url(), r#"["hookrelay.HookGap"]"#);
        relay_config(
            dir,
            proxy,
            r#"["FileNoteCreated"]"#,
            &account("alice", sim, "token = \"alice-token\"", ""),
            &dests,
        )
        // sled: the crash below is staged by writing to its files.
        .replace("[storage]\n", "[storage]\nbackend = \"sled\"\n")
    })
    .await;
    let first = sync(&s.relay).await;
    let old_id = first[0]["hooks"][0]["id"].as_str().unwrap().to_owned();

    // The relay looks broken to the upstream: its hook is disabled.
    s.proxy.fail_with(500);
    let report = s.sim.fire(json!({"event": "FileNoteCreated", "id": "259"})).await;
    assert_eq!(report["occurrences"][0]["calls"][0]["outcome"], "disabled", "{report}");
    s.proxy.fail_with(0);
    let (_, _, v) = s.sim.api(Method::GET, &format!("/{old_id}"), Some("alice-token"), None).await;
    assert_eq!(v["resthooks"]["status"], "Disabled");

    let accounts = sync(&s.relay).await;
    let a = &accounts[0];
    assert_eq!(a["ok"], true, "{a}");
    let change = &a["changes"][0];
    assert_eq!(
        (change["action"].as_str(), change["replaced"][0].as_str()),
        (Some("recreated"), Some(old_id.as_str()))
    );
    let new_id = change["hook_id"].as_str().unwrap();
    assert_ne!(new_id, old_id);
    let hooks = s.sim.all_hooks().await;
    assert_eq!(hooks.len(), 1, "the disabled hook was deleted: {hooks:?}");
    assert_eq!(
        (hooks[0]["id"].as_str(), hooks[0]["status"].as_str()),
        (Some(new_id), Some("Active"))
    );

    let got = gaps.wait_for(1, WAIT).await;
    let gap: Value = serde_json::from_slice(&got[0].body).unwrap();
    let attrs = &gap["data"]["attributes"];
    assert_eq!(
        (attrs["account"].as_str(), attrs["eventName"].as_str()),
        (Some("alice"), Some("FileNoteCreated"))
    );
    assert_eq!(attrs["disabledHookIds"][0], old_id.as_str());
    assert_eq!(attrs["newHookId"], new_id);
    let (start, end) =
        (attrs["windowStart"].as_str().unwrap(), attrs["windowEnd"].as_str().unwrap());
    assert!(start <= end, "{start} .. {end}");
    assert!(got[0].header("webhook-id").is_some());
    // The account shows the gap: its window, hooks and the event that reported it.
    let (_, hooks_now) = s.relay.admin_get("/admin/hooks").await;
    let last = &hooks_now["accounts"][0]["last_gaps"];
    assert_eq!(last.as_array().map(Vec::len), Some(1), "{hooks_now}");
    assert_eq!(
        (
            last[0]["event"].as_str(),
            last[0]["window_start"].as_str(),
            last[0]["window_end"].as_str()
        ),
        (Some("FileNoteCreated"), Some(start), Some(end)),
        "{last}"
    );
    assert_eq!(
        (&last[0]["disabled_hook_ids"][0], &last[0]["new_hook_id"]),
        (&json!(old_id), &json!(new_id))
    );
    let reported_by = last[0]["hook_gap_event"].as_str().unwrap();
    let (_, reporter) = s.relay.admin_get(&format!("/admin/events/{reported_by}")).await;
    assert_eq!(reporter["event"], "hookrelay.HookGap", "{reporter}");

    // The new hook works; the gap went only where it was asked for.
    s.sim.fire(json!({"event": "FileNoteCreated", "id": "260"})).await;
    crm.wait_for(1, WAIT).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(crm.count(), 1);
    assert!(String::from_utf8_lossy(&crm.received()[0].body).contains("\"260\""));
    assert_eq!(gaps.count(), 1);

    let m = s.relay.metrics().await;
    let t = |from, to| {
        metric(
            &m,
            "hookrelay_upstream_hook_transitions_total",
            &[("event", "FileNoteCreated"), ("from", from), ("to", to)],
        )
    };
    assert_eq!(
        (t("Active", "Disabled"), t("Disabled", "Active"), t("none", "Active")),
        (Some(1.0), Some(1.0), Some(1.0)),
        "{m}"
    );
    assert_eq!(
        metric(&m, "hookrelay_events_stored_total", &[("event", "hookrelay.HookGap")]),
        Some(1.0)
    );

    // A crash between storing the HookGap event and forgetting the gap leaves the gap,
    // closed, in the store. The next pass raises it again with the same body: a copy
    // of the same occurrence, dropped by dedup; and the gap is forgotten.
    let closed = json!({
        "hook_ids": [old_id], "window_start": start, "triggered_count": attrs["triggeredCount"],
        "detected_at": attrs["detectedAt"], "closed": {"window_end": end, "new_hook_id": new_id},
    });
    let Setup { _dir: dir, sim: _sim, proxy, mut relay } = s;
    relay.signal(libc::SIGTERM);
    assert!(relay.wait_exit(Duration::from_secs(10)).success());
    {
        let db = sled::open(dir.path()).unwrap();
        let tree = db.open_tree("upstream").unwrap();
        tree.insert(
            format!("gap/{SOURCE}/alice/FileNoteCreated"),
            serde_json::to_vec(&closed).unwrap(),
        )
        .unwrap();
        db.flush().unwrap();
    }
    common::wait_until_sled_unlocked(dir.path());
    let text = std::fs::read_to_string(dir.path().join("hookrelay.toml")).unwrap();
    let relay = Relay::start(dir.path(), &text).await;
    proxy.forward_to(relay.ingress);
    let a = &sync(&relay).await[0];
    assert_eq!(a["ok"], true, "{a}");
    let events = relay
        .admin_until("/admin/events?event=hookrelay.HookGap", WAIT, |v| {
            v["events"].as_array().is_some_and(|e| e.len() == 2 && e[0]["status"] != "received")
        })
        .await;
    assert_eq!(events["events"][0]["status"], "duplicate", "{events}");
    assert_eq!(events["events"][0]["duplicate_of"], events["events"][1]["id"], "{events}");
    // Forgotten: another pass raises nothing.
    sync(&relay).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, again) = relay.admin_get("/admin/events?event=hookrelay.HookGap").await;
    assert_eq!(again["events"].as_array().map(Vec::len), Some(2), "{again}");
    assert_eq!(gaps.count(), 1, "the gap was delivered once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quirky_answers_paging_throttling_and_foreign_hooks() {
    let s = setup(
        "quirks = { single_object = true, triggered_last_timestamp = true }",
        |dir, sim, proxy| {
            let accounts =
                account("alice", sim, "token = \"alice-token\"", "events = [\"ActionCreated\"]")
                    + &account("bob", sim, "token = \"bob-token\"", "page_size = 2\nprune = true");
            relay_config(
                dir,
                proxy,
                r#"["TaskCreated", "TaskUpdated", "StepChanged"]"#,
                &accounts,
                "",
            )
        },
    )
    .await;
    // The relay's own first pass runs at start; a sync waits for it (passes take turns),
    // so the hooks below are only ever seen by the pass this test asserts on.
    sync(&s.relay).await;
    // Someone else's hook, and a stale one of the relay's for an event no longer wanted.
    s.sim.create_hook("bob-token", "TaskCreated", "https://elsewhere.example.com/hook").await;
    let stale = s
        .sim
        .create_hook(
            "bob-token",
            "ParticipantCreated",
            &format!("{}/hooks/{SOURCE}/{TOKEN}/ParticipantCreated", s.proxy.url()),
        )
        .await;

    s.sim.control(Method::POST, "/sim/throttle", json!({"requests": 1, "retry_after": 1})).await;
    let started = Instant::now();
    let accounts = sync(&s.relay).await;
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "Retry-After: 1 honoured ({:?})",
        started.elapsed()
    );
    let (alice, bob) = (find(&accounts, "alice"), find(&accounts, "bob"));
    assert_eq!(
        (alice["ok"].as_bool(), bob["ok"].as_bool()),
        (Some(true), Some(true)),
        "{accounts:?}"
    );
    assert_eq!(alice["hooks"].as_array().map(Vec::len), Some(1));
    assert_eq!(bob["hooks"].as_array().map(Vec::len), Some(3), "{bob}");
    assert_eq!(bob["foreign_hooks"], 1);
    assert!(
        bob["changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["action"] == "pruned" && c["hook_id"] == stale.as_str()),
        "{bob}"
    );
    let all = s.sim.all_hooks().await;
    assert!(
        all.iter().any(|h| h["targetUrl"] == "https://elsewhere.example.com/hook"),
        "foreign hook untouched"
    );
    assert!(!all.iter().any(|h| h["id"] == stale.as_str()));

    // alice's single hook comes back as an object; its trigger time as triggeredLastTimestamp.
    let (_, _, v) = s.sim.api(Method::GET, "", Some("alice-token"), None).await;
    assert!(v["resthooks"].is_object());
    s.sim.fire(json!({"event": "ActionCreated"})).await;
    let accounts = sync(&s.relay).await;
    let alice = find(&accounts, "alice");
    assert!(alice["hooks"][0]["last_triggered"].as_str().is_some(), "{alice}");
    assert_eq!(alice["hooks"][0]["triggered_count"], 1);
    // One time format across the admin API: as events show theirs (RFC 3339, UTC,
    // microseconds, `Z`), whatever form the upstream used.
    let (_, events) = s.relay.admin_get("/admin/events?limit=1").await;
    for t in [
        &alice["hooks"][0]["last_triggered"],
        &alice["last_reconcile"],
        &events["events"][0]["received_at"],
    ] {
        let t = t.as_str().unwrap_or_default();
        let fraction = t.rsplit_once('.').map(|(_, f)| f);
        assert!(
            t.ends_with('Z') && fraction.map(str::len) == Some(7),
            "{t:?} in {alice} / {events}"
        );
    }
    // The same listing after the second sync: nothing to change (no re-create loop on quirks).
    assert!(accounts.iter().all(|a| a["changes"].as_array().unwrap().is_empty()), "{accounts:?}");

    let m = s.relay.metrics().await;
    assert!(
        metric(&m, "hookrelay_upstream_requests_total", &[("outcome", "throttled")]).unwrap()
            >= 1.0,
        "{m}"
    );
    let pruned = [
        ("account", "bob"),
        ("event", "ParticipantCreated"),
        ("from", "Active"),
        ("to", "Deleted"),
    ];
    assert_eq!(metric(&m, "hookrelay_upstream_hook_transitions_total", &pruned), Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_triggers_one_refresh_and_the_rotated_token_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), &sim_config());
    let proxy = Proxy::start().await;
    let oauth = format!(
        "[[sources.accounts]]\nname = \"carol\"\n[sources.accounts.oauth]\ntoken_url = \"{}\"\nclient_id = \"relay\"\nclient_secret = \"relay-secret\"\nrefresh_token = \"carol-rt-1\"\n",
        sim.url("/oauth/token")
    );
    let statics = account("dave", &sim, "token = \"dave-token-unknown\"", "");
    let text = relay_config(dir.path(), &proxy, r#"["ActionUpdated"]"#, &(oauth + &statics), "");
    let mut relay = Relay::start(dir.path(), &text).await;

    let accounts = sync(&relay).await;
    let carol = find(&accounts, "carol");
    assert_eq!(carol["ok"], true, "{carol}");
    assert_eq!(
        carol["hooks"].as_array().map(Vec::len),
        Some(1),
        "api_endpoint of the token answer used"
    );
    let dave = find(&accounts, "dave");
    assert_eq!(dave["ok"], false);
    assert!(dave["errors"][0].as_str().unwrap().contains("static token"), "{dave}");
    let refreshes = |m: &str, outcome| {
        metric(
            m,
            "hookrelay_upstream_token_refreshes_total",
            &[("account", "carol"), ("outcome", outcome)],
        )
    };
    let m = relay.metrics().await;
    assert_eq!(refreshes(&m, "success"), Some(1.0));
    assert_eq!(metric(&m, "hookrelay_upstream_account_up", &[("account", "dave")]), Some(0.0));

    // Access tokens expire: one 401, one refresh, the request retried.
    sim.control(Method::POST, "/sim/tokens/expire", json!({})).await;
    let accounts = sync(&relay).await;
    assert_eq!(find(&accounts, "carol")["ok"], true, "{accounts:?}");
    let m = relay.metrics().await;
    assert_eq!(refreshes(&m, "success"), Some(2.0));
    assert_eq!(
        metric(
            &m,
            "hookrelay_upstream_requests_total",
            &[("account", "carol"), ("method", "GET"), ("outcome", "unauthorized")]
        ),
        Some(1.0)
    );
    let logs = relay.logs();
    assert!(
        !logs.contains("carol-rt") && !logs.contains("rt-") && !logs.contains("at-"),
        "no token in the logs"
    );

    // carol-rt-1 is spent; the rotated refresh token was persisted in the store.
    relay.signal(libc::SIGTERM);
    assert!(relay.wait_exit(WAIT).success());
    drop(relay);
    let relay = Relay::start(dir.path(), &text).await;
    let accounts = sync(&relay).await;
    assert_eq!(find(&accounts, "carol")["ok"], true, "{accounts:?}");
    assert_eq!(find(&accounts, "carol")["changes"].as_array().map(Vec::len), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_is_re_read_when_the_upstream_refuses_the_old_token() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), &sim_config());
    let proxy = Proxy::start().await;
    let token_file = dir.path().join("bob.token");
    std::fs::write(&token_file, "bob-token").unwrap();
    let auth = format!("token_file = {:?}", token_file.display().to_string());
    let text = relay_config(
        dir.path(),
        &proxy,
        r#"["TaskCreated"]"#,
        &account("bob", &sim, &auth, ""),
        "",
    );
    let relay = Relay::start(dir.path(), &text).await;
    assert_eq!(sync(&relay).await[0]["ok"], true);

    // The token is rotated upstream; until the file has it too, the account fails.
    sim.control(Method::PUT, "/sim/users/bob/token", json!({"token": "bob-token-2"})).await;
    let failed = sync(&relay).await;
    assert_eq!(failed[0]["ok"], false);
    assert!(failed[0]["errors"][0].as_str().unwrap().contains("has not changed"), "{failed:?}");
    std::fs::write(&token_file, "bob-token-2\n").unwrap();
    wait_until("the account to recover", || async { sync(&relay).await[0]["ok"] == true }).await;
    assert_eq!(sim.all_hooks().await.len(), 1, "the hook was kept, not duplicated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_local_loop_works() {
    // config/local-loop.toml, moved to free ports and a temporary data dir.
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start_args(&["--user", "alice:alice-token", "--user", "bob:bob-token"]);
    let proxy = Proxy::start().await;
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/local-loop.toml"))
            .unwrap()
            .replace("127.0.0.1:8000", &sim.addr.to_string())
            .replace(
                "public_url = \"http://127.0.0.1:8080\"",
                &format!("public_url = \"{}\"", proxy.url()),
            )
            .replace("127.0.0.1:8080", "127.0.0.1:0")
            .replace("127.0.0.1:8079", "127.0.0.1:0")
            .replace("./data-local-loop", &dir.path().join("data").display().to_string());
    let relay = Relay::start(dir.path(), &text).await;
    proxy.forward_to(relay.ingress);
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(common::binary())
            .args(args)
            .env("HOOKRELAY_ADMIN_URL", format!("http://{}", relay.admin))
            .env("HOOKRELAY_ADMIN_TOKEN", "change-me-admin-token")
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let synced = cli(&["hooks", "sync"]);
    assert!(synced.contains("demo/alice  ok") && synced.contains("demo/bob  ok"), "{synced}");
    cli(&["sim", "fire", "--url", &sim.url(""), "--event", "ActionCreated", "--id", "5"]);
    let sink_url = sim.url("/sim/sink");
    wait_until("the delivery at the sink", || async {
        let v: Value = reqwest::get(&sink_url).await.unwrap().json().await.unwrap();
        !v["received"].as_array().unwrap().is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let v: Value = reqwest::get(&sink_url).await.unwrap().json().await.unwrap();
    let received = v["received"].as_array().unwrap();
    assert_eq!(received.len(), 1, "two callbacks, one delivery: {v}");
    assert_eq!(received[0]["path"], "/sim/sink/crm");
    assert_eq!(received[0]["body"]["data"]["id"], "5");
    assert!(received[0]["headers"]["webhook-id"].is_string());
    // A sub-path lists what was delivered there (the README's /sim/sink/gaps).
    let crm: Value = reqwest::get(sim.url("/sim/sink/crm")).await.unwrap().json().await.unwrap();
    assert_eq!(crm["received"].as_array().unwrap().len(), 1, "{crm}");
    let gaps: Value = reqwest::get(sim.url("/sim/sink/gaps")).await.unwrap().json().await.unwrap();
    assert_eq!(gaps["received"], serde_json::json!([]), "nothing was delivered to gaps");
    let listed = cli(&["hooks", "list"]);
    assert!(listed.contains("TRIGGERED (AS OF "), "the snapshot's age: {listed}");

    // The README's outage: the sink fails for 3 s, the relay retries and delivers.
    let crm_count = || async {
        let v: Value = reqwest::get(sim.url("/sim/sink/crm")).await.unwrap().json().await.unwrap();
        v["received"].as_array().unwrap().len()
    };
    let said = cli(&["sim", "outage", "--url", &sim.url(""), "--seconds", "3"]);
    assert!(said.contains("\"failing_for_seconds\":3"), "{said}");
    cli(&["sim", "fire", "--url", &sim.url(""), "--event", "FileNoteCreated", "--id", "9"]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(crm_count().await, 1, "nothing gets through during the outage");
    // Within the outage, the circuit's probe interval (30 s: a few fast failures open
    // it) and a margin.
    let deadline = Instant::now() + Duration::from_secs(3 + 30 + 15);
    while crm_count().await != 2 {
        assert!(Instant::now() < deadline, "the delivery after the outage did not come");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The README's heal: alice's hook disabled on command, an event fired (her call is
    // lost), a sync re-creates the hook and reports the gap at /sim/sink/gaps.
    let said = cli(&[
        "sim",
        "disable",
        "--url",
        &sim.url(""),
        "--event",
        "ActionCreated",
        "--user",
        "alice",
    ]);
    assert!(said.contains("\"disabled\""), "{said}");
    cli(&["sim", "fire", "--url", &sim.url(""), "--event", "ActionCreated", "--id", "6"]);
    let synced = cli(&["hooks", "sync"]);
    assert!(synced.contains("demo/alice  ok"), "{synced}");
    wait_until("the HookGap at /sim/sink/gaps", || async {
        let v: Value = reqwest::get(sim.url("/sim/sink/gaps")).await.unwrap().json().await.unwrap();
        v["received"].as_array().unwrap().iter().any(|d| {
            d["body"]["event"] == "hookrelay.HookGap" || d["body"].to_string().contains("HookGap")
        })
    })
    .await;
    // Nothing to disable: said plainly.
    let out = std::process::Command::new(common::binary())
        .args(["sim", "disable", "--url", &sim.url(""), "--hook", "999999"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no Active hook matches"));
}
