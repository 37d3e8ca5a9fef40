//! Dispatch in the embedded store: the events awaiting dispatch read after the cursor, the rules
//! applied under the lifecycle lock, one transaction for the whole batch (outcomes,
//! dedup keys, deliveries, schedule, queues and the cursor).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::apply::Alongside;
use super::codec::{decode_meta, parse_meta, split_record};
use super::events::Group;
use super::ride::Riders;
use super::{EmbeddedState, RECORDS};
use crate::lock::lock;
use crate::store::hex;
use crate::store::lifecycle::{self, Changes, Staged};
use crate::store::{
    CommitDispatch, DispatchPlan, DispatchVerdict, EventId, EventMeta, EventStatus, PendingEvent,
    StoreError, Written,
};

impl EmbeddedState {
    /// The committer's dispatch of a quiet `group` (`store::commit`) in the transaction
    /// that stores it, through the dispatcher's rules lent to it: one write instead
    /// of two, and no hand-off to the dispatcher's thread (BENCHMARKS.md). The caller
    /// holds `last_id`.
    ///
    /// Only when the inbox held nothing before the group (the cursor at the committed
    /// watermark): a backlog is the dispatcher's, oldest first. `None` when the group is
    /// to be stored as any other and left to the dispatcher: no hook, a backlog,
    /// nothing received, a hook that declines, or one that fails or panics before the
    /// transaction committed (the dispatcher meets the same failure and reports it).
    /// A failure after the commit is the group's: its fsync.
    /// The `riders` are recorded in the same transaction when it commits.
    pub(super) fn append_dispatched(
        &self,
        group: &Group<'_>,
        riders: &mut Riders,
    ) -> Result<Option<Written>, StoreError> {
        let Some(hook) = lock(&self.commit_dispatch).clone() else { return Ok(None) };
        if self.cursor.load(Ordering::Acquire) != self.committed.load(Ordering::Acquire) {
            return Ok(None);
        }
        let pending: Vec<PendingEvent> = group
            .events()
            .filter(|(_, ev)| ev.meta.status == EventStatus::Received)
            .map(|(id, ev)| PendingEvent {
                id,
                meta: ev.meta.clone(),
                body: ev.body.clone().unwrap_or_default(),
            })
            .collect();
        if pending.is_empty() {
            return Ok(None);
        }
        // Whether the transaction committed, and the write's result.
        let mut stored = false;
        let mut result = None;
        let reported = {
            let mut write = |plans: &[DispatchPlan], now_us| {
                if result.is_some() {
                    return Err(StoreError::Task("a group dispatched twice".into()));
                }
                let verdicts = self.store_dispatched(group, riders, plans, now_us, &mut stored);
                result = Some(verdicts.as_ref().map(drop).map_err(StoreError::duplicate));
                verdicts
            };
            // A panic in the dispatcher's rules is the dispatcher's to meet (its task
            // is supervised), never the committer's, which every ack needs.
            let call = std::panic::AssertUnwindSafe(|| hook.dispatch(&pending, &mut write));
            matches!(std::panic::catch_unwind(call), Ok(Ok(true)))
        };
        match (stored, result) {
            (false, _) => Ok(None),
            (true, Some(Err(e))) => Err(e),
            // The rules' report ran (and woke the workers), unless it panicked: then the
            // dispatcher is woken, and the workers find their deliveries at their poll.
            (true, _) => Ok(Some(Written { ids: group.ids.clone(), waiting: !reported })),
        }
    }

    /// The lent rules' `write` for [`EmbeddedState::append_dispatched`]: decides
    /// `plans` under the lifecycle lock with each event's meta from the group (its
    /// record is not stored yet), writes the group and the decisions in one
    /// transaction (`stored` set once it committed), moves the counts as an append
    /// then a dispatch would, and returns once the group is durable: the rules' report
    /// then wakes the workers, and a delivery must not leave before its event is
    /// durable.
    fn store_dispatched(
        &self,
        group: &Group<'_>,
        riders: &mut Riders,
        plans: &[DispatchPlan],
        now_us: u64,
        stored: &mut bool,
    ) -> Result<Vec<DispatchVerdict>, StoreError> {
        let guard = lock(&self.lifecycle);
        // The riders' records first, as if written just before: the dispatch sees them.
        let mut st = Staged::new(self);
        let staged = riders.stage(self, &mut st);
        let verdicts = self.decide_on(&mut st, plans, now_us, |id| {
            let event = group
                .events()
                .find(|(at, ev)| *at == id && ev.meta.status == EventStatus::Received);
            Ok(event.map(|(_, ev)| ev.meta.clone()))
        })?;
        let changes = st.into_changes();
        let cursor = settled_through(group, &changes.dispatched);
        let alongside = Alongside { cursor, journal: None, appended: &group.records };
        let new_keys = self.transact(&changes, alongside, now_us)?.unwrap_or(0);
        *stored = true;
        // As the append would, then as the dispatch would: the group tallied in the
        // inbox, then taken out of it.
        self.published(group)?;
        self.applied(&changes, cursor, new_keys);
        riders.written(self, staged);
        drop(guard);
        self.durable()?;
        Ok(verdicts)
    }

    /// Lends the dispatcher's rules to the committer, or takes them back (`None`).
    pub(super) fn set_commit_dispatch(&self, hook: Option<Arc<dyn CommitDispatch>>) {
        *lock(&self.commit_dispatch) = hook;
    }

    /// The first `limit` events awaiting dispatch, oldest first.
    pub(super) fn pending(&self, limit: usize) -> Result<Vec<PendingEvent>, StoreError> {
        let mut out = Vec::new();
        let from = self.cursor.load(Ordering::Acquire).saturating_add(1);
        // Read before the scan: every id up to it was visible when the scan began.
        let committed = self.committed.load(Ordering::Acquire);
        // Settled records right after the cursor (rejected ones, say) are stepped over
        // once, not at every poll.
        let mut settled_run = Some(from.saturating_sub(1));
        for item in self.records.range(EventId::new(from).to_key()..) {
            if out.len() >= limit {
                break;
            }
            let (key, value) = item?;
            let corrupt =
                |reason: String| StoreError::Corrupt { table: RECORDS, key: hex(&key), reason };
            let id = EventId::from_key(&key).ok_or_else(|| corrupt("key is not 8 bytes".into()))?;
            // Not before its group is published: the append tallies the group in the
            // ledger's `waiting` after writing it, and a dispatch taking the event in
            // between left it waiting for ever (an audit imbalance seen under load).
            if id.raw() > committed {
                break;
            }
            if !self.awaits_dispatch(&key, &value)? {
                if let Some(run) = settled_run.as_mut() {
                    *run = id.raw();
                }
                continue;
            }
            settled_run = None;
            let record = split_record(&value).map_err(corrupt)?;
            let mut meta = parse_meta(record.meta).map_err(corrupt)?;
            meta.resource = record.resource.map(str::to_owned);
            // The body shares the value the engine read (no copy): it ends the record.
            let body_len = record.body.map_or(0, <[u8]>::len);
            let len = value.len();
            let body = bytes::Bytes::from_owner(value).slice(len - body_len..);
            out.push(PendingEvent { id, meta, body });
        }
        if let Some(run) = settled_run {
            self.cursor.fetch_max(run.min(committed), Ordering::AcqRel);
        }
        Ok(out)
    }

    pub(super) fn dispatch(
        &self,
        plans: &[DispatchPlan],
        now_us: u64,
    ) -> Result<Vec<DispatchVerdict>, StoreError> {
        let guard = lock(&self.lifecycle);
        let (changes, outcomes) = self.decide(plans, now_us, |id| {
            let key = id.to_key();
            match self.records.get(key)? {
                // No outcome yet (just checked): the meta as stored is the event's.
                Some(value) if self.awaits_dispatch(&key, &value)? => {
                    decode_meta(&value).map(Some).map_err(|reason| StoreError::Corrupt {
                        table: RECORDS,
                        key: hex(&key),
                        reason,
                    })
                }
                _ => Ok(None),
            }
        })?;
        let cursor = self.cursor_after(&changes.dispatched.keys().copied().collect())?;
        self.apply_dispatch(&changes, cursor, now_us)?;
        drop(guard);
        // Not flushed here (see `Store::dispatch`): the next durable write covers it.
        Ok(outcomes)
    }

    /// The one rule of dispatch over `plans` at `now_us`, for the inbox's events and
    /// for a group being stored alike: each event whose meta `meta_of` gives (one that
    /// awaits dispatch) decided by [`lifecycle::dispatch`], the others `Gone`. The
    /// caller holds the lifecycle lock and writes the changes.
    fn decide(
        &self,
        plans: &[DispatchPlan],
        now_us: u64,
        meta_of: impl FnMut(EventId) -> Result<Option<EventMeta>, StoreError>,
    ) -> Result<(Changes, Vec<DispatchVerdict>), StoreError> {
        let mut st = Staged::new(self);
        let verdicts = self.decide_on(&mut st, plans, now_us, meta_of)?;
        Ok((st.into_changes(), verdicts))
    }

    /// [`EmbeddedState::decide`] on changes already staged in `st` (riders' records).
    fn decide_on(
        &self,
        st: &mut Staged<'_, Self>,
        plans: &[DispatchPlan],
        now_us: u64,
        mut meta_of: impl FnMut(EventId) -> Result<Option<EventMeta>, StoreError>,
    ) -> Result<Vec<DispatchVerdict>, StoreError> {
        self.dedup_buckets.forget_found();
        let mut verdicts = Vec::with_capacity(plans.len());
        for plan in plans {
            verdicts.push(match meta_of(plan.id)? {
                Some(meta) => lifecycle::dispatch(st, meta, plan, now_us)?,
                None => DispatchVerdict::Gone,
            });
        }
        Ok(verdicts)
    }

    /// Where the cursor can move once `dispatched` have their outcomes: over every
    /// following record that is settled, never past the committed watermark. `None`
    /// when it stays.
    fn cursor_after(&self, dispatched: &HashSet<EventId>) -> Result<Option<u64>, StoreError> {
        let start = self.cursor.load(Ordering::Acquire);
        // Read before the scan: every id up to it was visible when the scan began.
        let committed = self.committed.load(Ordering::Acquire);
        let mut cursor = start;
        for item in self.records.range(EventId::new(start.saturating_add(1)).to_key()..) {
            let (key, value) = item?;
            let Some(id) = EventId::from_key(&key) else { break };
            if id.raw() > committed {
                break;
            }
            let settled = dispatched.contains(&id) || !self.awaits_dispatch(&key, &value)?;
            if !settled {
                break;
            }
            cursor = id.raw();
        }
        Ok((cursor > start).then_some(cursor))
    }
}

/// Where the cursor moves once a group stored with its dispatch is written: through
/// its events in order as long as each is settled (final as stored, or `dispatched`).
/// `None` when its first event is left waiting.
fn settled_through(
    group: &Group<'_>,
    dispatched: &std::collections::BTreeMap<EventId, crate::store::EventMeta>,
) -> Option<u64> {
    group
        .events()
        .take_while(|(id, ev)| {
            ev.meta.status != EventStatus::Received || dispatched.contains_key(id)
        })
        .last()
        .map(|(id, _)| id.raw())
}

#[cfg(test)]
#[path = "dispatch_tests.rs"]
mod tests;
