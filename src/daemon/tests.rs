//! The relay started and stopped in this process, again and again: every part it
//! starts is stopped and joined, so nothing is left behind (threads, tasks holding
//! the store, listeners).

use std::time::Duration;

use super::*;

/// The threads of this process.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// A relay on `dir` with both listeners on free ports and one destination.
fn config(dir: &std::path::Path) -> Config {
    let text = format!(
        r#"
[ingress]
listen = "127.0.0.1:0"
[admin]
listen = "127.0.0.1:0"
token = "0123456789abcdef0123456789"
[storage]
data_dir = {:?}
min_free_bytes = 0
min_free_percent = 0.0
[shutdown]
grace = "5s"
[[sources]]
name = "demo"
token = "0123456789abcdef0123"
[[destinations]]
name = "crm"
url = "http://127.0.0.1:9/hooks"
filter = ".event == \"ActionCreated\""
"#,
        dir.join("data").display().to_string()
    );
    let path = dir.join("hookrelay.toml");
    std::fs::write(&path, text).unwrap();
    load::config(&path, &std::collections::HashMap::new()).unwrap()
}

/// Set in the test process this test runs itself in.
const ALONE: &str = "HOOKRELAY_TEST_ALONE";

/// Twenty starts and stops in one process leave the thread count where the first
/// left it (within the runtime's own idle blocking threads), and the store can be
/// opened again each time: nothing holds it. The count is of the whole process, so the
/// test runs itself again in a process of its own (other tests' threads would blur it).
#[test]
fn twenty_starts_and_stops_leave_no_thread_and_no_store_held() {
    if std::env::var_os(ALONE).is_none() {
        let name = "daemon::tests::twenty_starts_and_stops_leave_no_thread_and_no_store_held";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads", "1"])
            .env(ALONE, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "alone: {text}");
        eprintln!("{}", text.lines().filter(|l| l.contains("threads")).collect::<String>());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    // One runtime for all runs, whose blocking threads end as soon as they idle: what
    // stays is what the relay left.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_keep_alive(Duration::from_millis(50))
        .enable_all()
        .build()
        .unwrap();
    let mut during = Vec::new();
    let mut once = || {
        rt.block_on(async {
            let (trigger, requested) = StopTrigger::new();
            let running = tokio::spawn(run(config.clone(), requested));
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(!running.is_finished(), "the relay ended by itself");
            during.push(threads());
            trigger.stop_for("test");
            tokio::time::timeout(Duration::from_secs(10), running)
                .await
                .expect("stopped within its grace")
                .unwrap()
                .expect("a clean stop");
        });
        // Threads end a moment after their work: wait for the count to settle.
        let mut last = threads();
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(50));
            let now = threads();
            if now == last {
                break;
            }
            last = now;
        }
        last
    };
    let first = once();
    let mut counts = vec![first];
    for _ in 1..20 {
        counts.push(once());
    }
    eprintln!("threads while running: {during:?}; after each run: {counts:?}");
    let most = *counts.iter().max().unwrap();
    assert!(most <= first + 2, "threads after each run: {counts:?}");
    // Running, the relay had its own (the listeners' workers, the store's, the
    // committer): the count after is theirs gone, not a relay that never started.
    assert!(during.iter().all(|d| *d >= first + 3), "while running {during:?}, after {counts:?}");
}
