//! The relay at a glance: the overview, the store and the upstream accounts.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::upstream::AccountStatus;

/// `GET /admin/overview`: what the console's overview shows beside the destinations
/// and the accounts: the callbacks per source, the storage, the fleet.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Overview {
    /// Per source, counted by this relay since it started.
    pub(crate) sources: Vec<SourceCounts>,
    pub(crate) storage: Storage,
    /// Relays sharing the store, as this relay last read it (1 on sled).
    pub(crate) relays: u64,
}

/// One source's callbacks, counted by this relay since it started.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct SourceCounts {
    /// The configured name, or `unknown` for paths naming no source.
    pub(crate) source: String,
    /// Stored (answered 200), rejected ones included.
    pub(crate) received: u64,
    /// Stored as rejected (too large).
    pub(crate) rejected: u64,
    /// Refused: wrong source or token (404).
    pub(crate) unauthorized: u64,
    /// Closed unanswered (store failure, no space, body timeout, client gone): the
    /// upstream retries them.
    pub(crate) closed: u64,
    /// Copies of an occurrence already dispatched (dropped by dedup).
    pub(crate) duplicates: u64,
    /// Stored callbacks by event name (`other` for names outside the upstream's list).
    #[serde(default)]
    pub(crate) events: BTreeMap<String, u64>,
    /// Per event, calls the upstream counted on the relay's hooks that no callback
    /// stored answers (`hookrelay_upstream_callbacks_missing`; sources with accounts).
    #[serde(default)]
    pub(crate) missing: BTreeMap<String, u64>,
}

/// Where the data lives and how much room it has.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Storage {
    /// The store's backend: `redb` or `sled` (a local directory), or `postgres`.
    pub(crate) backend: String,
    /// Free bytes on the data directory's filesystem (local backends only).
    pub(crate) free_bytes: Option<u64>,
    /// Below this, callbacks are refused (local backends only).
    pub(crate) floor_bytes: Option<u64>,
    /// Free space is below the floor now.
    pub(crate) below_floor: bool,
    /// The store's size (none when it could not be read).
    pub(crate) store_bytes: Option<u64>,
}

/// `GET /admin/hooks` and `POST /admin/hooks/sync`: every upstream account.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Accounts {
    pub(crate) accounts: Vec<AccountStatus>,
}
