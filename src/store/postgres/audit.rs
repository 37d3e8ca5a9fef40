//! The audit ledger on PostgreSQL: the `audit` counters, summed over their shards,
//! and the inbox grouped by hour, read in one snapshot.

use async_trait::async_trait;

use super::cached::Cached;
use super::PostgresStore;
use crate::store::lifecycle::ledger::{Count, LedgerEdits, LedgerKey, HOUR_US};
use crate::store::{Audit, LedgerReading, StoreError};

fn sql_hour(hour: u64) -> i64 {
    i64::try_from(hour).unwrap_or(i64::MAX)
}

#[async_trait]
impl Audit for PostgresStore {
    async fn ledger(&self, from_hour: u64, to_hour: u64) -> Result<LedgerReading, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let (from, to) = (sql_hour(from_hour), sql_hour(to_hour));
        let hour_us = HOUR_US as i64;
        let start = self.inner.ledger_start.raw() as i64;
        let p1: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&from, &to];
        let p2: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [&from, &to, &hour_us, &start];
        let counters = tx.cached_query(
            "SELECT hour, source, event, destination, count, sum(n)::bigint FROM audit
             WHERE hour >= $1 AND hour < $2
             GROUP BY hour, source, event, destination, count",
            &p1,
        );
        let waiting = tx.cached_query(
            "SELECT id / $3, source, event, count(*) FROM events
             WHERE inbox AND id >= greatest($1 * $3, $4) AND id < $2 * $3
             GROUP BY 1, 2, 3",
            &p2,
        );
        let (counters, waiting) = tokio::try_join!(counters, waiting)?;
        tx.commit().await?;
        let mut counts = LedgerEdits::new();
        for row in counters {
            let name: &str = row.get(4);
            let Some(count) = Count::parse(name) else {
                return Err(StoreError::Corrupt {
                    table: "audit",
                    key: name.to_owned(),
                    reason: "a count this build does not know".into(),
                });
            };
            let n: i64 = row.get(5);
            if n != 0 {
                let key = LedgerKey {
                    hour: u64::try_from(row.get::<_, i64>(0)).unwrap_or(0),
                    source: row.get(1),
                    event: row.get(2),
                    destination: row.get(3),
                    count,
                };
                counts.insert(key, n);
            }
        }
        for row in waiting {
            let hour = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
            // Names the relay does not know share one bucket: add, never overwrite.
            let key = LedgerKey::event(hour, row.get(1), row.get(2), Count::Waiting);
            *counts.entry(key).or_insert(0) += row.get::<_, i64>(3);
        }
        Ok(LedgerReading { counts, start: self.inner.ledger_start })
    }

    async fn prune_ledger(&self, before_hour: u64, limit: usize) -> Result<usize, StoreError> {
        let client = self.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let gone = client
            .cached_execute(
                "DELETE FROM audit WHERE ctid IN
                 (SELECT ctid FROM audit WHERE hour < $1 LIMIT $2)",
                &[&sql_hour(before_hour), &limit],
            )
            .await?;
        Ok(usize::try_from(gone).unwrap_or(usize::MAX))
    }

    async fn add_triggered(
        &self,
        hour: u64,
        source: &str,
        event: &str,
        n: u64,
    ) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let edits = crate::store::lifecycle::ledger::triggered(hour, source, event, n);
        super::apply::add_to_ledger(&tx, &edits).await?;
        tx.commit().await?;
        Ok(())
    }
}
