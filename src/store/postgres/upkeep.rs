//! The PostgreSQL store as a resource: a ping, the database's size, closing.

use async_trait::async_trait;

use super::cached::Cached;
use super::store::us_of;
use super::PostgresStore;
use crate::store::{StoreError, Upkeep};

#[async_trait]
impl Upkeep for PostgresStore {
    async fn size_on_disk(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let row = client
            .cached_query_one(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = current_schema() AND c.relkind = 'r'",
                &[],
            )
            .await?;
        Ok(us_of(row.get(0)))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.client().await?.cached_query_one("SELECT 1", &[]).await?;
        Ok(())
    }

    async fn close(&self) -> Result<(), StoreError> {
        self.committer.close_and_join(&self.committer_thread).await?;
        // No renewal after the hand-over, no listener connection left open.
        self.inner.tasks.stop().await;
        // Best effort: unreleased leases run out by themselves.
        if let Err(e) = self.inner.give_up_leases().await {
            tracing::debug!(error = %e, "could not hand this relay's leases over");
        }
        self.inner.pool.close();
        self.inner.watchdog.stop();
        Ok(())
    }
}
