//! A restart that refuses no callback (issue 42): the listeners are held by the service
//! manager and handed to each start of the relay (socket activation), so callbacks
//! sent while it restarts wait in the kernel's queue. Debian's
//! `systemd-socket-activate` hands them over as documented; for restarts, the test is
//! the service manager, as systemd is: it holds both sockets (its backlog as
//! deploy/systemd/hookrelay.socket's) and passes them to every start with
//! `LISTEN_FDS`, `LISTEN_FDNAMES` and the child's own `LISTEN_PID`.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::load::{check_acked, Steady};
use crate::common::sink::Sink;
use crate::common::{self, metric, Relay};

/// How long after the load stops every acknowledged callback must be delivered.
const BOUND: Duration = Duration::from_secs(60);

/// A config whose own listeners are addresses nobody could bind (port 1 needs
/// privileges the relay does not have, and is not listened on here): a relay that
/// bound them instead of taking the handed sockets would fail to start.
fn config(data: &Path, tail: &str) -> String {
    common::config_with(data, "", tail)
        .replace("[ingress]\nlisten = \"127.0.0.1:0\"", "[ingress]\nlisten = \"127.0.0.2:1\"")
        .replace("[admin]\nlisten = \"127.0.0.1:0\"", "[admin]\nlisten = \"127.0.0.2:2\"")
}

/// A free loopback address.
fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_socket_activate_hands_the_relay_both_listeners_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let sink = Sink::start().await;
    let tail = format!("\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\n", sink.url());
    let path = dir.path().join("hookrelay.toml");
    std::fs::write(&path, config(&dir.path().join("data"), &tail)).unwrap();
    let (ingress, admin) = (free_addr(), free_addr());
    let mut command = Command::new("systemd-socket-activate");
    // Named the other way round from their order: the names decide.
    command
        .args(["-l", &admin.to_string(), "-l", &ingress.to_string(), "--fdname=admin:ingress"])
        .args([common::binary(), "serve", "--log-format", "json"])
        .arg("--config")
        .arg(&path);
    // systemd-socket-activate starts the relay at the first connection (as systemd
    // does a socket unit's service): that callback waits, and is answered by it.
    let first = tokio::spawn(async move {
        // Once the sockets are listening (it says so before the first connection).
        tokio::time::sleep(Duration::from_millis(500)).await;
        let url =
            format!("http://{ingress}/hooks/{}/{}/ActionCreated", common::SOURCE, common::TOKEN);
        let r = common::client().post(url).body(r#"{"data":{}}"#).send().await.unwrap();
        r.status().as_u16()
    });
    let mut relay = Relay::spawn(command, Duration::from_secs(30));
    assert_eq!((relay.ingress, relay.admin), (ingress, admin), "{}", relay.logs());
    assert_eq!(first.await.unwrap(), 200);
    relay.wait_ready().await;
    assert!(relay.logs().contains(r#""handed":true"#), "{}", relay.logs());
    sink.wait_for(1, Duration::from_secs(15)).await;
    relay.signal(libc::SIGTERM);
    assert!(relay.wait_exit(Duration::from_secs(30)).success());
}

/// The sockets a service manager holds: both listening, with a deep backlog.
struct Held {
    ingress: TcpListener,
    admin: TcpListener,
}

impl Held {
    fn bind() -> Held {
        let listen = || {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            // As hookrelay.socket's Backlog=4096 (std listens with 128).
            // SAFETY: listen(2) again on a listening socket only sets its backlog.
            assert_eq!(unsafe { libc::listen(l.as_raw_fd(), 4096) }, 0);
            l
        };
        Held { ingress: listen(), admin: listen() }
    }

    /// `hookrelay serve` on `config`, handed both sockets as systemd hands them: fds 3
    /// and 4, `LISTEN_FDS=2`, `LISTEN_FDNAMES=ingress:admin`, and `LISTEN_PID` the
    /// relay's own (set by the shell that then becomes it).
    fn start(&self, config: &Path) -> Relay {
        let (ingress, admin): (RawFd, RawFd) = (self.ingress.as_raw_fd(), self.admin.as_raw_fd());
        let mut command = Command::new("sh");
        command
            .args(["-c", r#"export LISTEN_PID=$$; exec "$0" "$@""#, common::binary()])
            .args(["serve", "--log-format", "json", "--config"])
            .arg(config)
            .env("LISTEN_FDS", "2")
            .env("LISTEN_FDNAMES", "ingress:admin");
        // SAFETY: only dup2, which is async-signal-safe, between fork and exec. The
        // sources are this process's listeners (above 4: opened after stdio and the
        // test harness's own files), copied to 3 and 4 without close-on-exec.
        unsafe {
            command.pre_exec(move || {
                for (from, to) in [(ingress, 3), (admin, 4)] {
                    if libc::dup2(from, to) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        Relay::spawn(command, Duration::from_secs(30))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_callbacks_a_second_through_five_reloads_and_five_restarts_refuse_none() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let sink = Sink::start().await;
    let file = |timeout: &str| {
        let tail = format!(
            "\n[[destinations]]\nname = \"crm\"\nurl = \"{}\"\ntimeout = \"{timeout}\"\nmax_concurrency = 32\n",
            sink.url()
        );
        config(&data, &tail)
    };
    let path = dir.path().join("hookrelay.toml");
    std::fs::write(&path, file("5s")).unwrap();
    let held = Held::bind();
    assert!(held.ingress.as_raw_fd() > 4 && held.admin.as_raw_fd() > 4);
    let mut relay = held.start(&path);
    relay.wait_ready().await;
    // 500 a second, steadily, each on a connection of its own, as the upstream's hook
    // calls: while the relay restarts they pile up in the kernel's queue.
    let url = relay.hook_url(Some("ActionCreated"));
    let load =
        Steady::start(url, 500, |n| format!(r#"{{"data":{{"type":"actions","id":"{n}"}}}}"#));
    let started = Instant::now();
    let mut restarts = Vec::new();
    // Every run's log lines above INFO, and when each restart began (s from the start).
    let (mut earlier, mut stopped_at) = (Vec::new(), Vec::new());
    for round in 0..5 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        // A reload: crm's settings change with attempts in flight.
        std::fs::write(&path, file(if round % 2 == 0 { "6s" } else { "5s" })).unwrap();
        relay.signal(libc::SIGHUP);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = relay.metrics().await;
            let took = metric(&text, "hookrelay_config_reloads_total", &[("result", "reloaded")]);
            if took == Some(1.0) {
                break;
            }
            assert!(Instant::now() < deadline, "the reload did not take:\n{}", relay.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        // A restart: stopped, and started again on the same sockets.
        let stopping = Instant::now();
        stopped_at.push(format!("{:.2}s", started.elapsed().as_secs_f64()));
        relay.signal(libc::SIGTERM);
        assert!(relay.wait_exit(Duration::from_secs(30)).success(), "{}", relay.logs());
        earlier.extend(
            relay.logs().lines().filter(|l| !l.contains("\"level\":\"INFO\"")).map(str::to_owned),
        );
        relay = held.start(&path);
        relay.wait_ready().await;
        restarts.push(stopping.elapsed());
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let elapsed = started.elapsed();
    let failed = load.failed.clone();
    let acked = load.stop().await;
    let rate = acked.len() as f64 / elapsed.as_secs_f64();
    eprintln!("{} callbacks in {elapsed:?} ({rate:.0}/s), restarts took {restarts:?}", acked.len());
    // Every callback was answered, and every answer was 200.
    let failed = failed.lock().unwrap().clone();
    assert!(
        failed.is_empty(),
        "{} callbacks not answered 200: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(rate > 450.0, "the load ran at {rate:.0}/s only");
    // Nothing acknowledged lost: each is stored with its body, and delivered within
    // the bound.
    check_acked(&relay, &acked).await;
    let bodies: std::collections::BTreeSet<String> =
        acked.iter().map(|(_, body)| body.clone()).collect();
    let deadline = Instant::now() + BOUND;
    loop {
        let got: std::collections::BTreeSet<String> = sink
            .received()
            .iter()
            .filter(|r| r.status == 200)
            .map(|r| String::from_utf8_lossy(&r.body).into_owned())
            .collect();
        let missing = bodies.difference(&got).count();
        if missing == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{missing} acknowledged callbacks not delivered");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    relay.signal(libc::SIGTERM);
    assert!(relay.wait_exit(Duration::from_secs(30)).success());
}
