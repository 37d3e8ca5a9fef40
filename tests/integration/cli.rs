//! The command line: help, check-config, and serve's refusal of bad config.

use crate::common;

use std::process::{Command, Output};

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(common::binary());
    cmd.args(args).env_remove("HOOKRELAY_CONFIG").env_remove("HOOKRELAY_LOG_FORMAT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_explains_the_commands() {
    let out = run(&["--help"], &[]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for needle in ["serve", "check-config", "HOOKRELAY__SECTION__KEY", "--log-format"] {
        assert!(help.contains(needle), "{needle} missing from:\n{help}");
    }
    let out = run(&["serve", "--help"], &[]);
    let help = text(&out.stdout);
    assert!(help.contains("SIGTERM") && help.contains("config/hookrelay.toml"), "{help}");
    let out = run(&["--version"], &[]);
    assert!(text(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn check_config_prints_the_shipped_config_masked() {
    let out = run(&["check-config"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains("name = \"demo\""), "{shown}");
    assert!(shown.contains("token = \"********\""), "{shown}");
    assert!(!shown.contains("demo-token-change-me"), "{shown}");
    assert!(!shown.contains("change-me-admin-token"), "{shown}");
}

#[test]
fn check_config_applies_environment_overrides() {
    let out = run(
        &["check-config"],
        &[
            ("HOOKRELAY__INGRESS__MAX_BODY_BYTES", "4096"),
            ("HOOKRELAY__STORAGE__DURABILITY", "buffered"),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains("max_body_bytes = 4096"), "{shown}");
    assert!(shown.contains("durability = \"buffered\""), "{shown}");
}

#[test]
fn bad_config_exits_1_naming_each_problem() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[[sources]]\nname = \"a b\"\ntoken = \"short\"\n").unwrap();
    let path = path.to_str().unwrap();
    for cmd in ["check-config", "serve"] {
        let out = run(&[cmd, "--config", path], &[]);
        assert_eq!(out.status.code(), Some(1), "{cmd}");
        let err = text(&out.stderr);
        assert!(err.contains("sources[0].name"), "{cmd}: {err}");
        assert!(err.contains("sources[0].token: too short"), "{cmd}: {err}");
        assert!(!err.contains("short\""), "the token itself is not echoed: {err}");
    }
    let out = run(&["check-config", "--config", "/nonexistent/x.toml"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("does not exist"));
    let out = run(&["check-config"], &[("HOOKRELAY__INGRESS__LISTN", "x")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("listn"), "{}", text(&out.stderr));
}

#[test]
fn serve_reports_a_port_in_use() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let config = common::config(&dir.path().join("data"), "").replace(
        "listen = \"127.0.0.1:0\"\nworkers",
        &format!("listen = \"127.0.0.1:{port}\"\nworkers"),
    );
    std::fs::write(&path, config).unwrap();
    let out = run(&["serve", "--config", path.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("binding ingress.listen 127.0.0.1:{port}")), "{err}");
    assert!(
        err.contains("another process listens on") && err.contains("set another ingress.listen"),
        "{err}"
    );
}

/// `check-config | head -1`: the reader goes away; the command ends quietly, no panic.
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let mut child = Command::new(common::binary())
        .args(["check-config", "--config", "config/hookrelay.toml"])
        .env_remove("HOOKRELAY_CONFIG")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end before the command writes.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.trim().is_empty(), "nothing to say about a closed pipe: {err}");
}

/// A second relay on a data directory in use says so plainly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_relay_on_the_same_data_dir_says_it_is_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::config(&dir.path().join("data"), "");
    let _first = common::Relay::start(dir.path(), &config).await;
    let second = tempfile::tempdir().unwrap();
    let path = second.path().join("c.toml");
    std::fs::write(&path, &config).unwrap();
    let out = run(&["serve", "--config", path.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("is in use by another process"), "{err}");
    assert!(err.contains("another hookrelay"), "{err}");
    assert_eq!(err.matches("is in use by another process").count(), 1, "said once: {err}");
}

/// The relay's memory is held in base pages (a transparent huge page is resident whole
/// however little of it is used): the kernel says so of the running process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_holds_no_memory_in_transparent_huge_pages() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::config(&dir.path().join("data"), "");
    let relay = common::Relay::start(dir.path(), &config).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", relay.pid())).unwrap();
    let thp: Vec<Vec<&str>> = status
        .lines()
        .filter(|l| l.starts_with("THP_enabled:"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(thp, vec![vec!["THP_enabled:", "0"]], "{status}");
}

/// A config full of credentials outside `token`/`secret` fields: check-config shows
/// none of them, and neither does a validation error about a URL.
#[test]
fn check_config_masks_url_passwords_query_values_and_header_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let secrets = ["URLPASSWORD1", "QUERYKEY2", "HEADERVALUE3", "APIBASEPW4", "PUBLICPW5"];
    let config = format!(
        "{}\n[[destinations]]\nname = \"crm\"\nurl = \"http://u:{}@crm.example/in?key={}&v=1\"\n\
         [destinations.headers]\nx-api-key = \"{}\"\n",
        common::config(&dir.path().join("data"), ""),
        secrets[0],
        secrets[1],
        secrets[2]
    )
    .replace(
        "[[sources]]",
        &format!(
            "[upstream]\npublic_url = \"https://relay:{}@relay.example\"\n\n[[sources]]",
            secrets[4]
        ),
    );
    std::fs::write(&path, &config).unwrap();
    let out = run(&["check-config", "--config", path.to_str().unwrap()], &[]);
    let shown = text(&out.stdout) + &text(&out.stderr);
    assert!(out.status.success(), "{shown}");
    for secret in secrets {
        assert!(!shown.contains(secret), "{secret} shown:\n{shown}");
    }
    assert!(shown.contains("crm.example/in?key="), "the URL stays recognisable:\n{shown}");
    assert!(shown.contains("x-api-key"), "header names stay:\n{shown}");

    // A URL the validation rejects is echoed masked.
    let bad = config.replace("url = \"http://u:", "url = \"ftp://u:");
    std::fs::write(&path, bad).unwrap();
    let out = run(&["check-config", "--config", path.to_str().unwrap()], &[]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("destinations[0].url"), "{err}");
    for secret in secrets {
        assert!(!err.contains(secret), "{secret} in the error:\n{err}");
    }
}
