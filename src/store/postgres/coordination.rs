//! Coordination of the relays sharing the database: leases (`lead.rs`), advisory
//! locks, heartbeats in `relays`, wake-ups by `LISTEN`/`NOTIFY` (`listen.rs`).

use std::time::Duration;

use async_trait::async_trait;

use super::cached::Cached;
use super::store::us_of;
use super::{sql_us, PostgresStore};
use crate::store::{Coordination, Exclusive, StoreError};

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
        let client = self.client().await?;
        // The announcement commits (a statement of its own) before the fleet is read:
        // of two relays joining at once, the one that reads second sees the other, so
        // they never both find themselves alone (a relay alone takes the whole of the
        // limits at once: `fleet.rs`). No lock: a relay frozen mid-heartbeat holds no
        // other relay's heartbeat up. The database's clock, not the relays': they need
        // not agree.
        client
            .cached_execute(
                "INSERT INTO relays (owner, started_us, seen_us)
                 SELECT $1, us, us FROM
                     (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us) AS now
                 -- A relay the others stopped counting joins again at the back.
                 ON CONFLICT (owner) DO UPDATE SET seen_us = excluded.seen_us,
                     started_us = CASE WHEN relays.seen_us < excluded.seen_us - $2
                         THEN excluded.started_us ELSE relays.started_us END",
                &[&owner, &live_us],
            )
            .await?;
        let rows = client
            .cached_query(
                "WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us)
                 SELECT owner, now.us FROM relays, now
                 WHERE seen_us >= now.us - $1
                 ORDER BY started_us, owner",
                &[&live_us],
            )
            .await?;
        // Long gone relays are forgotten (best effort: any relay may do it).
        client
            .cached_execute(
                "DELETE FROM relays WHERE seen_us < (extract(epoch FROM clock_timestamp()) * 1000000)::bigint - $1",
                &[&live_us.saturating_mul(60)],
            )
            .await?;
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
