//! Real brokers for the broker destinations' tests, from Debian's packages, each
//! started by the test on a free loopback port in a directory of its own, stopped
//! and started again on the same port and data (an outage), and killed when dropped.
//! Never assumed running: a missing server binary fails the test and names the package.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port below the kernel's ephemeral range (32768 and up), so that
/// no relay, sink or client of another test (they bind port 0) takes it while the
/// broker boots (RabbitMQ takes up to 20 s) or while it is stopped for an outage:
/// a random port from 20000 to 32767 that binds now.
fn free_port() -> u16 {
    for _ in 0..1000 {
        let port = fastrand::u16(20_000..32_768);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port from 20000 to 32767")
}

/// Waits until `port` accepts connections, for `what`.
fn wait_listening(port: u16, what: &str, child: &mut Child) {
    // RabbitMQ takes 5 to 20 s on a busy machine.
    let deadline = Instant::now() + Duration::from_secs(90);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited at start ({status}); see its log");
        }
        assert!(Instant::now() < deadline, "{what} did not listen on {port} within 90 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `program` from the Debian package `package`, or a failure that says to install it.
fn program(program: &str, package: &str) -> PathBuf {
    for dir in ["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"] {
        let path = Path::new(dir).join(program);
        if path.exists() {
            return path;
        }
    }
    panic!("{program} not found: install Debian's {package} (.ci/run does)");
}

/// One broker process: how it is started, so that it can be started again.
struct Process {
    name: &'static str,
    command: Box<dyn Fn() -> Command + Send>,
    port: u16,
    child: Option<Child>,
    log: PathBuf,
}

impl Process {
    fn start(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the broker's log file");
        let mut child = (self.command)()
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.name));
        wait_listening(self.port, self.name, &mut child);
        self.child = Some(child);
    }

    /// Stops it (SIGTERM, then SIGKILL after 10 s) and waits for it.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A broker's process and directory: stopped and started again by the test.
pub struct Server {
    process: Process,
    dir: tempfile::TempDir,
}

impl Server {
    /// Starts `name` by `command(port, dir)` on a free port, in a new directory.
    fn start(name: &'static str, command: impl Fn(u16, &Path) -> Command + Send + 'static) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let at = dir.path().to_owned();
        let mut process = Process {
            name,
            command: Box::new(move || command(port, &at)),
            port,
            child: None,
            log: dir.path().join(format!("{name}.log")),
        };
        process.start();
        Self { process, dir }
    }

    pub fn port(&self) -> u16 {
        self.process.port
    }

    /// Stops it (SIGTERM, then SIGKILL after 10 s).
    pub fn stop(&mut self) {
        self.process.stop();
    }

    /// Starts it again, on the same port and data.
    pub fn start_again(&mut self) {
        self.process.start();
    }

    pub fn log(&self) -> String {
        self.process.log_text()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A NATS server with JetStream, its store in a temp directory.
pub struct Nats(Server);

impl Nats {
    pub fn start() -> Self {
        let bin = program("nats-server", "nats-server");
        Self(Server::start("nats-server", move |port, dir| {
            let mut c = Command::new(&bin);
            c.args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"]).arg(dir.join("js"));
            c
        }))
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.0.port())
    }

    /// A client of this server, for the test's own reading and setup.
    pub async fn client(&self) -> async_nats::Client {
        async_nats::connect(self.url()).await.expect("connecting to the test's NATS")
    }
}

impl std::ops::Deref for Nats {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.0
    }
}

impl std::ops::DerefMut for Nats {
    fn deref_mut(&mut self) -> &mut Server {
        &mut self.0
    }
}

/// A Redis server, persisting with an append-only file fsynced on every write
/// (`appendfsync always`): what it acknowledged survives its restart.
pub struct Redis(Server);

impl Redis {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// With `args` added to its command line (`--requirepass`, say).
    pub fn start_with(args: &[&str]) -> Self {
        let bin = program("redis-server", "redis-server");
        let extra: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        Self(Server::start("redis-server", move |port, dir| {
            let mut c = Command::new(&bin);
            c.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--dir"])
                .arg(dir)
                .args(["--appendonly", "yes", "--appendfsync", "always", "--save", ""])
                .args(["--daemonize", "no", "--protected-mode", "no"])
                .args(&extra);
            c
        }))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.0.port())
    }

    /// A connection of this server's, for the test's own reading (with `password`).
    pub async fn connection(&self, password: Option<&str>) -> redis::aio::MultiplexedConnection {
        let url = match password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}", self.0.port()),
            None => self.url(),
        };
        let client = redis::Client::open(url).expect("redis url");
        // A loaded machine answers a long XRANGE slowly: no short response timeout.
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(Duration::from_secs(60)))
            .set_connection_timeout(Some(Duration::from_secs(30)));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("connecting to the test's Redis")
    }
}

impl std::ops::Deref for Redis {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.0
    }
}

impl std::ops::DerefMut for Redis {
    fn deref_mut(&mut self) -> &mut Server {
        &mut self.0
    }
}

/// A RabbitMQ node of its own (its name, ports, database and Erlang cookie in a temp
/// directory), run as root from Debian's package without the package's service.
pub struct Rabbit {
    server: Server,
    node: String,
}

impl Rabbit {
    pub fn start() -> Self {
        let bin = program("rabbitmq-server", "rabbitmq-server");
        assert!(bin.exists());
        let server_bin = PathBuf::from("/usr/lib/rabbitmq/bin/rabbitmq-server");
        let dist_port = free_port();
        let node = format!("hookrelay-{dist_port}@localhost");
        let name = node.clone();
        let server = Server::start("rabbitmq-server", move |port, dir| {
            std::fs::write(dir.join("enabled_plugins"), "[].").expect("the plugins file");
            let mut c = Command::new(&server_bin);
            c.env("HOME", dir)
                .env("RABBITMQ_NODENAME", &name)
                .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
                .env("RABBITMQ_NODE_PORT", port.to_string())
                .env("RABBITMQ_DIST_PORT", dist_port.to_string())
                .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
                .env("RABBITMQ_LOG_BASE", dir.join("log"))
                .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
                .env("RABBITMQ_PID_FILE", dir.join("pid"))
                .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq"));
            c
        });
        Self { server, node }
    }

    /// The URL of its `guest` user (whose password is `guest`; loopback only).
    pub fn url(&self) -> String {
        format!("amqp://guest@127.0.0.1:{}/%2f", self.server.port())
    }

    /// Runs `rabbitmqctl` on this node; its output, or a failure with it.
    pub fn ctl(&self, args: &[&str]) -> String {
        let out = Command::new("/usr/lib/rabbitmq/bin/rabbitmqctl")
            .env("HOME", self.server.dir())
            .arg("-n")
            .arg(&self.node)
            .args(args)
            .output()
            .expect("running rabbitmqctl");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "rabbitmqctl {args:?}: {text}");
        text
    }

    /// A connection of the test's own, as `guest`.
    pub async fn connection(&self) -> lapin::Connection {
        let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.server.port());
        lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
            .await
            .expect("connecting to the test's RabbitMQ")
    }
}

impl std::ops::Deref for Rabbit {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.server
    }
}

impl std::ops::DerefMut for Rabbit {
    fn deref_mut(&mut self) -> &mut Server {
        &mut self.server
    }
}
