//! Coordination of the relays sharing the database: leases (`lead.rs`), advisory
//! locks, heartbeats in `relays`, wake-ups by `LISTEN`/`NOTIFY` (`listen.rs`).

use std::time::Duration;

use async_trait::async_trait;

use super::cached::Cached;
use super::store::us_of;
use super::{sql_us, PostgresStore};
use crate::store::{Coordination, Exclusive, StoreError};

/// The advisory lock (a task name, keyed per schema) that heartbeats take in turn.
const HEARTBEAT_TURN: &str = "\0heartbeat";

#[async_trait]
impl Coordination for PostgresStore {
    async fn lead(&self, task: &str) -> Result<bool, StoreError> {
        self.inner.lead(task).await
    }

    async fn exclusive(&self, task: &str) -> Result<Exclusive, StoreError> {
        // Not the key of `lead(task)`: the leader holds that one on another connection
        // and takes this one too for each pass.
        let key = self.inner.lock_key(&format!("{task}\0pass"));
        // A connection of its own, out of the pool: closing it (dropping the hold) ends
        // the transaction and its lock, even where no runtime is left to roll back.
        let client = deadpool_postgres::Object::take(self.client().await?);
        // Waited for (not bounded by statement_timeout; a minute at most), and held
        // through the pass's calls to the upstream (the session may sit idle in it).
        client
            .batch_execute(
                "BEGIN; SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = '60s';
                 SET LOCAL idle_in_transaction_session_timeout = 0",
            )
            .await?;
        client.execute("SELECT pg_advisory_xact_lock($1)", &[&key]).await?;
        Ok(Exclusive::new(client))
    }

    async fn heartbeat(
        &self,
        owner: &str,
        live_for: Duration,
    ) -> Result<Option<crate::store::Fleet>, StoreError> {
        let live_us = sql_us(crate::clock::micros(live_for));
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // Heartbeats take turns: each sees every relay announced before it, so two
        // relays joining at once never both find themselves alone (a relay alone takes
        // the whole of the limits at once: `fleet.rs`). The statement after the lock
        // takes its snapshot once the previous heartbeat has committed.
        tx.cached_execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[&self.inner.lock_key(HEARTBEAT_TURN)],
        )
        .await?;
        // The database's clock, not the relays': they need not agree.
        let rows = tx
            .cached_query(
                "WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us),
                 me AS (
                     INSERT INTO relays (owner, started_us, seen_us)
                     SELECT $1, us, us FROM now
                     -- A relay the others stopped counting joins again at the back.
                     ON CONFLICT (owner) DO UPDATE SET seen_us = excluded.seen_us,
                         started_us = CASE WHEN relays.seen_us < excluded.seen_us - $2
                             THEN excluded.started_us ELSE relays.started_us END
                     RETURNING owner, started_us)
                 SELECT owner, (SELECT us FROM now) FROM (
                     SELECT owner, started_us FROM relays, now
                     WHERE seen_us >= now.us - $2 AND owner <> $1
                     UNION ALL SELECT owner, started_us FROM me) AS live
                 ORDER BY started_us, owner",
                &[&owner, &live_us],
            )
            .await?;
        // Long gone relays are forgotten (best effort: any relay may do it).
        tx.cached_execute(
                "DELETE FROM relays WHERE seen_us < (extract(epoch FROM clock_timestamp()) * 1000000)::bigint - $1",
                &[&live_us.saturating_mul(60)],
            )
            .await?;
        tx.commit().await?;
        let owners: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        let store_us = rows.first().map_or(0, |r| us_of(r.get(1)));
        let rank = owners.iter().position(|o| o == owner).unwrap_or(owners.len());
        let size = owners.len().max(rank + 1);
        self.inner.fleet_size.store(size, std::sync::atomic::Ordering::Relaxed);
        Ok(Some(crate::store::Fleet { rank, size, store_us }))
    }

    fn wakeups(&self) -> Option<tokio::sync::broadcast::Receiver<crate::store::Wake>> {
        Some(self.inner.subscribe())
    }
}
