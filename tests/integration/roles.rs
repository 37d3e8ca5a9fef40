//! Roles, tried as the people who hold them: a helpdesk viewer, a consumer team's
//! operator scoped to its own destination, and the admin, on a relay holding dead
//! letters for two destinations. Every route of the served OpenAPI document is called
//! with every role and held to the table below (a route missing from it fails the
//! test); then what each role sees and may change is checked through the API and in
//! a real browser.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::browser::Browser;
use crate::common::sink::{Mode, Sink};
use crate::common::{self, Relay, ADMIN_TOKEN};
use crate::journal::call;

const VIEWER: &str = "helpdesk-token-0123456789abcdef";
const OPERATOR: &str = "crm-team-token-0123456789abcdef";

/// The role each route needs, as the issue states it (not read from the code):
/// reading is a viewer's, changing an operator's, a preview (it shows a body) an
/// admin's.
const NEEDS: &[(&str, &str, &str)] = &[
    ("GET", "/admin/openapi.json", "viewer"),
    ("GET", "/admin/events", "viewer"),
    ("GET", "/admin/events/{id}", "viewer"),
    ("POST", "/admin/events/{id}/replay", "operator"),
    ("GET", "/admin/dead-letters", "viewer"),
    ("DELETE", "/admin/dead-letters", "operator"),
    ("POST", "/admin/dead-letters/replay", "operator"),
    ("POST", "/admin/dead-letters/selection/replay", "operator"),
    ("POST", "/admin/dead-letters/selection/discard", "operator"),
    ("GET", "/admin/audit", "viewer"),
    ("GET", "/admin/overview", "viewer"),
    ("GET", "/admin/destinations", "viewer"),
    ("POST", "/admin/destinations/{name}/pause", "operator"),
    ("POST", "/admin/destinations/{name}/resume", "operator"),
    ("POST", "/admin/destinations/{name}/preview", "admin"),
    ("GET", "/admin/hooks", "viewer"),
    ("POST", "/admin/hooks/sync", "operator"),
    ("POST", "/admin/reload", "admin"),
    ("GET", "/admin/backup", "admin"),
    ("GET", "/admin/destinations/history", "viewer"),
    ("GET", "/admin/journal", "viewer"),
];

/// The roles from least to most.
const ROLES: [(&str, &str); 3] =
    [("viewer", VIEWER), ("operator", OPERATOR), ("admin", ADMIN_TOKEN)];

fn rank(role: &str) -> usize {
    ROLES.iter().position(|(r, _)| *r == role).expect("a role")
}

/// A relay whose `crm` and `erp` both answer 400: every callback leaves a dead letter
/// for each. Its tokens: the admin's, a viewer's, and an operator's scoped to `crm`.
async fn relay_with_dead_letters(dir: &std::path::Path) -> (Relay, Sink, Sink, Vec<String>) {
    let (crm, erp) = (Sink::start().await, Sink::start().await);
    crm.set_mode(Mode::Status(400));
    erp.set_mode(Mode::Status(400));
    let tail = format!(
        r#"
[[destinations]]
name = "crm"
url = "{}"
[[destinations]]
name = "erp"
url = "{}"
[[admin.tokens]]
name = "helpdesk"
role = "viewer"
token = "{VIEWER}"
[[admin.tokens]]
name = "crm-team"
role = "operator"
destinations = ["crm"]
token = "{OPERATOR}"
"#,
        crm.url(),
        erp.url()
    );
    let text = common::config_with(&dir.join("data"), "", &tail)
        .replace("[admin]\n", "[admin]\nwrong_tokens_per_minute = 1000\n");
    let relay = Relay::start(dir, &text).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let body = format!(
            r#"{{"data":{{"type":"actions","id":"{n}","attributes":{{"secret":"client matter {n}"}}}}}}"#
        );
        let r = relay.callback(Some("ActionCreated"), "application/json", body).await;
        assert_eq!(r.status(), 200);
        ids.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned());
    }
    relay
        .admin_until("/admin/dead-letters", Duration::from_secs(20), |v| {
            v["dead_letters"].as_array().is_some_and(|d| d.len() == 6)
        })
        .await;
    (relay, crm, erp, ids)
}

/// Every route of the served document, with every role: refused (403, naming the
/// role needed) below its rule, let through at or above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_holds_every_role_to_its_rule() {
    let dir = tempfile::tempdir().unwrap();
    let (relay, _crm, _erp, ids) = relay_with_dead_letters(dir.path()).await;
    let (status, document) = relay.admin_get("/admin/openapi.json").await;
    assert_eq!(status, 200);
    let mut tried = 0;
    for (path, item) in document["paths"].as_object().unwrap() {
        if !path.starts_with("/admin") {
            continue;
        }
        for method in item.as_object().unwrap().keys() {
            let method = method.to_uppercase();
            let needs = NEEDS
                .iter()
                .find(|(m, p, _)| *m == method && p == path)
                .map(|(_, _, r)| *r)
                .unwrap_or_else(|| panic!("{method} {path} has no rule in this test's table"));
            let concrete = path.replace("{id}", &ids[0]).replace("{name}", "crm");
            let body = match path.as_str() {
                "/admin/dead-letters/selection/replay"
                | "/admin/dead-letters/selection/discard" => {
                    Some(json!({ "dead_letters": [{ "event": ids[2], "destination": "crm" }] }))
                }
                "/admin/destinations/{name}/preview" => Some(json!({ "event": ids[0] })),
                "/admin/events/{id}/replay" => Some(json!({ "destinations": ["crm"] })),
                _ => None,
            };
            for (role, token) in ROLES {
                let (status, answer) = call(&relay, token, &method, &concrete, body.clone()).await;
                if rank(role) < rank(needs) {
                    assert_eq!(status, 403, "{role} on {method} {path}: {answer}");
                    let message = answer["error"].as_str().unwrap_or_default();
                    assert!(
                        message.contains(&format!("needs the {needs} role")),
                        "{role} on {method} {path}: {message}"
                    );
                } else {
                    assert!(
                        status != 403 && status != 401 && status < 500,
                        "{role} on {method} {path}: {status} {answer}"
                    );
                }
                tried += 1;
            }
        }
    }
    assert_eq!(tried, NEEDS.len() * ROLES.len(), "every rule of the table was tried");
}

/// The viewer reads everything but bodies and headers; the operator scoped to `crm`
/// sees and changes crm's dead letters, never erp's, and sees no body either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_sees_no_body_and_a_scoped_operator_acts_on_its_own_destination_only() {
    let dir = tempfile::tempdir().unwrap();
    let (relay, _crm, _erp, ids) = relay_with_dead_letters(dir.path()).await;
    let event = format!("/admin/events/{}", ids[0]);

    let (status, admin_view) = call(&relay, ADMIN_TOKEN, "GET", &event, None).await;
    assert_eq!(status, 200);
    assert!(admin_view["body"].as_str().unwrap().contains("client matter 0"), "{admin_view}");
    assert_eq!(admin_view["redacted"], false);
    assert!(!admin_view["headers"].as_object().unwrap().is_empty());
    for token in [VIEWER, OPERATOR] {
        let (status, view) = call(&relay, token, "GET", &event, None).await;
        assert_eq!(status, 200);
        assert_eq!(view["redacted"], true, "{view}");
        assert!(
            view["body"].is_null() && view["headers"].as_object().unwrap().is_empty(),
            "{view}"
        );
        assert!(!view.to_string().contains("client matter"), "{view}");
    }
    let (_, viewer_view) = call(&relay, VIEWER, "GET", &event, None).await;
    assert_eq!(
        viewer_view["deliveries"].as_array().unwrap().len(),
        2,
        "a viewer without scope sees all"
    );

    // The operator's view: crm only.
    let (_, op_view) = call(&relay, OPERATOR, "GET", &event, None).await;
    let seen: Vec<&str> = op_view["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["destination"].as_str().unwrap())
        .collect();
    assert_eq!(seen, ["crm"]);
    let (_, dead) = call(&relay, OPERATOR, "GET", "/admin/dead-letters", None).await;
    let dead = dead["dead_letters"].as_array().unwrap();
    assert!(dead.len() == 3 && dead.iter().all(|d| d["destination"] == "crm"), "{dead:?}");
    let (_, listed) = call(&relay, OPERATOR, "GET", "/admin/destinations", None).await;
    assert_eq!(listed["destinations"].as_array().unwrap().len(), 1, "{listed}");
    // The audit too: crm's row only, beside every event's (a viewer sees every event).
    let mut audits = Vec::new();
    for token in [VIEWER, OPERATOR] {
        let (status, audit) = call(&relay, token, "GET", "/admin/audit", None).await;
        assert_eq!(status, 200, "{audit}");
        let rows = audit["destinations"].as_array().unwrap().iter();
        let names: Vec<String> = rows.map(|d| d["destination"].as_str().unwrap().into()).collect();
        audits.push((names, audit["events"].as_array().unwrap().len()));
    }
    assert_eq!(audits[0].0, ["crm", "erp"]);
    assert_eq!(audits[1], (vec!["crm".to_owned()], audits[0].1));

    // Acting on erp is refused, each way it can be asked, and nothing changes.
    for (method, path, body) in [
        ("POST", "/admin/dead-letters/replay?destination=erp".to_owned(), None),
        ("DELETE", "/admin/dead-letters?destination=erp".to_owned(), None),
        (
            "POST",
            "/admin/dead-letters/selection/replay".to_owned(),
            Some(json!({ "dead_letters": [{ "event": ids[0], "destination": "erp" }] })),
        ),
        (
            "POST",
            "/admin/dead-letters/selection/discard".to_owned(),
            Some(
                json!({ "dead_letters": [{ "event": ids[0], "destination": "crm" }, { "event": ids[0], "destination": "erp" }] }),
            ),
        ),
        (
            "POST",
            format!("/admin/events/{}/replay", ids[0]),
            Some(json!({ "destinations": ["erp"] })),
        ),
        ("POST", "/admin/destinations/erp/pause".to_owned(), None),
    ] {
        let (status, answer) = call(&relay, OPERATOR, method, &path, body).await;
        assert_eq!(status, 403, "{method} {path}: {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains("scoped to destination(s) crm"),
            "{answer}"
        );
    }
    let (_, all) = relay.admin_get("/admin/dead-letters").await;
    assert_eq!(
        all["dead_letters"].as_array().unwrap().len(),
        6,
        "a refused request changed something"
    );

    // Replaying "everything" as the crm team replays crm's: erp's stay dead.
    let (status, answer) = call(&relay, OPERATOR, "POST", "/admin/dead-letters/replay", None).await;
    assert_eq!((status, answer["replayed"].as_u64()), (200, Some(3)), "{answer}");
    let (_, erp_dead) = relay.admin_get("/admin/dead-letters?destination=erp").await;
    assert_eq!(erp_dead["dead_letters"].as_array().unwrap().len(), 3);
    // An event replayed without naming destinations goes to the operator's own.
    let (status, answer) =
        call(&relay, OPERATOR, "POST", &format!("/admin/events/{}/replay", ids[1]), None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["destinations"], json!(["crm"]));
    // The viewer changes nothing at all.
    let (status, answer) = call(&relay, VIEWER, "POST", "/admin/dead-letters/replay", None).await;
    assert_eq!(status, 403);
    assert!(
        answer["error"].as_str().unwrap().contains("token \"helpdesk\" is a viewer"),
        "{answer}"
    );
}

/// Waits until the element `css` shows `needle` (outside `main`: the header, the
/// status line).
async fn shown(b: &Browser, css: &str, needle: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = b.find(css).await.text().await;
        if text.contains(needle) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{css} shows {text:?}, not {needle:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Signs in with `token` through the console's form.
async fn sign_in(b: &Browser, relay: &Relay, token: &str) {
    b.goto(&format!("http://{}/console/", relay.admin)).await;
    let input = b.find("input[type=password][name=token]").await;
    input.clear().await;
    input.type_text(token).await;
    b.click_button("Sign in").await;
}

/// In the browser: the viewer is told who it is, sees no body and no button that
/// would change something; the crm team sees crm's dead letters only, and replays
/// them from the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_each_role_what_it_may_see_and_do() {
    let dir = tempfile::tempdir().unwrap();
    let (relay, _crm, _erp, ids) = relay_with_dead_letters(dir.path()).await;
    let b = Browser::start().await;
    let base = format!("http://{}", relay.admin);

    sign_in(&b, &relay, VIEWER).await;
    shown(&b, "#who", "helpdesk (viewer)").await;
    b.goto(&format!("{base}/console/events/{}", ids[0])).await;
    b.find("#redacted").await;
    let violations = b.accessibility_violations().await;
    assert!(violations.is_empty(), "the viewer's event page: {violations:#?}");
    let page = b.source().await;
    assert!(!page.contains("client matter"), "the viewer's page holds the body");
    assert!(!page.contains(">Replay"), "the viewer is offered a replay");
    b.goto(&format!("{base}/console/dead-letters")).await;
    b.wait_for_text("Dead letters", Duration::from_secs(10)).await;
    assert!(b.find_all("tbody tr").await.len() >= 6);
    assert!(!b.source().await.contains("Replay selected"), "the viewer is offered a replay");
    b.goto(&format!("{base}/console/destinations")).await;
    b.wait_for_text("Destinations", Duration::from_secs(10)).await;
    assert!(!b.source().await.contains(">Pause "), "the viewer is offered a pause");
    b.click_button("Sign out").await;

    sign_in(&b, &relay, OPERATOR).await;
    shown(&b, "#who", "crm-team (operator · crm)").await;
    b.goto(&format!("{base}/console/dead-letters")).await;
    b.wait_for_text("Replay selected", Duration::from_secs(10)).await;
    let rows = b.find_all("tbody tr").await;
    assert_eq!(rows.len(), 3, "the crm team sees crm's dead letters only");
    for row in rows {
        assert!(!row.text().await.contains("erp"));
    }
    b.click_button("Replay all matching").await;
    b.confirm("Replay all").await;
    shown(&b, "#status", "3 dead letters replayed").await;
    let (_, erp_dead) = relay.admin_get("/admin/dead-letters?destination=erp").await;
    assert_eq!(erp_dead["dead_letters"].as_array().unwrap().len(), 3, "erp's were left alone");

    // The journal page shows what each did: the sign-ins, and the crm team's replay.
    b.goto(&format!("{base}/console/journal")).await;
    let text = b.wait_for_text("crm-team", Duration::from_secs(10)).await;
    for (who, action) in [("helpdesk", "sign_in"), ("helpdesk", "sign_out"), ("crm-team", "replay")]
    {
        assert!(
            text.lines().any(|l| l.contains(who) && l.contains(action)),
            "{who} {action} not in the journal page: {text}"
        );
    }
    let violations = b.accessibility_violations().await;
    assert!(violations.is_empty(), "the journal page: {violations:#?}");
    b.screenshot(
        &std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target/console-screenshots/journal.png"),
    )
    .await;
    assert!(b.console_errors().await.is_empty(), "{:?}", b.console_errors().await);
}
