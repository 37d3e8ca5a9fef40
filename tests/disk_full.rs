//! Free-space admission on a real full filesystem: a small tmpfs mounted for the test
//! (the tests run as root in CI), filled until free space is below the floor, then
//! freed again. Skipped, saying so, only where mounting is impossible.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::load::{Acked, Load};
use common::{metric, Relay};

/// A small filesystem mounted for a test: a tmpfs, or an ext4 image on a loop device.
/// Always unmounted (and the image removed) when dropped.
struct Scratch {
    dir: tempfile::TempDir,
    image: Option<tempfile::NamedTempFile>,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Tmpfs,
    Ext4,
}

impl Scratch {
    /// `None` (with the reason printed) only where this process cannot mount.
    fn mount(kind: Kind, mib: u64) -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut image = None;
        let out = match kind {
            Kind::Tmpfs => Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
                .arg(dir.path())
                .output(),
            Kind::Ext4 => {
                let file = tempfile::NamedTempFile::new().expect("image file");
                file.as_file().set_len(mib << 20).expect("size the image");
                let mkfs = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(file.path()).output();
                match mkfs {
                    Ok(o) if o.status.success() => {}
                    other => panic!("mkfs.ext4 failed (is e2fsprogs installed?): {other:?}"),
                }
                let out = Command::new("mount")
                    .args(["-o", "loop"])
                    .arg(file.path())
                    .arg(dir.path())
                    .output();
                image = Some(file);
                out
            }
        };
        match out {
            Ok(o) if o.status.success() => Some(Self { dir, image }),
            Ok(o) => {
                eprintln!(
                    "SKIPPED: cannot mount a {kind:?} here (needs root and loop devices): {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: cannot run mount: {e}");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Lazy, so a file still open somewhere cannot keep the mount.
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
        let _ = self.image.take();
    }
}

/// Writes `mib` MiB of zeros to `path`.
fn fill(path: &PathBuf, mib: usize) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("filler");
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..mib {
        f.write_all(&chunk).expect("filler write");
    }
    f.sync_all().expect("filler sync");
}

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_floor_callbacks_are_refused_and_come_back_when_space_is_freed() {
    let Some(fs) = Scratch::mount(Kind::Tmpfs, 64) else { return };
    let data = fs.path().join("data");
    let text = common::config(&data, "")
        .replace("[storage]", "[storage]\nmin_free_bytes = 16777216\nmin_free_percent = 0.0");
    let work = tempfile::tempdir().unwrap();
    let relay = Relay::start(work.path(), &text).await;

    let first = relay.callback(Some("ActionCreated"), "application/json", "{\"data\":1}").await;
    assert_eq!(first.status(), 200);

    // Leave well under 16 MiB free.
    let filler = fs.path().join("filler");
    fill(&filler, 54);
    let deadline = Instant::now() + WAIT;
    let reason = loop {
        let r = reqwest::get(format!("http://{}/readyz", relay.admin)).await.unwrap();
        if r.status() == 503 {
            break r.text().await.unwrap();
        }
        assert!(Instant::now() < deadline, "still ready with the disk nearly full");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(reason.contains("below the floor") && reason.contains("min_free_bytes"), "{reason}");

    // Refused the way a store failure is: no HTTP answer at all (any status would
    // lose the event or disable the hook); nothing stored.
    let refused = reqwest::Client::new()
        .post(relay.hook_url(Some("ActionCreated")))
        .body("{\"data\":2}")
        .send()
        .await;
    let err = refused.expect_err("a callback below the floor must get no answer");
    assert!(err.status().is_none(), "{err:?}");
    let text = relay.metrics().await;
    let refused = metric(&text, "hookrelay_ingress_requests_total", &[("outcome", "no_space")]);
    assert_eq!(refused, Some(1.0), "counted");
    assert_eq!(metric(&text, "hookrelay_ready", &[]), Some(0.0));
    let free = metric(&text, "hookrelay_storage_free_bytes", &[]).unwrap();
    let floor = metric(&text, "hookrelay_storage_floor_bytes", &[]).unwrap();
    assert!(free < floor && floor == 16_777_216.0, "free {free}, floor {floor}");
    assert!(relay.logs().contains("refusing callbacks"), "the crossing is logged");

    // Space freed: ready again, callbacks stored, all by itself.
    std::fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let r = reqwest::get(format!("http://{}/readyz", relay.admin)).await.unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "not ready again after space was freed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = relay.callback(Some("ActionCreated"), "application/json", "{\"data\":3}").await;
    assert_eq!(again.status(), 200);
    let id = again.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let (status, _) = relay.admin_get(&format!("/admin/events/{id}")).await;
    assert_eq!(status, 200, "stored");
    drop(relay);
}

/// Every acknowledged callback is stored with its exact body.
async fn check_acked(relay: &common::Relay, acked: &[(String, String)]) {
    use futures_util::StreamExt;
    let bad: Vec<String> = futures_util::stream::iter(acked.iter().cloned())
        .map(|(id, body)| async move {
            let (status, v) = relay.admin_get(&format!("/admin/events/{id}")).await;
            let sent: serde_json::Value = serde_json::from_str(&body).unwrap();
            let stored = v["body"].as_str().and_then(|b| serde_json::from_str(b).ok());
            if status == 200 && stored.as_ref() == Some(&sent) {
                None
            } else {
                Some(format!("{id}: status {status}, body {}", v["body"]))
            }
        })
        .buffer_unordered(8)
        .filter_map(|r| async move { r })
        .collect()
        .await;
    assert!(
        bad.is_empty(),
        "{} of {} acknowledged callbacks lost or damaged, e.g. {:?}",
        bad.len(),
        acked.len(),
        &bad[..bad.len().min(5)]
    );
}

/// Fills the disk (no free-space floor, so the store really meets ENOSPC) from 8
/// clients, five times: each time the relay must stop by itself with a non-zero exit
/// (fail-stop: never wedge, never keep answering on a failed store); after space is
/// freed it must start again, hold every callback it ever acknowledged with its exact
/// body, and take callbacks again.
async fn fill_and_restart(kind: Kind) {
    let Some(fs) = Scratch::mount(kind, 48) else { return };
    const CYCLES: usize = 5;
    // Room handed back after each fill.
    let fillers: Vec<PathBuf> = (0..CYCLES).map(|i| fs.path().join(format!("filler{i}"))).collect();
    for f in &fillers {
        fill(f, 6);
    }
    let data = fs.path().join("data");
    let tail = "\n[[destinations]]\nname = \"down\"\nurl = \"http://127.0.0.1:9/\"\n";
    let text = common::config_with(&data, "", tail).replace(
        "[storage]",
        "[storage]\nmin_free_bytes = 0\nmin_free_percent = 0.0\nwrite_timeout = \"5s\"",
    );
    let work = tempfile::tempdir().unwrap();
    let acked: Acked = Acked::default();
    for (cycle, filler) in fillers.iter().enumerate() {
        let mut relay = common::Relay::start(work.path(), &text).await;
        let so_far = acked.lock().unwrap().clone();
        check_acked(&relay, &so_far).await;

        let pad = "x".repeat(700);
        let load = Load::start(
            8,
            vec![relay.hook_url(Some("ActionCreated"))],
            Duration::ZERO,
            acked.clone(),
            move |k, n| format!(r#"{{"cycle":{cycle},"client":{k},"n":{n},"pad":"{pad}"}}"#),
        );
        let deadline = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(status) = relay.exited() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "{kind:?} cycle {cycle}: the relay neither filled the disk nor stopped; logs:\n{}",
                relay.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        load.stop().await;
        let logs = relay.logs();
        assert!(!status.success(), "{kind:?} cycle {cycle}: a failed store must exit non-zero");
        assert!(logs.contains("the store failed"), "{kind:?} cycle {cycle}: {logs}");
        let total = acked.lock().unwrap().len();
        assert!(
            total > so_far.len(),
            "{kind:?} cycle {cycle}: nothing acknowledged before the disk filled"
        );
        eprintln!(
            "{kind:?} cycle {cycle}: {} acknowledged, relay exited {status}",
            total - so_far.len()
        );
        std::fs::remove_file(filler).unwrap();
    }
    let relay = common::Relay::start(work.path(), &text).await;
    let all = acked.lock().unwrap().clone();
    check_acked(&relay, &all).await;
    let again = relay.callback(Some("ActionCreated"), "application/json", "{\"data\":1}").await;
    assert_eq!(again.status(), 200, "callbacks taken again once space was freed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_callbacks_survive_repeated_full_disks_on_tmpfs() {
    fill_and_restart(Kind::Tmpfs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_callbacks_survive_repeated_full_disks_on_ext4() {
    fill_and_restart(Kind::Ext4).await;
}

/// Writes zeros to `path` until the filesystem is full.
fn fill_up(path: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("filler");
    let chunk = vec![0u8; 64 << 10];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
}

/// SIGTERM with the disk completely full (filled by another process, past the floor)
/// stops the relay within its grace period, and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_on_a_full_disk_ends_within_the_grace_period() {
    let Some(fs) = Scratch::mount(Kind::Tmpfs, 64) else { return };
    let data = fs.path().join("data");
    let work = tempfile::tempdir().unwrap();
    let text = common::config(&data, "");
    let mut relay = common::Relay::start(work.path(), &text).await;
    let mut ids = Vec::new();
    for n in 0..20 {
        let r = relay
            .callback(Some("ActionCreated"), "application/json", format!("{{\"n\":{n}}}"))
            .await;
        assert_eq!(r.status(), 200);
        ids.push(r.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_owned());
    }
    let filler = fs.path().join("filler");
    fill_up(&filler);
    // A callback now is refused (floor, or the store failing), never answered non-200.
    if let Ok(r) = relay.client.post(relay.hook_url(Some("ActionCreated"))).body("{}").send().await
    {
        assert_eq!(r.status(), 200, "a valid callback got {}", r.status());
    }
    let stopping = Instant::now();
    relay.signal(libc::SIGTERM);
    // shutdown.grace is 5 s in the test config; a little more for the process to go.
    relay.wait_exit(Duration::from_secs(9));
    eprintln!("stopped in {:?}", stopping.elapsed());

    std::fs::remove_file(&filler).unwrap();
    let relay = common::Relay::start(work.path(), &text).await;
    for id in ids {
        let (status, _) = relay.admin_get(&format!("/admin/events/{id}")).await;
        assert_eq!(status, 200, "acknowledged {id} lost");
    }
}
