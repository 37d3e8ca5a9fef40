//! Applies a rule's [`Changes`] in one sled transaction over every tree they touch,
//! deriving the index entries from each delivery's state before and after: a
//! scheduled delivery has exactly one `schedule` entry, a dead one one `dead_letters`
//! entry, and nothing else has either.

use std::sync::atomic::Ordering;

use sled::transaction::{ConflictableTransactionError as Txe, TransactionError, TransactionalTree};
use sled::Transactional;

use super::codec::DispatchRecord;
use super::{keys, SledState, CURSOR_KEY, SCHEDULED_PENDING, SCHEDULED_RETRYING};
use crate::store::lifecycle::ledger::{self, LedgerEdits};
use crate::store::lifecycle::Changes;
use crate::store::{DeliveryRecord, DeliveryState, StoreError};

/// A count's change as the signed counters hold it (see `SledState::inbox_count`).
pub(super) fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(super) fn tx_error(e: TransactionError<StoreError>) -> StoreError {
    match e {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(e) => e.into(),
    }
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, Txe<StoreError>> {
    serde_json::to_vec(value).map_err(|e| Txe::Abort(StoreError::Encode(e)))
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
type Trees<'a> = [&'a TransactionalTree; 6];

/// The writes of `changes` (and the dispatch cursor, when it moves) inside a
/// transaction over [`Trees`] and, when a delivery enters or leaves `dead`,
/// `dead_letters`. Returns (events dispatched, new dedup keys).
fn write(
    changes: &Changes,
    edits: &LedgerEdits,
    cursor: Option<u64>,
    [records, outcomes, dedup, deliveries, schedule, ordering]: Trees<'_>,
    dead: Option<&TransactionalTree>,
) -> Result<(u64, u64), Txe<StoreError>> {
    let (mut dispatched, mut new_keys) = (0u64, 0u64);
    // The record stays as ingest wrote it: only the verdict is written, keyed by the
    // event's record when it has one (which indexes it by record).
    for (id, meta) in &changes.dispatched {
        let key = keys::outcome(*id, meta.resource.as_deref());
        if outcomes.insert(key, encode(&DispatchRecord::of(meta))?)?.is_none() {
            dispatched += 1;
        }
    }
    if let Some(cursor) = cursor {
        outcomes.insert(CURSOR_KEY, &cursor.to_be_bytes())?;
    }
    for (hash, entry) in &changes.dedup {
        if dedup.insert(hash, &keys::encode_dedup(entry))?.is_none() {
            new_keys += 1;
        }
    }
    for ((event, dest), change) in &changes.deliveries {
        let key = keys::delivery(*event, dest);
        let edits = change.index_edits();
        if let Some(due) = edits.unschedule {
            schedule.remove(keys::schedule(dest, due, *event))?;
        }
        match (dead, edits.dead) {
            (Some(dead), Some(true)) => drop(dead.insert(key.as_slice(), &[])?),
            (Some(dead), Some(false)) => drop(dead.remove(key.as_slice())?),
            _ => {}
        }
        match &change.after {
            Some(after) => {
                if let Some(due) = edits.schedule {
                    schedule.insert(keys::schedule(dest, due, *event), &[marker(after)])?;
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
            Some(q) => ordering.insert(key, &keys::encode_order(q))?,
            None => ordering.remove(key)?,
        };
    }
    for (id, record) in &changes.pruned {
        records.remove(&id.to_key())?;
        outcomes.remove(keys::outcome(*id, record.as_deref()))?;
    }
    SledState::write_edits(outcomes, edits)?;
    Ok((dispatched, new_keys))
}

impl SledState {
    /// Writes `changes` atomically, then updates the in-memory counts. The caller
    /// holds the lifecycle lock; durability is the caller's next step.
    pub(super) fn apply(&self, changes: &Changes) -> Result<(), StoreError> {
        self.apply_dispatch(changes, None)
    }

    /// [`SledState::apply`], moving the dispatch cursor to `cursor` in the same
    /// transaction: every id up to it is settled once the outcomes are written.
    pub(super) fn apply_dispatch(
        &self,
        changes: &Changes,
        cursor: Option<u64>,
    ) -> Result<(), StoreError> {
        if changes.is_empty() && cursor.is_none() {
            return Ok(());
        }
        // A sled transaction costs more for every tree it spans: `dead_letters` joins
        // only when a delivery enters or leaves `dead` (never at dispatch).
        let edits = ledger::edits(changes, self.ledger_start());
        let dead_letters = changes.deliveries.values().any(|c| c.index_edits().dead.is_some());
        let t = (
            &self.records,
            &self.outcomes,
            &self.dedup,
            &self.deliveries,
            &self.schedule,
            &self.ordering,
        );
        let (dispatched, new_keys) = if dead_letters {
            (t.0, t.1, t.2, t.3, t.4, t.5, &self.dead_letters)
                .transaction(|(a, b, c, d, e, f, dead)| {
                    write(changes, &edits, cursor, [a, b, c, d, e, f], Some(dead))
                })
                .map_err(tx_error)?
        } else {
            t.transaction(|(a, b, c, d, e, f)| {
                write(changes, &edits, cursor, [a, b, c, d, e, f], None)
            })
            .map_err(tx_error)?
        };
        if let Some(cursor) = cursor {
            self.cursor.fetch_max(cursor, Ordering::AcqRel);
        }
        self.inbox_count.fetch_sub(signed(dispatched), Ordering::Relaxed);
        self.untally(changes);
        self.dedup_count.fetch_add(signed(new_keys), Ordering::Relaxed);
        let mut counts = crate::lock::lock(&self.counts);
        for change in changes.deliveries.values() {
            counts.apply(change.before.as_ref(), change.after.as_ref());
        }
        Ok(())
    }
}
