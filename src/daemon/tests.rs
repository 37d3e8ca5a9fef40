//! The relay started and stopped in this process, again and again: every part it
//! starts is stopped and joined, so nothing is left behind (threads, tasks holding
//! the store, listeners).

use std::time::Duration;

use super::*;

/// The threads of this process.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// The names of this process's threads, each once with how many have it: what a
/// failed count names (a leak shows which part left it).
fn thread_names() -> String {
    let mut names = std::collections::BTreeMap::<String, usize>::new();
    for entry in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        *names.entry(name.trim().to_owned()).or_default() += 1;
    }
    format!("{names:?}")
}

/// A port nobody holds now, below the kernel's ephemeral range: the relay binds it
/// twenty times, and between two runs no connection may take it as its local port. A
/// port from `bind(0)` is ephemeral: another test's connection, or the next run's own
/// ingress `bind(0)`, could take it, and the relay's bind would fail (the likeliest
/// cause of this test's failure in CI beside the other tests).
fn free_port() -> u16 {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range");
    let ephemeral = range
        .ok()
        .and_then(|r| r.split_whitespace().next().and_then(|low| low.parse::<u16>().ok()))
        .unwrap_or(32768);
    let low = 10_000u16;
    assert!(
        ephemeral > low + 1000,
        "the ephemeral range starts at {ephemeral}: too low for this test"
    );
    let span = u32::from(ephemeral - low);
    let start = std::process::id() % span;
    (0..span)
        .map(|i| low + ((start + i) % span) as u16)
        .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .expect("a free port below the ephemeral range")
}

/// Whether the admin listener on `port` answers `/readyz` with 200: every part of
/// the relay is started (a fixed sleep was too short on a loaded machine).
async fn ready(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let asked = stream.write_all(b"GET /readyz HTTP/1.0\r\nHost: relay\r\n\r\n").await;
    let mut answer = Vec::new();
    asked.is_ok()
        && stream.read_to_end(&mut answer).await.is_ok()
        && String::from_utf8_lossy(&answer).split(' ').nth(1) == Some("200")
}

/// A relay on `dir` with its ingress on a free port, its admin listener on `admin`,
/// and one destination.
fn config(dir: &std::path::Path, admin: u16) -> Config {
    let text = format!(
        r#"
[ingress]
listen = "127.0.0.1:0"
[admin]
listen = "127.0.0.1:{admin}"
token = "0123456789abcdef0123456789"
[storage]
data_dir = {data:?}
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
        data = dir.join("data").display().to_string()
    );
    let path = dir.join("hookrelay.toml");
    std::fs::write(&path, text).unwrap();
    load::config(&path, &std::collections::HashMap::new()).unwrap()
}

/// The thread count once it holds still for `quiet` (threads end a moment after
/// their work), or whatever it is after 20 s.
fn settled(quiet: Duration) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut last = threads();
    let mut since = std::time::Instant::now();
    while std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(25));
        let now = threads();
        if now != last {
            (last, since) = (now, std::time::Instant::now());
        } else if since.elapsed() >= quiet {
            break;
        }
    }
    last
}

/// The thread count once it is at most `bound`, or the count after 20 s: a slow
/// machine gets time for threads to end, a leak still shows.
fn down_to(bound: usize) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = threads();
        if now <= bound || std::time::Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
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
        // The child's panic first, alone: CI shows only a part of a long output.
        let panic: String = text
            .lines()
            .skip_while(|l| !l.contains("panicked at"))
            .take(12)
            .collect::<Vec<_>>()
            .join("\n");
        assert!(out.status.success() && text.contains("1 passed"), "alone: {panic}\n\n{text}");
        eprintln!("{}", text.lines().filter(|l| l.contains("threads")).collect::<String>());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let admin = free_port();
    let config = config(dir.path(), admin);
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
            let running = tokio::spawn(run(config.clone(), Default::default(), requested));
            // Bounds for a CI machine running the other tests beside this one (a
            // failure there came without its message: these say which bound it was).
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while !ready(admin).await {
                if running.is_finished() {
                    panic!("the relay ended by itself: {:?}", running.await);
                }
                assert!(tokio::time::Instant::now() < deadline, "not ready within 60 s");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            during.push(threads());
            trigger.stop_for("test");
            tokio::time::timeout(Duration::from_secs(30), running)
                .await
                .expect("not stopped within 30 s (its grace is 5 s, then the store's close)")
                .unwrap()
                .expect("a clean stop");
        });
    };
    once();
    // The first run's count, once still for a second, is the baseline: later runs
    // must come back down to it (within the runtime's own idle threads).
    let first = settled(Duration::from_secs(1));
    let mut counts = vec![first];
    for _ in 1..20 {
        once();
        counts.push(down_to(first + 2));
    }
    eprintln!("threads while running: {during:?}; after each run: {counts:?}");
    let most = *counts.iter().max().unwrap();
    assert!(most <= first + 2, "threads after each run: {counts:?}; now {}", thread_names());
    // Running, the relay had its own (the listeners' workers, the store's, the
    // committer): the count after is theirs gone, not a relay that never started.
    assert!(
        during.iter().all(|d| *d >= first + 3),
        "while running {during:?}, after {counts:?}; now {}",
        thread_names()
    );
}
