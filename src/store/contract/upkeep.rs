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
}
