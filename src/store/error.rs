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
    /// The store failed for good in this process (a write error, or a write that did
    /// not return in time: see `store/health.rs`); the relay restarts to reopen it.
    #[error("the store has failed and takes no more writes until the relay restarts: {0}")]
    Failed(String),
    /// Another relay's transaction touched the same rows at the same time (a deadlock,
    /// a serialization failure, or both inserting one key): the work is redone.
    #[error("concurrent update: {0}")]
    Conflict(String),
    /// The store's settings are wrong in a way no waiting mends (a URL that does not
    /// parse): the relay says so and exits.
    #[error("{0}")]
    Config(String),
    /// A blocking store task did not finish (panicked or was cancelled).
    #[error("store task failed: {0}")]
    Task(String),
    #[cfg(test)]
    #[error("injected failure: {0}")]
    Injected(&'static str),
}

impl StoreError {
    /// The same error again, for each caller of a shared write (group commit): the
    /// error type holds a `serde_json::Error`, which cannot be cloned.
    pub(crate) fn duplicate(&self) -> StoreError {
        match self {
            StoreError::Backend { backend, message } => {
                StoreError::Backend { backend, message: message.clone() }
            }
            StoreError::Corrupt { table, key, reason } => {
                StoreError::Corrupt { table, key: key.clone(), reason: reason.clone() }
            }
            StoreError::Encode(e) => {
                StoreError::Encode(<serde_json::Error as serde::de::Error>::custom(e))
            }
            StoreError::Schema { found, supported } => {
                StoreError::Schema { found: found.clone(), supported: *supported }
            }
            StoreError::Failed(reason) => StoreError::Failed(reason.clone()),
            StoreError::Conflict(message) => StoreError::Conflict(message.clone()),
            StoreError::Task(message) => StoreError::Task(message.clone()),
            StoreError::Config(message) => StoreError::Config(message.clone()),
            #[cfg(test)]
            StoreError::Injected(what) => StoreError::Injected(what),
        }
    }

    /// Whether waiting may mend it: a database that is down, starting, failing over,
    /// refusing a user or missing a database for now (an operator may be fixing it
    /// while the relay waits, saying why). Not a schema newer than this build, nor
    /// settings that cannot work.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(self, StoreError::Backend { .. } | StoreError::Conflict(_) | StoreError::Task(_))
    }

    /// Whether this error from a write means the engine itself failed (I/O, a full
    /// disk) rather than one record being unusable: such a write fails the store
    /// (see `health.rs`).
    pub(crate) fn is_engine_failure(&self) -> bool {
        match self {
            StoreError::Backend { .. } | StoreError::Task(_) => true,
            #[cfg(test)]
            StoreError::Injected(_) => true,
            _ => false,
        }
    }
}
