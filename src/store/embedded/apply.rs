//! Applies a rule's [`Changes`] in one transaction over every tree they touch,
//! deriving the index entries from each delivery's state before and after: a
//! scheduled delivery has exactly one `schedule` entry, a dead one one `dead_letters`
//! entry, and nothing else has either.

use std::sync::atomic::Ordering;

use super::codec::{self, DispatchRecord};
use super::engine::{TxError, TxResult, TxTree};
use super::{keys, EmbeddedState, CURSOR_KEY, RECORDS, SCHEDULED_PENDING, SCHEDULED_RETRYING};
use crate::store::lifecycle::ledger::{self, LedgerEdits};
use crate::store::lifecycle::Changes;
use crate::store::{hex, DeliveryRecord, DeliveryState, StoreError};

/// A count's change as the signed counters hold it (see `EmbeddedState::inbox_count`).
pub(super) fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn encode<T: serde::Serialize>(value: &T) -> TxResult<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| TxError::Abort(StoreError::Encode(e)))
}

fn marker(r: &DeliveryRecord) -> u8 {
    if r.state == DeliveryState::Retrying {
        SCHEDULED_RETRYING
    } else {
        SCHEDULED_PENDING
    }
}

/// The trees every change may write, in this order: records, outcomes, dedup,
/// deliveries, schedule, ordering.
type Trees<'a, 't> = &'a [TxTree<'t>; 6];

/// What a rule's transaction writes besides its [`Changes`].
#[derive(Default)]
pub(super) struct Alongside<'a> {
    /// Where the dispatch cursor moves: every id up to it is settled once the
    /// outcomes are written.
    pub(super) cursor: Option<u64>,
    /// An admin's journal entry (a key and value of the `journal` tree): the change
    /// and its entry, all or nothing.
    pub(super) journal: Option<([u8; 16], Vec<u8>)>,
    /// A group of events stored by the same transaction that dispatches them
    /// (`records` keys and values, written first: `dispatch.rs`).
    pub(super) appended: &'a [(Vec<u8>, Vec<u8>)],
}

/// The writes of `changes` (with the events `appended` and the dispatch `cursor`,
/// when it moves) inside a transaction over [`Trees`] and, when a delivery enters or
/// leaves `dead`, `dead_letters`; dedup keys filed as seen at `now_us`. Returns how
/// many dedup keys it added (net of the renewed keys it moved between buckets).
fn write(
    state: &EmbeddedState,
    changes: &Changes,
    edits: &LedgerEdits,
    alongside: &Alongside<'_>,
    now_us: u64,
    [records, outcomes, dedup, deliveries, schedule, ordering]: Trees<'_, '_>,
    dead: Option<&TxTree<'_>>,
) -> TxResult<i64> {
    for (key, value) in alongside.appended {
        records.insert(key, value.as_slice())?;
    }
    // The event's record stays as ingest wrote it: only the verdict is written, keyed
    // by the event's resource when it has one (which indexes it by resource).
    for (id, meta) in &changes.dispatched {
        let key = keys::outcome(*id, meta.resource.as_deref());
        outcomes.insert(key, encode(&DispatchRecord::of(meta))?)?;
    }
    if let Some(cursor) = alongside.cursor {
        outcomes.insert(CURSOR_KEY, cursor.to_be_bytes())?;
    }
    let new_keys = state.write_dedup(dedup, changes.dedup.iter(), now_us)?;
    for ((event, dest), change) in &changes.deliveries {
        let key = keys::delivery(*event, dest);
        let edits = change.index_edits();
        if let Some(due) = edits.unschedule {
            schedule.remove(keys::schedule(dest, due, *event))?;
        }
        match (dead, edits.dead) {
            (Some(dead), Some(true)) => drop(dead.insert(key.as_slice(), [])?),
            (Some(dead), Some(false)) => drop(dead.remove(key.as_slice())?),
            _ => {}
        }
        match &change.after {
            Some(after) => {
                if let Some(due) = edits.schedule {
                    schedule.insert(keys::schedule(dest, due, *event), [marker(after)])?;
                }
                deliveries.insert(key, super::record::encode(after))?;
            }
            None => {
                deliveries.remove(key)?;
            }
        }
    }
    for ((dest, resource), queue) in &changes.queues {
        let key = keys::order(dest, resource);
        match queue {
            Some(q) => ordering.insert(key, keys::encode_order(q))?,
            None => ordering.remove(key)?,
        };
    }
    for (id, resource) in &changes.pruned {
        records.remove(id.to_key())?;
        outcomes.remove(keys::outcome(*id, resource.as_deref()))?;
    }
    drop_bodies(changes, records)?;
    EmbeddedState::write_edits(outcomes, edits)?;
    Ok(new_keys)
}

/// The records of `changes.bodies_dropped` without their bodies: all removed, then
/// written again, so that redb frees the pages their bodies filled rather than keep
/// them part-empty (as `Tree::apply_shrinking` does for the retention pass).
fn drop_bodies(changes: &Changes, records: &TxTree<'_>) -> TxResult<()> {
    let mut stripped = Vec::new();
    for id in &changes.bodies_dropped {
        let key = id.to_key();
        let Some(value) = records.get(key)? else { continue };
        let corrupt = |reason| StoreError::Corrupt { table: RECORDS, key: hex(&key), reason };
        if let Some(without) = codec::strip_body(&value).map_err(|r| TxError::Abort(corrupt(r)))? {
            stripped.push((key, without));
        }
    }
    for (key, _) in &stripped {
        records.remove(key)?;
    }
    for (key, without) in &stripped {
        records.insert(key, without)?;
    }
    Ok(())
}

impl EmbeddedState {
    /// Writes `changes` atomically, then updates the in-memory counts. The caller
    /// holds the lifecycle lock; durability is the caller's next step.
    pub(super) fn apply(&self, changes: &Changes) -> Result<(), StoreError> {
        self.apply_with(changes, Alongside::default(), crate::clock::now_us())
    }

    /// [`EmbeddedState::apply`], moving the dispatch cursor to `cursor` in the same
    /// transaction: every id up to it is settled once the outcomes are written. The
    /// dedup keys it writes are filed as seen at `now_us` (`dedup.rs`).
    pub(super) fn apply_dispatch(
        &self,
        changes: &Changes,
        cursor: Option<u64>,
        now_us: u64,
    ) -> Result<(), StoreError> {
        self.apply_with(changes, Alongside { cursor, ..Alongside::default() }, now_us)
    }

    /// [`EmbeddedState::apply`], adding `journal` (a key and value of the `journal`
    /// tree) in the same transaction: an admin's change and its journal entry.
    pub(super) fn apply_journalled(
        &self,
        changes: &Changes,
        journal: Option<([u8; 16], Vec<u8>)>,
    ) -> Result<(), StoreError> {
        self.apply_with(
            changes,
            Alongside { journal, ..Alongside::default() },
            crate::clock::now_us(),
        )
    }

    /// `now_us` files the dedup keys, which only dispatch writes.
    fn apply_with(
        &self,
        changes: &Changes,
        alongside: Alongside<'_>,
        now_us: u64,
    ) -> Result<(), StoreError> {
        let cursor = alongside.cursor;
        let Some(new_keys) = self.transact(changes, alongside, now_us)? else { return Ok(()) };
        self.applied(changes, cursor, new_keys);
        Ok(())
    }

    /// The transaction of [`EmbeddedState::apply_with`]: `changes` and what goes
    /// `alongside` them written, the in-memory counts not moved yet
    /// ([`EmbeddedState::applied`] does, once the caller has done its part). Returns
    /// the dedup keys added, or `None` when there was nothing to write.
    pub(super) fn transact(
        &self,
        changes: &Changes,
        alongside: Alongside<'_>,
        now_us: u64,
    ) -> Result<Option<i64>, StoreError> {
        let nothing_alongside = alongside.cursor.is_none()
            && alongside.journal.is_none()
            && alongside.appended.is_empty();
        if changes.is_empty() && nothing_alongside {
            return Ok(None);
        }
        // A sled transaction costs more for every tree it spans: `dead_letters` joins
        // only when a delivery enters or leaves `dead` (never at dispatch), `journal`
        // only for an admin's change.
        let edits = ledger::edits(changes, self.ledger_start());
        let dead_letters = changes.deliveries.values().any(|c| c.index_edits().dead.is_some());
        let mut trees = vec![
            &self.records,
            &self.outcomes,
            &self.dedup,
            &self.deliveries,
            &self.schedule,
            &self.ordering,
        ];
        if dead_letters {
            trees.push(&self.dead_letters);
        }
        if alongside.journal.is_some() {
            trees.push(&self.journal);
        }
        let new_keys = self.db.transaction(&trees, |t| {
            let (six, rest) = t.split_at(6);
            let six: Trees<'_, '_> = six.try_into().map_err(|_| {
                TxError::Abort(StoreError::Task("a transaction without its six trees".into()))
            })?;
            let (dead, rest) = rest.split_at(usize::from(dead_letters));
            if let (Some((key, value)), Some(tree)) = (&alongside.journal, rest.first()) {
                tree.insert(key, value.as_slice())?;
            }
            write(self, changes, &edits, &alongside, now_us, six, dead.first())
        })?;
        Ok(Some(new_keys))
    }

    /// The in-memory side of a transaction of `changes` that moved the cursor to
    /// `cursor` and added `new_keys` dedup keys. The caller holds the lifecycle lock.
    pub(super) fn applied(&self, changes: &Changes, cursor: Option<u64>, new_keys: i64) {
        if let Some(cursor) = cursor {
            self.cursor.fetch_max(cursor, Ordering::AcqRel);
        }
        // Each event dispatched left the inbox (dispatch takes only events without an
        // outcome, under the lifecycle lock), counted now unless the count behind the
        // open has yet to read it.
        let left = self.counts.dispatches_counted_now(changes);
        self.inbox_count.fetch_sub(signed(left.len() as u64), Ordering::Relaxed);
        self.untally(changes, &left);
        self.dedup_count.fetch_add(new_keys, Ordering::Relaxed);
        self.counts.apply(changes);
    }
}
