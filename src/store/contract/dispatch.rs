//! Dispatch: the inbox of events waiting, the dedup keys, and the one atomic step that
//! turns an event into its deliveries.

use std::sync::Arc;

use async_trait::async_trait;

use crate::store::{DispatchPlan, DispatchVerdict, InboxStats, PendingEvent, StoreError};

/// Makes the dispatch plans of pending events, one each in order (routing, filters and
/// dedup key: the dispatcher's configuration), callable on whichever thread the store
/// runs it. A batch at a time: the filters of a whole batch run in one hand-over.
pub(crate) type Planner = Arc<dyn Fn(&[PendingEvent]) -> Vec<DispatchPlan> + Send + Sync>;

/// The store's dispatch of a batch at `now_us`, on the calling thread, as
/// [`Dispatch::dispatch`] does it.
pub(crate) type DispatchWrite<'a> =
    &'a mut dyn FnMut(&[DispatchPlan], u64) -> Result<Vec<DispatchVerdict>, StoreError>;

/// Dispatch the committer does itself, in the transaction that stores a quiet group (a
/// few callbacks, none waiting behind them: `store::commit`) when the inbox held
/// nothing before it (the embedded store; see [`Dispatch::dispatch_with_commits`]).
/// At a gentle rate an event is then stored and dispatched by one write on the thread
/// that stored it, instead of that thread waking the dispatcher's (a hand-off between
/// threads cost about 7% of a callback's CPU at 200/s) and a second write
/// (BENCHMARKS.md). The ack waits for the plan, tens of µs. The dispatcher's rules,
/// its reports and its wake-ups are the same: the dispatcher lends them.
pub(crate) trait CommitDispatch: Send + Sync {
    /// Plans `pending` (the group's events, in order), dispatches them through `write`
    /// and reports them as the dispatcher reports a batch: true. `write` returns once
    /// the events and their dispatch are durable, so the report may wake the workers.
    /// False, having written nothing, when they must wait for the dispatcher: filters
    /// to ask in the shaping processes, or no room for the write under the free-space
    /// floor. The write's error, unreported: the store says whether the events were
    /// stored (its committer then stores them as any group, for the dispatcher, which
    /// meets the error and says so).
    fn dispatch(
        &self,
        pending: &[PendingEvent],
        write: DispatchWrite<'_>,
    ) -> Result<bool, StoreError>;
}

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
    /// Has the backend's committer dispatch the events it stores through `hook` when
    /// it can ([`CommitDispatch`]), or no longer (`None`: the dispatcher stopped).
    /// False when the backend never does (the default): its commits wake the
    /// dispatcher, as they do when the hook declines.
    fn dispatch_with_commits(&self, _hook: Option<Arc<dyn CommitDispatch>>) -> bool {
        false
    }
    /// Deletes up to `limit` dedup keys whose window ended before `now_us`, in one
    /// write; returns how many. A purge pass calls it until it returns 0, so that no
    /// single write holds the writer (and the acks behind it) for long, however many
    /// keys a burst left to expire at once.
    async fn purge_dedup(&self, now_us: u64, limit: usize) -> Result<usize, StoreError>;
    /// Dedup keys currently held.
    async fn dedup_len(&self) -> Result<u64, StoreError>;
}
