//! Work that runs on one relay of a fleet at a time (see [`crate::store::Store::lead`]):
//! a lease row per task, with an expiry on the database's clock, renewed by its holder.
//!
//! Why a lease and not a session advisory lock: a lock lives as long as its session,
//! and a half-open session (the relay's machine gone, no FIN) keeps it until the
//! server notices, two hours by default; meanwhile nobody runs the task. A lease
//! simply runs out. The holder renews its leases every [`RENEW`] and believes it holds
//! one only until [`TTL`] after it *sent* the last renewal that worked (less a margin),
//! which is before the database's expiry: two relays never both believe they lead.
//!
//! The dispatcher's lease also fences its writes: the dispatch transaction locks the
//! lease row `FOR SHARE` and goes on only if this relay holds it, so a relay that lost
//! the lead mid-batch cannot dispatch behind the new leader's back (a takeover's
//! `UPDATE` waits for that transaction to end).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::cached::Cached;
use super::PgState;
use crate::store::StoreError;

/// How long a lease lasts after a renewal, on the database's clock.
pub(super) const TTL: Duration = Duration::from_secs(10);
/// How often the holder renews its leases: a lease survives a few failed renewals.
const RENEW: Duration = Duration::from_secs(2);
/// The holder stops believing it leads this long before the database's expiry.
const MARGIN: Duration = Duration::from_secs(1);
/// A lease call that has not returned after this is given up on (a hung connection
/// must not keep the lead believed held).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The leases this relay holds: task → until when it believes it holds it.
#[derive(Default)]
pub(super) struct Held(std::sync::Mutex<HashMap<String, Instant>>);

impl Held {
    fn holds(&self, task: &str, now: Instant) -> bool {
        crate::lock::lock(&self.0).get(task).is_some_and(|until| *until > now)
    }

    fn set(&self, task: &str, until: Instant) {
        crate::lock::lock(&self.0).insert(task.to_owned(), until);
    }

    fn tasks(&self) -> Vec<String> {
        crate::lock::lock(&self.0).keys().cloned().collect()
    }

    /// Keeps `renewed` (until `until`) and forgets the rest.
    fn renewed(&self, renewed: &[String], until: Instant) -> Vec<String> {
        let mut held = crate::lock::lock(&self.0);
        let lost: Vec<String> = held.keys().filter(|t| !renewed.contains(t)).cloned().collect();
        for task in &lost {
            held.remove(task);
        }
        for task in renewed {
            held.insert(task.clone(), until);
        }
        lost
    }
}

/// The database's clock, in µs, as SQL.
const DB_NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint";

/// Until when a lease renewed by a call sent at `sent` is believed held.
fn believed_until(sent: Instant) -> Instant {
    sent + TTL - MARGIN
}

fn ttl_us() -> i64 {
    i64::try_from(TTL.as_micros()).unwrap_or(i64::MAX)
}

/// The advisory lock key of `task` in `schema` (for [`crate::store::Store::exclusive`]'s
/// transaction locks): relays of one fleet agree on it, other schemas' fleets on the
/// same server do not collide with it.
pub(super) fn lock_key(schema: &str, task: &str) -> i64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("hookrelay\0{schema}\0{task}"));
    let mut key = [0u8; 8];
    key.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(key)
}

impl PgState {
    /// The advisory lock key of `task` in this schema.
    pub(super) fn lock_key(&self, task: &str) -> i64 {
        lock_key(&self.schema, task)
    }

    /// Whether this relay believes it leads dispatch now (its own commits wake its
    /// dispatcher; the others' reach it by notification, `listen.rs`).
    pub(super) fn leads_dispatch(&self) -> bool {
        self.held.holds(crate::store::DISPATCH_LEAD, Instant::now())
    }

    /// See [`crate::store::Store::lead`]: true while this relay holds `task`'s lease;
    /// takes it when it is free or its holder's has run out.
    pub(super) async fn lead(&self, task: &str) -> Result<bool, StoreError> {
        if self.held.holds(task, Instant::now()) {
            return Ok(true);
        }
        let sent = Instant::now();
        let took = self
            .lease_call("taking a lease", |client| async move {
                let row = client
                    .cached_query_opt(
                        &format!(
                            "INSERT INTO leases (task, holder, expires_us) VALUES ($1, $2, {DB_NOW} + $3)
                             ON CONFLICT (task) DO UPDATE SET holder = excluded.holder,
                                 expires_us = excluded.expires_us
                             WHERE leases.holder = excluded.holder OR leases.expires_us <= {DB_NOW}
                             RETURNING task"
                        ),
                        &[&task, &self.instance, &ttl_us()],
                    )
                    .await?;
                Ok(row.is_some())
            })
            .await?;
        if took {
            self.held.set(task, believed_until(sent));
            tracing::info!(task, "this relay now leads the task");
        }
        Ok(took)
    }

    /// Renews every lease this relay holds; forgets those it no longer does.
    async fn renew(&self) -> Result<(), StoreError> {
        let tasks = self.held.tasks();
        if tasks.is_empty() {
            return Ok(());
        }
        let sent = Instant::now();
        let renewed = self
            .lease_call("renewing the leases", |client| async move {
                let rows = client
                    .cached_query(
                        &format!(
                            "UPDATE leases SET expires_us = {DB_NOW} + $3
                             WHERE holder = $1 AND task = ANY($2) RETURNING task"
                        ),
                        &[&self.instance, &tasks, &ttl_us()],
                    )
                    .await?;
                Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>())
            })
            .await?;
        for task in self.held.renewed(&renewed, believed_until(sent)) {
            tracing::warn!(task, "this relay lost the lead of the task (its lease was taken over)");
        }
        Ok(())
    }

    /// `call` on a pooled connection, given up on after [`CALL_TIMEOUT`] (`what` it
    /// does, for the error).
    async fn lease_call<T, F, Fut>(&self, what: &str, call: F) -> Result<T, StoreError>
    where
        F: FnOnce(deadpool_postgres::Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        tokio::time::timeout(CALL_TIMEOUT, async { call(self.pool.get().await?).await })
            .await
            .map_err(|_| timed_out(what))?
    }

    /// Gives up every lease (a relay shutting down hands its tasks over at once).
    pub(super) async fn give_up_leases(&self) -> Result<(), StoreError> {
        self.held.renewed(&[], Instant::now());
        let client = self.pool.get().await?;
        client.cached_execute("DELETE FROM leases WHERE holder = $1", &[&self.instance]).await?;
        Ok(())
    }

    /// Whether this relay may dispatch, given the dispatcher's lease holder as
    /// [`DISPATCH_HOLDER`] read it in the dispatch transaction (locking the row against
    /// a takeover until that transaction ends): yes when this relay holds the lease,
    /// or when no relay ever took it (`None`: the store used directly).
    pub(super) fn may_dispatch(&self, holder: Option<&str>) -> bool {
        holder.is_none_or(|h| h == self.instance)
    }
}

/// The dispatcher's lease holder, its row locked `FOR SHARE` (see
/// [`PgState::may_dispatch`]): a subquery of dispatch's first statement, the task's
/// name in `$2`.
pub(super) const DISPATCH_HOLDER: &str = "SELECT holder FROM leases WHERE task = $2 FOR SHARE";

fn timed_out(what: &str) -> StoreError {
    StoreError::Backend {
        backend: "postgres",
        message: format!(
            "{what} took longer than {CALL_TIMEOUT:?}: the database is slow or unreachable"
        ),
    }
}

/// Renews `inner`'s leases every [`RENEW`] until the store's close stops it (or the
/// store is gone); run on the store's own [`crate::store::Tasks`].
pub(super) async fn renewing(inner: Weak<PgState>) {
    let mut failing = false;
    loop {
        tokio::time::sleep(RENEW).await;
        let Some(inner) = inner.upgrade() else { return };
        match inner.renew().await {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("lease renewals work again");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                let what = "cannot renew this relay's leases; the tasks it leads go to \
                            another relay once they run out";
                inner.health.trouble(crate::store::Trouble::Unreachable, what, &e);
            }
            Err(_) => {}
        }
        drop::<Arc<PgState>>(inner);
    }
}
