//! The store's one error type, the same whatever the backend.

/// Why a store operation failed. Messages never contain event bodies or secrets.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    /// The backend's own failure (I/O, full disk, lost connection), with its message.
    #[error("{backend}: {message}")]
    Backend { backend: &'static str, message: String },
    #[error("record {key} in `{table}` is unreadable: {reason}")]
    Corrupt { table: &'static str, key: String, reason: String },
    #[error("cannot encode a record: {0}")]
    Encode(#[from] serde_json::Error),
    #[error(
        "the store holds schema version {found}, this build understands {supported}: \
         use a newer hookrelay or another storage location"
    )]
    Schema { found: String, supported: u32 },
    /// A blocking store task did not finish (panicked or was cancelled).
    #[error("store task failed: {0}")]
    Task(String),
    #[cfg(test)]
    #[error("injected failure: {0}")]
    Injected(&'static str),
}
