//! Connecting to the database: errors that name the server and the cause, TLS as
//! `sslmode` says, and poolers refused clearly unless they keep the session (a real
//! PgBouncer).

use super::*;

/// A wrong password, a missing database and a server that is down each give an error
/// naming host:port, the user or database, and the cause (what `hookrelay migrate`
/// prints, as `/readyz` and the logs do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_errors_name_the_server_and_the_cause() {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let port = server.port();
    let url = server.database("errors");
    server.require_password("keeper", "right-password");
    let migrate = |url: String| {
        let (ok, text) = migrate_with(&url, "");
        assert!(!ok, "{text}");
        text
    };
    let at = format!("127.0.0.1:{port}");
    let text = migrate(format!("postgres://keeper:wrong-password@{at}/errors"));
    assert!(
        text.contains(&at) && text.contains("password authentication failed for user \"keeper\""),
        "{text}"
    );
    assert!(text.contains("check the password"), "{text}");
    assert!(!text.contains("wrong-password"), "a password in an error: {text}");
    let text = migrate(format!("postgres://postgres@{at}/no_such_database"));
    assert!(text.contains(&at) && text.contains("\"no_such_database\" does not exist"), "{text}");
    assert!(text.contains("createdb"), "{text}");
    let down = free_addr();
    let text = migrate(format!("postgres://postgres@{down}/errors"));
    assert!(text.contains(&down) && text.to_lowercase().contains("refused"), "{text}");
    assert!(text.contains("is PostgreSQL running"), "{text}");
    drop(url);
}

/// TLS to the database (a test server with a certificate for `localhost` signed by a
/// CA of the test's): `require` encrypts; `verify-full` with that CA connects by name
/// and refuses the address (the certificate is not for it), `verify-ca` takes it;
/// another CA is refused with an error that says so; a relay on verify-full keeps its
/// every session encrypted and delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_the_database_is_verified_as_sslmode_says() {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let port = server.port();
    let plain = server.database("tls");
    let ca = server.enable_tls();
    let other = tempfile::tempdir().unwrap();
    let wrong_ca = common::pg::new_ca(other.path(), "another CA");
    let migrate = |url: String, extra: String| migrate_with(&url, &extra);
    let (ip, name) = (format!("127.0.0.1:{port}"), format!("localhost:{port}"));
    let ca_s = ca.display().to_string();
    let (ok, text) =
        migrate(format!("postgres://postgres@{ip}/tls?sslmode=require"), String::new());
    assert!(ok, "require: {text}");
    let full = |ca: &std::path::Path| {
        format!("sslmode = \"verify-full\"\nca_file = {:?}\n", ca.display().to_string())
    };
    let (ok, text) = migrate(format!("postgres://postgres@{name}/tls"), full(&ca));
    assert!(ok, "verify-full by name: {text}");
    let (ok, text) = migrate(
        format!("postgres://postgres@{name}/tls?sslmode=verify-full&sslrootcert={ca_s}"),
        String::new(),
    );
    assert!(ok, "verify-full in the URL: {text}");
    let (ok, text) = migrate(format!("postgres://postgres@{ip}/tls"), full(&ca));
    assert!(
        !ok && text.contains(&ip) && text.contains("certificate"),
        "verify-full by address: {text}"
    );
    let (ok, text) = migrate(
        format!("postgres://postgres@{ip}/tls"),
        format!("sslmode = \"verify-ca\"\nca_file = {ca_s:?}\n"),
    );
    assert!(ok, "verify-ca by address: {text}");
    // As libpq: verifying needs a root certificate, named (the public CAs only as
    // "system"), or nothing starts.
    for (url, extra) in [
        (format!("postgres://postgres@{ip}/tls"), "sslmode = \"verify-ca\"\n".to_owned()),
        (format!("postgres://postgres@{name}/tls?sslmode=verify-full"), String::new()),
    ] {
        let (ok, text) = migrate(url, extra);
        assert!(!ok && text.contains("needs a root certificate"), "{text}");
        assert!(text.contains("ca_file") && text.contains("\"system\""), "{text}");
    }
    let (ok, text) = migrate(
        format!("postgres://postgres@{name}/tls"),
        "sslmode = \"verify-full\"\nca_file = \"system\"\n".to_owned(),
    );
    assert!(!ok && (text.contains("UnknownIssuer") || text.contains("unknown issuer")), "{text}");
    let (ok, text) = migrate(format!("postgres://postgres@{name}/tls"), full(&wrong_ca));
    assert!(!ok && text.contains(&name), "another CA: {text}");
    assert!(text.contains("UnknownIssuer") || text.contains("unknown issuer"), "{text}");
    assert!(text.contains("check storage.postgres.sslmode and ca_file"), "{text}");

    // A relay on verify-full: every session of it is encrypted, and it delivers.
    let sink = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("postgres://postgres@{name}/tls");
    let text = config(dir.path(), &url, &sink).replace(
        "[storage.postgres]\n",
        &format!("[storage.postgres]\nsslmode = \"verify-full\"\nca_file = {ca_s:?}\n"),
    );
    let relay = Relay::start(dir.path(), &text).await;
    let r = relay
        .callback(Some("ActionCreated"), "application/json", r#"{"data":{"id":"tls-1"}}"#)
        .await;
    assert_eq!(r.status(), 200);
    sink.wait_for(1, Duration::from_secs(20)).await;
    let metrics = relay.metrics().await;
    let verified = |mode: &str| {
        common::metric(&metrics, "hookrelay_postgres_tls_verified", &[("sslmode", mode)])
    };
    assert_eq!(verified("verify-full"), Some(1.0), "{metrics}");
    let (client, connection) =
        tokio_postgres::connect(&plain, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_activity a
             JOIN pg_stat_ssl s ON s.pid = a.pid WHERE a.application_name LIKE 'hookrelay%'",
            &[],
        )
        .await
        .unwrap();
    let (encrypted, all): (i64, i64) = (row.get(0), row.get(1));
    assert!(all > 0 && encrypted == all, "{encrypted} of {all} sessions encrypted");
}

/// A PgBouncer (Debian's `pgbouncer`) in front of a test server, run as `postgres`.
struct PgBouncer {
    dir: tempfile::TempDir,
    port: u16,
}

impl PgBouncer {
    /// Starts one on a free port with `pool_mode` and any `extra` settings.
    fn start(server: &PgServer, pool_mode: &str, extra: &str) -> PgBouncer {
        let dir = tempfile::Builder::new().prefix("hookrelay-pgbouncer").tempdir().unwrap();
        let port: u16 = free_addr().rsplit(':').next().unwrap().parse().unwrap();
        let d = dir.path().display();
        std::fs::write(dir.path().join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        std::fs::write(
            dir.path().join("pgbouncer.ini"),
            format!(
                "[databases]\n* = host=127.0.0.1 port={}\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
                 listen_port = {port}\nauth_type = trust\nauth_file = {d}/users.txt\n\
                 pool_mode = {pool_mode}\nunix_socket_dir =\nlogfile = {d}/pgbouncer.log\n\
                 pidfile = {d}/pgbouncer.pid\n{extra}\n",
                server.port()
            ),
        )
        .unwrap();
        let owned =
            std::process::Command::new("chown").args(["-R", "postgres"]).arg(dir.path()).status();
        assert!(owned.unwrap().success());
        let out = std::process::Command::new("runuser")
            .args(["-u", "postgres", "--", "pgbouncer", "-d"])
            .arg(dir.path().join("pgbouncer.ini"))
            .output()
            .expect("pgbouncer (Debian's package; scripts/test.sh installs it)");
        assert!(out.status.success(), "pgbouncer: {}", String::from_utf8_lossy(&out.stderr));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "pgbouncer does not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        PgBouncer { dir, port }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.path().join("pgbouncer.pid")) {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                // SAFETY: a signal to the pooler this test started.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
    }
}

/// Through PgBouncer: a transaction-mode pool, which refuses or drops the settings the
/// relay sends at connect, is refused at start with an error that says so and what to
/// do (the relay exits: no waiting mends it); a session-mode pool with the schema set
/// on the role works, and delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poolers_are_refused_clearly_unless_they_keep_the_session() {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    server.database("pooled");
    let sink = Sink::start().await;
    let serve = |url: String| {
        let dir = tempfile::tempdir().unwrap();
        let mut child = spawn_serve(dir.path(), &config(dir.path(), &url, &sink));
        // It must exit at once: no waiting mends a pooler that drops the settings.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("the relay kept running behind a pooler that drops its settings");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut text = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut text).unwrap();
        (status.success(), text)
    };
    let plain = PgBouncer::start(&server, "transaction", "");
    let (ok, text) = serve(format!("postgres://postgres@127.0.0.1:{}/pooled", plain.port));
    assert!(!ok && text.contains("unsupported startup parameter"), "{text}");
    assert!(text.contains("connection pooler") && text.contains("docs/deploy.md"), "{text}");
    let dropping = PgBouncer::start(&server, "transaction", "ignore_startup_parameters = options");
    let (ok, text) = serve(format!("postgres://postgres@127.0.0.1:{}/pooled", dropping.port));
    assert!(!ok && text.contains("did not take effect"), "{text}");
    assert!(text.contains("transaction pooling is not supported"), "{text}");
    // Session pooling, the schema (and timeouts) set on the role: works.
    server.psql(
        "ALTER ROLE postgres IN DATABASE pooled SET search_path = hookrelay;
         ALTER ROLE postgres IN DATABASE pooled SET statement_timeout = '5s'",
    );
    let session = PgBouncer::start(&server, "session", "ignore_startup_parameters = options");
    let dir = tempfile::tempdir().unwrap();
    let url = format!("postgres://postgres@127.0.0.1:{}/pooled", session.port);
    let relay = Relay::start(dir.path(), &config(dir.path(), &url, &sink)).await;
    let r = relay
        .callback(Some("ActionCreated"), "application/json", r#"{"data":{"id":"pooled-1"}}"#)
        .await;
    assert_eq!(r.status(), 200);
    sink.wait_for(1, Duration::from_secs(20)).await;
}
