//! Back up and restore while it runs (issue 42): `hookrelay backup --to FILE` under a
//! steady load of callbacks takes one consistent snapshot; `--verify` checks it and
//! tells a damaged copy; `hookrelay restore` puts it into an empty data directory
//! (refusing one that holds a store); and a relay started on it delivers every
//! callback acknowledged before the backup began. On redb and on sled alike.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::load::Steady;
use crate::common::sink::{Mode, Sink};
use crate::common::{self, Relay};

/// How long the restored relay has to deliver what the backup owed.
const BOUND: Duration = Duration::from_secs(60);

/// The config of a relay on `engine` in `data`, delivering to `sink`.
fn config(data: &Path, engine: &str, sink: &Sink) -> String {
    let tail = format!("\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n", sink.url());
    common::config_with(data, "", &format!("{}{tail}", common::FAST_RETRY))
        .replace("[storage]\n", &format!("[storage]\nbackend = \"{engine}\"\n"))
}

/// Runs the command line with `args`; (exit code, stdout, stderr).
fn hookrelay(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(common::binary()).args(args).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

async fn a_backup_taken_under_load_restores_and_delivers_what_it_owed(engine: &str) {
    let dir = tempfile::tempdir().unwrap();
    // The consumer is down while the backup is taken: everything is still owed.
    let down = Sink::start().await;
    down.set_mode(Mode::Status(503));
    let relay = Relay::start(dir.path(), &config(&dir.path().join("data"), engine, &down)).await;
    let url = relay.hook_url(Some("ActionCreated"));
    let load =
        Steady::start(url, 200, |n| format!(r#"{{"data":{{"type":"actions","id":"{n}"}}}}"#));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before: Vec<(String, String)> = load.acked.lock().unwrap().clone();
    assert!(before.len() > 100, "only {} acknowledged before the backup", before.len());
    // The backup, while callbacks keep coming.
    let file = dir.path().join("relay.backup");
    let (status, out, err) = {
        let (dir, file) = (dir.path().to_owned(), file.clone());
        let admin = format!("http://{}", relay.admin);
        tokio::task::spawn_blocking(move || {
            let config = dir.join("hookrelay.toml");
            let (config, file) =
                (config.to_str().unwrap().to_owned(), file.to_str().unwrap().to_owned());
            hookrelay(&["backup", "--to", &file, "--config", &config, "--admin-url", &admin])
        })
        .await
        .unwrap()
    };
    assert_eq!(status, 0, "{out}{err}");
    assert!(out.contains("a sound backup"), "{out}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let failed = load.failed.clone();
    let acked = load.stop().await;
    assert!(failed.lock().unwrap().is_empty(), "{:?}", failed.lock().unwrap());
    assert!(acked.len() > before.len());
    // Who took it is journalled.
    let (_, journal) = relay.admin_get("/admin/journal?action=backup").await;
    let entries = journal["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{journal}");
    assert_eq!(entries[0]["who"], "admin");
    assert!(entries[0]["count"].as_u64().unwrap() > before.len() as u64, "{journal}");
    relay.signal(libc::SIGTERM);
    let mut relay = relay;
    assert!(relay.wait_exit(Duration::from_secs(30)).success());

    // --verify: the file is sound; a copy with one byte changed is not.
    let (status, out, _) = hookrelay(&["backup", "--verify", file.to_str().unwrap(), "--json"]);
    assert_eq!(status, 0, "{out}");
    let summary: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(summary["engine"], engine);
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    let damaged = dir.path().join("damaged.backup");
    std::fs::write(&damaged, &bytes).unwrap();
    let (status, _, err) = hookrelay(&["backup", "--verify", damaged.to_str().unwrap()]);
    assert_eq!(status, 1);
    assert!(err.contains("fails its check"), "{err}");

    // The restore, into a new data directory; a second one there is refused.
    let restored = tempfile::tempdir().unwrap();
    let up = Sink::start().await;
    let text = config(&restored.path().join("data"), engine, &up);
    let cfg = restored.path().join("hookrelay.toml");
    std::fs::write(&cfg, &text).unwrap();
    let from = file.to_str().unwrap();
    let (status, out, err) =
        hookrelay(&["restore", "--from", from, "--config", cfg.to_str().unwrap()]);
    assert_eq!(status, 0, "{out}{err}");
    assert!(out.contains("restored"), "{out}");
    let (status, _, err) =
        hookrelay(&["restore", "--from", from, "--config", cfg.to_str().unwrap()]);
    assert_eq!(status, 1);
    assert!(err.contains("holds a store already"), "{err}");
    let (status, _, err) = hookrelay(&[
        "restore",
        "--from",
        damaged.to_str().unwrap(),
        "--config",
        cfg.to_str().unwrap(),
    ]);
    assert_eq!(status, 1);
    assert!(err.contains("checksum") || err.contains("damaged"), "{err}");

    // Progress: the relay on the restored store delivers, within the bound, every
    // callback acknowledged before the backup began.
    let relay = Relay::start(restored.path(), &text).await;
    let owed: std::collections::BTreeSet<&str> = before.iter().map(|(_, b)| b.as_str()).collect();
    let deadline = Instant::now() + BOUND;
    loop {
        let got: std::collections::BTreeSet<String> = up
            .received()
            .iter()
            .filter(|r| r.status == 200)
            .map(|r| String::from_utf8_lossy(&r.body).into_owned())
            .collect();
        let missing = owed.iter().filter(|b| !got.contains(**b)).count();
        if missing == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{missing} owed callbacks not delivered:\n{}",
            relay.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // And each of them is there with its id.
    for (id, body) in before.iter().take(20) {
        let (status, event) = relay.admin_get(&format!("/admin/events/{id}")).await;
        assert_eq!(status, 200, "{id}");
        assert_eq!(event["body"].as_str(), Some(body.as_str()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_of_redb_under_load_restores_and_delivers_what_it_owed() {
    a_backup_taken_under_load_restores_and_delivers_what_it_owed("redb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_of_sled_under_load_restores_and_delivers_what_it_owed() {
    a_backup_taken_under_load_restores_and_delivers_what_it_owed("sled").await;
}

/// A backup whose client stopped reading does not hold the relay's stop: at SIGTERM
/// the backup ends, is journalled (as not finished), its connection is cut, and the
/// relay exits well within its grace, with every callback still there after. (It held
/// the stop for the whole grace, and the cut backup went unjournalled.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_whose_client_stopped_reading_ends_at_the_stop_and_is_journalled() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let text = common::config(&dir.path().join("data"), "")
        .replace("[shutdown]\ngrace = \"5s\"", "[shutdown]\ngrace = \"60s\"");
    assert!(text.contains("grace = \"60s\""), "{text}");
    let relay = Relay::start(dir.path(), &text).await;
    // 40 MiB of bodies: far more than the response's channel and the sockets hold.
    let pad = "x".repeat(1 << 20);
    for n in 0..40 {
        let body = format!(r#"{{"data":{{"type":"actions","id":"{n}"}},"pad":"{pad}"}}"#);
        let answer = relay.callback(Some("ActionCreated"), "application/json", body).await;
        assert_eq!(answer.status(), 200);
    }
    // The client asks for a backup and reads nothing.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(relay.admin).await.unwrap();
    let ask = format!(
        "GET /admin/backup HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer {}\r\n\r\n",
        common::ADMIN_TOKEN
    );
    stalled.write_all(ask.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let asked = Instant::now();
    relay.signal(libc::SIGTERM);
    let mut relay = relay;
    let status = tokio::task::spawn_blocking(move || {
        let status = relay.wait_exit(Duration::from_secs(90));
        (status, relay)
    });
    let (status, relay) = status.await.unwrap();
    let took = asked.elapsed();
    assert!(status.success(), "{}", relay.logs());
    assert!(took < Duration::from_secs(20), "the stop took {took:?} of its 60 s grace");
    drop(stalled);

    // Journalled, as not finished; and every callback is still there.
    let relay = Relay::start(dir.path(), &text).await;
    let (_, journal) = relay.admin_get("/admin/journal?action=backup").await;
    let entries = journal["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{journal}");
    assert_ne!(entries[0]["result"], "ok", "{journal}");
    assert_eq!(relay.all_event_ids().await.len(), 40);
}
