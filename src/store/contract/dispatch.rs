//! Dispatch: the inbox of events waiting, the dedup keys, and the one atomic step that
//! turns an event into its deliveries.

use std::sync::Arc;

use async_trait::async_trait;

use crate::store::{DispatchPlan, DispatchVerdict, InboxStats, PendingEvent, StoreError};

/// Makes the dispatch plans of pending events, one each in order (routing, filters and
/// dedup key: the dispatcher's configuration), callable on whichever thread the store
/// runs it. A batch at a time: the filters of a whole batch run in one hand-over.
pub(crate) type Planner = Arc<dyn Fn(&[PendingEvent]) -> Vec<DispatchPlan> + Send + Sync>;

/// The inbox and dedup: read by the dispatcher (one per fleet, see
/// [`DISPATCH_LEAD`](super::DISPATCH_LEAD)), purged by its timer.
#[async_trait]
pub(crate) trait Dispatch: Send + Sync {
    /// Events waiting for dispatch; a lower bound, said so, while the backend counts
    /// them after its open. Never waits for the count (a scrape reads it).
    async fn inbox(&self) -> Result<InboxStats, StoreError>;
    /// The oldest events waiting for dispatch, at most `limit`.
    async fn pending(&self, limit: usize) -> Result<Vec<PendingEvent>, StoreError>;
    /// Dispatches the events of `plans` by [`lifecycle::dispatch`] at `now_us`, in one
    /// atomic write. An event no longer in the inbox is [`DispatchVerdict::Gone`]: a
    /// crash, or another relay, can neither lose an event nor dispatch it twice. So is
    /// one whose row another transaction holds (PostgreSQL skips locked rows): it stays
    /// in the inbox for a later pass. Need not be durable on return: a dispatch lost in
    /// a crash is redone from the inbox, and an attempt's durable record makes the
    /// dispatch before it durable too.
    ///
    /// [`lifecycle::dispatch`]: crate::store::lifecycle::dispatch
    async fn dispatch(
        &self,
        plans: Vec<DispatchPlan>,
        now_us: u64,
    ) -> Result<Vec<DispatchVerdict>, StoreError>;
    /// [`Dispatch::pending`] then [`Dispatch::dispatch`] of the plans `plan` makes of
    /// them. sled does both in one hop to its thread pool, which dispatch pays for
    /// every batch; the others take this default, two calls. Returns the events taken
    /// and their outcomes.
    async fn dispatch_next(
        &self,
        limit: usize,
        plan: Planner,
        now_us: u64,
    ) -> Result<(Vec<PendingEvent>, Vec<DispatchPlan>, Vec<DispatchVerdict>), StoreError> {
        let pending = self.pending(limit).await?;
        if pending.is_empty() {
            return Ok((pending, Vec::new(), Vec::new()));
        }
        let plans = plan(&pending);
        let outcomes = self.dispatch(plans.clone(), now_us).await?;
        Ok((pending, plans, outcomes))
    }
    /// Deletes dedup keys whose window ended before `now_us`; returns how many.
    async fn purge_dedup(&self, now_us: u64) -> Result<usize, StoreError>;
    /// Dedup keys currently held.
    async fn dedup_len(&self) -> Result<u64, StoreError>;
}
