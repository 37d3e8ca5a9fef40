//! The journal of admin changes, as an auditor reads it: every replay, discard, pause,
//! resume, hook sync and sign-in (failed ones too) made through the API or the console
//! shows in `GET /admin/journal` with the token's name, the address, the time, what it
//! was on, how many and the result; on the embedded store across a restart, and on
//! PostgreSQL across two relays (`postgres::` has that one).

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::sink::{Mode, Sink};
use crate::common::{self, Relay, ADMIN_TOKEN};

pub(crate) const OPERATOR: &str = "crm-team-token-0123456789abcdef";

/// `[[admin.tokens]]`: the crm team's operator token.
pub(crate) fn operator_token() -> String {
    format!(
        "\n[[admin.tokens]]\nname = \"crm-team\"\nrole = \"operator\"\ndestinations = [\"crm\"]\ntoken = \"{OPERATOR}\"\n"
    )
}

/// One call with `token`: its status and JSON.
pub(crate) async fn call(
    relay: &Relay,
    token: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    relay.admin_as(token, method, path, body).await
}

/// The journal's entries as `(who, action, count, result)`, newest first.
pub(crate) async fn journal(relay: &Relay, query: &str) -> Vec<(String, String, u64, String)> {
    let (status, page) =
        call(relay, OPERATOR, "GET", &format!("/admin/journal{query}"), None).await;
    assert_eq!(status, 200, "{page}");
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap().to_owned();
            (s("who"), s("action"), e["count"].as_u64().unwrap(), s("result"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_and_sign_in_is_journalled_with_who_where_and_how_many() {
    let dir = tempfile::tempdir().unwrap();
    let crm = Sink::start().await;
    crm.set_mode(Mode::Status(400));
    // Where the journal's operational events go, for whoever keeps its own record.
    let audit_log = Sink::start().await;
    let tail = format!(
        r#"
[[destinations]]
name = "crm"
url = "{}"
events = ["ActionCreated"]
[[destinations]]
name = "audit-log"
url = "{}"
events = ["hookrelay.AdminAction"]
{}"#,
        crm.url(),
        audit_log.url(),
        operator_token()
    );
    let text = common::config_with(&dir.path().join("data"), "", &tail);
    let relay = Relay::start(dir.path(), &text).await;
    let mut ids = Vec::new();
    for n in 0..2 {
        let body = format!(r#"{{"data":{{"type":"actions","id":"{n}"}}}}"#);
        let r = relay.callback(Some("ActionCreated"), "application/json", body).await;
        ids.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned());
    }
    relay
        .admin_until("/admin/dead-letters", Duration::from_secs(15), |v| {
            v["dead_letters"].as_array().is_some_and(|d| d.len() == 2)
        })
        .await;
    assert!(journal(&relay, "").await.is_empty(), "reading changes nothing");

    // The console: a wrong token, then the crm team signs in and out.
    let client = reqwest::Client::new();
    let session = format!("http://{}/console/session", relay.admin);
    let r =
        client.post(&session).json(&json!({ "token": "not-a-token-at-all" })).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = client.post(&session).json(&json!({ "token": OPERATOR })).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let cookie = r.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_owned();
    let csrf = r.json::<Value>().await.unwrap()["csrf"].as_str().unwrap().to_owned();
    let r = client
        .delete(&session)
        .header("cookie", &cookie)
        .header("x-csrf-token", &csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);

    // The API: a replay of one dead letter, a pause and a resume, a bulk discard.
    let chosen = json!({ "dead_letters": [{ "event": ids[0], "destination": "crm" }] });
    let (status, _) =
        call(&relay, OPERATOR, "POST", "/admin/dead-letters/selection/replay", Some(chosen)).await;
    assert_eq!(status, 200);
    assert_eq!(
        call(&relay, ADMIN_TOKEN, "POST", "/admin/destinations/crm/pause", None).await.0,
        200
    );
    assert_eq!(
        call(&relay, ADMIN_TOKEN, "POST", "/admin/destinations/crm/resume", None).await.0,
        200
    );
    relay
        .admin_until("/admin/dead-letters", Duration::from_secs(15), |v| {
            v["dead_letters"].as_array().is_some_and(|d| d.len() == 2)
        })
        .await;
    let (status, answer) =
        call(&relay, OPERATOR, "DELETE", "/admin/dead-letters?destination=crm", None).await;
    assert_eq!((status, answer["deleted"].as_u64()), (200, Some(2)), "{answer}");
    // A refused request changed nothing, and is not a change.
    assert_eq!(call(&relay, OPERATOR, "POST", "/admin/destinations/erp/pause", None).await.0, 403);

    let expected = [
        ("crm-team", "discard", 2, "ok"),
        ("admin", "resume", 1, "ok"),
        ("admin", "pause", 1, "ok"),
        ("crm-team", "replay", 1, "ok"),
        ("crm-team", "sign_out", 1, "ok"),
        ("crm-team", "sign_in", 1, "ok"),
        ("", "sign_in_failed", 0, "wrong token"),
    ];
    let as_owned = |e: &[(&str, &str, u64, &str)]| -> Vec<(String, String, u64, String)> {
        e.iter().map(|(w, a, n, r)| ((*w).into(), (*a).into(), *n, (*r).into())).collect()
    };
    assert_eq!(journal(&relay, "").await, as_owned(&expected));

    // Each change also went out as a hookrelay.AdminAction to the destination that asks.
    let sent: Vec<String> = audit_log
        .wait_for(expected.len(), Duration::from_secs(15))
        .await
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    assert!(
        sent.iter()
            .any(|b| b.contains("\"action\":\"discard\"") && b.contains("\"id\":\"crm-team\"")),
        "{sent:?}"
    );

    // Each entry says where from, when, and on what.
    let (_, page) = call(&relay, OPERATOR, "GET", "/admin/journal?action=replay", None).await;
    let replay = &page["entries"][0];
    assert_eq!(replay["from"], "127.0.0.1");
    assert_eq!(replay["target"]["dead_letters"][0]["event"], ids[0].as_str(), "{replay}");
    let at = replay["at"].as_str().unwrap();
    assert!(at.starts_with("20") && at.ends_with('Z'), "{at}");
    // Filters and pages.
    assert_eq!(journal(&relay, "?who=admin").await.len(), 2);
    assert_eq!(journal(&relay, "?who=crm-team&action=discard").await.len(), 1);
    let (_, first) = call(&relay, OPERATOR, "GET", "/admin/journal?limit=4", None).await;
    let next = first["next_before"].as_str().unwrap();
    let rest = journal(&relay, &format!("?before={next}")).await;
    assert_eq!(rest, as_owned(&expected[4..]));
    let (status, bad) =
        call(&relay, OPERATOR, "GET", "/admin/journal?action=delete_all", None).await;
    assert_eq!(status, 400, "{bad}");

    // The command line reads it too, as a table and as JSON.
    let cli = |args: &[&str]| {
        let (code, out, err) = relay.cli(dir.path(), &[&["journal"], args].concat());
        assert_eq!(code, 0, "{err}");
        out
    };
    let table = cli(&["--who", "crm-team"]);
    assert!(
        table.starts_with("AT") && table.contains("WHO") && table.contains("RESULT"),
        "{table}"
    );
    assert_eq!(table.lines().filter(|l| l.contains("crm-team")).count(), 4, "{table}");
    assert!(!table.contains("admin "), "{table}");
    let json: Value = serde_json::from_str(&cli(&["--action", "pause", "--json"])).unwrap();
    assert_eq!(json["entries"].as_array().unwrap().len(), 1, "{json}");
    assert_eq!(json["entries"][0]["who"], "admin");

    // Durable: the same journal after a restart.
    drop(relay);
    let relay = Relay::start(dir.path(), &text).await;
    assert_eq!(journal(&relay, "").await, as_owned(&expected));
}
