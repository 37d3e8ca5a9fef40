//! Dispatch: takes received events from the inbox, deduplicates them, routes them,
//! and turns each into one delivery per destination that wants it — all of it in one
//! store transaction per batch.

mod dedup;
mod plan;
mod purge;
mod resource;
mod route;
mod wake;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::config::{Config, StorageBackend};
use crate::delivery::Destinations;
use crate::internal_events::taxonomy::{self, ErrorType, Stage};
use crate::internal_events::{DispatchLead, EventDispatched, InternalEvent};
use crate::lock::Current;
use crate::metrics::Metrics;
use crate::shape;
use crate::shutdown::Stop;
use crate::store::{
    CommitDispatch, DispatchPlan, DispatchVerdict, DispatchWrite, PendingEvent, SharedStore,
    StoreError, DISPATCH_LEAD,
};
use crate::telemetry::{trace, Tracer};

use plan::PlanRules;
use purge::purge_dedup;
use route::Router;
use wake::inbox_wakeup;

/// Events taken from the inbox per transaction. sled 0.34 runs every transaction
/// and batch under one global write lock, so a long dispatch transaction stalls the
/// committer and with it every acknowledgement. 32 keeps ingest fast while dispatch
/// still keeps up with sustained load (BENCHMARKS.md: 8, 32, 64 and 256 compared).
const BATCH: usize = 32;
/// How long an idle dispatcher waits for a wake-up from its own committer.
const IDLE_POLL: Duration = Duration::from_secs(1);
/// How long an idle dispatcher of a fleet waits before looking at the inbox again
/// (other relays' commits do not wake it).
const FLEET_POLL: Duration = Duration::from_millis(100);
/// How often a relay that does not dispatch asks for the lead.
const FOLLOW_POLL: Duration = Duration::from_secs(1);
/// What one batch writes at most, about: a plan, deliveries and schedule entries for
/// [`BATCH`] events (bodies are not copied).
const DISPATCH_BYTES: u64 = BATCH as u64 * 1024;

/// Whether some destination of `config` takes events named `event` (from any source:
/// only operational events are asked, and their source does not route them).
pub(crate) fn wanted(config: &Config, event: &str) -> bool {
    !Router::new(&config.destinations).destinations_for("", event).is_empty()
}

/// What dispatch routes by, in force: the plan rules and the destinations they wake.
/// A reload replaces both at once; a batch is planned and woken by the pair it began
/// with.
pub(crate) struct DispatchRules(Current<(PlanRules, Arc<Destinations>)>);

impl DispatchRules {
    pub(crate) fn new(config: &Config, destinations: Arc<Destinations>) -> Self {
        Self(Current::new((PlanRules::of(config, &destinations), destinations)))
    }

    /// Puts the routes of `config` to `destinations` in force (a reload).
    pub(crate) fn reload(&self, config: &Config, destinations: Arc<Destinations>) {
        self.0.replace((PlanRules::of(config, &destinations), destinations));
    }
}

/// The dispatcher task's state.
pub(crate) struct Dispatcher {
    store: SharedStore,
    rules: Arc<DispatchRules>,
    metrics: Arc<Metrics>,
    wake: Arc<Notify>,
    /// Below the free-space floor, dispatch (a write) waits for space.
    space: Arc<crate::space::Space>,
    /// Each event's dispatch span.
    tracer: Arc<Tracer>,
    /// Where the filters run: never inside the store's write.
    shaper: Arc<shape::Shaper>,
}

impl Dispatcher {
    /// `wake` is notified by the committer after each group, so dispatch follows
    /// ingest without polling delay.
    pub(crate) fn new(
        store: SharedStore,
        rules: Arc<DispatchRules>,
        metrics: Arc<Metrics>,
        wake: Arc<Notify>,
        space: Arc<crate::space::Space>,
        tracer: Arc<Tracer>,
        shaper: Arc<shape::Shaper>,
    ) -> Self {
        Self { store, rules, metrics, wake, space, tracer, shaper }
    }

    /// Starts dispatching until `stop`. On an embedded store the dispatcher has a
    /// thread of its own, `hookrelay-dispatch` (`store::own_thread`): a batch then
    /// wakes one thread, this one, where it woke three (a runtime thread, the blocking
    /// pool's, the runtime's again). The dedup purge it spawns stays with the runtime.
    /// PostgreSQL's calls are network round trips: there it is a task of the runtime.
    pub(crate) fn start(
        self,
        stop: Stop,
        backend: StorageBackend,
    ) -> std::io::Result<JoinHandle<()>> {
        if backend == StorageBackend::Postgres {
            return Ok(tokio::spawn(self.run(stop)));
        }
        crate::store::own_thread::spawn("hookrelay-dispatch", self.run(stop))
    }

    /// Dispatches until `stop`; what is left in the inbox is dispatched after restart.
    /// Meanwhile an embedded store's committer dispatches what it stores when no
    /// callback waits ([`WithCommits`]), and wakes this task only for the rest.
    async fn run(self, mut stop: Stop) {
        let with_commits = WithCommits {
            rules: self.rules.clone(),
            metrics: self.metrics.clone(),
            space: self.space.clone(),
            tracer: self.tracer.clone(),
        };
        let _lent = self
            .store
            .dispatch_with_commits(Some(Arc::new(with_commits)))
            .then(|| Lent(self.store.clone()));
        let purger = tokio::spawn(purge_dedup(
            self.store.clone(),
            self.metrics.clone(),
            self.space.clone(),
            stop.clone(),
        ));
        // In a fleet the inbox also fills through the other relays, whose commits
        // wake this one by notification (`Wake::Inbox`); a notification can be lost
        // (a reconnection), so the leader also looks again this often when idle.
        let mut wakeups = self.store.wakeups();
        let idle = if wakeups.is_some() { FLEET_POLL } else { IDLE_POLL };
        let mut leading = false;
        while !stop.is_stopped() {
            // One relay of a fleet dispatches for all (the lease moves within seconds
            // when it dies): two dispatchers would split a resource's updates between
            // them, and their commits could put a later one first.
            match self.store.lead(DISPATCH_LEAD).await {
                Ok(true) => {
                    if !leading {
                        DispatchLead::Taken.emit(&self.metrics);
                    }
                    leading = true;
                }
                answer => {
                    match answer {
                        Err(e) => DispatchLead::Unknown(&e).emit(&self.metrics),
                        Ok(_) if leading => DispatchLead::Lost.emit(&self.metrics),
                        Ok(_) => DispatchLead::Elsewhere.emit(&self.metrics),
                    }
                    // Whatever comes next is news: a lead taken again is shown again.
                    leading = false;
                    tokio::select! {
                        _ = tokio::time::sleep(FOLLOW_POLL) => {}
                        _ = stop.wait() => {}
                    }
                    continue;
                }
            }
            if self.space.below_floor() {
                // Every write adds to the data directory: below the floor only what
                // frees space or finishes work in flight goes on (see `space/`).
                tokio::select! {
                    _ = tokio::time::sleep(crate::space::HOLD_POLL) => {}
                    _ = stop.wait() => {}
                }
                continue;
            }
            // A batch writes its records, deliveries and schedule: out of the budget.
            if !self.space.admit(DISPATCH_BYTES).await {
                tokio::select! {
                    _ = tokio::time::sleep(crate::space::HOLD_POLL) => {}
                    _ = stop.wait() => {}
                }
                continue;
            }
            match self.dispatch_batch().await {
                // The inbox is drained (a part-full batch took all there was): the
                // next commit brings a whole group. Looping at once would dispatch
                // it in slivers, each a transaction that holds sled's write lock
                // against the committer.
                Ok(n) if n < BATCH => {
                    tokio::select! {
                        _ = self.wake.notified() => {}
                        _ = inbox_wakeup(&mut wakeups) => {}
                        _ = tokio::time::sleep(idle) => {}
                        _ = stop.wait() => {}
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    taxonomy::failed(
                        &self.metrics,
                        Stage::Dispatch,
                        ErrorType::Storage,
                        "dispatch failed; retrying in 1 s",
                        &e,
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = stop.wait() => {}
                    }
                }
            }
        }
        let _ = purger.await;
    }

    /// Dispatches one batch; returns how many events it read from the inbox, those
    /// another relay dispatched meanwhile (`Gone`) included, or 0 when every one was
    /// (looking again at once would fetch the same bodies again and again).
    async fn dispatch_batch(&self) -> anyhow::Result<usize> {
        let now = crate::clock::now_us();
        let in_force = self.rules.0.load();
        let rules = &in_force.0;
        let (pending, plans, outcomes) = if rules.filters.is_empty() {
            // Read, plan and dispatch in one store call (one hop for a blocking
            // backend); durable when it returns, as configured: the store's business.
            let rules = in_force.clone();
            let planner: crate::store::Planner =
                Arc::new(move |pending| rules.0.plans_unfiltered(pending));
            self.store.dispatch_next(BATCH, planner, now).await?
        } else {
            // Filters run in the shaping processes, bounded, and never inside the
            // store's write (whose watchdog a slow one would trip): read, ask, then
            // write. An event dispatched meanwhile (it cannot be: one relay leads)
            // would come back `Gone`.
            let pending = self.store.pending(BATCH).await?;
            if pending.is_empty() {
                return Ok(0);
            }
            let mut routes = rules.routes(&pending);
            let asked = std::mem::take(&mut routes.to_filter);
            let verdicts =
                if asked.is_empty() { Vec::new() } else { self.shaper.filtered_out(asked).await };
            let plans = rules.plans(&pending, routes, verdicts);
            let outcomes = self.store.dispatch(plans.clone(), now).await?;
            (pending, plans, outcomes)
        };
        if pending.is_empty() {
            return Ok(0);
        }
        let batch = Batch { pending: &pending, plans: &plans, outcomes: &outcomes };
        batch.report(&in_force.1, &self.metrics, &self.tracer, now);
        let gone = outcomes.iter().filter(|o| matches!(o, DispatchVerdict::Gone)).count();
        Ok(if gone == pending.len() { 0 } else { pending.len() })
    }
}

/// A dispatched batch: the events read, their plans and what dispatch made of them.
struct Batch<'a> {
    pending: &'a [PendingEvent],
    plans: &'a [DispatchPlan],
    outcomes: &'a [DispatchVerdict],
}

impl Batch<'_> {
    /// Each event's internal event and dispatch span (begun at `now`), and a wake-up
    /// for each destination given a delivery: the one report of a batch, whichever
    /// thread dispatched it.
    fn report(&self, destinations: &Destinations, metrics: &Metrics, tracer: &Tracer, now: u64) {
        let done = crate::clock::now_us();
        let mut woken = std::collections::HashSet::new();
        for ((event, plan), outcome) in self.pending.iter().zip(self.plans).zip(self.outcomes) {
            EventDispatched { event, plan, outcome }.emit(metrics);
            if !matches!(outcome, DispatchVerdict::Gone) {
                let (id, meta) = (event.id, &event.meta);
                tracer.record(|salt| trace::dispatch(salt, id, meta, outcome, now, done));
            }
            if let DispatchVerdict::Dispatched { .. } = outcome {
                for dest in &plan.destinations {
                    if woken.insert(dest.as_str()) {
                        destinations.wake(dest);
                    }
                }
            }
        }
    }
}

/// The dispatcher's rules and reports lent to the committer of an embedded store
/// (`store::CommitDispatch`): at a gentle rate the thread that stores an event
/// dispatches it in the same write, as this dispatcher would have, instead of waking
/// it.
struct WithCommits {
    rules: Arc<DispatchRules>,
    metrics: Arc<Metrics>,
    space: Arc<crate::space::Space>,
    tracer: Arc<Tracer>,
}

impl CommitDispatch for WithCommits {
    fn dispatch(
        &self,
        pending: &[PendingEvent],
        write: DispatchWrite<'_>,
    ) -> Result<bool, StoreError> {
        let in_force = self.rules.0.load();
        let rules = &in_force.0;
        // Filters are asked in the shaping processes, never inside a store's write; the
        // free-space budget is measured on the blocking pool: the dispatcher's, both.
        if !rules.filters.is_empty() || !self.space.try_admit(DISPATCH_BYTES) {
            return Ok(false);
        }
        let now = crate::clock::now_us();
        let plans = rules.plans_unfiltered(pending);
        let outcomes = write(&plans, now)?;
        let batch = Batch { pending, plans: &plans, outcomes: &outcomes };
        batch.report(&in_force.1, &self.metrics, &self.tracer, now);
        Ok(true)
    }
}

/// Takes back from the store what the dispatcher lent its committer, when the
/// dispatcher's task ends (a panic included): the rules hold the destinations, which
/// hold the store.
struct Lent(SharedStore);

impl Drop for Lent {
    fn drop(&mut self) {
        self.0.dispatch_with_commits(None);
    }
}
