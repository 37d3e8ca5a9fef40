//! Connecting: the URL and its TLS parameters, the session settings every connection
//! carries (schema, timeouts, keepalives), the pool, and the check that a pooler in
//! between kept those settings.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

use super::{explain, pg, schema, tls, TlsSettings, POOL_TIMEOUT};
use crate::store::StoreError;

/// A session of this relay idle in a transaction for this long is ended by the server.
const IDLE_IN_TRANSACTION_MS: u64 = 30_000;

/// A pool of one to `url` with the relay's session settings.
pub(super) fn connect_pool(
    url: &str,
    schema: &str,
    statement_timeout: Duration,
    tls: &TlsSettings,
    size: usize,
) -> Result<
    (explain::Pool, tokio_postgres::Config, tokio_postgres_rustls::MakeRustlsConnect),
    StoreError,
> {
    let url_with_tls = url;
    let (url, _) = tls::split_url(url)?;
    let mut config: tokio_postgres::Config = url.parse().map_err(|_| {
        // The parser's message may quote the URL: say what is wrong without it.
        StoreError::Config(
            "storage.postgres.url is not a valid PostgreSQL URL \
             (postgres://user:password@host:port/database)"
                .into(),
        )
    })?;
    let timeout_ms = statement_timeout.as_millis();
    // The server ends a session of this relay that sits in a transaction doing
    // nothing (a relay frozen or cut off mid-transaction keeps its row locks, and the
    // dispatch lease's, only that long), and probes an idle client's socket, so that
    // a vanished relay's session goes in about a minute, not two hours.
    config.options(format!(
        "-c search_path={} -c statement_timeout={timeout_ms} \
         -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS} \
         -c tcp_keepalives_idle=30 -c tcp_keepalives_interval=10 -c tcp_keepalives_count=3",
        schema::quote_ident(schema)
    ));
    config.application_name("hookrelay");
    config.connect_timeout(explain::CONNECT_TIMEOUT);
    // And the relay probes the server's: a connection to a vanished server fails in
    // about a minute instead of hanging its caller.
    config.keepalives(true);
    config.keepalives_idle(Duration::from_secs(30));
    config.keepalives_interval(Duration::from_secs(10));
    config.keepalives_retries(3);
    config.tcp_user_timeout(Duration::from_secs(60));
    let chosen = tls::TlsChoice::of(url_with_tls, tls)?;
    let connector = tls::connector(&mut config, chosen.mode, chosen.ca_file.as_deref())?;
    let manager = Manager::from_config(
        config.clone(),
        connector.clone(),
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    let pool = Pool::builder(manager)
        .max_size(size.max(2))
        // With the server down, a caller gets an error instead of waiting for ever.
        .wait_timeout(Some(POOL_TIMEOUT))
        .create_timeout(Some(POOL_TIMEOUT))
        .recycle_timeout(Some(POOL_TIMEOUT))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| StoreError::Backend {
            backend: "postgres",
            message: format!("connection pool: {e}"),
        })?;
    let target = explain::Target::of(&config);
    Ok((explain::Pool { pool, target }, config, connector))
}

/// Checks that the settings sent at connect (the startup `options`: `search_path`,
/// the timeouts) took effect. A pooler between the relay and PostgreSQL may refuse or
/// drop them (PgBouncer does, unless told to pass them); in transaction mode it also
/// hands each transaction to any server session, so nothing set per session holds.
pub(super) async fn session_settings_took(
    client: &pg::Client,
    schema: &str,
) -> Result<(), StoreError> {
    let row = client.query_one("SELECT current_setting('search_path')", &[]).await?;
    let path: String = row.get(0);
    if path.split(',').any(|p| p.trim().trim_matches('"') == schema) {
        return Ok(());
    }
    Err(StoreError::Config(format!(
        "the session settings hookrelay sends at connect did not take effect (search_path is \
         {path:?}, not the schema {schema:?}): a connection pooler between the relay and \
         PostgreSQL drops them. Connect to PostgreSQL directly, or through a session-mode \
         pool (PgBouncer pool_mode = session) that passes the startup `options`; transaction \
         pooling is not supported (docs/deploy.md, poolers)"
    )))
}

/// See [`crate::store::postgres_url_problem`].
pub(crate) fn url_problem(url: &str, tls: &TlsSettings) -> Option<String> {
    match tls::split_url(url) {
        Err(e) => Some(e.to_string()),
        Ok((rest, _)) => match rest.parse::<tokio_postgres::Config>() {
            Err(_) => Some(
                "storage.postgres.url: not a PostgreSQL URL (postgres://user:password@host:port/database)"
                    .to_owned(),
            ),
            Ok(_) => tls::TlsChoice::of(url, tls).err().map(|e| e.to_string()),
        },
    }
}
