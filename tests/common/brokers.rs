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

/// Waits until `port` accepts connections, for `what` (started as `child`, if given).
fn wait_listening(port: u16, what: &str, mut child: Option<&mut Child>) {
    // RabbitMQ takes 5 to 20 s on a busy machine.
    let deadline = Instant::now() + Duration::from_secs(90);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(Ok(Some(status))) = child.as_mut().map(|c| c.try_wait()) {
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

/// A broker's TLS: the CA that signed its certificate (for `127.0.0.1`), and the
/// user and password it requires.
#[derive(Clone, Debug)]
pub struct Tls {
    pub ca: PathBuf,
    pub user: String,
    pub password: String,
}

/// The certificate files of a broker in `dir` (`dir/tls/`: `server.pem`,
/// `server.key`, the CA's `ca.pem`), made at its first start.
fn certificates(dir: &Path) -> PathBuf {
    let tls = dir.join("tls");
    if !tls.join("server.pem").exists() {
        let ca = super::pg::server_certificate(&tls, "IP:127.0.0.1,DNS:localhost");
        // A name without spaces, for rabbitmq.conf.
        std::fs::copy(ca, tls.join("ca.pem")).expect("the CA's copy");
    }
    tls
}

/// `name` in the certificate directory `tls`, as a string for a command line.
fn file(tls: &Path, name: &str) -> String {
    tls.join(name).to_str().expect("utf-8 path").to_owned()
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
        // A process group of its own: RabbitMQ's script starts the Erlang VM as a
        // child, which a signal to the script alone would leave running (and writing
        // its crash dumps into the working directory once its data is gone).
        let mut command = (self.command)();
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.name));
        wait_listening(self.port, self.name, Some(&mut child));
        self.child = Some(child);
    }

    /// Stops it, its children included (SIGTERM to its group, then SIGKILL after
    /// 10 s), and waits until none of the group is left: the script may exit before
    /// the VM it started.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let group = -(child.id() as i32);
        unsafe { libc::kill(group, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let _ = child.try_wait(); // reaps the script once it exits
            if unsafe { libc::kill(group, 0) } != 0 {
                break;
            }
            if Instant::now() > deadline {
                unsafe { libc::kill(group, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.wait();
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // The whole group: the VM RabbitMQ's script started goes with it.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
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
            command: Box::new(move || {
                let mut c = command(port, &at);
                c.current_dir(&at);
                c
            }),
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

/// A NATS server with JetStream, its store in a temp directory; with TLS and a user
/// when started by [`Nats::start_tls`].
pub struct Nats {
    server: Server,
    tls: Option<Tls>,
}

impl Nats {
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// Requiring TLS (a certificate of a CA of the test's) and `user`:`password`.
    pub fn start_tls(user: &str, password: &str) -> Self {
        Self::start_with(Some((user.to_owned(), password.to_owned())))
    }

    fn start_with(login: Option<(String, String)>) -> Self {
        let bin = program("nats-server", "nats-server");
        let secured = login.clone();
        let server = Server::start("nats-server", move |port, dir| {
            let mut c = Command::new(&bin);
            c.args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"]).arg(dir.join("js"));
            if let Some((user, password)) = &secured {
                let tls = certificates(dir);
                c.args(["--tls", "--tlscert", &file(&tls, "server.pem")])
                    .args(["--tlskey", &file(&tls, "server.key")])
                    .args(["--user", user, "--pass", password]);
            }
            c
        });
        let tls = login.map(|(user, password)| Tls {
            ca: server.dir().join("tls").join("ca.pem"),
            user,
            password,
        });
        Self { server, tls }
    }

    /// The relay's URL: `tls://user@...` (its password given apart) when TLS is on.
    pub fn url(&self) -> String {
        match &self.tls {
            Some(tls) => format!("tls://{}@127.0.0.1:{}", tls.user, self.server.port()),
            None => format!("nats://127.0.0.1:{}", self.server.port()),
        }
    }

    pub fn tls(&self) -> Option<&Tls> {
        self.tls.as_ref()
    }

    /// A client of this server, for the test's own reading and setup.
    pub async fn client(&self) -> async_nats::Client {
        let mut options = async_nats::ConnectOptions::new();
        if let Some(tls) = &self.tls {
            options = options
                .require_tls(true)
                .add_root_certificates(tls.ca.clone())
                .user_and_password(tls.user.clone(), tls.password.clone());
        }
        let scheme = if self.tls.is_some() { "tls" } else { "nats" };
        options
            .connect(format!("{scheme}://127.0.0.1:{}", self.server.port()))
            .await
            .expect("connecting to the test's NATS")
    }
}

impl std::ops::Deref for Nats {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.server
    }
}

impl std::ops::DerefMut for Nats {
    fn deref_mut(&mut self) -> &mut Server {
        &mut self.server
    }
}

/// A Redis server, persisting with an append-only file fsynced on every write
/// (`appendfsync always`): what it acknowledged survives its restart. Started by
/// [`Redis::start_tls`], it also takes TLS on a port of its own, and a password.
pub struct Redis {
    server: Server,
    /// The TLS port, and the password every connection needs.
    tls: Option<(u16, Tls)>,
}

impl Redis {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// With `args` added to its command line (`--requirepass`, say).
    pub fn start_with(args: &[&str]) -> Self {
        let extra: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        Self { server: Self::server(extra, None), tls: None }
    }

    /// Requiring `password`, and taking TLS (a certificate of a CA of the test's) on
    /// a second port beside the plain one (which the test's own reading uses).
    pub fn start_tls(password: &str) -> Self {
        let tls_port = free_port();
        let extra = vec!["--requirepass".to_owned(), password.to_owned()];
        let server = Self::server(extra, Some(tls_port));
        let ca = server.dir().join("tls").join("ca.pem");
        let tls = Tls { ca, user: String::new(), password: password.to_owned() };
        let redis = Self { server, tls: Some((tls_port, tls)) };
        // The TLS listener opens with the plain one; wait for it all the same.
        wait_listening(tls_port, "redis-server's TLS listener", None);
        redis
    }

    fn server(extra: Vec<String>, tls_port: Option<u16>) -> Server {
        let bin = program("redis-server", "redis-server");
        Server::start("redis-server", move |port, dir| {
            let mut c = Command::new(&bin);
            c.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--dir"])
                .arg(dir)
                .args(["--appendonly", "yes", "--appendfsync", "always", "--save", ""])
                .args(["--daemonize", "no", "--protected-mode", "no"])
                .args(&extra);
            if let Some(tls_port) = tls_port {
                let tls = certificates(dir);
                c.args(["--tls-port", &tls_port.to_string()])
                    .args(["--tls-cert-file", &file(&tls, "server.pem")])
                    .args(["--tls-key-file", &file(&tls, "server.key")])
                    .args(["--tls-ca-cert-file", &file(&tls, "ca.pem")])
                    .args(["--tls-auth-clients", "no"]);
            }
            c
        })
    }

    /// The relay's URL: `rediss://` on the TLS port when TLS is on.
    pub fn url(&self) -> String {
        match &self.tls {
            Some((port, _)) => format!("rediss://127.0.0.1:{port}"),
            None => format!("redis://127.0.0.1:{}", self.server.port()),
        }
    }

    pub fn tls(&self) -> Option<&Tls> {
        self.tls.as_ref().map(|(_, tls)| tls)
    }

    /// A connection of this server's plain port, for the test's own reading (with
    /// `password`, or the one TLS mode set).
    pub async fn connection(&self, password: Option<&str>) -> redis::aio::MultiplexedConnection {
        let password = password.or(self.tls().map(|t| t.password.as_str()));
        let url = match password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}", self.server.port()),
            None => format!("redis://127.0.0.1:{}", self.server.port()),
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
        &self.server
    }
}

impl std::ops::DerefMut for Redis {
    fn deref_mut(&mut self) -> &mut Server {
        &mut self.server
    }
}

/// A RabbitMQ node of its own (its name, ports, database and Erlang cookie in a temp
/// directory), run as root from Debian's package without the package's service.
pub struct Rabbit {
    server: Server,
    node: String,
    /// The TLS port, and the user made for it.
    tls: Option<(u16, Tls)>,
}

impl Rabbit {
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// Taking TLS (a certificate of a CA of the test's) on a second port beside the
    /// plain one (which the test's own reading uses), with a user `user`:`password`
    /// allowed everything on `/`.
    pub fn start_tls(user: &str, password: &str) -> Self {
        let tls_port = free_port();
        let mut rabbit = Self::start_with(Some(tls_port));
        rabbit.ctl(&["add_user", user, password]);
        rabbit.ctl(&["set_permissions", "-p", "/", user, ".*", ".*", ".*"]);
        let ca = rabbit.server.dir().join("tls").join("ca.pem");
        let tls = Tls { ca, user: user.to_owned(), password: password.to_owned() };
        rabbit.tls = Some((tls_port, tls));
        rabbit
    }

    fn start_with(tls_port: Option<u16>) -> Self {
        let bin = program("rabbitmq-server", "rabbitmq-server");
        assert!(bin.exists());
        let server_bin = PathBuf::from("/usr/lib/rabbitmq/bin/rabbitmq-server");
        let dist_port = free_port();
        let node = format!("hookrelay-{dist_port}@localhost");
        let name = node.clone();
        let server = Server::start("rabbitmq-server", move |port, dir| {
            std::fs::write(dir.join("enabled_plugins"), "[].").expect("the plugins file");
            if let Some(tls_port) = tls_port {
                let tls = certificates(dir);
                let conf = format!(
                    "listeners.ssl.default = {tls_port}\n\
                     ssl_options.cacertfile = {}\n\
                     ssl_options.certfile = {}\n\
                     ssl_options.keyfile = {}\n\
                     ssl_options.verify = verify_none\n\
                     ssl_options.fail_if_no_peer_cert = false\n",
                    file(&tls, "ca.pem"),
                    file(&tls, "server.pem"),
                    file(&tls, "server.key"),
                );
                std::fs::write(dir.join("rabbitmq.conf"), conf).expect("rabbitmq.conf");
            }
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
        Self { server, node, tls: None }
    }

    /// The relay's URL: its `guest` user (whose password is `guest`; loopback only);
    /// with TLS on, `amqps://` on the TLS port as the TLS user.
    pub fn url(&self) -> String {
        match &self.tls {
            Some((port, tls)) => format!("amqps://{}@127.0.0.1:{port}/%2f", tls.user),
            None => format!("amqp://guest@127.0.0.1:{}/%2f", self.server.port()),
        }
    }

    pub fn tls(&self) -> Option<&Tls> {
        self.tls.as_ref().map(|(_, tls)| tls)
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
