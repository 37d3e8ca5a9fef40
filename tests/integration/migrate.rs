//! `hookrelay migrate --to redb` (and back): a store with delivered, retrying and
//! duplicate events, left by a SIGKILL, moved to the other engine; the relay on the copy
//! delivers everything due, once, and still knows the duplicates it saw before. The
//! upgrade from the old default: an unset `storage.backend` keeps a sled store (and
//! says how to move), and refuses a directory holding both.

use crate::common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::sink::{Mode, Sink};
use common::Relay;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(30);

/// One occurrence as the upstream sends it; `hook` differs between the users who
/// hold a hook for it (the same occurrence, arriving again).
fn occurrence(id: u32, hook: u32) -> String {
    json!({
        "data": {"type": "actions", "id": id.to_string(), "attributes": {"name": format!("n{id}")}},
        "meta": {"debug": {"time": "2026-06-12 13:23:00 +1200",
                 "resthook": {"id": hook.to_string(), "trigger_count": 1}}}
    })
    .to_string()
}

fn migrate(config: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(common::binary());
    cmd.arg("migrate").arg("--config").arg(config).args(args).env_remove("HOOKRELAY_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn check_config(config: &std::path::Path) -> Output {
    Command::new(common::binary())
        .arg("check-config")
        .arg("--config")
        .arg(config)
        .env_remove("HOOKRELAY_CONFIG")
        .env_remove("HOOKRELAY__STORAGE__BACKEND")
        .output()
        .unwrap()
}

/// Removes what a sled store keeps in `data` (what `migrate` lists as left over).
fn remove_sled_files(data: &std::path::Path) {
    for leftover in ["db", "conf", "blobs"] {
        let p = data.join(leftover);
        if p.is_dir() {
            std::fs::remove_dir_all(&p).unwrap();
        } else if p.exists() {
            std::fs::remove_file(&p).unwrap();
        }
    }
    for entry in std::fs::read_dir(data).unwrap().flatten() {
        if entry.file_name().to_string_lossy().starts_with("snap.") {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
}

/// `hookrelay serve` to its end (a relay that refuses to start).
fn serve(config: &std::path::Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(common::binary());
    cmd.arg("serve").arg("--config").arg(config).env_remove("HOOKRELAY_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The webhook-ids the sink answered 200 to, each with how many times.
fn delivered(sink: &Sink) -> std::collections::BTreeMap<String, usize> {
    let mut seen = std::collections::BTreeMap::new();
    for r in sink.received() {
        if r.status == 200 {
            *seen.entry(r.header("webhook-id").unwrap_or_default().to_owned()).or_insert(0) += 1;
        }
    }
    seen
}

async fn post(relay: &Relay, id: u32, hook: u32) -> Value {
    let r = relay.callback(Some("ActionCreated"), "application/json", occurrence(id, hook)).await;
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_moved_to_redb_and_back_delivers_everything_due_once() {
    let sink = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let tail = format!(
        "\n[[destinations]]\nname = \"a\"\nurl = \"{}\"\ntimeout = \"5s\"\n\n[delivery.retry]\ninitial_backoff = \"1s\"\nmax_backoff = \"1s\"\n",
        sink.url()
    );
    let text_cfg = common::config_with(&data, "", &tail);
    let config = dir.path().join("hookrelay.toml");
    std::fs::write(&config, &text_cfg).unwrap();

    // On sled (an earlier release's default, named here: a new directory is redb's): 10
    // delivered, then the consumer fails and 20 more wait for it; each of the 30 also
    // arrives from a second user (a duplicate).
    let sled = [("HOOKRELAY__STORAGE__BACKEND", "sled")];
    let relay = Relay::start_env(dir.path(), &text_cfg, &sled).await;
    for id in 0..10 {
        post(&relay, id, 1).await;
    }
    sink.wait_for(10, WAIT).await;
    sink.set_mode(Mode::Status(503));
    for id in 10..30 {
        post(&relay, id, 1).await;
    }
    for id in 0..30 {
        post(&relay, id, 2).await;
    }
    sink.wait_for(11, WAIT).await; // failing (its circuit may hold the rest back)
    relay
        .admin_until("/admin/events?status=dispatched&limit=100", WAIT, |v| {
            v["events"].as_array().is_some_and(|e| e.len() == 30)
        })
        .await;
    relay
        .admin_until("/admin/events?status=duplicate&limit=100", WAIT, |v| {
            v["events"].as_array().is_some_and(|e| e.len() == 30)
        })
        .await;
    let ids_before = relay.all_event_ids().await;
    assert_eq!(ids_before.len(), 60);
    relay.signal(libc::SIGKILL);
    drop(relay);

    // The configuration leaves the backend unset (the upgrade of a relay that ran on
    // the old default): it goes on on sled, and says how to move.
    let relay = Relay::start(dir.path(), &text_cfg).await;
    assert_eq!(relay.all_event_ids().await, ids_before, "an unset backend kept the sled store");
    let logs = relay.logs();
    assert!(
        logs.contains("running on sled because storage.backend is unset")
            && logs.contains("hookrelay migrate --to redb"),
        "{logs}"
    );
    relay.signal(libc::SIGKILL);
    drop(relay);

    // While the relay is stopped: to redb, the backend still unset. A second run
    // refuses (the copy exists).
    let out = migrate(&config, &["--to", "redb", "--dry-run"], &[]);
    assert!(out.status.success() && text(&out).contains("nothing changed"), "{}", text(&out));
    assert!(!data.join("hookrelay.redb").exists(), "a dry run wrote a database");
    let out = migrate(&config, &["--to", "redb"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("checked entry by entry")
            && said.contains("switched to it")
            && said.contains("backend = \"redb\""),
        "{said}"
    );
    assert_eq!(std::fs::read_to_string(data.join("CURRENT")).unwrap(), "redb\n");
    let out = migrate(&config, &["--to", "redb"], &sled);
    assert!(!out.status.success(), "a second copy over the first");
    assert!(text(&out).contains("already holds a redb database"), "{}", text(&out));
    // Unset, the directory runs on the store CURRENT names, though both are there;
    // set to the old engine, the relay refuses the stale copy, saying what to do.
    let out = check_config(&config);
    assert!(out.status.success(), "{}", text(&out));
    let out = serve(&config, &sled);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("was moved to redb"), "{}", text(&out));

    // On redb, the consumer back: every event due is delivered within the bound, the
    // 10 delivered before are not sent again, and a third user's copy of an old
    // occurrence is still a duplicate.
    sink.set_mode(Mode::Ok);
    let redb = [("HOOKRELAY__STORAGE__BACKEND", "redb")];
    let relay = Relay::start_env(dir.path(), &text_cfg, &redb).await;
    assert_eq!(relay.all_event_ids().await, ids_before, "the same events, in the same order");
    let deadline = Instant::now() + WAIT;
    while delivered(&sink).len() < 30 {
        assert!(Instant::now() < deadline, "not all 30 delivered on redb: {:?}", delivered(&sink));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = post(&relay, 3, 3).await;
    let shown = relay
        .admin_until(&format!("/admin/events/{}", again["id"].as_str().unwrap()), WAIT, |e| {
            e["status"] != "received"
        })
        .await;
    assert_eq!(shown["status"], "duplicate", "the dedup window came along: {shown}");
    let fresh = post(&relay, 99, 1).await;
    let deadline = Instant::now() + WAIT;
    while delivered(&sink).len() < 31 {
        assert!(Instant::now() < deadline, "a new event was not delivered on redb");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(delivered(&sink).values().all(|n| *n == 1), "delivered twice: {:?}", delivered(&sink));
    let _ = fresh;
    let mut relay = relay;
    relay.signal(libc::SIGTERM);
    assert!(relay.wait_exit(WAIT).success());
    drop(relay);

    // And back to sled (the rollback), over the leftovers of the first copy removed.
    remove_sled_files(&data);
    let out = migrate(&config, &["--to", "sled"], &redb);
    assert!(out.status.success(), "{}", text(&out));
    std::fs::remove_file(data.join("hookrelay.redb")).unwrap();
    // The backend unset, the sled store alone: sled.
    let relay = Relay::start(dir.path(), &text_cfg).await;
    let ids = relay.all_event_ids().await;
    assert_eq!(ids.len(), 62, "60, the third user's duplicate and the new one: {ids:?}");
    post(&relay, 100, 1).await;
    let deadline = Instant::now() + WAIT;
    while delivered(&sink).len() < 32 {
        assert!(Instant::now() < deadline, "a new event was not delivered back on sled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(delivered(&sink).values().all(|n| *n == 1), "delivered twice: {:?}", delivered(&sink));
}

#[test]
fn migrate_to_says_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hookrelay.toml");
    std::fs::write(&config, common::config(&dir.path().join("data"), "")).unwrap();
    // Nothing stored yet (the backend unset: redb, a new directory's).
    let out = migrate(&config, &["--to", "sled"], &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("no redb database in"), "{}", text(&out));
    // The engine it is on already.
    let out = migrate(&config, &["--to", "redb"], &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("is redb already"), "{}", text(&out));
    // Not an engine.
    let out = migrate(&config, &["--to", "postgres"], &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("redb"), "{}", text(&out));
}

/// Copies the directory `from` (files and subdirectories) to `to`.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let into = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &into);
        } else {
            std::fs::copy(entry.path(), &into).unwrap();
        }
    }
}

/// `migrate --to redb` killed (SIGKILL) at 12 points from its start to its end: every
/// time, the relay then opens one current store, sled or redb, with every event, and
/// delivers what was due within the bound. Then the state a crash leaves between the
/// switch's commit and the end of its move (the copy's files part moved, part still
/// staged), made on disk as it would be: the next open finishes the move. A copy cut
/// short never makes the relay start on half a store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_killed_at_any_point_leaves_one_current_store_with_everything() {
    let sink = Sink::start().await;
    let root = tempfile::tempdir().unwrap();
    let template = root.path().join("template");
    let tail = format!(
        "\n[[destinations]]\nname = \"a\"\nurl = \"{}\"\n\n[delivery.retry]\n\
         initial_backoff = \"500ms\"\nmax_backoff = \"1s\"\n",
        sink.url()
    );
    // On sled, 300 events with 4 KB bodies, all held (the consumer down): each is due.
    sink.set_mode(Mode::Status(503));
    let sled = [("HOOKRELAY__STORAGE__BACKEND", "sled")];
    let cfg = common::config_with(&template, "", &tail);
    let relay = Relay::start_env(root.path(), &cfg, &sled).await;
    let pad = "x".repeat(4000);
    for id in 0..300u32 {
        let body = json!({"data": {"type": "actions", "id": id.to_string(), "pad": pad}});
        let r = relay.callback(Some("ActionCreated"), "application/json", body.to_string()).await;
        assert_eq!(r.status(), 200);
    }
    let ids = relay.all_event_ids().await;
    assert_eq!(ids.len(), 300);
    let mut relay = relay;
    relay.signal(libc::SIGTERM);
    assert!(relay.wait_exit(WAIT).success());
    drop(relay);
    sink.set_mode(Mode::Ok);

    // How long a whole migration takes here, to spread the kills over it.
    let timing = root.path().join("timing");
    copy_dir(&template, &timing);
    let config = root.path().join("timing.toml");
    std::fs::write(&config, common::config_with(&timing, "", &tail)).unwrap();
    let began = Instant::now();
    let out = migrate(&config, &["--to", "redb"], &sled);
    assert!(out.status.success(), "{}", text(&out));
    let whole = began.elapsed();
    eprintln!("a whole migration took {whole:?}");

    let mut ended = std::collections::BTreeMap::new();
    for i in 0..12u32 {
        let data = root.path().join(format!("run{i}"));
        copy_dir(&template, &data);
        let cfg = common::config_with(&data, "", &tail);
        let config = root.path().join(format!("run{i}.toml"));
        std::fs::write(&config, &cfg).unwrap();
        let mut child = Command::new(common::binary())
            .arg("migrate")
            .arg("--config")
            .arg(&config)
            .args(["--to", "redb"])
            .env_remove("HOOKRELAY_CONFIG")
            .env("HOOKRELAY__STORAGE__BACKEND", "sled")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(whole.mul_f64(f64::from(i) / 11.0));
        let _ = child.kill();
        let finished = child.wait().unwrap().success();
        // Unset backend: the current store, whichever it is, with every event.
        let dir = root.path().join(format!("relay{i}"));
        std::fs::create_dir(&dir).unwrap();
        let before = sink.count();
        let relay = Relay::start(&dir, &cfg).await;
        assert_eq!(relay.all_event_ids().await, ids, "run {i}: every event, in order");
        let on = if relay.logs().contains("running on sled") { "sled" } else { "redb" };
        *ended.entry((on, finished)).or_insert(0) += 1;
        // Everything due is delivered within the bound.
        let deadline = Instant::now() + WAIT;
        while sink.count() < before + 300 {
            let n = sink.count() - before;
            assert!(Instant::now() < deadline, "run {i}: {n} of 300 delivered within {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut relay = relay;
        relay.signal(libc::SIGTERM);
        assert!(relay.wait_exit(WAIT).success(), "run {i}");
    }
    eprintln!("(engine, migration finished) after each kill: {ended:?}");
    assert!(ended.keys().any(|(on, _)| *on == "sled"), "no kill came before the switch");

    // Cut short inside the move to sled: CURRENT says sled, `conf` moved, `db` and
    // `blobs` still staged. The open finishes the move; every event is there and is
    // delivered.
    let data = root.path().join("timing");
    remove_sled_files(&data);
    let out = migrate(&config, &["--to", "sled"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    std::fs::remove_file(data.join("hookrelay.redb")).unwrap();
    let staged = data.join(".migrate-sled");
    std::fs::create_dir(&staged).unwrap();
    for moved_back in ["db", "blobs"] {
        if data.join(moved_back).exists() {
            std::fs::rename(data.join(moved_back), staged.join(moved_back)).unwrap();
        }
    }
    assert_eq!(std::fs::read_to_string(data.join("CURRENT")).unwrap(), "sled\n");
    let cfg = common::config_with(&data, "", &tail);
    let before = sink.count();
    std::fs::create_dir(root.path().join("finish")).unwrap();
    let relay = Relay::start(&root.path().join("finish"), &cfg).await;
    assert!(relay.logs().contains("finished a switch"), "{}", relay.logs());
    assert!(!staged.exists(), "the staging directory is gone");
    assert_eq!(relay.all_event_ids().await, ids, "every event after the finished move");
    let deadline = Instant::now() + WAIT;
    while sink.count() < before + 300 {
        assert!(Instant::now() < deadline, "{} of 300 delivered", sink.count() - before);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
