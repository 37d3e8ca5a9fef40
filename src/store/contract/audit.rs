//! The audit ledger: every callback accounted for, per hour of receive time.

use async_trait::async_trait;

use crate::store::lifecycle::ledger::LedgerEdits;
use crate::store::{EventId, StoreError};

/// The ledger's counters over a window, as one consistent reading.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LedgerReading {
    /// Every counter of the window's hours (summed over whatever a backend splits them
    /// into), with `waiting` read from the inbox at the same instant.
    pub(crate) counts: LedgerEdits,
    /// The first event the ledger counts: a store that held events before the ledger
    /// existed starts it at its next event (older ones are not accounted).
    pub(crate) start: EventId,
}

/// Kept by every write that stores an event or moves one on (see
/// [`lifecycle::ledger`](crate::store::lifecycle::ledger)); read by `GET /admin/audit`
/// and the imbalance check.
#[async_trait]
pub(crate) trait Audit: Send + Sync {
    /// The counters of the hours `from_hour..to_hour` (hours since the Unix epoch), and
    /// the events of those hours still in the inbox as `waiting`, read at one instant:
    /// no write lands between the two.
    async fn ledger(&self, from_hour: u64, to_hour: u64) -> Result<LedgerReading, StoreError>;

    /// Deletes the counters of the hours before `before_hour`, at most `limit` of them
    /// (a backend's unit: a row of counters), and returns how many went: retention's
    /// leader calls it until fewer than `limit` go (`retention.audit`). A count moved
    /// later in a pruned hour (a replay of an older dead letter) makes a row that the
    /// next pass prunes again.
    async fn prune_ledger(&self, before_hour: u64, limit: usize) -> Result<usize, StoreError>;

    /// Adds `n` to the `triggered` counter of (`source`, `event`) in `hour`: calls the
    /// upstream counted on its hooks, as a reconcile saw them.
    async fn add_triggered(
        &self,
        hour: u64,
        source: &str,
        event: &str,
        n: u64,
    ) -> Result<(), StoreError>;
}
