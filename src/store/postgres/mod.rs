//! The PostgreSQL backend: several relays on one database (issue 12, first step).
//!
//! How it keeps the contract:
//! - **Rules**: every decision is made by [`crate::store::lifecycle`] inside one
//!   transaction. The rules read through a synchronous [`View`](crate::store::lifecycle::View);
//!   the backend answers it from rows fetched `FOR UPDATE` beforehand ([`view::Prefetch`]):
//!   a rule is run, the rows it asked for and did not have are fetched and locked, and
//!   it is run again, until it asks for nothing new (two or three passes). The rules
//!   are pure, so a pass on incomplete rows costs nothing but CPU. Then the changes
//!   are applied in the same transaction (`apply.rs`), and the locks make the decision
//!   atomic against every other relay. A row that does not exist cannot be locked: two
//!   relays inserting the same dedup key or delivery collide on its primary key, one
//!   transaction fails, and its work is done again later.
//! - **Ids** are the receive time in µs, made unique per relay by a local counter and
//!   across relays by the primary key (`ON CONFLICT DO NOTHING`, then the next id),
//!   and raised above every id committed before the group's insert: receive order
//!   across relays follows the upstream's own (a callback sent after another's answer
//!   has the larger id), whatever each relay's clock says.
//! - **Dispatch** is one relay's at a time (the `dispatch` lease, `lead.rs`): it reads
//!   the inbox in id order, so a resource's updates are queued in receive order.
//! - **Claims** live in the `deliveries` row (owner, token from a sequence, lease
//!   expiry): claimed with `FOR UPDATE SKIP LOCKED`, checked when recording.
//! - **Durability** is PostgreSQL's: a write returns after its commit.
//! - **Async**: tokio-postgres through a deadpool pool; appends are grouped by the
//!   [`Committer`] thread into one multi-row insert and one commit.
//! - **Wake-ups**: a transaction that makes deliveries due notifies the schema's
//!   channel; every relay listens on a connection of its own (`listen.rs`).

mod append;
mod apply;
mod audit;
mod cached;
mod combine;
mod connect;
mod coordination;
mod delivery_queue;
mod dispatch;
mod event_log;
mod explain;
mod journal;
mod lead;
mod listen;
mod prune;
pub(super) mod schema;
mod shared_state;
mod store;
#[cfg(test)]
pub(crate) mod test_server;
mod tls;
mod tx;
mod upkeep;
mod view;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) use connect::url_problem;
pub(crate) use tls::{TlsChoice, TlsSettings};

use connect::{connect_pool, session_settings_took};

use super::{Committer, EventId, EventStatus, Health, NewEvent, StoreError, StoreObserver};

/// The client types, under one name.
pub(super) mod pg {
    pub(crate) use deadpool_postgres::{Client, Transaction};
    pub(crate) use tokio_postgres::Row;
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        use tokio_postgres::error::SqlState;
        // tokio-postgres' messages name no password: they are safe to show.
        let message = match e.as_db_error() {
            Some(db) => format!("{}: {}", db.code().code(), db.message()),
            None => e.to_string(),
        };
        let conflict = [
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::UNIQUE_VIOLATION,
        ];
        match e.code() {
            Some(code) if conflict.contains(code) => StoreError::Conflict(message),
            _ => StoreError::Backend { backend: "postgres", message },
        }
    }
}

/// Beyond `write_timeout`, how long a write may go on before the store counts it hung
/// (its own timeout did not fire: never expected).
const HUNG_MARGIN: Duration = Duration::from_secs(60);

/// Longest wait for a pooled connection, a new one, or a health check of one.
pub(super) const POOL_TIMEOUT: Duration = Duration::from_secs(5);

/// How to open the store.
pub(crate) struct PostgresOptions {
    /// `postgres://user:password@host:port/db`: a secret, never logged.
    pub(crate) url: String,
    pub(crate) pool_size: usize,
    /// The schema holding hookrelay's tables.
    pub(crate) schema: String,
    /// Every statement is cancelled by the server after this.
    pub(crate) statement_timeout: Duration,
    /// TLS settings beside the URL's (they win over it).
    pub(crate) tls: TlsSettings,
    /// Most callbacks one group commit takes.
    pub(crate) commit_max_batch: usize,
    /// A write that has not returned after this fails (and is retried by its
    /// caller); the store goes on.
    pub(crate) write_timeout: Duration,
    /// How long the fleet counts a silent relay (`fleet::LIVE_FOR`): a claim of a relay
    /// silent longer than that and its attempt's bound is taken over.
    pub(crate) live_for: Duration,
    pub(crate) observer: Arc<dyn StoreObserver>,
}

/// PostgreSQL-backed [`crate::store::Store`]; cheap to clone.
#[derive(Clone)]
pub(crate) struct PostgresStore {
    inner: Arc<PgState>,
    committer: Committer,
    committer_thread: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
}

pub(super) struct PgState {
    pool: explain::Pool,
    /// To open the wake-ups' connection.
    config: tokio_postgres::Config,
    /// TLS for it, as for the pool's.
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    /// Distinguishes this fleet's advisory locks from another schema's.
    schema: String,
    /// The leases of the tasks this relay leads (`lead.rs`).
    held: lead::Held,
    /// The last id this relay handed out.
    last_id: AtomicU64,
    /// The first event the audit ledger counts (`audit_start`).
    pub(super) ledger_start: EventId,
    health: Arc<Health>,
    /// How long one write may take before it fails.
    write_timeout: Duration,
    /// [`PostgresOptions::live_for`].
    pub(super) live_for: Duration,
    /// The write watchdog's thread, stopped at close (and with the last handle).
    pub(super) watchdog: crate::store::Ticker,
    /// The lease renewal and the notification listener, stopped at close (and with
    /// the last handle).
    pub(super) tasks: crate::store::Tasks,
    /// The fleet's wake-ups, once something subscribed (`listen.rs`).
    wakeups: std::sync::OnceLock<tokio::sync::broadcast::Sender<super::Wake>>,
    /// The schema's notification channel (`listen.rs`).
    channel: String,
    /// Tells this store's notifications from other relays' (their payload starts with
    /// it): a relay's own workers are woken in-process already.
    instance: String,
    /// Relays in the fleet at the last heartbeat (0: not known yet). Alone, a relay
    /// sends no notifications: nobody would listen.
    fleet_size: std::sync::atomic::AtomicUsize,
}

/// `hookrelay migrate`: applies the migrations (or, `dry_run`, lists them).
pub(crate) async fn migrate_only(
    url: &str,
    schema_name: &str,
    tls: TlsSettings,
    dry_run: bool,
) -> Result<String, StoreError> {
    let (pool, _, _) = connect_pool(url, schema_name, Duration::from_secs(60), &tls, 2)?;
    let mut client = pool.get().await?;
    let found = schema::version(&client, schema_name).await?;
    let known = schema::MIGRATIONS.len() as i32;
    if found > known {
        return Err(StoreError::Schema { found: found.to_string(), supported: known as u32 });
    }
    if dry_run {
        let todo: Vec<String> = (found + 1..=known).map(|v| v.to_string()).collect();
        return Ok(if todo.is_empty() {
            format!("schema {schema_name:?} is at version {found}, this build's: nothing to apply")
        } else {
            format!(
                "schema {schema_name:?} is at version {found}; would apply migration(s) {} to reach {known} (dry run: nothing changed)",
                todo.join(", ")
            )
        });
    }
    let now = schema::migrate(&mut client, schema_name).await?;
    Ok(format!("schema {schema_name:?} was at version {found}, is at version {now}"))
}

impl PostgresStore {
    /// Connects, migrates the schema (or refuses a newer one), and starts group commit.
    pub(crate) async fn open(opts: PostgresOptions) -> Result<Self, StoreError> {
        let (pool, config, tls) = connect_pool(
            &opts.url,
            &opts.schema,
            opts.statement_timeout,
            &opts.tls,
            opts.pool_size,
        )?;
        let mut client = pool.get().await?;
        session_settings_took(&client, &opts.schema).await?;
        schema::migrate(&mut client, &opts.schema).await?;
        // Ids keep increasing across a restart even if the clock stepped back.
        let last: Option<i64> = client.query_one("SELECT max(id) FROM events", &[]).await?.get(0);
        let start: i64 = client.query_one("SELECT start FROM audit_start", &[]).await?.get(0);
        drop(client);
        // Every write gives up after write_timeout (a slow database is not a failed
        // one: the write fails, its caller retries, the relay goes on); the watchdog
        // only catches a call that never returns even so.
        let hung = opts.write_timeout + HUNG_MARGIN;
        let health =
            Health::new("postgres", hung, crate::store::Writers::Concurrent, opts.observer.clone());
        let watchdog = Health::start_watchdog(&health)?;
        let last_id = AtomicU64::new(last.map_or(0, |l| u64::try_from(l).unwrap_or(0)));
        let inner = Arc::new(PgState {
            pool,
            config,
            tls,
            schema: opts.schema.clone(),
            held: lead::Held::default(),
            last_id,
            ledger_start: EventId::new(u64::try_from(start).unwrap_or(0)),
            health: health.clone(),
            write_timeout: opts.write_timeout,
            live_for: opts.live_for,
            watchdog,
            tasks: crate::store::Tasks::default(),
            wakeups: std::sync::OnceLock::new(),
            channel: listen::channel_of(&opts.schema),
            instance: format!("{:016x}", fastrand::u64(..)),
            fleet_size: std::sync::atomic::AtomicUsize::new(0),
        });
        inner.tasks.spawn(lead::renewing(Arc::downgrade(&inner)));
        let writer = inner.clone();
        let runtime = tokio::runtime::Handle::current();
        let (committer, thread) = Committer::start(
            "postgres",
            Box::new(move |events, _quiet, _riders| {
                // A lost connection is not the end of the store: the next group
                // reconnects (no fail-stop on PostgreSQL's errors).
                let ids = writer
                    .health
                    .write(|_| false, || runtime.block_on(writer.bounded(writer.append(events))))?;
                Ok(crate::store::Written::waiting(ids))
            }),
            opts.commit_max_batch,
            opts.observer.clone(),
            health,
        )?;
        Ok(Self { inner, committer, committer_thread: Arc::new(Mutex::new(Some(thread))) })
    }
}

impl PgState {
    /// `work`, given up after `write_timeout`: the database waited on a lock, failed
    /// over or went away; the caller retries the write later.
    pub(super) async fn bounded<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.write_timeout, work).await.unwrap_or_else(|_| {
            Err(StoreError::Backend {
                backend: "postgres",
                message: format!(
                    "the database did not finish a write within {:?} (storage.write_timeout): \
                     it is slow, waiting on a lock, failing over or unreachable; the write is retried",
                    self.write_timeout
                ),
            })
        })
    }
}

/// µs as PostgreSQL's bigint.
pub(super) fn sql_us(us: u64) -> i64 {
    i64::try_from(us).unwrap_or(i64::MAX)
}

/// An id as PostgreSQL's bigint.
pub(super) fn sql_id(id: EventId) -> i64 {
    sql_us(id.raw())
}

#[cfg(test)]
mod tests;
