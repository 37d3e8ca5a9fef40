//! A throwaway PostgreSQL server for tests: Debian's `postgresql` binaries, `initdb`
//! and `pg_ctl` on a temporary directory and a free loopback port, run as the
//! unprivileged `postgres` user when the tests run as root (PostgreSQL refuses to run
//! as root). Stopped and deleted when dropped. There is no skip: without the package
//! the test fails and says how to install it (`scripts/test.sh` installs it).
//!
//! Plain std and `tempfile` only, so the integration tests include this same file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A running server; `url()` connects to its `postgres` database.
// Some methods serve only the integration tests, which include this file.
#[allow(dead_code)]
pub struct PgServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    /// The server options it was started with, to start it again.
    opts: String,
}

/// Where Debian puts the server binaries (`/usr/lib/postgresql/<major>/bin`), newest
/// major first; or wherever `pg_ctl` is on the PATH.
fn find_bin() -> PathBuf {
    let mut majors: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    majors.sort();
    if let Some(bin) = majors.into_iter().rev().find(|b| b.join("pg_ctl").exists()) {
        return bin;
    }
    if let Ok(out) = Command::new("sh").args(["-c", "command -v pg_ctl"]).output() {
        let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if let Some(dir) = Path::new(&path).parent().filter(|_| out.status.success()) {
            return dir.to_path_buf();
        }
    }
    panic!(
        "PostgreSQL server binaries not found (no /usr/lib/postgresql/*/bin/pg_ctl): \
         install Debian's `postgresql` package (apt-get install -y postgresql); \
         scripts/test.sh does this"
    );
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `bin/tool args` as the `postgres` user when root.
fn run(bin: &Path, tool: &str, args: &[&str]) -> Output {
    let exe = bin.join(tool);
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    cmd.args(args)
        .current_dir("/")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()))
}

/// Runs `openssl` with `args`; panics with its output if it fails.
fn openssl(args: &[&str]) {
    let out = Command::new("openssl").args(args).output().expect("the openssl command");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A new self-signed CA named `name` in `dir` (`{name}.pem`, `{name}.key`); returns its
/// certificate's path.
pub fn new_ca(dir: &Path, name: &str) -> PathBuf {
    let (pem, key) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        &format!("/CN={name}"),
        "-keyout",
        key.to_str().expect("utf-8"),
        "-out",
        pem.to_str().expect("utf-8"),
    ]);
    pem
}

/// A new CA (`hookrelay test CA.pem`) in `dir`, and a server certificate it signed
/// (`server.pem`, key `server.key`) for `san` (`DNS:localhost`, `IP:127.0.0.1`);
/// returns the CA's PEM file. Needs the `openssl` command.
pub fn server_certificate(dir: &Path, san: &str) -> PathBuf {
    std::fs::create_dir_all(dir).expect("tls dir");
    let ca = new_ca(dir, "hookrelay test CA");
    let at = |name: &str| dir.join(name).to_str().expect("utf-8").to_owned();
    std::fs::write(dir.join("san.ext"), format!("subjectAltName={san}\n")).expect("san");
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &at("server.key"),
        "-out",
        &at("server.csr"),
        "-subj",
        "/CN=localhost",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        &at("server.csr"),
        "-CA",
        &at("hookrelay test CA.pem"),
        "-CAkey",
        &at("hookrelay test CA.key"),
        "-CAcreateserial",
        "-out",
        &at("server.pem"),
        "-days",
        "2",
        "-extfile",
        &at("san.ext"),
    ]);
    ca
}

/// `pg_ctl start` of the data directory `data` with server options `opts`, logging to
/// `log`, waiting up to 60 s for it to accept connections.
fn pg_ctl_start(bin: &Path, data: &str, opts: &str, log: &Path) -> Output {
    let log = log.to_str().expect("utf-8");
    run(bin, "pg_ctl", &["-D", data, "-o", opts, "-l", log, "-w", "-t", "60", "start"])
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
    l.local_addr().expect("local addr").port()
}

#[allow(dead_code)]
impl PgServer {
    /// Creates and starts a server; panics, saying why, if it cannot.
    pub fn start() -> PgServer {
        Self::start_with("")
    }

    /// [`PgServer::start`] with `extra` server options (`-c name=value ...`), e.g. a
    /// benchmark's `shared_preload_libraries=pg_stat_statements`.
    pub fn start_with(extra: &str) -> PgServer {
        let bin = find_bin();
        let dir = tempfile::Builder::new().prefix("hookrelay-pg").tempdir().expect("temp dir");
        if is_root() {
            let owned = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(owned.success(), "chown of the PostgreSQL test directory to postgres failed");
        }
        let data = dir.path().join("data");
        let data_s = data.to_str().expect("utf-8 temp path");
        let out = run(
            &bin,
            "initdb",
            &["-D", data_s, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"],
        );
        assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        // A port taken between the probe and the start makes pg_ctl fail: try again.
        for _ in 0..5 {
            let port = free_port();
            let opts = format!(
                // autovacuum_naptime as docs/deploy.md recommends for a fleet.
                "-p {port} -c listen_addresses=127.0.0.1 -k {} -c fsync=on -c max_connections=200 -c autovacuum_naptime=5s {extra}",
                dir.path().display()
            );
            let log = dir.path().join("server.log");
            let out = pg_ctl_start(&bin, data_s, &opts, &log);
            if out.status.success() {
                return PgServer { dir, bin, port, opts };
            }
            eprintln!(
                "pg_ctl start on port {port} failed, retrying: {}{}",
                String::from_utf8_lossy(&out.stderr),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        panic!("could not start a PostgreSQL test server");
    }

    /// The connection URL (no password: trust authentication on loopback).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Creates a fresh database and returns its URL: one per test, one server per run.
    pub fn database(&self, name: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres", "-q", "-c"])
            .arg(format!("CREATE DATABASE \"{name}\""))
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "CREATE DATABASE failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Creates `user` with `password`, and makes the server ask it for that password
    /// over TCP (other users keep trust authentication).
    pub fn require_password(&self, user: &str, password: &str) {
        let psql = |sql: &str| {
            let out = Command::new(self.bin.join("psql"))
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "postgres",
                    "-q",
                    "-c",
                ])
                .arg(sql)
                .output()
                .expect("psql");
            assert!(out.status.success(), "psql: {}", String::from_utf8_lossy(&out.stderr));
        };
        psql(&format!("CREATE ROLE \"{user}\" LOGIN PASSWORD '{password}'"));
        let hba = self.dir.path().join("data").join("pg_hba.conf");
        let old = std::fs::read_to_string(&hba).expect("pg_hba.conf");
        let line = format!("host all {user} 127.0.0.1/32 scram-sha-256\n");
        std::fs::write(&hba, line + &old).expect("pg_hba.conf");
        psql("SELECT pg_reload_conf()");
    }

    /// Turns TLS on, with a certificate for the name `localhost` only (not for
    /// `127.0.0.1`: verify-full to the address fails, verify-ca passes) signed by a new
    /// CA; returns the CA's PEM file. Needs the `openssl` command.
    pub fn enable_tls(&self) -> PathBuf {
        let dir = self.dir.path().join("tls");
        let ca = server_certificate(&dir, "DNS:localhost");
        let at = |name: &str| dir.join(name).to_str().expect("utf-8").to_owned();
        if is_root() {
            let owned = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .expect("chown");
            assert!(owned.success(), "chown of the TLS files failed");
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join("server.key"), std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
        let out = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres", "-q"])
            .args(["-c", &format!("ALTER SYSTEM SET ssl_cert_file = '{}'", at("server.pem"))])
            .args(["-c", &format!("ALTER SYSTEM SET ssl_key_file = '{}'", at("server.key"))])
            .args(["-c", "ALTER SYSTEM SET ssl = on", "-c", "SELECT pg_reload_conf()"])
            .output()
            .expect("psql");
        assert!(out.status.success(), "enabling TLS: {}", String::from_utf8_lossy(&out.stderr));
        ca
    }

    /// Runs `sql` as `postgres` on the `postgres` database; panics if it fails.
    pub fn psql(&self, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres", "-At", "-c"])
            .arg(sql)
            .output()
            .expect("psql");
        assert!(out.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// A streaming standby of this server (`pg_basebackup -R`), started on a port of
    /// its own; `synchronous` makes it the primary's synchronous standby, commits
    /// waiting until it has applied them (`synchronous_commit = remote_apply`).
    pub fn standby(&self, synchronous: bool) -> PgServer {
        if synchronous {
            self.psql("ALTER SYSTEM SET synchronous_standby_names = '*'");
            self.psql("ALTER SYSTEM SET synchronous_commit = 'remote_apply'");
            self.psql("SELECT pg_reload_conf()");
        }
        let dir =
            tempfile::Builder::new().prefix("hookrelay-pg-standby").tempdir().expect("temp dir");
        if is_root() {
            let owned =
                Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir.path()).status();
            assert!(owned.expect("chown").success(), "chown of the standby's directory failed");
        }
        let data = dir.path().join("data");
        let data_s = data.to_str().expect("utf-8");
        let port = self.port.to_string();
        let out = run(
            &self.bin,
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                data_s,
                "-R",
                "-X",
                "stream",
                "--no-sync",
            ],
        );
        assert!(out.status.success(), "pg_basebackup: {}", String::from_utf8_lossy(&out.stderr));
        // The copy carries the primary's synchronous_standby_names: once promoted, with
        // no standby of its own, every commit would wait for ever.
        let auto = data.join("postgresql.auto.conf");
        let conf = std::fs::read_to_string(&auto).expect("postgresql.auto.conf");
        let kept: String = conf
            .lines()
            .filter(|l| !l.starts_with("synchronous_standby_names"))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&auto, kept).expect("postgresql.auto.conf");
        let port = free_port();
        let opts = self
            .opts
            .replacen(&format!("-p {} ", self.port), &format!("-p {port} "), 1)
            .replace(&self.dir.path().display().to_string(), &dir.path().display().to_string());
        let log = dir.path().join("server.log");
        let out = pg_ctl_start(&self.bin, data_s, &opts, &log);
        assert!(
            out.status.success(),
            "standby start: {}{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let standby = PgServer { dir, bin: self.bin.clone(), port, opts };
        if synchronous {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while self.psql("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
                != "1"
            {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the standby never became synchronous"
                );
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        standby
    }

    /// Promotes this standby to primary.
    pub fn promote(&self) {
        let data = self.dir.path().join("data");
        let out = run(&self.bin, "pg_ctl", &["-D", data.to_str().expect("utf-8"), "-w", "promote"]);
        assert!(out.status.success(), "promote: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Stops the server at once, as a crash would (no checkpoint, connections cut).
    pub fn crash(&self) {
        let data = self.dir.path().join("data");
        let out = run(
            &self.bin,
            "pg_ctl",
            &["-D", data.to_str().expect("utf-8"), "-m", "immediate", "-w", "stop"],
        );
        assert!(out.status.success(), "stop: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Stops the server (fast shutdown: open connections are cut).
    pub fn stop(&self) {
        let data = self.dir.path().join("data");
        let data_s = data.to_str().expect("utf-8");
        let out = run(&self.bin, "pg_ctl", &["-D", data_s, "-m", "fast", "-w", "stop"]);
        assert!(
            out.status.success(),
            "pg_ctl stop failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts a stopped server again, on the same port. While it was down its port
    /// was free: another process (a test's outgoing connection, whose local port the
    /// kernel picks from the same range) may hold it for a moment, so a failed start is
    /// tried again for up to 15 s, and a last failure says what the server's log says.
    pub fn start_again(&self) {
        let data = self.dir.path().join("data");
        let data_s = data.to_str().expect("utf-8");
        let log = self.dir.path().join("server.log");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            let out = pg_ctl_start(&self.bin, data_s, &self.opts, &log);
            if out.status.success() {
                return;
            }
            let why = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stderr),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            assert!(
                std::time::Instant::now() < deadline,
                "pg_ctl start on port {} failed for 15 s: {why}",
                self.port
            );
            eprintln!("pg_ctl start on port {} failed, retrying: {why}", self.port);
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        if let Some(data) = data.to_str() {
            let _ = run(&self.bin, "pg_ctl", &["-D", data, "-m", "immediate", "-w", "stop"]);
        }
    }
}

/// One server for the whole test process (each test takes its own database), stopped
/// when the process exits.
pub fn shared() -> &'static PgServer {
    static SERVER: std::sync::OnceLock<PgServer> = std::sync::OnceLock::new();
    SERVER.get_or_init(|| {
        extern "C" fn stop_at_exit() {
            if let Some(server) = SERVER.get() {
                let data = server.dir.path().join("data");
                if let Some(data) = data.to_str() {
                    let _ =
                        run(&server.bin, "pg_ctl", &["-D", data, "-m", "immediate", "-w", "stop"]);
                }
                let _ = std::fs::remove_dir_all(server.dir.path());
            }
        }
        let server = PgServer::start();
        // SAFETY: registering a plain function with no captured state.
        unsafe { libc::atexit(stop_at_exit) };
        server
    })
}

/// A database name no other test of this process uses.
pub fn unique_database(prefix: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix}_{}_{n}", std::process::id())
}
