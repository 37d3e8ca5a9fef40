//! Connection errors an operator can act on: which server (host:port, database, user;
//! never the password), what went wrong (refused, timed out, authentication failed,
//! no such database, TLS and why), and what to check.
//!
//! tokio-postgres says "error connecting to server" and keeps the reason in its
//! source chain; deadpool wraps that again ("Error occurred while creating a new
//! object: db error"). Both hid the cause: a wrong password and a missing database
//! read the same. Every connection the store opens goes through [`Pool::get`] or
//! [`Target::explain`], so every such error says it all.

use std::error::Error as _;
use std::time::Duration;

use tokio_postgres::error::SqlState;

use crate::store::StoreError;

/// The server a store connects to, as shown in errors (no password).
#[derive(Clone, Debug)]
pub(crate) struct Target {
    /// `host:port`, or each of them for a multi-host URL.
    pub(crate) hosts: String,
    database: String,
    user: String,
}

impl Target {
    pub(crate) fn of(config: &tokio_postgres::Config) -> Self {
        let ports = config.get_ports();
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                match h {
                    tokio_postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
                    tokio_postgres::config::Host::Unix(path) => {
                        format!("{}/.s.PGSQL.{port}", path.display())
                    }
                }
            })
            .collect();
        let user = config.get_user().unwrap_or("(none)").to_owned();
        Self {
            hosts: if hosts.is_empty() { "localhost:5432".into() } else { hosts.join(",") },
            database: config.get_dbname().unwrap_or(&user).to_owned(),
            user,
        }
    }

    /// `e`, said with the server it concerns, its cause, and what to check.
    pub(crate) fn explain(&self, e: &tokio_postgres::Error) -> StoreError {
        let (cause, check) = self.cause(e);
        let error = self.error(&cause, check);
        // A pooler refusing the session settings refuses them every time: no waiting
        // mends it (a relay that waited would hide it behind "not ready").
        match error {
            StoreError::Backend { message, .. } if cause.contains("startup parameter") => {
                StoreError::Config(message)
            }
            other => other,
        }
    }

    fn error(&self, cause: &str, check: &str) -> StoreError {
        let (hosts, database, user) = (&self.hosts, &self.database, &self.user);
        StoreError::Backend {
            backend: "postgres",
            message: format!(
                "PostgreSQL at {hosts} (database {database:?}, user {user:?}): {cause}; {check}"
            ),
        }
    }

    /// What went wrong, and what to check, for a connection error.
    fn cause(&self, e: &tokio_postgres::Error) -> (String, &'static str) {
        if let Some(db) = e.as_db_error() {
            let text = db.message().to_owned();
            let check = match db.code() {
                c if *c == SqlState::INVALID_PASSWORD => {
                    "check the password in storage.postgres.url (or its file or variable)"
                }
                c if *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION => {
                    "check the user in storage.postgres.url and the server's pg_hba.conf"
                }
                c if *c == SqlState::INVALID_CATALOG_NAME => {
                    "create the database (createdb) or fix its name in storage.postgres.url"
                }
                c if *c == SqlState::CANNOT_CONNECT_NOW => {
                    "the server is starting, stopping or recovering: the relay tries again"
                }
                c if *c == SqlState::TOO_MANY_CONNECTIONS => {
                    "the server's max_connections is used up: lower storage.postgres.pool_size \
                     or raise max_connections (docs/deploy.md)"
                }
                c if *c == SqlState::READ_ONLY_SQL_TRANSACTION => {
                    "this server is a standby: point storage.postgres.url at the primary, or \
                     list every host with target_session_attrs=read-write"
                }
                _ if text.contains("startup parameter") => {
                    "a connection pooler (PgBouncer?) refuses the settings hookrelay sends at \
                     connect: connect to PostgreSQL directly, or through a session-mode pool \
                     that passes the startup `options` (docs/deploy.md, poolers)"
                }
                _ => "see the server's log for the same time",
            };
            return (format!("{} ({})", text, db.code().code()), check);
        }
        // The reason is the innermost error of the chain.
        let mut chain = Vec::new();
        let mut source = e.source();
        while let Some(s) = source {
            chain.push(s);
            source = s.source();
        }
        let text = chain.last().map_or_else(|| e.to_string(), |s| s.to_string());
        let lower = text.to_ascii_lowercase();
        // rustls' errors arrive wrapped in an io::Error: look at the words first.
        if lower.contains("server does not support tls") {
            return (
                text,
                "the server has TLS off: turn ssl on there, or lower storage.postgres.sslmode",
            );
        }
        if lower.contains("certificate") || lower.contains("tls") || lower.contains("handshake") {
            return (
                text,
                "check storage.postgres.sslmode and ca_file against the server's certificate \
                 (its CA, and the host name it was issued for)",
            );
        }
        if lower.contains("lookup address") || lower.contains("name or service not known") {
            return (text, "check the host name in storage.postgres.url (DNS)");
        }
        if let Some(io) = chain.iter().find_map(|s| s.downcast_ref::<std::io::Error>()) {
            use std::io::ErrorKind::*;
            let check = match io.kind() {
                ConnectionRefused => "is PostgreSQL running and listening on that host and port?",
                TimedOut => "is the host reachable (firewall, security group, DNS)?",
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof => {
                    "the server or the network closed the connection: the relay tries again"
                }
                NotFound => "check the host name in storage.postgres.url (DNS)",
                _ => "check the host, the port and the network",
            };
            return (io.to_string(), check);
        }
        if lower.contains("timeout") || lower.contains("timed out") {
            return (text, "is the host reachable, and the server not overloaded?");
        }

        (
            if chain.is_empty() { e.to_string() } else { format!("{e}: {text}") },
            "check the server's log for the same time",
        )
    }
}

/// The store's pool of connections; every error from getting one is explained.
pub(crate) struct Pool {
    pub(super) pool: deadpool_postgres::Pool,
    pub(super) target: Target,
}

impl Pool {
    /// A connection, or why there is none.
    pub(crate) async fn get(&self) -> Result<deadpool_postgres::Client, StoreError> {
        use deadpool_postgres::{PoolError, TimeoutType};
        self.pool.get().await.map_err(|e| match e {
            PoolError::Backend(e) => self.target.explain(&e),
            PoolError::Timeout(TimeoutType::Wait) => self.target.error(
                &format!("every pooled connection stayed busy for {:?}", super::POOL_TIMEOUT),
                "the database is slow or waiting on locks; or raise storage.postgres.pool_size",
            ),
            PoolError::Timeout(_) => self.target.error(
                &format!("no connection within {:?}", super::POOL_TIMEOUT),
                "is the host reachable, and the server not overloaded?",
            ),
            other => self.target.error(&other.to_string(), "the relay is shutting down"),
        })
    }

    pub(crate) fn close(&self) {
        self.pool.close();
    }
}

/// How long a connection attempt may take.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
