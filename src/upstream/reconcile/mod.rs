//! The reconciler: every `reconcile_interval` (and on `hooks sync`), each account's
//! hooks are listed and brought in line with the configuration (see `plan.rs`);
//! Disabled hooks are re-created and their gap reported; the metrics and the admin
//! view are updated from what was found and done.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use futures_util::StreamExt;

use super::client::AccountClient;
use super::gap::{self, PendingGap};
use super::gauges::Gauges;
use super::model::Hook;
use super::plan::{self, Targets};
use super::status::{AccountStatus, Change, GapView, HookView};
use super::{AccountId, UpstreamError};
use crate::config::{Secret, MASK};
use crate::internal_events::{
    AccountReconciled, HookRecreated, InternalEvent, ReconcilerStoreFailed, StoredGapUnreadable,
};
use crate::lock::lock;
use crate::metrics::Metrics;
use crate::shutdown::Stop;
use crate::store::SharedStore;

mod gaps;
mod shared;

use shared::status_key;

/// One account the relay keeps hooks for.
pub(crate) struct Account {
    pub(crate) client: AccountClient,
    pub(crate) events: Vec<String>,
    pub(crate) prune: bool,
    /// `{public_url}/hooks/{source}/`.
    pub(crate) prefix: String,
    /// The source's callback token (part of every target URL).
    pub(crate) source_token: Secret,
}

impl Account {
    fn id(&self) -> &AccountId {
        &self.client.id
    }

    fn target(&self, event: &str) -> String {
        format!("{}{}/{event}", self.prefix, self.source_token.expose())
    }

    /// A target URL fit for the admin API: the source token masked.
    fn shown(&self, url: &str) -> String {
        url.replace(self.source_token.expose(), MASK)
    }
}

/// The name under which relays sharing a store take turns at reconciling.
const LEAD_TASK: &str = "reconciler";

/// Keeps every account's hooks as configured.
pub(crate) struct Reconciler {
    accounts: Vec<Account>,
    store: SharedStore,
    /// The hook lifecycle's metrics, and the missing-callbacks comparison behind one.
    gauges: Gauges,
    max_concurrency: usize,
    /// Between two passes: a status older than two is stale.
    interval: std::time::Duration,
    /// One pass at a time (timer and `hooks sync` share it); holds when the last one
    /// ended, so that the timer's pass is skipped when a sync has just run (it would
    /// otherwise run right behind the sync that made it wait, and see the world
    /// changed under the caller of that sync).
    pass: tokio::sync::Mutex<Option<Instant>>,
    status: Mutex<BTreeMap<AccountId, AccountStatus>>,
    /// Disabled hooks already counted as a transition (a failed re-creation is retried).
    seen_disabled: Mutex<HashSet<String>>,
}

impl Reconciler {
    pub(crate) fn new(
        accounts: Vec<Account>,
        store: SharedStore,
        metrics: Arc<Metrics>,
        max_concurrency: usize,
        interval: std::time::Duration,
    ) -> Self {
        let ids: Vec<(AccountId, Vec<String>)> =
            accounts.iter().map(|a| (a.id().clone(), a.events.clone())).collect();
        Self {
            accounts,
            store,
            gauges: Gauges::new(metrics, &ids),
            max_concurrency: max_concurrency.max(1),
            interval,
            pass: tokio::sync::Mutex::new(None),
            status: Mutex::new(BTreeMap::new()),
            seen_disabled: Mutex::new(HashSet::new()),
        }
    }

    /// Runs a pass now and every `interval` until `stop`.
    pub(crate) async fn run(self: Arc<Self>, interval: std::time::Duration, mut stop: Stop) {
        if self.accounts.is_empty() {
            // Nothing to reconcile; a supervised task ends only at shutdown.
            stop.wait().await;
            return;
        }
        loop {
            // One relay of a fleet reconciles for all; the others take over if it dies.
            match self.store.lead(LEAD_TASK).await {
                Ok(true) => {
                    tokio::select! {
                        _ = self.pass_unless_within(interval) => {}
                        _ = stop.wait() => return,
                    }
                }
                Ok(false) => tracing::debug!("another relay leads hook reconciliation"),
                Err(e) => ReconcilerStoreFailed {
                    what: "cannot tell which relay reconciles hooks; skipping this pass",
                    account: None,
                    error: &e,
                }
                .emit(&self.gauges.metrics),
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.wait() => return,
            }
        }
    }

    /// The timer's pass: none if one ended within `interval` (a sync, run while this
    /// one waited for its turn or just before).
    async fn pass_unless_within(&self, interval: std::time::Duration) {
        let last = self.pass.lock().await;
        if last.is_some_and(|ended| ended.elapsed() < interval) {
            tracing::debug!("a pass ended within the interval: the timer's is skipped");
            return;
        }
        self.pass_held(last).await;
    }

    /// Reconciles every account (at most `max_concurrency` at once); returns their status.
    pub(crate) async fn sync(&self) -> Vec<AccountStatus> {
        let last = self.pass.lock().await;
        self.pass_held(last).await
    }

    /// A pass, with the turn `last` held; notes when it ended.
    async fn pass_held(
        &self,
        mut last: tokio::sync::MutexGuard<'_, Option<Instant>>,
    ) -> Vec<AccountStatus> {
        let statuses = self.pass_inner().await;
        *last = Some(Instant::now());
        statuses
    }

    /// A pass's work: the fleet's turn, then every account.
    async fn pass_inner(&self) -> Vec<AccountStatus> {
        // And one pass at a time across relays sharing the store, so that a `hooks
        // sync` asked of several at once creates each hook once.
        let _fleet = match self.store.exclusive(LEAD_TASK).await {
            Ok(hold) => hold,
            Err(e) => {
                ReconcilerStoreFailed {
                    what:
                        "cannot hold hook reconciliation against other relays; skipping this pass",
                    account: None,
                    error: &e,
                }
                .emit(&self.gauges.metrics);
                return self.statuses();
            }
        };
        // By index: a closure over `&Account` trips the compiler's Send inference.
        futures_util::stream::iter(0..self.accounts.len())
            .map(|i| self.reconcile(&self.accounts[i]))
            .buffer_unordered(self.max_concurrency)
            .collect::<Vec<()>>()
            .await;
        let mut statuses = self.statuses();
        for status in &mut statuses {
            status.last_gaps = self.last_gaps(&status.source, &status.account).await;
        }
        statuses
    }

    async fn reconcile(&self, account: &Account) {
        let id = account.id();
        let started = Instant::now();
        // On a shared store, the missing-callbacks comparison counts every relay's.
        match self.store.received_counts(&id.source).await {
            Ok(Some(counts)) => self.gauges.set_fleet_received(&id.source, counts),
            Ok(None) => {}
            Err(e) => ReconcilerStoreFailed {
                what: "cannot read the fleet's callback counts; comparing with the last ones read",
                account: Some(id),
                error: &e,
            }
            .emit(&self.gauges.metrics),
        }
        let mut progress = Progress::default();
        let listed = self.reconcile_inner(account, &mut progress).await;
        if let Err(e) = listed {
            progress.errors.push(e.to_string());
        }
        let ok = progress.errors.is_empty();
        AccountReconciled {
            account: id,
            took: started.elapsed(),
            hooks: progress.ours.len(),
            changes: progress.changes.len(),
            errors: &progress.errors,
        }
        .emit(&self.gauges.metrics);
        let previous = lock(&self.status).get(id).cloned();
        let hooks = if progress.listed {
            progress.ours.iter().map(|h| HookView::of(h, account.shown(&h.target_url))).collect()
        } else {
            previous.map(|p| p.hooks).unwrap_or_default()
        };
        let now = SystemTime::now();
        let status = AccountStatus {
            source: id.source.clone(),
            account: id.account.clone(),
            ok,
            errors: progress.errors,
            last_reconcile: Some(crate::timefmt::format_admin(now)),
            events: account.events.clone(),
            hooks,
            foreign_hooks: progress.foreign,
            changes: progress.changes,
            reconciled_at_us: Some(crate::clock::unix_micros(now)),
            age_seconds: None,
            stale: false,
            last_gaps: Vec::new(),
        };
        // Shared with the other relays: any of them shows the last pass.
        match serde_json::to_vec(&status) {
            Ok(bytes) => {
                let key = status_key(&id.source, &id.account);
                if let Err(e) = self.store.upstream_put(&key, Some(bytes)).await {
                    ReconcilerStoreFailed {
                        what: "cannot store the account's status; other relays show an older one",
                        account: Some(id),
                        error: &e,
                    }
                    .emit(&self.gauges.metrics);
                }
            }
            Err(e) => crate::internal_events::taxonomy::failed(
                &self.gauges.metrics,
                crate::internal_events::taxonomy::Stage::Upstream,
                crate::internal_events::taxonomy::ErrorType::Invalid,
                "cannot encode the account's status; other relays show an older one",
                &e,
            ),
        }
        lock(&self.status).insert(id.clone(), status);
    }

    /// Lists, plans and applies; per-change failures are collected in `progress` so
    /// that one refused change does not hold up the others.
    async fn reconcile_inner(
        &self,
        account: &Account,
        progress: &mut Progress,
    ) -> Result<(), UpstreamError> {
        let hooks = account.client.list().await?;
        progress.listed = true;
        let plan = {
            let target = |event: &str| account.target(event);
            let targets = Targets { prefix: &account.prefix, target: &target };
            plan::plan(&account.events, &hooks, &targets, account.prune)
        };
        progress.foreign = plan.foreign;
        progress.ours =
            hooks.into_iter().filter(|h| h.target_url.starts_with(&account.prefix)).collect();
        let mut pending = self.pending_gaps(account).await;
        // Gaps closed but not forgotten (a crash after their event was stored): raised
        // again with the same body (a copy for dedup), never merged into a new gap.
        let closed: Vec<String> =
            pending.iter().filter(|(_, g)| g.closed.is_some()).map(|(e, _)| e.clone()).collect();
        for event in closed {
            if let Some(gap) = pending.remove(&event) {
                if let Err(e) = self.report_gap(account, &event, gap).await {
                    progress.errors.push(format!("reporting the {event} hook gap: {e}"));
                }
            }
        }

        for (event, old) in plan.recreate {
            let earlier = pending.remove(&event);
            if let Err(e) = self.recreate(account, &event, &old, earlier, progress).await {
                progress.errors.push(format!("re-creating the {event} hook: {e}"));
            }
        }
        for event in plan.create {
            let gap = pending.remove(&event);
            if let Err(e) = self.create(account, &event, gap, progress).await {
                progress.errors.push(format!("creating the {event} hook: {e}"));
            }
        }
        for hook in plan.prune {
            match account.client.delete(std::slice::from_ref(&hook.id)).await {
                Ok(()) => {
                    self.gauges.transition(account.id(), &hook.event_name, &hook.status, "Deleted");
                    progress.ours.retain(|h| h.id != hook.id);
                    tracing::info!(source = %account.id().source, account = %account.id().account, event = %hook.event_name, hook = %hook.id, "hook pruned");
                    progress.changes.push(Change {
                        action: "pruned".into(),
                        event: hook.event_name,
                        hook_id: hook.id,
                        replaced: Vec::new(),
                    });
                }
                Err(e) => progress.errors.push(format!("pruning hook {}: {e}", hook.id)),
            }
        }
        let calls = self.gauges.update(account.id(), &account.events, &progress.ours);
        let hour = crate::store::lifecycle::ledger::hour_of(crate::store::EventId::new(
            crate::clock::now_us(),
        ));
        for (event, n) in calls {
            if let Err(e) = self.store.add_triggered(hour, &account.id().source, &event, n).await {
                ReconcilerStoreFailed {
                    what: "cannot add the upstream's calls to the audit ledger; its `triggered` \
                           will be short",
                    account: Some(account.id()),
                    error: &e,
                }
                .emit(&self.gauges.metrics);
            }
        }
        Ok(())
    }

    async fn create(
        &self,
        account: &Account,
        event: &str,
        gap: Option<PendingGap>,
        progress: &mut Progress,
    ) -> Result<(), UpstreamError> {
        let new = account.client.create(event, &account.target(event)).await?;
        self.gauges.transition(account.id(), event, "none", "Active");
        tracing::info!(source = %account.id().source, account = %account.id().account, event, hook = %new.id, "hook created");
        self.gauges.track_created(account.id(), event, &new.id);
        let action = match gap {
            // The Disabled hook was deleted by an earlier pass whose create failed.
            Some(gap) => {
                self.gauges.transition(account.id(), event, "Disabled", "Active");
                self.report_gap(account, event, gap.close(&new.id, crate::clock::now())).await?;
                "recreated"
            }
            None => "created",
        };
        progress.changes.push(Change {
            action: action.into(),
            event: event.to_owned(),
            hook_id: new.id.clone(),
            replaced: Vec::new(),
        });
        progress.ours.push(new);
        Ok(())
    }
}

/// What a pass found and did for one account, kept even when it fails half-way.
#[derive(Default)]
struct Progress {
    listed: bool,
    ours: Vec<Hook>,
    foreign: usize,
    changes: Vec<Change>,
    errors: Vec<String>,
}
