//! Retention: finished events are deleted after `retention.delivered`; dead letters
//! and anything still scheduled are kept. Deliveries to a destination removed from
//! the config go dead after `retention.removed_destinations` (they would otherwise stay
//! scheduled for ever, and keep their events).

use crate::internal_events::taxonomy::{self, ErrorType, Stage};
use crate::internal_events::{
    BodiesPruned, EventsPruned, InternalEvent, RemovedDestinationFound, RemovedDestinationRetired,
};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::unix_micros;
use crate::config::{RetentionConfig, RetryPolicy};
use crate::metrics::Metrics;
use crate::shutdown::Stop;
use crate::space::Space;
use crate::store::lifecycle::AttemptReport;
use crate::store::{AttemptWrite, EventId, SharedStore, StoreError};

/// Events deleted per store call, so one pass never holds the store for long.
const CHUNK: usize = 1000;
/// What one chunk of a pass writes, about, out of the free-space budget before it: a
/// delete is a write too (sled appends it to its log before any space comes back; redb
/// copies the pages it changes).
const CHUNK_BYTES: u64 = CHUNK as u64 * 256;

/// Prunes every `interval` until `stop`.
pub(crate) async fn run(
    store: SharedStore,
    config: RetentionConfig,
    configured: BTreeSet<String>,
    metrics: Arc<Metrics>,
    space: Arc<Space>,
    mut stop: Stop,
) {
    let owner = format!("retention-{}", std::process::id());
    loop {
        let cutoff = cutoff_us(config.delivered);
        // One relay of a fleet prunes for all; another takes over if it dies.
        // Below the free-space floor no pass: on sled a delete appends to the log
        // before any space comes back (see `space/`).
        let leads =
            match if space.below_floor() { Ok(false) } else { store.lead("retention").await } {
                Ok(leads) => leads,
                Err(e) => {
                    taxonomy::failed(
                        &metrics,
                        Stage::Retention,
                        ErrorType::Storage,
                        "cannot tell which relay prunes; skipping this pass",
                        &e,
                    );
                    false
                }
            };
        // Room for the pass's writes, or no pass: the budget measured again if spent.
        let leads = leads && space.admit(CHUNK_BYTES).await;
        if leads {
            // Waits for the queues to be counted after a restart (an embedded store
            // counts a large backlog behind the open): not past a stop.
            tokio::select! {
                retired = retire_removed(&store, &configured, config.removed_destinations, &owner, &metrics) => {
                    if let Err(e) = retired {
                        taxonomy::failed(&metrics, Stage::Retention, ErrorType::Storage, "cannot retire the deliveries of removed destinations; trying again next pass", &e);
                    }
                }
                _ = stop.wait() => return,
            }
        }
        while leads && !stop.is_stopped() && space.admit(CHUNK_BYTES).await {
            match store.prune(cutoff, CHUNK).await {
                Ok(n) => {
                    EventsPruned(n).emit(&metrics);
                    if n < CHUNK {
                        break;
                    }
                }
                Err(e) => {
                    taxonomy::failed(
                        &metrics,
                        Stage::Retention,
                        ErrorType::Storage,
                        "pruning failed; trying again next pass",
                        &e,
                    );
                    break;
                }
            }
        }
        if leads {
            prune_ledger(&store, ledger_before_hour(config.audit), &space, &stop, &metrics).await;
            // The journal of admin changes is kept as long as the ledger.
            if space.admit(CHUNK_BYTES).await {
                if let Err(e) = store.journal_prune(cutoff_us(config.audit)).await {
                    let what = "pruning the journal failed; trying again next pass";
                    taxonomy::failed(&metrics, Stage::Retention, ErrorType::Storage, what, &e);
                }
            }
        }
        if let (true, Some(keep)) = (leads, config.delivered_bodies) {
            let before = cutoff_us(keep);
            if let Err(e) = prune_bodies(&store, before, &metrics, &space, &stop).await {
                taxonomy::failed(
                    &metrics,
                    Stage::Retention,
                    ErrorType::Storage,
                    "dropping the bodies of settled events failed; trying again next pass",
                    &e,
                );
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(config.interval.max(Duration::from_secs(1))) => {}
            _ = stop.wait() => return,
        }
    }
}

/// Now less `keep`, in µs since the epoch: the one rule for every cutoff of retention.
/// Events received before `cutoff_us(retention.delivered)` go once finished; before
/// `cutoff_us(retention.delivered_bodies)` they keep no body once settled (the pass
/// here drops the bodies of events settled when it reaches them; an attempt that
/// settles an older event drops its body as it is recorded: `delivery::recorder`).
pub(crate) fn cutoff_us(keep: Duration) -> u64 {
    crate::clock::now().checked_sub(keep).map_or(0, unix_micros)
}

/// The first hour of the audit ledger `retention.audit` (= `keep`) keeps now: hours
/// that ended more than `keep` ago go.
pub(crate) fn ledger_before_hour(keep: Duration) -> u64 {
    cutoff_us(keep) / crate::store::lifecycle::ledger::HOUR_US
}

/// Deletes the audit ledger's hours before `before_hour`, a chunk at a time.
async fn prune_ledger(
    store: &SharedStore,
    before_hour: u64,
    space: &Arc<Space>,
    stop: &Stop,
    metrics: &Metrics,
) {
    let mut gone = 0;
    while !stop.is_stopped() && space.admit(CHUNK_BYTES).await {
        match store.prune_ledger(before_hour, CHUNK).await {
            Ok(n) => {
                gone += n;
                if n < CHUNK {
                    break;
                }
            }
            Err(e) => {
                taxonomy::failed(
                    metrics,
                    Stage::Retention,
                    ErrorType::Storage,
                    "pruning the audit ledger failed; trying again next pass",
                    &e,
                );
                break;
            }
        }
    }
    if gone > 0 {
        tracing::info!(
            rows = gone,
            before_hour,
            "audit ledger hours older than retention.audit deleted"
        );
    }
}

/// Where the bodies' pass stopped, kept in the store: a restart, or another relay
/// taking the lead, goes on from there instead of looking at days of events again.
const BODIES_CURSOR: &str = "retention/bodies_after";

/// Retention by part: the bodies of settled events received before `before_us` go, in
/// chunks, from where the last pass stopped. An event passed while still owed an
/// attempt keeps its body until its record goes.
async fn prune_bodies(
    store: &SharedStore,
    before_us: u64,
    metrics: &Metrics,
    space: &Arc<Space>,
    stop: &Stop,
) -> Result<(), StoreError> {
    let stored = store.upstream_get(BODIES_CURSOR).await?;
    let mut after = stored
        .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
        .map_or(EventId::new(0), |b| EventId::new(u64::from_be_bytes(b)));
    while !stop.is_stopped() && space.admit(CHUNK_BYTES).await {
        let (gone, last) = store.prune_bodies(after, before_us, CHUNK).await?;
        BodiesPruned(gone).emit(metrics);
        let Some(last) = last else { break };
        after = last;
        store.upstream_put(BODIES_CURSOR, Some(last.raw().to_be_bytes().to_vec())).await?;
    }
    Ok(())
}

/// The store key remembering since when (µs) a destination with deliveries is gone
/// from the config: shared by every relay, so that a restart does not postpone it.
fn removed_key(destination: &str) -> String {
    format!("{REMOVED}{destination}")
}

/// The prefix of [`removed_key`].
const REMOVED: &str = "removed/";

/// Deliveries to destinations no longer configured: noted (and logged) when first
/// found, made dead after `grace` (claimed and recorded as a permanent failure with the
/// reason, through the same rules as any attempt: an ordered resource's next delivery
/// follows). A destination that comes back is forgotten. Returns how many went dead.
async fn retire_removed(
    store: &SharedStore,
    configured: &BTreeSet<String>,
    grace: Duration,
    owner: &str,
    metrics: &Metrics,
) -> Result<usize, StoreError> {
    let open = store.open_destinations().await?;
    for (key, _) in store.upstream_scan(REMOVED).await? {
        let dest = key.trim_start_matches(REMOVED);
        if configured.contains(dest) || !open.iter().any(|d| d == dest) {
            store.upstream_put(&key, None).await?;
        }
    }
    let now = crate::clock::now_us();
    let mut retired = 0;
    for dest in open.iter().filter(|d| !configured.contains(*d)) {
        let key = removed_key(dest);
        let since =
            store.upstream_get(&key).await?.and_then(|v| v.try_into().ok()).map(u64::from_be_bytes);
        let Some(since) = since else {
            let q = store.queue_stats(dest).await?;
            RemovedDestinationFound {
                destination: dest,
                pending: q.pending,
                retrying: q.retrying,
                held: q.held,
                grace,
            }
            .emit(metrics);
            store.upstream_put(&key, Some(now.to_be_bytes().to_vec())).await?;
            continue;
        };
        let gone_for = Duration::from_micros(now.saturating_sub(since));
        if gone_for < grace {
            continue;
        }
        let reason = format!(
            "destination {dest} is no longer in the config (gone for {}); replay this dead letter once it is back",
            humantime::format_duration(Duration::from_secs(gone_for.as_secs()))
        );
        let mut dead = 0;
        loop {
            // Due ones only: a retrying delivery goes at its due time, a held one when its
            // resource's earlier delivery is dead (the next loop turn).
            let claims = store.claim_due(dest, owner, now, Duration::from_secs(60), 256).await?;
            if claims.is_empty() {
                break;
            }
            let reports = claims
                .into_iter()
                .map(|c| (c, AttemptReport::not_sent(now, reason.clone())))
                .collect();
            let recorded = store.record_attempts(reports, &RetryPolicy::default(), None).await?;
            dead += recorded.writes.iter().filter(|r| matches!(r, AttemptWrite::Done(_))).count();
        }
        RemovedDestinationRetired { destination: dest, dead }.emit(metrics);
        retired += dead;
    }
    Ok(retired)
}
