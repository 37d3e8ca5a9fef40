//! Free-space admission on a real full filesystem: a small tmpfs mounted for the test
//! (the tests run as root in CI), filled until free space is below the floor, then
//! freed again. Skipped, saying so, only where mounting is impossible.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{metric, Relay};

/// A tmpfs mounted at a temporary directory; always unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` (with the reason printed) where this process cannot mount.
    fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Self { dir }),
            Ok(o) => {
                eprintln!(
                    "SKIPPED: cannot mount a tmpfs here (needs root): {}",
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

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy, so a file still open somewhere cannot keep the mount.
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
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
    let Some(fs) = Tmpfs::mount("48m") else { return };
    let data = fs.path().join("data");
    let text = common::config(&data, "")
        .replace("[storage]", "[storage]\nmin_free_bytes = 16777216\nmin_free_percent = 0.0");
    let work = tempfile::tempdir().unwrap();
    let relay = Relay::start(work.path(), &text).await;

    let first = relay.callback(Some("ActionCreated"), "application/json", "{\"data\":1}").await;
    assert_eq!(first.status(), 200);

    // Leave well under 16 MiB free.
    let filler = fs.path().join("filler");
    fill(&filler, 38);
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
