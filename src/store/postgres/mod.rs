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
            Box::new(move |events| {
                // A lost connection is not the end of the store: the next group
                // reconnects (no fail-stop on PostgreSQL's errors).
                writer
                    .health
                    .write(|_| false, || runtime.block_on(writer.bounded(writer.append(events))))
            }),
            None,
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
mod tests {
    use std::time::{Duration, Instant};

    use super::test_server;
    use crate::store::fixtures;
    use crate::store::{Coordination, Dispatch, EventLog, Upkeep};

    /// Two stores on one new database, as two relays of a fleet hold it.
    pub(super) async fn two_relays(
        prefix: &'static str,
    ) -> (super::PostgresStore, super::PostgresStore) {
        let url = tokio::task::spawn_blocking(move || {
            test_server::shared().database(&test_server::unique_database(prefix))
        })
        .await
        .unwrap();
        (fixtures::postgres(&url).await, fixtures::postgres(&url).await)
    }

    /// Runs `sql` on the database of `store` (the test's hand on the tables).
    async fn sql(store: &super::PostgresStore, sql: &str) {
        store.client().await.unwrap().batch_execute(sql).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_relay_leads_a_task_and_another_takes_over_when_its_lease_runs_out() {
        let (a, b) = two_relays("lead").await;
        assert!(a.lead("retention").await.unwrap());
        assert!(a.lead("retention").await.unwrap(), "a leader stays leader");
        assert!(!b.lead("retention").await.unwrap(), "two leaders");
        assert!(b.lead("reconciler").await.unwrap(), "tasks are led independently");
        // The holder renews its lease: past the lease's first term, it still leads.
        tokio::time::sleep(super::lead::TTL + Duration::from_secs(2)).await;
        assert!(!b.lead("retention").await.unwrap(), "a lease ran out while renewed");
        assert!(a.lead("retention").await.unwrap());
        // Its lease runs out on the database's clock (the holder cut off: no renewal
        // arrives): the other relay takes it at its next ask, and the old holder learns
        // it at its next renewal. The row's holder is renamed too: a cut-off holder's
        // renewals cannot arrive, but this one's, in this process, could land between
        // the update and the ask (it did, on a loaded machine).
        sql(&a, "UPDATE leases SET expires_us = 0, holder = holder || '-cut-off' WHERE task = 'retention'").await;
        assert!(b.lead("retention").await.unwrap(), "nobody took over the lead");
        let deadline = Instant::now() + Duration::from_secs(5);
        while a.lead("retention").await.unwrap() {
            assert!(Instant::now() < deadline, "the old holder still believes it leads");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // A relay that closes hands its leases over at once.
        assert!(!a.lead("reconciler").await.unwrap());
        b.close().await.unwrap();
        assert!(a.lead("reconciler").await.unwrap(), "a closed relay kept its lease");
    }

    /// A relay that lost the dispatch lease dispatches nothing, even from a batch it
    /// read while it led: the new leader dispatches (one order per resource).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_relay_that_lost_the_dispatch_lease_dispatches_nothing() {
        use crate::store::fixtures::{plan, received};
        use crate::store::{DispatchVerdict, DISPATCH_LEAD};
        let (a, b) = two_relays("lead").await;
        let id = a.append(received("demo", "ActionCreated", 100, "{}")).await.unwrap();
        assert!(a.lead(DISPATCH_LEAD).await.unwrap());
        sql(&a, "UPDATE leases SET expires_us = 0 WHERE task = 'dispatch'").await;
        assert!(b.lead(DISPATCH_LEAD).await.unwrap());
        // a still believes it leads (until its next renewal), and tries.
        let out = a.dispatch(vec![plan(id, 1, &["x"])], 200).await.unwrap();
        assert!(matches!(out[..], [DispatchVerdict::Gone]), "{out:?}");
        let out = b.dispatch(vec![plan(id, 1, &["x"])], 200).await.unwrap();
        assert!(matches!(out[..], [DispatchVerdict::Dispatched { .. }]), "{out:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn heartbeats_rank_the_live_relays_in_the_order_they_joined() {
        let (a, b) = two_relays("lead").await;
        let live = Duration::from_millis(1500);
        let fleet = |rank, size| Some((rank, size));
        let beat = |store: &super::PostgresStore, owner: &'static str| {
            let store = store.clone();
            async move {
                let f = store.heartbeat(owner, live).await.unwrap().unwrap();
                // The database's clock comes with the fleet (this machine's, here).
                let here = crate::clock::unix_micros(std::time::SystemTime::now());
                assert!(f.store_us.abs_diff(here) < 5_000_000, "{} vs {here}", f.store_us);
                Some((f.rank, f.size))
            }
        };
        assert_eq!(beat(&a, "relay-a").await, fleet(0, 1));
        assert_eq!(beat(&b, "relay-b").await, fleet(1, 2));
        assert_eq!(beat(&a, "relay-a").await, fleet(0, 2), "ranks stay");
        // relay-a stops announcing itself: once it is older than `live`, b is alone.
        tokio::time::sleep(live + Duration::from_millis(300)).await;
        assert_eq!(beat(&b, "relay-b").await, fleet(0, 1));
        // It comes back: it joins again, behind b.
        assert_eq!(beat(&a, "relay-a").await, fleet(1, 2));
        assert_eq!(beat(&b, "relay-b").await, fleet(0, 2));
    }

    /// Of relays joining at once, at most one finds itself alone: the others would
    /// otherwise all take the whole of the limits (`fleet::settled`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn relays_joining_at_once_never_both_find_themselves_alone() {
        let (a, b) = two_relays("join").await;
        const AT_ONCE: usize = 6;
        // Short-lived, so that each round is a fleet of its own.
        let live = Duration::from_millis(300);
        for round in 0..10 {
            let beats = (0..AT_ONCE).map(|k| {
                let store = if k % 2 == 0 { a.clone() } else { b.clone() };
                tokio::spawn(async move {
                    let owner = format!("relay-{round}-{k}");
                    store.heartbeat(&owner, live).await.unwrap().unwrap().size
                })
            });
            let mut sizes = Vec::new();
            for beat in beats.collect::<Vec<_>>() {
                sizes.push(beat.await.unwrap());
            }
            let alone = sizes.iter().filter(|s| **s == 1).count();
            assert!(alone <= 1, "round {round}: {alone} relays found themselves alone: {sizes:?}");
            assert!(
                sizes.contains(&AT_ONCE),
                "round {round}: the last to read sees all: {sizes:?}"
            );
            tokio::time::sleep(live + Duration::from_millis(200)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_exclusive_hold_makes_other_relays_wait() {
        let (a, b) = two_relays("lead").await;
        let held = a.exclusive("reconciler").await.unwrap();
        let waiter = tokio::spawn(async move {
            let _hold = b.exclusive("reconciler").await.unwrap();
            Instant::now()
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiter.is_finished(), "two relays held the task at once");
        let released = Instant::now();
        drop(held);
        let got = tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap();
        assert!(got >= released);
    }
}
