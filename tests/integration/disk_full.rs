//! Free-space admission on a real full filesystem: a small tmpfs mounted for the test
//! (the tests run as root in CI), filled until free space is below the floor, then
//! freed again. Where mounting is impossible the tests fail, saying why: a fault test
//! that passes without its fault proves nothing (run the tests as root, as CI does).

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::load::{check_acked, Acked, Load};
use common::scratch::{fill, free_bytes, Kind, Scratch};
use common::{metric, Relay};

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_floor_callbacks_are_refused_and_come_back_when_space_is_freed() {
    let fs = Scratch::mount(Kind::Tmpfs, 64);
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

/// Fills the disk (no free-space floor, so the store really meets ENOSPC) from 8
/// clients, five times: each time the relay must stop by itself with a non-zero exit
/// (fail-stop: never wedge, never keep answering on a failed store); after space is
/// freed it must start again, hold every callback it ever acknowledged with its exact
/// body, and take callbacks again.
async fn fill_and_restart(kind: Kind, backend: &str, cycles: usize) {
    let fs = Scratch::mount(kind, 48);
    // Room handed back after each fill.
    let fillers: Vec<PathBuf> = (0..cycles).map(|i| fs.path().join(format!("filler{i}"))).collect();
    for f in &fillers {
        fill(f, 6);
    }
    let data = fs.path().join("data");
    let tail = "\n[[destinations]]\nname = \"down\"\nurl = \"http://127.0.0.1:9/\"\n";
    let text = common::config_with(&data, "", tail).replace(
        "[storage]",
        &format!(
            "[storage]\nbackend = \"{backend}\"\nmin_free_bytes = 0\nmin_free_percent = 0.0\nwrite_timeout = \"5s\""
        ),
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
        // redb on a loaded machine took over 120 s to fill it.
        let deadline = Instant::now() + Duration::from_secs(240);
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
    fill_and_restart(Kind::Tmpfs, "sled", 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_callbacks_survive_repeated_full_disks_on_ext4() {
    fill_and_restart(Kind::Ext4, "sled", 5).await;
}

/// The same on redb: its failed commit fails the store, the next open finds the last
/// durable commit (quick repair), everything acknowledged is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_callbacks_survive_repeated_full_disks_on_redb() {
    fill_and_restart(Kind::Ext4, "redb", 2).await;
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
    let fs = Scratch::mount(Kind::Tmpfs, 64);
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

/// Loads the relay until it refuses callbacks (below the floor), then watches free
/// space for a while: the relay's own writes (dispatch, attempt records against a
/// failing consumer, purges) must stop short of the disk. Returns the lowest free
/// space seen.
async fn fill_to_the_floor(
    relay: &Relay,
    fs: &Path,
    cycle: usize,
    acked: &Acked,
    pad: usize,
) -> u64 {
    let pad = "x".repeat(pad);
    let load = Load::start(
        8,
        vec![relay.hook_url(Some("ActionCreated"))],
        Duration::ZERO,
        acked.clone(),
        move |k, n| {
            format!(r#"{{"data":{{"type":"actions","id":"{cycle}-{k}-{n}"}},"pad":"{pad}"}}"#)
        },
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let r = reqwest::get(format!("http://{}/readyz", relay.admin)).await.unwrap();
        if r.status() == 503 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cycle {cycle}: never reached the floor: {}",
            relay.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut lowest = u64::MAX;
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(5) {
        lowest = lowest.min(free_bytes(fs));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    load.stop().await;
    lowest.min(free_bytes(fs))
}

/// The floor covers every writer, not only the ingress: three fill/free cycles on a
/// 64 MiB tmpfs with an 8 MiB floor and a consumer that keeps failing (so attempts
/// and their records keep coming). Free space never reaches 0; once space is freed
/// callbacks and deliveries resume without a restart; SIGTERM below the floor exits 0
/// every time; every acknowledged callback is there, with its body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_holds_every_writer_through_fill_and_free_cycles() {
    floor_cycles("redb", 700).await;
}

/// The fast fill of issue 40: 8 clients posting 16 KiB callbacks, which jumped a
/// polled floor to 0 bytes free and stopped the relay. The budget admits each write
/// before it is made: the same three cycles hold on redb. (On sled, a CI run once saw
/// the second cycle not resume within 10 s of the space being freed: open, issue 40.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_fill_of_16_kib_bodies_never_jumps_the_floor_on_redb() {
    floor_cycles("redb", 16 << 10).await;
}

async fn floor_cycles(backend: &str, pad: usize) {
    let fs = Scratch::mount(Kind::Tmpfs, 64);
    let sink = common::sink::Sink::start().await;
    sink.set_mode(common::sink::Mode::Status(503));
    // Leave about 24 MiB for the relay, and 6 MiB to free in each cycle.
    fill(&fs.path().join("base"), 22);
    let fillers: Vec<PathBuf> = (0..3).map(|i| fs.path().join(format!("filler{i}"))).collect();
    for f in &fillers {
        fill(f, 6);
    }
    let data = fs.path().join("data");
    let tail = format!(
        // The consumer keeps failing: after a restart with a backlog its circuit may
        // open (1,000 failures), and then a probe a second keeps attempts coming.
        "\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n\n[delivery]\ncircuit_failure_threshold = 1000\ncircuit_probe_interval = \"1s\"\n\
         [delivery.retry]\ninitial_backoff = \"50ms\"\nmax_backoff = \"200ms\"\n",
        sink.url()
    );
    let text = common::config_with(&data, "", &tail).replace(
        "[storage]",
        &format!(
            "[storage]\nbackend = \"{backend}\"\nmin_free_bytes = 8388608\nmin_free_percent = 0.0"
        ),
    );
    let work = tempfile::tempdir().unwrap();
    let acked: Acked = Acked::default();
    for (cycle, filler) in fillers.iter().enumerate() {
        let mut relay = if cycle == 0 {
            let relay = Relay::start(work.path(), &text).await;
            let lowest = fill_to_the_floor(&relay, fs.path(), cycle, &acked, pad).await;
            eprintln!("cycle {cycle}: lowest free {:.1} MiB", lowest as f64 / 1048576.0);
            assert!(
                lowest > 1 << 20,
                "cycle {cycle}: the relay's own writes ate the floor: {lowest} bytes free"
            );
            relay
        } else if backend == "sled" {
            // A sled relay below the floor waits for space before it opens the store
            // (the twelve-restarts test above): space first, then the relay.
            std::fs::remove_file(filler).unwrap();
            Relay::start(work.path(), &text).await
        } else {
            // The last cycle stopped below the floor: the relay starts there, stays up
            // (no crash loop), not ready, and says why.
            let mut relay = Relay::start_listening(common::binary(), work.path(), &text, &[]).await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            assert!(
                relay.exited().is_none(),
                "cycle {cycle}: exited below the floor: {}",
                relay.logs()
            );
            // Not ready and saying why, unless the fresh relay's margin (the write
            // amplification it assumes before it has measured its own, smaller than
            // the one the last relay had learnt) still leaves room above the floor:
            // then it takes writes, and the floor still holds.
            let r = reqwest::get(format!("http://{}/readyz", relay.admin)).await.unwrap();
            let status = r.status();
            let said = r.text().await.unwrap();
            if status == 503 {
                assert!(said.contains("below the floor"), "cycle {cycle}: {said}");
            } else {
                assert_eq!(status, 200, "cycle {cycle}: {said}");
                let free = free_bytes(fs.path());
                assert!(free >= 8 << 20, "cycle {cycle}: ready at {free} bytes free");
                eprintln!(
                    "cycle {cycle}: restarted ready, {:.1} MiB free",
                    free as f64 / 1048576.0
                );
            }
            relay
        };
        let so_far = acked.lock().unwrap().clone();
        check_acked(&relay, &so_far).await;
        // Space back: callbacks and attempts resume by themselves.
        if filler.exists() {
            std::fs::remove_file(filler).unwrap();
        }
        let attempts = sink.count();
        let deadline = Instant::now() + WAIT;
        loop {
            // Closed without an answer until the relay measures the freed space.
            let url = relay.hook_url(Some("ActionCreated"));
            let sent = relay.client.post(url).body("{\"data\":{}}").send().await;
            if sent.is_ok_and(|r| r.status() == 200) && sink.count() > attempts {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "cycle {cycle}: nothing resumed after space was freed ({:.1} MiB free): {}",
                free_bytes(fs.path()) as f64 / 1048576.0,
                relay.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Down to the floor again, and stopped there: exit 0 within the grace period.
        let lowest = fill_to_the_floor(&relay, fs.path(), cycle + 10, &acked, pad).await;
        eprintln!("cycle {cycle}, after freeing: lowest free {:.1} MiB", lowest as f64 / 1048576.0);
        assert!(lowest > 1 << 20, "cycle {cycle}: {lowest} bytes free");
        relay.signal(libc::SIGTERM);
        let status = relay.wait_exit(Duration::from_secs(9));
        assert!(
            status.success(),
            "cycle {cycle}: SIGTERM below the floor exited {status}: {}",
            relay.logs()
        );
        // The next cycle starts below the floor: it must start, not crash-loop.
    }
    let relay = if backend == "sled" {
        std::fs::remove_file(fs.path().join("base")).unwrap();
        Relay::start(work.path(), &text).await
    } else {
        Relay::start_listening(common::binary(), work.path(), &text, &[]).await
    };
    let all = acked.lock().unwrap().clone();
    assert!(all.len() > 200, "{} acknowledged", all.len());
    check_acked(&relay, &all).await;
}

/// A sled relay killed on a disk that then fills to the last byte, and restarted
/// twelve times on it (a supervisor's crash loop): each start waits for space before
/// opening the store (sled writes at open, and a write cut short there once left the
/// store unopenable for good), stays up, and exits 0 on SIGTERM. A stray, empty
/// unfinished snapshot (`snap.*.generating`, which sled 0.34 reads as corruption) is
/// put in the data directory halfway: once space is freed, the relay removes it, opens,
/// and holds every acknowledged callback with its body, within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sled_relay_restarted_twelve_times_on_a_full_disk_opens_with_everything_once_space_is_back(
) {
    let fs = Scratch::mount(Kind::Tmpfs, 64);
    let data = fs.path().join("data");
    let text = common::config_with(&data, "", "").replace(
        "[storage]",
        "[storage]\nbackend = \"sled\"\nmin_free_bytes = 8388608\nmin_free_percent = 0.0",
    );
    let work = tempfile::tempdir().unwrap();
    let acked: Acked = Acked::default();
    let mut relay = Relay::start(work.path(), &text).await;
    let pad = "x".repeat(1000);
    let load = Load::start(
        8,
        vec![relay.hook_url(Some("ActionCreated"))],
        Duration::ZERO,
        acked.clone(),
        move |k, n| format!(r#"{{"client":{k},"n":{n},"pad":"{pad}"}}"#),
    );
    while acked.lock().unwrap().len() < 500 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A crash under load, then the disk full to the last byte.
    relay.kill();
    load.stop().await;
    drop(relay);
    let filler = fs.path().join("filler");
    fill_up(&filler);
    assert!(free_bytes(fs.path()) < 1 << 20);
    let config = work.path().join("hookrelay.toml");
    for start in 0..12 {
        if start == 6 {
            std::fs::File::create(data.join("snap.00000000DEADBEEF.generating")).unwrap();
        }
        let log = work.path().join(format!("start-{start}.log"));
        let mut child = std::process::Command::new(common::binary())
            .args(["serve", "--log-format", "json", "--config"])
            .arg(&config)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !std::fs::read_to_string(&log).unwrap().contains("waiting for free space") {
            assert!(
                child.try_wait().unwrap().is_none(),
                "start {start} exited: {}",
                std::fs::read_to_string(&log).unwrap()
            );
            assert!(Instant::now() < deadline, "start {start}: no wait for space");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(child.try_wait().unwrap().is_none(), "start {start}: stays up while waiting");
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(i32::try_from(child.id()).unwrap(), libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "start {start}: SIGTERM did not stop it");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(status.success(), "start {start}: exited {status}");
    }
    assert!(data.join("snap.00000000DEADBEEF.generating").exists(), "untouched while full");
    std::fs::remove_file(&filler).unwrap();
    let relay = Relay::start(work.path(), &text).await;
    assert!(!data.join("snap.00000000DEADBEEF.generating").exists());
    assert!(relay.logs().contains("removed an unfinished sled snapshot"));
    let all = acked.lock().unwrap().clone();
    assert!(all.len() >= 500);
    check_acked(&relay, &all).await;
    let again = relay.callback(Some("ActionCreated"), "application/json", "{\"data\":1}").await;
    assert_eq!(again.status(), 200);
}

/// The same fast fill on sled. Its second cycle twice did not "resume" in CI: the relay,
/// restarted on a backlog of deliveries all due at once to a consumer that keeps
/// failing, opened the destination's circuit, whose probes came once per default
/// interval, slower than the test looked; the space had been granted (14 MiB free
/// above an 8 MiB floor). The probe interval is now a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_fill_of_16_kib_bodies_never_jumps_the_floor_on_sled() {
    floor_cycles("sled", 16 << 10).await;
}
