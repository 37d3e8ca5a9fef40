//! The console, as an operator uses it: a real headless Chromium against a relay
//! holding real events, deliveries and dead letters; what it does is checked through
//! the admin API, and each page with axe-core. Screenshots go to
//! `target/console-screenshots/` (the README's come from there: `docs/console/`).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::browser::Browser;
use crate::common::proxy::Proxy;
use crate::common::sim::Sim;
use crate::common::sink::{Mode, Sink};
use crate::common::{self, Relay, ADMIN_TOKEN};

/// Where the screenshots go.
fn shots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots")
}

/// A relay with two destinations: `crm` answers 200, `erp` 400 (so its deliveries
/// die at once), and callbacks about two resources.
async fn relay_with_history(dir: &std::path::Path) -> (Relay, Sink, Sink, Vec<String>) {
    let crm = Sink::start().await;
    let erp = Sink::start().await;
    erp.set_mode(Mode::Status(400));
    let tail = format!(
        "\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n\n[[destinations]]\nname = \"erp\"\nurl = \"{}\"\n",
        crm.url(),
        erp.url()
    );
    let relay = Relay::start(dir, &common::config_with(&dir.join("data"), "", &tail)).await;
    let mut ids = Vec::new();
    for (kind, id, n) in [("actions", "5", 1), ("tasks", "7", 2), ("actions", "5", 3)] {
        let body = format!(
            r#"{{"data":{{"type":"{kind}","id":"{id}","attributes":{{"subject":"update {n}"}}}}}}"#
        );
        let r = relay.callback(Some("ActionUpdated"), "application/json", body).await;
        assert_eq!(r.status(), 200);
        ids.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned());
    }
    crm.wait_for(3, Duration::from_secs(15)).await;
    relay
        .admin_until("/admin/dead-letters?destination=erp", Duration::from_secs(15), |v| {
            v["dead_letters"].as_array().is_some_and(|a| a.len() == 3)
        })
        .await;
    (relay, crm, erp, ids)
}

/// Signs in through the form.
async fn sign_in(b: &Browser, relay: &Relay, token: &str) {
    b.goto(&format!("http://{}/console/", relay.admin)).await;
    let input = b.find("input[type=password][name=token]").await;
    input.clear().await;
    input.type_text(token).await;
    b.click_button("Sign in").await;
}

/// Asserts that axe-core finds no serious or critical violation on the page.
async fn accessible(b: &Browser, page: &str) {
    let violations = b.accessibility_violations().await;
    assert!(violations.is_empty(), "{page}: {violations:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_signs_in_finds_an_event_replays_a_dead_letter_and_pauses_a_destination() {
    let dir = tempfile::tempdir().unwrap();
    let (relay, _crm, erp, ids) = relay_with_history(dir.path()).await;
    let b = Browser::start().await;
    let base = format!("http://{}", relay.admin);

    // A wrong token is refused with a clear message; the right one signs in.
    b.goto(&format!("{base}/console/")).await;
    b.find("input[type=password]").await;
    b.screenshot(&shots().join("sign-in.png")).await;
    accessible(&b, "sign-in").await;
    sign_in(&b, &relay, "not-the-token").await;
    let refused = b.find("#sign-in-error").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while refused.text().await.is_empty() {
        assert!(std::time::Instant::now() < deadline, "no message for a wrong token");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused.text().await.contains("wrong admin token"), "{}", refused.text().await);
    // The browser logs the refused request itself, and nothing else.
    let logged = b.console_errors().await;
    assert!(
        logged.len() == 1 && logged[0].contains("/console/session") && logged[0].contains("401"),
        "{logged:?}"
    );
    sign_in(&b, &relay, ADMIN_TOKEN).await;
    let overview = b.wait_for_text("Storage and fleet", Duration::from_secs(10)).await;
    for shown in
        ["crm", "erp", "HTTP 400", "circuit closed", "demo", "Relays alive", "above the floor"]
    {
        assert!(overview.contains(shown), "{shown} missing from the overview: {overview}");
    }
    // Each destination with its kind.
    let kinds = b
        .run(
            "return [...document.querySelectorAll('th[scope=row] .kind')].map((k) => k.parentNode.textContent)",
            serde_json::json!([]),
        )
        .await;
    assert!(kinds.as_array().is_some_and(|k| k.contains(&"erp http".into())), "{kinds}");
    // What it shows is what the API says.
    let (_, ov) = relay.admin_get("/admin/overview").await;
    let demo = ov["sources"].as_array().unwrap().iter().find(|s| s["source"] == "demo").unwrap();
    assert_eq!(
        (demo["received"].as_u64(), demo["duplicates"].as_u64()),
        (Some(3), Some(0)),
        "{ov}"
    );
    assert_eq!(ov["relays"], 1);
    assert_eq!(ov["storage"]["backend"], "redb", "a new data directory's default");
    assert!(ov["storage"]["store_bytes"].as_u64().unwrap() > 0, "{ov}");
    assert!(
        ov["storage"]["free_bytes"].as_u64().unwrap()
            > ov["storage"]["floor_bytes"].as_u64().unwrap()
    );
    let (_, dests) = relay.admin_get("/admin/destinations").await;
    let by_name = |n: &str| {
        dests["destinations"].as_array().unwrap().iter().find(|d| d["name"] == n).cloned().unwrap()
    };
    assert_eq!(by_name("crm")["deliveries_per_minute"], 3, "{dests}");
    assert_eq!(by_name("erp")["last_error"], "HTTP 400", "{dests}");
    assert!(by_name("erp")["last_error_at"].is_string());
    // The last hour: three lines per destination (backlog, oldest pending, deliveries
    // per minute), drawn from the relay's own samples and said in words.
    let (_, hist) = relay.admin_get("/admin/destinations/history").await;
    assert_eq!(hist["interval_seconds"], 10, "{hist}");
    let crm = hist["destinations"].as_array().unwrap().iter().find(|d| d["name"] == "crm").cloned();
    assert!(crm.is_some_and(|c| !c["points"].as_array().unwrap().is_empty()), "{hist}");
    let charts = b
        .run(
            "return [...document.querySelectorAll('svg.spark')].map((s) => [s.getAttribute('aria-label'), s.querySelectorAll('polyline').length])",
            json!([]),
        )
        .await;
    let charts = charts.as_array().unwrap();
    assert_eq!(charts.len(), 6, "two destinations, three charts each: {charts:?}");
    for chart in charts {
        assert_eq!(chart[1], 1, "a line: {chart}");
        assert!(chart[0].as_str().unwrap().contains("over the last hour"), "{chart}");
    }
    // Its latest value is a sample taken now: the table's.
    let said = |c: &Value| c[0].as_str().unwrap().to_owned();
    assert!(
        charts.iter().any(|c| said(c).starts_with("crm deliveries per minute: now 3,")),
        "{charts:?}"
    );
    b.screenshot(&shots().join("overview.png")).await;
    accessible(&b, "overview").await;

    // The session is a cookie the page's script cannot read, never the token.
    let cookies = b.cookies().await;
    assert_eq!(cookies.len(), 1, "{cookies:?}");
    assert_eq!(cookies[0]["httpOnly"], true);
    assert_eq!(cookies[0]["sameSite"], "Strict");
    assert!(cookies[0].get("expiry").is_none(), "a browser-session cookie: {cookies:?}");
    assert!(!cookies[0]["value"].as_str().unwrap().contains(ADMIN_TOKEN));
    let script_sees: Value = b.run("return document.cookie;", serde_json::json!([])).await;
    assert_eq!(script_sees, "", "HttpOnly");

    // Find the events about one resource, open one, see its attempts.
    b.goto(&format!("{base}/console/events")).await;
    b.find("input[name=resource]").await.type_text("actions/5").await;
    b.click_button("Search").await;
    // The unfiltered list shows all three: wait for the search's list (two CI runs read
    // the unfiltered one, the second under the search's address: the console changes
    // it before it fetches). A search that does not filter fails here.
    b.wait_for_url("/console/events?resource=actions%2F5", Duration::from_secs(10)).await;
    let listed = b
        .wait_for_text_where(
            "the events of actions/5 alone",
            |t| t.contains(&ids[0]) && t.contains(&ids[2]) && !t.contains(&ids[1]),
            Duration::from_secs(10),
        )
        .await;
    assert!(listed.contains("actions/5") && !listed.contains("tasks/7"), "{listed}");
    accessible(&b, "events").await;
    b.screenshot(&shots().join("events.png")).await;
    // A window of receive time, through the API and on the page.
    let (_, second) = relay.admin_get(&format!("/admin/events/{}", ids[1])).await;
    let from = second["received_at"].as_str().unwrap().to_owned();
    let listed = |v: &Value| -> Vec<String> {
        v["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, after) = relay.admin_get(&format!("/admin/events?since={from}")).await;
    assert_eq!(listed(&after), [ids[2].clone(), ids[1].clone()]);
    let (_, before) = relay.admin_get(&format!("/admin/events?until={from}")).await;
    assert_eq!(listed(&before), [ids[0].clone()]);
    // Each event's badge is its most urgent delivery (crm delivered, erp dead: dead),
    // and the listing filters by it, page by page.
    let (_, dead) = relay.admin_get("/admin/events?delivery=dead&limit=2").await;
    assert_eq!(listed(&dead), [ids[2].clone(), ids[1].clone()], "{dead}");
    assert!(dead["events"].as_array().unwrap().iter().all(|e| e["worst_delivery"] == "dead"));
    let next = dead["next_after"].as_str().unwrap();
    let (_, rest) =
        relay.admin_get(&format!("/admin/events?delivery=dead&limit=2&after={next}")).await;
    assert_eq!(listed(&rest), [ids[0].clone()], "{rest}");
    let (_, none) = relay.admin_get("/admin/events?delivery=retrying").await;
    assert_eq!(listed(&none), Vec::<String>::new(), "{none}");
    b.goto(&format!("http://{}/console/events?delivery=dead", relay.admin)).await;
    let shown = b.wait_for_text("dead (dispatched)", Duration::from_secs(10)).await;
    assert!(shown.contains(&ids[0]), "{shown}");
    let (status, bad) = relay.admin_get("/admin/events?since=yesterday").await;
    assert_eq!(status, 400, "{bad}");
    assert!(bad["error"].as_str().unwrap().contains("since"), "{bad}");
    b.goto(&format!("{base}/console/events?until={from}")).await;
    let shown = b.wait_for_text(&ids[0], Duration::from_secs(10)).await;
    assert!(!shown.contains(&ids[1]) && !shown.contains(&ids[2]), "{shown}");
    let until = b.find("input[name=until]").await.attribute("value").await.unwrap_or_default();
    assert!(!until.is_empty(), "the window is shown in the form");
    b.goto(&format!("{base}/console/events?resource=actions%2F5")).await;
    b.find(&format!("a[href='/console/events/{}']", ids[2])).await.click().await;
    let event = b.wait_for_text(&format!("Event {}", ids[2]), Duration::from_secs(10)).await;
    // Each attempt with the start of its answer ("sink says 400", "thanks").
    for word in [
        "crm",
        "erp",
        "delivered",
        "dead",
        "400",
        "actions/5",
        "update 3",
        "sink says 400",
        "thanks",
    ] {
        assert!(event.contains(word), "{word} missing from the event page: {event}");
    }
    let (_, detail) = relay.admin_get(&format!("/admin/events/{}", ids[2])).await;
    let answers: Vec<_> = detail["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["destination"].clone(), d["attempts"][0]["answer"].clone()))
        .collect();
    assert!(answers.contains(&(json!("erp"), json!("sink says 400"))), "{answers:?}");
    assert!(answers.contains(&(json!("crm"), json!("thanks"))), "{answers:?}");
    accessible(&b, "event").await;
    b.screenshot(&shots().join("event.png")).await;

    // A deep link survives a reload and is opened directly, without signing in again.
    b.reload().await;
    b.wait_for_text(&format!("Event {}", ids[2]), Duration::from_secs(10)).await;
    b.goto(&format!("{base}/console/events/{}", ids[1])).await;
    let other = b.wait_for_text(&format!("Event {}", ids[1]), Duration::from_secs(10)).await;
    assert!(other.contains("tasks/7") && other.contains("dead"), "{other}");

    // Replay one dead letter once the consumer is fixed: it is delivered.
    erp.set_mode(Mode::Ok);
    b.goto(&format!("{base}/console/dead-letters?destination=erp")).await;
    b.wait_for_text(&ids[1], Duration::from_secs(10)).await;
    accessible(&b, "dead letters").await;
    b.screenshot(&shots().join("dead-letters.png")).await;
    b.find(&format!("input[aria-label='Select event {} to erp']", ids[1])).await.click().await;
    b.click_button("Replay selected").await;
    b.confirm("Replay 1 dead letter?").await;
    let status = b.find("#status").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !status.text().await.contains("1 dead letter replayed") {
        assert!(std::time::Instant::now() < deadline, "no count shown: {:?}", status.text().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    erp.wait_for(4, Duration::from_secs(15)).await;
    relay
        .admin_until(&format!("/admin/events/{}", ids[1]), Duration::from_secs(15), |v| {
            v["deliveries"].as_array().is_some_and(|d| {
                d.iter().any(|d| d["destination"] == "erp" && d["state"] == "delivered")
            })
        })
        .await;
    let (_, left) = relay.admin_get("/admin/dead-letters?destination=erp").await;
    assert_eq!(left["dead_letters"].as_array().unwrap().len(), 2, "only the one chosen: {left}");
    // Discard another one: it leaves the dead letters as `discarded`.
    b.goto(&format!("{base}/console/dead-letters?destination=erp")).await;
    b.find(&format!("input[aria-label='Select event {} to erp']", ids[0])).await.click().await;
    b.click_button("Discard selected").await;
    b.confirm("Discard 1 dead letter?").await;
    let status = b.find("#status").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !status.text().await.contains("1 dead letter discarded") {
        assert!(std::time::Instant::now() < deadline, "no count shown: {:?}", status.text().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, first) = relay.admin_get(&format!("/admin/events/{}", ids[0])).await;
    let erp_state =
        first["deliveries"].as_array().unwrap().iter().find(|d| d["destination"] == "erp").unwrap()
            ["state"]
            .clone();
    assert_eq!(erp_state, "discarded");
    let (_, left) = relay.admin_get("/admin/dead-letters?destination=erp").await;
    let left: Vec<&str> = left["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["event"].as_str().unwrap())
        .collect();
    assert_eq!(left, [ids[2].as_str()]);
    // Dead letters by receive time.
    let (_, third) = relay.admin_get(&format!("/admin/events/{}", ids[2])).await;
    let at = third["received_at"].as_str().unwrap();
    let (_, later) = relay.admin_get(&format!("/admin/dead-letters?until={at}")).await;
    assert!(later["dead_letters"].as_array().unwrap().is_empty(), "{later}");
    let (_, since) = relay.admin_get(&format!("/admin/dead-letters?since={at}")).await;
    assert_eq!(since["dead_letters"].as_array().unwrap().len(), 1, "{since}");

    // Pause and resume a destination: the API sees each change.
    b.goto(&format!("{base}/console/destinations")).await;
    let shown = b.wait_for_text("order: none", Duration::from_secs(10)).await;
    assert!(shown.contains("sources: *") && shown.contains("8 of 8"), "route and share: {shown}");
    accessible(&b, "destinations").await;
    b.screenshot(&shots().join("destinations.png")).await;
    b.click_button("Pause crm").await;
    b.confirm("Pause crm?").await;
    relay
        .admin_until("/admin/destinations", Duration::from_secs(10), |v| {
            paused(v, "crm") == Some(true)
        })
        .await;
    b.click_button("Resume crm").await;
    b.confirm("Resume crm?").await;
    relay
        .admin_until("/admin/destinations", Duration::from_secs(10), |v| {
            paused(v, "crm") == Some(false)
        })
        .await;
    b.goto(&format!("{base}/console/hooks")).await;
    b.wait_for_text("Sync now", Duration::from_secs(10)).await;
    accessible(&b, "hooks").await;

    // Readable at 360 px: no page scrolls sideways (wide tables scroll inside).
    b.resize(360, 800).await;
    let event_page = format!("/console/events/{}", ids[2]);
    for (page, shown) in [
        ("/console/", "Storage and fleet"),
        ("/console/events?resource=actions%2F5", "Resource"),
        (event_page.as_str(), "Deliveries"),
        ("/console/dead-letters", "Replay selected"),
        ("/console/destinations", "Route"),
        ("/console/hooks", "Sync now"),
    ] {
        b.goto(&format!("{base}{page}")).await;
        b.wait_for_text(shown, Duration::from_secs(10)).await;
        let width =
            b.run("return document.documentElement.scrollWidth;", serde_json::json!([])).await;
        assert!(width.as_u64().unwrap() <= 360, "{page} is {width} px wide at 360");
        if page == "/console/" {
            b.screenshot(&shots().join("overview-360.png")).await;
        }
    }

    // No console error on any page, and the token in no page source nor log line.
    assert_eq!(b.console_errors().await, Vec::<String>::new());
    assert!(!b.source().await.contains(ADMIN_TOKEN));
    assert!(!relay.logs().contains(ADMIN_TOKEN), "the token is in the relay's log");
}

/// The hooks page against a simulated upstream: each hook with its state, the
/// upstream's count against the callbacks stored, and "Sync now" with its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hooks_page_shows_each_hook_against_what_was_stored_and_syncs_now() {
    let dir = tempfile::tempdir().unwrap();
    let sink = Sink::start().await;
    let sim_config =
        format!("callback_retries = 1\ncallback_retry_backoff = \"50ms\"\n{}", common::sim::USERS);
    let sim = Sim::start(dir.path(), &sim_config);
    let proxy = Proxy::start().await;
    let tail = format!(
        "events = [\"ActionCreated\"]\n[[sources.accounts]]\nname = \"alice\"\napi_base = \"{}\"\ntoken = \"alice-token\"\n\n[upstream]\npublic_url = \"{}\"\nreconcile_interval = \"1h\"\n\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n",
        sim.api_base(),
        proxy.url(),
        sink.url()
    );
    let relay =
        Relay::start(dir.path(), &common::config_with(&dir.path().join("data"), "", &tail)).await;
    proxy.forward_to(relay.ingress);
    let b = Browser::start().await;
    sign_in(&b, &relay, ADMIN_TOKEN).await;
    b.wait_for_text("Storage and fleet", Duration::from_secs(10)).await;
    b.goto(&format!("http://{}/console/hooks", relay.admin)).await;
    b.click_button("Sync now").await;
    let status = b.find("#status").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !status.text().await.contains("Sync done") {
        assert!(std::time::Instant::now() < deadline, "no sync result: {:?}", status.text().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.wait_for_text("alice", Duration::from_secs(10)).await;
    let report = sim.fire(serde_json::json!({"event": "ActionCreated", "id": "77"})).await;
    assert_eq!(report["occurrences"][0]["calls"][0]["outcome"], "delivered", "{report}");
    sink.wait_for(1, Duration::from_secs(20)).await;
    b.click_button("Sync now").await;
    // One row: ActionCreated, active, triggered 1, stored 1, missing 0.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let cells: Vec<String> = {
            let mut v = Vec::new();
            for c in b.find_all("section[aria-label='demo / alice'] tbody td").await {
                v.push(c.text().await);
            }
            v
        };
        if cells.len() >= 6 && cells[3] == "1" {
            assert_eq!(cells[0], "ActionCreated", "{cells:?}");
            assert_eq!(cells[2], "active", "{cells:?}");
            assert_eq!(
                (cells[4].as_str(), cells[5].as_str()),
                ("1", "0"),
                "stored, missing: {cells:?}"
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "hooks never showed the call: {cells:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The relay looks broken to the upstream: the hook is Disabled; "Sync now"
    // re-creates it, and the gap's window links to the HookGap event reporting it.
    proxy.fail_with(500);
    let report = sim.fire(serde_json::json!({"event": "ActionCreated", "id": "78"})).await;
    assert_eq!(report["occurrences"][0]["calls"][0]["outcome"], "disabled", "{report}");
    proxy.fail_with(0);
    b.click_button("Sync now").await;
    let gap = b.find("section[aria-label='demo / alice'] tbody td:nth-child(8) a").await;
    gap.click().await;
    let page = b.wait_for_text("hookrelay.HookGap", Duration::from_secs(10)).await;
    assert!(page.contains("windowStart") && page.contains("ActionCreated"), "{page}");
    b.goto(&format!("http://{}/console/hooks", relay.admin)).await;
    b.find("section[aria-label='demo / alice'] tbody td:nth-child(8) a").await;
    accessible(&b, "hooks").await;
    b.screenshot(&shots().join("hooks.png")).await;
    assert_eq!(b.console_errors().await, Vec::<String>::new());
    assert!(!b.source().await.contains("alice-token") && !b.source().await.contains(common::TOKEN));
}

/// Whether `name` is paused in a `GET /admin/destinations` answer.
fn paused(v: &Value, name: &str) -> Option<bool> {
    v["destinations"].as_array()?.iter().find(|d| d["name"] == name)?["paused"].as_bool()
}

/// Without the browser: the headers, the cookie's rules, CSRF on every change, and
/// the sign-in throttle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_sessions_need_their_csrf_token_and_wrong_tokens_are_throttled() {
    let dir = tempfile::tempdir().unwrap();
    let tail = "\n[[destinations]]\nname = \"crm\"\nurl = \"http://127.0.0.1:9/\"\n";
    let relay =
        Relay::start(dir.path(), &common::config_with(&dir.path().join("data"), "", tail)).await;
    let base = format!("http://{}", relay.admin);
    let http =
        reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();

    // Every console page: the shell, with a strict policy; deep links too.
    for path in ["/console/", "/console/events/123", "/console/dead-letters?destination=crm"] {
        let r = http.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let csp = r.headers()["content-security-policy"].to_str().unwrap().to_owned();
        assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"), "{csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert_eq!(r.headers()["x-frame-options"], "DENY");
        assert_eq!(r.headers()["referrer-policy"], "no-referrer");
        let page = r.text().await.unwrap();
        assert!(page.contains("<input") || page.contains("console.js"), "{page}");
        assert!(!page.contains("<script>"), "no inline script");
    }
    let r = http.get(format!("{base}/console")).send().await.unwrap();
    assert_eq!(r.status(), 308);
    assert_eq!(r.headers()["location"], "/console/");

    // The API refuses a session it did not issue, and a change without the CSRF token.
    let forged = http
        .get(format!("{base}/admin/destinations"))
        .header("cookie", "hookrelay_console=v1.1.0000000000000000.00")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 401);
    let signed = http
        .post(format!("{base}/console/session"))
        .json(&serde_json::json!({ "token": ADMIN_TOKEN }))
        .send()
        .await
        .unwrap();
    assert_eq!(signed.status(), 200);
    let set_cookie = signed.headers()["set-cookie"].to_str().unwrap().to_owned();
    for part in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set_cookie.contains(part), "{set_cookie}");
    }
    assert!(!set_cookie.contains("Max-Age") && !set_cookie.contains("Expires"), "{set_cookie}");
    let cookie = set_cookie.split(';').next().unwrap().to_owned();
    let csrf = signed.json::<Value>().await.unwrap()["csrf"].as_str().unwrap().to_owned();
    let read =
        http.get(format!("{base}/admin/destinations")).header("cookie", &cookie).send().await;
    assert_eq!(read.unwrap().status(), 200, "a read needs the cookie only");
    let pause = format!("{base}/admin/destinations/crm/pause");
    let no_csrf = http.post(&pause).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(no_csrf.status(), 403);
    let wrong = http.post(&pause).header("cookie", &cookie).header("x-csrf-token", "00").send();
    assert_eq!(wrong.await.unwrap().status(), 403);
    let (_, v) = relay.admin_get("/admin/destinations").await;
    assert_eq!(paused(&v, "crm"), Some(false), "refused changes changed nothing");
    let ok = http.post(&pause).header("cookie", &cookie).header("x-csrf-token", &csrf).send();
    assert_eq!(ok.await.unwrap().status(), 200);
    let (_, v) = relay.admin_get("/admin/destinations").await;
    assert_eq!(paused(&v, "crm"), Some(true));
    // Signing out needs the CSRF token too, and clears the cookie.
    let out = http.delete(format!("{base}/console/session")).header("cookie", &cookie).send();
    assert_eq!(out.await.unwrap().status(), 403);
    let out = http
        .delete(format!("{base}/console/session"))
        .header("cookie", &cookie)
        .header("x-csrf-token", &csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 204);
    assert!(out.headers()["set-cookie"].to_str().unwrap().contains("Max-Age=0"));

    // Wrong tokens: a clear message, then refused unread for a while.
    let attempt = || {
        http.post(format!("{base}/console/session"))
            .json(&serde_json::json!({ "token": "guess" }))
            .send()
    };
    for _ in 0..5 {
        let r = attempt().await.unwrap();
        assert_eq!(r.status(), 401);
        let msg = r.json::<Value>().await.unwrap()["error"].as_str().unwrap().to_owned();
        assert!(
            msg.contains("wrong admin token") && msg.contains("HOOKRELAY__ADMIN__TOKEN"),
            "{msg}"
        );
    }
    let r = attempt().await.unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let right = http
        .post(format!("{base}/console/session"))
        .json(&serde_json::json!({ "token": ADMIN_TOKEN }))
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), 429, "even the right token waits: nothing is read meanwhile");
    let metrics = relay.metrics().await;
    assert!(
        metrics.contains("hookrelay_console_sign_ins_total{result=\"wrong_token\"} 5"),
        "{metrics}"
    );
    assert!(
        metrics.contains("hookrelay_console_sign_ins_total{result=\"throttled\"} 2"),
        "{metrics}"
    );
    assert!(!relay.logs().contains(ADMIN_TOKEN) && !relay.logs().contains("guess"));
}

/// A client bound to the loopback address `from` (127.0.0.0/8 is all this machine's).
fn client_from(from: [u8; 4]) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(std::net::IpAddr::from(from))
        .timeout(Duration::from_secs(30))
        .pool_idle_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// A flood of wrong tokens (1,000 bearer tokens on /admin from one address, eight at
/// a time) is throttled for that address only: the right token from another address
/// is let in at once, on the API and at the console's sign-in, while the flood goes
/// on; the flooding address is refused unread even with the right token. A sign-in
/// that is not JSON, or comes from a page of another origin, is refused before it
/// costs anyone a try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_wrong_tokens_is_throttled_per_address_and_never_locks_out_the_right_one() {
    let dir = tempfile::tempdir().unwrap();
    let relay =
        Relay::start(dir.path(), &common::config_with(&dir.path().join("data"), "", "")).await;
    let base = format!("http://{}", relay.admin);
    let (flooder, operator) = (client_from([127, 0, 0, 1]), client_from([127, 0, 0, 2]));
    // Cross-site or plain sign-ins: refused, and no try spent.
    for _ in 0..10 {
        let plain =
            operator.post(format!("{base}/console/session")).header("content-type", "text/plain");
        let r = plain.body(r#"{"token":"guess"}"#).send().await.unwrap();
        assert_eq!(r.status(), 415);
        let r = operator
            .post(format!("{base}/console/session"))
            .header("origin", "https://evil.example")
            .json(&json!({"token": "guess"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403);
        assert!(r.text().await.unwrap().contains("another origin"));
    }
    let flood = {
        let (flooder, base) = (flooder.clone(), base.clone());
        tokio::spawn(async move {
            let mut statuses = std::collections::BTreeMap::new();
            let mut sent = 0;
            while sent < 1_000 {
                let batch: Vec<_> = (0..8)
                    .map(|i| {
                        flooder
                            .get(format!("{base}/admin/destinations"))
                            .bearer_auth(format!("wrong-token-{sent}-{i}"))
                            .send()
                    })
                    .collect();
                for r in futures_util::future::join_all(batch).await {
                    *statuses.entry(r.unwrap().status().as_u16()).or_insert(0) += 1;
                }
                sent += 8;
            }
            statuses
        })
    };
    // While it floods: the operator's right token, at once, every time.
    let mut checked = 0;
    while !flood.is_finished() || checked < 5 {
        let started = std::time::Instant::now();
        let r = operator.get(format!("{base}/admin/destinations")).bearer_auth(ADMIN_TOKEN).send();
        assert_eq!(r.await.unwrap().status(), 200);
        let r = operator
            .post(format!("{base}/console/session"))
            .header("origin", &base)
            .json(&json!({"token": ADMIN_TOKEN}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        checked += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let statuses = flood.await.unwrap();
    assert_eq!(statuses.get(&401), Some(&5), "{statuses:?}");
    assert_eq!(statuses.get(&429), Some(&(1_000 - 5)), "{statuses:?}");
    // The flooding address waits, whatever it sends.
    let r = flooder.get(format!("{base}/admin/destinations")).bearer_auth(ADMIN_TOKEN).send();
    let r = r.await.unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let metrics = relay.metrics().await;
    let refused = |result: &str| {
        common::metric(&metrics, "hookrelay_admin_token_refusals_total", &[("result", result)])
    };
    assert_eq!(refused("wrong_token"), Some(5.0));
    assert_eq!(refused("throttled"), Some(996.0));
    assert!(!relay.logs().contains("wrong-token-"), "no token in the logs");
}
