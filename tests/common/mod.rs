//! Test harness: the real `hookrelay` binary as a child process, on loopback ports it
//! picks itself (`127.0.0.1:0`), with its data in a temporary directory.

#![allow(dead_code)] // each test file uses a different part of the harness

pub mod arrivals;
pub mod brokers;
pub mod browser;
pub mod load;
pub mod open_loop;
#[path = "../../src/store/postgres/test_server.rs"]
pub mod pg;
pub mod proxy;
pub mod scratch;
pub mod sim;
pub mod sink;
pub mod stats;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const SOURCE: &str = "demo";
pub const TOKEN: &str = "source-token-0123456789abcdef";
pub const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef";

/// Fast retries (and circuit probes) for tests: `[delivery]` keys to append to a config.
pub const FAST_RETRY: &str = "
[delivery]
circuit_probe_interval = \"200ms\"
[delivery.retry]
initial_backoff = \"100ms\"
max_backoff = \"400ms\"
";

/// A callback body shaped like the upstream's (~625 bytes of JSON), distinct per `n`:
/// what the footprint and capacity benches store.
pub fn upstream_body(n: u64) -> String {
    serde_json::json!({
        "jsonapi": {"version": "1.0"},
        "data": {"type": "actions", "id": n.to_string(), "attributes": {
            "name": format!("Smith v Jones ({n})"),
            "description": "Prepare the affidavit and file it with the registry before the hearing; \
                 call the client about the settlement offer and update the matter notes.",
            "status": "in_progress", "priority": "normal",
            "created_at": "2026-11-22T09:14:03Z", "updated_at": "2026-11-22T09:15:41Z",
            "due_date": "2026-12-01", "assignee": {"id": "1207", "name": "A. Practitioner"},
            "matter": {"id": (n % 977).to_string(), "number": format!("M-{:06}", n % 977)},
            "tags": ["litigation", "court", "deadline"]
        }},
        "meta": {"debug": {"resthook": {"id": "46", "trigger_count": n, "event_name": "ActionUpdated"}}}
    })
    .to_string()
}

/// Bytes of every file under `dir` (apparent size).
pub fn bytes_under(dir: &Path) -> u64 {
    sum_under(dir, &|meta| meta.len())
}

/// The bytes the files under `dir` hold on the disk (their blocks): a file grown ahead
/// of use (redb's) has a hole that [`bytes_under`], the files' lengths, counts too.
pub fn blocks_under(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    sum_under(dir, &|meta| meta.blocks() * 512)
}

/// `size` of every file under `dir`, summed.
fn sum_under(dir: &Path, size: &dyn Fn(&std::fs::Metadata) -> u64) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() { sum_under(&entry.path(), size) } else { size(&meta) };
    }
    total
}

/// A bench setting from the environment (`BENCH_ROUNDS=5`), or `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A config for tests: loopback listeners on free ports, one source, an admin token;
/// `extra` goes into `[ingress]`.
pub fn config(data_dir: &Path, extra: &str) -> String {
    config_with(data_dir, extra, "")
}

/// Like [`config`], with `tail` (destinations, `[delivery]`, source keys...) appended
/// right after the `[[sources]]` entry.
pub fn config_with(data_dir: &Path, extra: &str, tail: &str) -> String {
    format!(
        r#"
[ingress]
listen = "127.0.0.1:0"
workers = 2
{extra}
[admin]
listen = "127.0.0.1:0"
token = "{ADMIN_TOKEN}"

[storage]
data_dir = {data_dir:?}

[log]
level = "info"

[shutdown]
grace = "5s"

[[sources]]
name = "{SOURCE}"
token = "{TOKEN}"
{tail}
"#,
        data_dir = data_dir.display().to_string(),
    )
}

/// Reads a child's stderr on a thread: keeps every line, and sends `(listener, addr)`
/// for every JSON `listening` line.
pub fn read_logs(
    stderr: std::process::ChildStderr,
) -> (Arc<Mutex<String>>, mpsc::Receiver<(String, SocketAddr)>) {
    let logs = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel();
    let sink = logs.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if v["message"] == "listening" {
                    let addr: SocketAddr = v["addr"].as_str().unwrap().parse().unwrap();
                    let _ = tx.send((v["listener"].as_str().unwrap().to_owned(), addr));
                }
            }
            let mut logs = sink.lock().unwrap();
            logs.push_str(&line);
            logs.push('\n');
        }
    });
    (logs, rx)
}

/// A running relay.
pub struct Relay {
    child: Child,
    pub ingress: SocketAddr,
    pub admin: SocketAddr,
    logs: Arc<Mutex<String>>,
    pub client: reqwest::Client,
}

/// The tests' HTTP client. Its pooled connections are dropped after 2 s idle, before
/// the relay's keep-alive (actix-web's 5 s) closes them: a request sent on a
/// connection the server is closing at that moment fails with `IncompleteMessage`
/// (HTTP/1.1's keep-alive race), which a loaded machine made frequent enough to fail
/// a test that reads thousands of events over 8 connections (the pool grows past 8
/// while responses are read, and the extra ones idle at the bottom of its stack).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_idle_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// Has the kernel write back every dirty page now, before a benchmark's rounds: a
/// build just made leaves hundreds of MB dirty, which the kernel writes back 30 s
/// later (`vm.dirty_expire_centisecs`), in the middle of a round, where every
/// `fdatasync` of the relay waits behind it. Seen twice as a 100-200 ms stall of the
/// ack 8-9 s into the first round, each time right after a release build, and never
/// in three runs started without one (BENCHMARKS.md).
pub fn write_back_dirty_pages() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() }
}

pub fn binary() -> &'static str {
    // HOOKRELAY_TEST_BIN: a long run (`chaos --minutes 30`) on a copy of the binary,
    // unaffected by builds made meanwhile.
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("HOOKRELAY_TEST_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_hookrelay").to_owned())
    })
}

impl Relay {
    /// Writes `config_text` next to the data and starts `hookrelay serve` on it; returns
    /// once `/readyz` answers 200.
    pub async fn start(dir: &Path, config_text: &str) -> Relay {
        Self::start_binary(binary(), dir, config_text).await
    }

    /// Like [`Relay::start`], with another build of the relay (benchmarks compare two).
    pub async fn start_binary(bin: &str, dir: &Path, config_text: &str) -> Relay {
        Self::start_full(bin, dir, config_text, &[]).await
    }

    /// Like [`Relay::start`], with extra environment variables.
    pub async fn start_env(dir: &Path, config_text: &str, env: &[(&str, &str)]) -> Relay {
        Self::start_full(binary(), dir, config_text, env).await
    }

    /// Like [`Relay::start_binary`], with extra environment variables.
    pub async fn start_full(
        bin: &str,
        dir: &Path,
        config_text: &str,
        env: &[(&str, &str)],
    ) -> Relay {
        let relay = Self::start_listening(bin, dir, config_text, env).await;
        relay.wait_ready().await;
        relay
    }

    /// Starts the relay and returns once both listeners are up, ready or not (a relay
    /// started below its free-space floor, say).
    pub async fn start_listening(
        bin: &str,
        dir: &Path,
        config_text: &str,
        env: &[(&str, &str)],
    ) -> Relay {
        Self::start_listening_within(bin, dir, config_text, env, Duration::from_secs(30)).await
    }

    /// Like [`Relay::start_listening`], waiting at most `within` for the listeners (a
    /// large store takes its time to open: the capacity bench).
    pub async fn start_listening_within(
        bin: &str,
        dir: &Path,
        config_text: &str,
        env: &[(&str, &str)],
        within: Duration,
    ) -> Relay {
        let config_path: PathBuf = dir.join("hookrelay.toml");
        std::fs::write(&config_path, config_text).unwrap();
        let mut command = Command::new(bin);
        command.envs(env.iter().copied()).args(["serve", "--log-format", "json", "--config"]);
        command.arg(&config_path);
        Self::spawn(command, within)
    }

    /// Runs `command` (a relay's `serve`, however it is started: under
    /// systemd-socket-activate, say) and returns once both listeners are up.
    pub fn spawn(mut command: Command, within: Duration) -> Relay {
        let mut child = command
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start hookrelay");
        let (logs, rx) = read_logs(child.stderr.take().unwrap());
        let (mut ingress, mut admin) = (None, None);
        while ingress.is_none() || admin.is_none() {
            match rx.recv_timeout(within) {
                Ok((name, addr)) if name == "ingress" => ingress = Some(addr),
                Ok((_, addr)) => admin = Some(addr),
                Err(_) => {
                    let _ = child.kill();
                    panic!("relay did not report its listeners; logs:\n{}", logs.lock().unwrap());
                }
            }
        }
        Relay { child, ingress: ingress.unwrap(), admin: admin.unwrap(), logs, client: client() }
    }

    /// Waits until `/readyz` answers 200 (at most 30 s).
    pub async fn wait_ready(&self) {
        self.wait_ready_within(Duration::from_secs(30)).await;
    }

    /// Waits until `/readyz` answers 200, at most `within`.
    pub async fn wait_ready_within(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let url = format!("http://{}/readyz", self.admin);
            if let Ok(r) = self.client.get(&url).send().await {
                if r.status() == 200 {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "relay not ready; logs:\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap()
    }

    /// Everything the relay has logged so far.
    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().clone()
    }

    /// URL of a callback for `SOURCE`, optionally naming the event.
    pub fn hook_url(&self, event: Option<&str>) -> String {
        match event {
            Some(e) => format!("http://{}/hooks/{SOURCE}/{TOKEN}/{e}", self.ingress),
            None => format!("http://{}/hooks/{SOURCE}/{TOKEN}", self.ingress),
        }
    }

    /// Posts a callback and returns the response.
    /// Sends raw bytes to the ingress on a fresh connection (closing our side after
    /// them when `half_close`) and returns whatever comes back before EOF, within 10 s:
    /// for requests no HTTP client writes.
    pub async fn raw_exchange(&self, request: &[u8], half_close: bool) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut conn = tokio::net::TcpStream::connect(self.ingress).await.unwrap();
        conn.write_all(request).await.unwrap();
        if half_close {
            conn.shutdown().await.unwrap();
        }
        let mut answer = Vec::new();
        let read = conn.read_to_end(&mut answer);
        let done = tokio::time::timeout(std::time::Duration::from_secs(10), read).await;
        assert!(done.is_ok(), "no EOF within 10 s after: {}", String::from_utf8_lossy(&answer));
        String::from_utf8_lossy(&answer).into_owned()
    }

    pub async fn callback(
        &self,
        event: Option<&str>,
        content_type: &str,
        body: impl Into<reqwest::Body>,
    ) -> reqwest::Response {
        self.client
            .post(self.hook_url(event))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .expect("callback request")
    }

    /// GET on the admin listener with the admin token; returns status and JSON.
    pub async fn admin_get(&self, path: &str) -> (u16, Value) {
        let r = self
            .client
            .get(format!("http://{}{path}", self.admin))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("admin request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// `method path` on the admin listener with `token` and a JSON `body`; returns
    /// status and JSON (the roles' and the journal's tests call as several holders).
    pub async fn admin_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let mut req =
            self.client.request(method, format!("http://{}{path}", self.admin)).bearer_auth(token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await.expect("admin request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Runs the admin command line (`args`) against this relay, with the config in
    /// `dir`; returns (exit code, stdout, stderr).
    pub fn cli(&self, dir: &Path, args: &[&str]) -> (i32, String, String) {
        let out = std::process::Command::new(binary())
            .args(args)
            .arg("--config")
            .arg(dir.join("hookrelay.toml"))
            .arg("--admin-url")
            .arg(format!("http://{}", self.admin))
            .env_remove("HOOKRELAY_ADMIN_TOKEN")
            .output()
            .expect("running the command line");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// POST on the admin listener with the admin token; returns status and JSON.
    pub async fn admin_post(&self, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req =
            self.client.post(format!("http://{}{path}", self.admin)).bearer_auth(ADMIN_TOKEN);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await.expect("admin request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Polls `GET path` until `check` accepts the JSON (panics after `timeout`).
    pub async fn admin_until(
        &self,
        path: &str,
        timeout: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let (_, v) = self.admin_get(path).await;
            if check(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{path} never satisfied the check; last: {v:#}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        let url = format!("http://{}/metrics", self.admin);
        self.client.get(url).send().await.unwrap().text().await.unwrap()
    }

    /// Every stored event id, following the admin API's pages.
    pub async fn all_event_ids(&self) -> Vec<String> {
        let mut ids = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let path = match &after {
                Some(a) => format!("/admin/events?limit=1000&after={a}"),
                None => "/admin/events?limit=1000".to_owned(),
            };
            let (status, page) = self.admin_get(&path).await;
            assert_eq!(status, 200, "{page}");
            for e in page["events"].as_array().unwrap() {
                ids.push(e["id"].as_str().unwrap().to_owned());
            }
            match page["next_after"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => return ids,
            }
        }
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(rc, 0, "kill({}, {sig})", self.pid());
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "relay did not exit; logs:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The exit status, if the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How many of a relay's last log lines a failing test prints: what the relay saw
/// when the assertion failed, in CI output that has nothing else from it.
const LOG_LINES_ON_FAILURE: usize = 40;

impl Drop for Relay {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let logs = self.logs.lock().map(|l| l.clone()).unwrap_or_default();
            let lines: Vec<&str> = logs.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_LINES_ON_FAILURE)..];
            eprintln!(
                "--- the relay's last {} log lines (of {}):\n{}",
                tail.len(),
                lines.len(),
                tail.join("\n")
            );
        }
    }
}

/// The value of the sample `name` whose labels include every `(label, value)` of
/// `labels` in a Prometheus text exposition; `None` if there is none.
/// libfaketime (Debian's `libfaketime`, installed by scripts/test.sh): a relay's wall
/// clock, moved while it runs by rewriting a file ([`faketime_env`]).
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The environment that puts a relay's wall clock at the offset written in the file
/// `offset` (`+0`, `-3600s`), read again on every reading; the monotonic clock is left
/// alone.
pub fn faketime_env(offset: &str) -> Vec<(&'static str, String)> {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} missing: apt-get install libfaketime (scripts/test.sh does)"
    );
    vec![
        ("LD_PRELOAD", LIBFAKETIME.to_owned()),
        ("FAKETIME_TIMESTAMP_FILE", offset.to_owned()),
        ("FAKETIME_NO_CACHE", "1".to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
    ]
}

pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (n, rest) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if n != name {
            return None;
        }
        let all =
            labels.iter().all(|(k, v)| rest.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
        all.then(|| value.parse().ok()).flatten()
    })
}

/// A histogram's observations so far and their sum, `(count, sum)`, from a `/metrics`
/// text (0 for a histogram not observed yet).
pub fn histogram(text: &str, name: &str) -> (f64, f64) {
    let series = |suffix: &str| metric(text, &format!("{name}_{suffix}"), &[]).unwrap_or(0.0);
    (series("count"), series("sum"))
}

/// `promtool` (Debian package `prometheus`, installed by scripts/test.sh).
pub fn promtool(args: &[&str], stdin: Option<&str>) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect(
            "promtool not found: install the Debian package `prometheus` (scripts/test.sh does)",
        );
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

/// Waits (at most 10 s) until nobody holds the lock sled takes on `{dir}/db`: a sled
/// handle dropped in the test process is let go by its flusher thread a moment later,
/// and a relay started in between finds its store in use (one such reopen failed a CI
/// run).
pub fn wait_until_sled_unlocked(dir: &Path) {
    use std::os::fd::AsRawFd;
    let path = dir.join("db");
    let file = std::fs::File::open(&path)
        .unwrap_or_else(|e| panic!("opening {} to test its lock: {e}", path.display()));
    let deadline = Instant::now() + Duration::from_secs(10);
    // SAFETY: flock on a descriptor this function owns; it touches no memory.
    while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        assert!(Instant::now() < deadline, "{} still locked after 10 s", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Closing the file (dropped here) lets the lock go.
}
