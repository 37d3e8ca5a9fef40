//! Per-resource ordering on sled: each (destination, record) queue is a head/tail
//! entry in `ordering` plus `next_in_order` links in the delivery records (sled
//! transactions cannot scan, so the queue is a linked list of point reads).

use sled::transaction::{ConflictableTransactionError as Txe, TransactionalTree};

use super::super::{keys, DeliveryRecord, DeliveryState, StoreError};
use super::deliveries::decode_record;
use super::SCHEDULED_PENDING;

/// A finished delivery at the head of its record's queue hands the turn to the next
/// one (scheduled now), or removes the queue if it was the last.
pub(super) fn advance_queue(
    deliveries: &TransactionalTree,
    schedule: &TransactionalTree,
    ordering: &TransactionalTree,
    done: &DeliveryRecord,
    resource: &[u8; 16],
) -> Result<(), Txe<StoreError>> {
    let dest = done.destination.as_str();
    let qk = keys::order(dest, resource);
    let Some((head, tail, len)) = ordering.get(&qk)?.and_then(|v| keys::decode_order(&v)) else {
        return Ok(());
    };
    if head != done.event {
        return Ok(()); // a replay of a delivery whose turn has passed
    }
    let Some(next) = done.next_in_order else {
        ordering.remove(qk)?;
        return Ok(());
    };
    ordering.insert(qk, &keys::encode_order(next, tail, len.saturating_sub(1)))?;
    let nk = keys::delivery(next, dest);
    if let Some(v) = deliveries.get(&nk)? {
        let mut rec = decode_record(&nk, &v).map_err(Txe::Abort)?;
        let now = crate::store::unix_micros(std::time::SystemTime::now());
        rec.state = DeliveryState::Pending;
        rec.next_attempt_us = Some(now);
        rec.round_started_us = now;
        schedule.insert(keys::schedule(dest, now, next), &[SCHEDULED_PENDING])?;
        let value = serde_json::to_vec(&rec).map_err(|e| Txe::Abort(StoreError::Encode(e)))?;
        deliveries.insert(nk, value)?;
    }
    Ok(())
}
