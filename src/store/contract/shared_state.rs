//! The relay's small shared state, keyed by text: the hook lifecycle's (rotated OAuth2
//! refresh tokens, pending gaps, the accounts' status) and the trace salt
//! (`telemetry/ids.rs`).

use async_trait::async_trait;

use crate::store::StoreError;

/// A small durable map every relay on the store sees (`upstream/` keeps its keys, and
/// `telemetry/` one).
#[async_trait]
pub(crate) trait SharedState: Send + Sync {
    /// The value of `key`, if set.
    async fn upstream_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Sets `key` to `value`, or removes it with `None`; durable when it returns.
    async fn upstream_put(&self, key: &str, value: Option<Vec<u8>>) -> Result<(), StoreError>;
    /// Every entry whose key starts with `prefix`.
    async fn upstream_scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError>;
}
