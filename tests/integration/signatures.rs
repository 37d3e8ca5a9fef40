//! Signed deliveries verify with the Standard Webhooks reference verifier (the
//! `standardwebhooks` Python package, installed by scripts/test.sh).

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::sink::Sink;
use common::Relay;
use serde_json::json;

/// `whsec_` + base64 of 32 bytes.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwRv5D8XT7Qm8=";

const VERIFY: &str = r#"
import json, sys
from standardwebhooks.webhooks import Webhook
case = json.load(open(sys.argv[1]))
wh = Webhook(case["secret"])
body = case["body"].encode()
wh.verify(body, case["headers"])
try:
    wh.verify(body + b" ", case["headers"])
    print("tampered body accepted")
    sys.exit(1)
except Exception:
    pass
print("verified")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_verify_with_the_standard_webhooks_library() {
    let sink = Sink::start().await;
    let tail = format!(
        "\n[[destinations]]\nname = \"signed\"\nurl = \"{}\"\nsecret = \"{SECRET}\"\n",
        sink.url()
    );
    let dir = tempfile::tempdir().unwrap();
    let relay =
        Relay::start(dir.path(), &common::config_with(&dir.path().join("data"), "", &tail)).await;
    let body = r#"{"data":{"type":"actions","id":"5"},"meta":{"debug":{"resthook":{"event_name":"ActionCreated"}}}}"#;
    assert_eq!(relay.callback(None, "application/json", body).await.status(), 200);
    let got = sink.wait_for(1, Duration::from_secs(15)).await;
    let r = &got[0];
    assert!(r.header("webhook-signature").unwrap().starts_with("v1,"));

    verify_with_reference(dir.path(), SECRET, r);
    // The secret never shows in the relay's logs.
    assert!(!relay.logs().contains("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"));
}

/// Verifies the delivery `r` signed with `secret` with the Standard Webhooks reference
/// verifier (and that a tampered body fails it).
pub(crate) fn verify_with_reference(
    dir: &std::path::Path,
    secret: &str,
    r: &common::sink::Received,
) {
    let case = json!({
        "secret": secret,
        "body": String::from_utf8(r.body.clone()).unwrap(),
        "headers": {
            "webhook-id": r.header("webhook-id").unwrap(),
            "webhook-timestamp": r.header("webhook-timestamp").unwrap(),
            "webhook-signature": r.header("webhook-signature").unwrap(),
        }
    });
    let file = dir.join(format!("case-{}.json", fastrand::u64(..)));
    std::fs::write(&file, case.to_string()).unwrap();
    // scripts/test.sh puts the verifier in its virtualenv under target/; a python3 that
    // has it otherwise does as well.
    let venv = concat!(env!("CARGO_MANIFEST_DIR"), "/target/ci-tools/bin/python3");
    let python = if std::path::Path::new(venv).exists() { venv } else { "python3" };
    let out = Command::new(python).arg("-c").arg(VERIFY).arg(&file).output().expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'standardwebhooks'"),
        "the standardwebhooks package is missing: run ./scripts/test.sh, which installs it"
    );
    assert!(
        out.status.success() && stdout.contains("verified"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
}
