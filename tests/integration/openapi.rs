//! The admin API against its own OpenAPI document: the document a relay serves is the
//! committed one, and schemathesis (a property-based API fuzzer, PyPI) finds no 5xx,
//! no answer outside the schema, no undocumented status and no undeclared method
//! answered other than 405, on a relay with data in it.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::sink::{Mode, Sink};
use common::Relay;
use serde_json::Value;

/// scripts/test.sh installs schemathesis (pinned) in a virtualenv of its own.
const PULL_TOKEN: &str = "pull-token-0123456789abcdef";
const SCHEMATHESIS: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/target/schemathesis/bin/schemathesis");

/// A relay holding events of every kind: about a record, binary, rejected, and with a
/// dead letter (the destination answers 422).
async fn relay_with_data(dir: &std::path::Path, sink: &Sink) -> Relay {
    sink.set_mode(Mode::Status(422));
    let tail = format!(
        "\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n\n[[destinations]]\nname = \"feed\"\nkind = \"pull\"\ntoken = \"{PULL_TOKEN}\"\n",
        sink.url()
    );
    // schemathesis tries wrong and missing tokens on purpose, from the address it
    // then uses the right one from: the throttle raised for it (429 is documented).
    let text = common::config_with(&dir.join("data"), "max_body_bytes = 2048", &tail)
        .replace("[admin]\n", "[admin]\nwrong_tokens_per_minute = 1000000\n");
    let relay = Relay::start(dir, &text).await;
    for (event, body) in [
        ("ActionCreated", r#"{"data":{"type":"actions","id":"5","attributes":{}}}"#.to_owned()),
        ("ActionUpdated", r#"{"data":{"type":"actions","id":5}}"#.to_owned()),
        ("TaskCreated", "not json at all".to_owned()),
        ("TaskUpdated", "x".repeat(4096)),
    ] {
        let r = relay.callback(Some(event), "application/json", body).await;
        assert_eq!(r.status(), 200);
    }
    let r = relay
        .callback(Some("ContactCreated"), "application/octet-stream", vec![0xff, 0xfe, 0])
        .await;
    assert_eq!(r.status(), 200);
    relay
        .admin_until("/admin/dead-letters", Duration::from_secs(15), |v| {
            v["dead_letters"].as_array().is_some_and(|d| d.len() >= 3)
        })
        .await;
    relay
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_is_the_committed_one() {
    let sink = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let relay = relay_with_data(dir.path(), &sink).await;
    let (status, served) = relay.admin_get("/admin/openapi.json").await;
    assert_eq!(status, 200);
    let committed: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        served, committed,
        "docs/openapi.json is out of date: hookrelay openapi > docs/openapi.json"
    );
    assert_eq!(served["openapi"], "3.1.0");
    // An undeclared method on a declared path: 405 with what is allowed.
    let r = reqwest::Client::new()
        .put(format!("http://{}/admin/events", relay.admin))
        .bearer_auth(common::ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing() {
    assert!(
        std::path::Path::new(SCHEMATHESIS).exists(),
        "{SCHEMATHESIS} is missing: scripts/test.sh installs it (python3 -m venv target/schemathesis && target/schemathesis/bin/pip install schemathesis==4.32.5)"
    );
    let sink = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let relay = relay_with_data(dir.path(), &sink).await;
    let url = format!("http://{}", relay.admin);
    let schema = dir.path().join("openapi.json");
    let workdir = dir.path().to_owned(); // schemathesis keeps its cache in the working directory
    let (_, served) = relay.admin_get("/admin/openapi.json").await;
    std::fs::write(&schema, served.to_string()).unwrap();
    // The admin listener's operations with the admin token; then the pull API's, on
    // the public listener, with the pull destination's token.
    // The pull run names the one pull destination (schemathesis.toml's parameters in
    // its own working directory), so that its requests reach more than a 404.
    let pull_dir = workdir.join("pull");
    std::fs::create_dir_all(&pull_dir).unwrap();
    std::fs::write(
        pull_dir.join("schemathesis.toml"),
        "[parameters]\n\"path.destination\" = \"feed\"\n",
    )
    .unwrap();
    let runs = [
        (url, common::ADMIN_TOKEN.to_owned(), "--exclude-path-regex", workdir.clone()),
        (
            format!("http://{}", relay.ingress),
            PULL_TOKEN.to_owned(),
            "--include-path-regex",
            pull_dir,
        ),
    ];
    let mut text = String::new();
    for (url, token, filter, workdir) in runs {
        let schema = schema.clone();
        let out = tokio::task::spawn_blocking(move || {
            Command::new(SCHEMATHESIS)
                .current_dir(&workdir)
                .arg("run")
                .arg(&schema)
                .args(["--url", &url])
                .args(["-H", &format!("Authorization: Bearer {token}")])
                .args([filter, "^/pull/"])
                // Every check but "valid-looking data is accepted": a well-formed name of a
                // destination that does not exist is rightly refused.
                .args(["--checks", "all", "--exclude-checks", "positive_data_acceptance"])
                .args(["--max-examples", "60", "--seed", "1", "--workers", "1"])
                .env("NO_COLOR", "1")
                .output()
                .expect("run schemathesis")
        })
        .await
        .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "schemathesis found problems ({filter}):\n{said}");
        assert!(said.contains("No issues found"), "{said}");
        text.push_str(&said);
    }
    let document: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json"))
            .unwrap(),
    )
    .unwrap();
    // Each run's operations (a path item's `servers` is not an operation).
    let count = |pull: bool| -> usize {
        let paths = document["paths"].as_object().unwrap();
        let ops = paths.iter().filter(|(p, _)| p.starts_with("/pull/") == pull);
        ops.map(|(_, item)| item.as_object().unwrap().keys().filter(|k| *k != "servers").count())
            .sum()
    };
    for operations in [count(false), count(true)] {
        assert!(
            text.contains(&format!("Tested: {operations}")),
            "every operation ({operations}) was tested: {text}"
        );
    }
    // The relay took all of it without a failed task.
    let (status, _) = relay.admin_get("/admin/destinations").await;
    assert_eq!(status, 200);
}
