//! The delivery queue: each destination's deliveries, claimed by a worker, attempted,
//! retried, dead, replayed, paused.

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;

use super::JournalEntry;
use crate::config::RetryPolicy;
use crate::store::lifecycle::{AttemptReport, Managed};
use crate::store::{
    Claim, DeadLetterFilter, DeliveryRecord, EventId, QueueStats, Recorded, StoreError,
};

/// A claim's lease beyond its attempt's own bound (the request's timeout): room to
/// record the attempt. An attempt outliving it (a stalled relay) may be made again by
/// another relay.
pub(crate) const CLAIM_MARGIN: Duration = Duration::from_secs(60);

/// How long after its owner last announced itself (a fleet heartbeat, on the store's
/// clock) a claim of `lease` is taken over: the attempt's bound (`lease` less
/// [`CLAIM_MARGIN`]) after `live_for`, how long the fleet counts a silent relay (the
/// fleet's `LIVE_FOR`, given to the store when it opens). A relay starts no attempt
/// once its heartbeat has failed for the fleet's `FENCE` (shorter), so by then its
/// last attempt has ended: the delivery is never in flight twice at once. A killed
/// relay's deliveries move on within seconds instead of a whole lease.
pub(crate) fn owner_silence(lease: Duration, live_for: Duration) -> Duration {
    lease.saturating_sub(CLAIM_MARGIN) + live_for
}

/// The deliveries: claimed and recorded by the delivery workers, listed, replayed,
/// discarded and paused by the admin API.
#[async_trait]
pub(crate) trait DeliveryQueue: Send + Sync {
    /// Claims up to `limit` of `destination`'s deliveries due at `now_us`, earliest
    /// first, for `owner` until `now_us + lease`. A delivery claimed by anyone whose
    /// lease has not expired is skipped; an expired claim is taken over, and so, in a
    /// fleet, is the claim of a relay silent for [`owner_silence`] (its
    /// heartbeat lapsed: it died, or it is cut off and starts nothing).
    async fn claim_due(
        &self,
        destination: &str,
        owner: &str,
        now_us: u64,
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Claim>, StoreError>;
    /// [`DeliveryQueue::claim_due`], then [`DeliveryQueue::next_due_after`] at the
    /// same `now_us`, in one call: a worker's look that claims what is due learns in
    /// the same trip how long it may sleep once those are started (at a gentle rate
    /// every look paid a second trip to the store for it: issue 44). Backends that can
    /// answer both at once override this.
    async fn claim_due_and_next(
        &self,
        destination: &str,
        owner: &str,
        now_us: u64,
        lease: Duration,
        limit: usize,
    ) -> Result<(Vec<Claim>, Option<u64>), StoreError> {
        let claims = self.claim_due(destination, owner, now_us, lease, limit).await?;
        Ok((claims, self.next_due_after(destination, now_us).await?))
    }
    /// Gives a claim back without an attempt (it is due again at once).
    async fn release(&self, claim: &Claim) -> Result<(), StoreError>;
    /// Gives back every claim of `owner` on `destination` whose token is not in `keep`
    /// (the claims its worker holds): claims a call took whose answer never reached
    /// the worker (given up on by a timeout after the store had done it, or dropped
    /// with a restarted worker), which would otherwise wait a whole lease. Returns how
    /// many.
    async fn release_unknown(
        &self,
        destination: &str,
        owner: &str,
        keep: &[u64],
    ) -> Result<usize, StoreError>;
    /// When the destination's next delivery after `now_us` is due.
    async fn next_due_after(
        &self,
        destination: &str,
        now_us: u64,
    ) -> Result<Option<u64>, StoreError>;
    /// Records attempts, each made under its claim, by [`lifecycle::record_attempts`],
    /// in one atomic write, and ends the claims; returns what became of each, in order.
    /// Nothing is written for an attempt whose claim was lost (its lease expired and
    /// someone else claimed the delivery) or whose delivery moved meanwhile. Workers
    /// group the attempts that finish together, as the committer groups callbacks.
    /// An event received before `bodies_before_us` that an attempt settles loses its
    /// body in the same write (`retention.delivered_bodies`, `None` when unset).
    ///
    /// [`lifecycle::record_attempts`]: crate::store::lifecycle::record_attempts
    async fn record_attempts(
        &self,
        attempts: Vec<(Claim, AttemptReport)>,
        policy: &RetryPolicy,
        bodies_before_us: Option<u64>,
    ) -> Result<Recorded, StoreError>;
    /// Every delivery of one event, one per destination.
    async fn deliveries_of(&self, event: EventId) -> Result<Vec<DeliveryRecord>, StoreError>;
    /// Makes an admin's `change` and, when given, appends `journal` with its `count`
    /// set to how many things the change changed, in one transaction: no change is
    /// made without its journal entry, and no entry names a change that was not made.
    /// Returns that count. Durable when it returns (with a journal entry, whatever
    /// the durability setting, as [`super::Journal::journal_append`]).
    async fn change(
        &self,
        change: QueueChange,
        journal: Option<JournalEntry>,
    ) -> Result<u64, StoreError>;
    /// [`lifecycle::replay`] for each of `destinations`, unjournalled (the conformance
    /// tests' shorthand: the relay's replays are an admin's, journalled); returns how
    /// many were scheduled.
    ///
    /// [`lifecycle::replay`]: crate::store::lifecycle::Managed::Replay
    #[cfg(test)]
    async fn replay(
        &self,
        event: EventId,
        destinations: Vec<String>,
        now_us: u64,
    ) -> Result<usize, StoreError> {
        let each = destinations.into_iter().map(|d| (event, d)).collect();
        let change = QueueChange::Deliveries { each, how: Managed::Replay, now_us };
        Ok(usize::try_from(self.change(change, None).await?).unwrap_or(usize::MAX))
    }
    /// [`lifecycle::discard`], unjournalled (the tests' shorthand): false if the
    /// delivery was not dead.
    ///
    /// [`lifecycle::discard`]: crate::store::lifecycle::Managed::Discard
    #[cfg(test)]
    async fn discard(&self, event: EventId, destination: &str) -> Result<bool, StoreError> {
        let each = vec![(event, destination.to_owned())];
        let change = QueueChange::Deliveries { each, how: Managed::Discard, now_us: 0 };
        Ok(self.change(change, None).await? > 0)
    }
    /// Dead deliveries, newest event first.
    async fn dead_letters(
        &self,
        filter: DeadLetterFilter,
    ) -> Result<Vec<DeliveryRecord>, StoreError>;
    /// Counts of a destination's queue by state: kept current by the embedded
    /// backends, counted by PostgreSQL per call (over an index of open states).
    async fn queue_stats(&self, destination: &str) -> Result<QueueStats, StoreError>;
    /// Destinations with deliveries still to make (pending, retrying or held), sorted:
    /// retention finds those of destinations no longer configured.
    async fn open_destinations(&self) -> Result<Vec<String>, StoreError>;
    /// Paused destinations, shared by every relay on the store.
    async fn paused(&self) -> Result<HashSet<String>, StoreError>;
    /// Pauses or resumes a destination for every relay on the store, unjournalled (the
    /// circuit's own pause).
    async fn set_paused(&self, destination: &str, paused: bool) -> Result<(), StoreError> {
        let change = QueueChange::Pause { destination: destination.to_owned(), paused };
        self.change(change, None).await.map(drop)
    }
}

/// What an admin request changes in the delivery queue, made by
/// [`DeliveryQueue::change`] in one transaction with its journal entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum QueueChange {
    /// Each `(event, destination)` delivery changed as `how` says (at `now_us`):
    /// counts those changed.
    Deliveries { each: Vec<(EventId, String)>, how: Managed, now_us: u64 },
    /// A destination paused (`true`) or resumed, for every relay: counts 1.
    Pause { destination: String, paused: bool },
}
