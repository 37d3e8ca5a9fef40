//! The hook lifecycle's small shared state on PostgreSQL: the `upstream` table.

use async_trait::async_trait;

use super::cached::Cached;
use super::PostgresStore;
use crate::store::{SharedState, StoreError};

#[async_trait]
impl SharedState for PostgresStore {
    async fn upstream_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let client = self.client().await?;
        let row =
            client.cached_query_opt("SELECT value FROM upstream WHERE key = $1", &[&key]).await?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn upstream_put(&self, key: &str, value: Option<Vec<u8>>) -> Result<(), StoreError> {
        self.write(async {
            let client = self.client().await?;
            match value {
                Some(v) => {
                    client
                        .cached_execute(
                            "INSERT INTO upstream (key, value) VALUES ($1, $2)
                             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                            &[&key, &v],
                        )
                        .await?
                }
                None => {
                    client.cached_execute("DELETE FROM upstream WHERE key = $1", &[&key]).await?
                }
            };
            Ok(())
        })
        .await
    }

    async fn upstream_scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let client = self.client().await?;
        // starts_with, not LIKE: a prefix may hold `%` or `_`.
        let rows = client
            .cached_query(
                "SELECT key, value FROM upstream WHERE starts_with(key, $1) ORDER BY key",
                &[&prefix],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
}
