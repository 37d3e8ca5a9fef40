//! The store as a resource: whether it answers, the room it takes, closing it.

use async_trait::async_trait;

use crate::store::StoreError;

/// Asked by readiness, the space guard and shutdown.
#[async_trait]
pub(crate) trait Upkeep: Send + Sync {
    /// Whether the store answers now (a round trip to a database server). An embedded
    /// store is always there.
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Bytes the store takes on disk.
    async fn size_on_disk(&self) -> Result<u64, StoreError>;

    /// Makes everything durable, whatever the durability setting (at shutdown).
    async fn close(&self) -> Result<(), StoreError>;

    /// Writes a backup of the whole store to `out`: one consistent snapshot, in the
    /// format of `store/backup.rs`; returns (entries, bytes, SHA-256 hex). The embedded
    /// store only: a database has its own tools.
    async fn backup(
        &self,
        out: Box<dyn std::io::Write + Send>,
    ) -> Result<(u64, u64, String), StoreError> {
        drop(out);
        Err(StoreError::Config(
            "a backup is taken of the embedded store: on PostgreSQL use pg_dump (docs/deploy.md)"
                .into(),
        ))
    }
}
