//! [`DispatchStore`] on sled: the inbox becomes event records and deliveries in one
//! transaction, dedup check included.

use std::sync::atomic::Ordering;

use sled::transaction::{ConflictableTransactionError as Txe, TransactionError};
use sled::Transactional;

use super::super::codec::decode_pending;
use super::super::{
    keys, DeliveryRecord, DeliveryState, DispatchOutcome, DispatchPlan, DispatchStore, EventId,
    EventStatus, PendingEvent, StoreError,
};
use super::{hex, SledStore, DEDUP, INBOX, SCHEDULED_PENDING};

/// `dedup` value: `[original event id: 8][window end µs: 8]`.
fn encode_dedup(original: EventId, until_us: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&original.to_key());
    v[8..].copy_from_slice(&until_us.to_be_bytes());
    v
}

fn decode_dedup(value: &[u8]) -> Option<(EventId, u64)> {
    let (id, until) = value.split_first_chunk::<8>()?;
    Some((EventId::from_key(id)?, u64::from_be_bytes(until.try_into().ok()?)))
}

pub(super) fn tx_error(e: TransactionError<StoreError>) -> StoreError {
    match e {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(e) => StoreError::Sled(e),
    }
}

impl DispatchStore for SledStore {
    fn pending(&self, limit: usize) -> Result<Vec<PendingEvent>, StoreError> {
        let mut out = Vec::new();
        for item in self.inbox.iter().take(limit) {
            let (key, value) = item?;
            let corrupt =
                |reason: String| StoreError::Corrupt { tree: INBOX, key: hex(&key), reason };
            let id = EventId::from_key(&key).ok_or_else(|| corrupt("key is not 8 bytes".into()))?;
            let (meta, body) = decode_pending(&value).map_err(corrupt)?;
            out.push(PendingEvent { id, meta, body: bytes::Bytes::copy_from_slice(body) });
        }
        Ok(out)
    }

    fn dispatch(
        &self,
        plans: &[DispatchPlan],
        now_us: u64,
    ) -> Result<Vec<DispatchOutcome>, StoreError> {
        let trees = (
            &self.inbox,
            &self.events,
            &self.bodies,
            &self.dedup,
            &self.deliveries,
            &self.schedule,
            &self.ordering,
        );
        let (outcomes, new_keys) = trees
            .transaction(|(inbox, events, bodies, dedup, deliveries, schedule, ordering)| {
                let mut outcomes = Vec::with_capacity(plans.len());
                let mut new_keys = 0usize;
                for plan in plans {
                    let key = plan.id.to_key();
                    let Some(raw) = inbox.get(key)? else {
                        outcomes.push(DispatchOutcome::Gone);
                        continue;
                    };
                    let (mut meta, body) = decode_pending(&raw).map_err(|reason| {
                        Txe::Abort(StoreError::Corrupt { tree: INBOX, key: hex(&key), reason })
                    })?;
                    let mut duplicate_of = None;
                    if let Some(dk) = &plan.dedup {
                        let held = dedup.get(dk.hash)?.and_then(|v| decode_dedup(&v));
                        match held {
                            Some((original, until))
                                if until > meta.received_at_us && original != plan.id =>
                            {
                                duplicate_of = Some(original);
                            }
                            held => {
                                let until = meta.received_at_us.saturating_add(dk.window_us);
                                dedup.insert(&dk.hash, &encode_dedup(plan.id, until))?;
                                new_keys += usize::from(held.is_none());
                            }
                        }
                    }
                    let outcome = if let Some(original) = duplicate_of {
                        meta.status = EventStatus::Duplicate;
                        meta.duplicate_of = Some(original);
                        DispatchOutcome::Duplicate { original }
                    } else if plan.destinations.is_empty() {
                        meta.status = EventStatus::Unrouted;
                        DispatchOutcome::Unrouted
                    } else {
                        meta.status = EventStatus::Dispatched;
                        meta.destinations.clone_from(&plan.destinations);
                        let encode = |r: &DeliveryRecord| {
                            serde_json::to_vec(r).map_err(|e| Txe::Abort(StoreError::Encode(e)))
                        };
                        for dest in &plan.destinations {
                            let mut record = DeliveryRecord::new(plan.id, dest, now_us);
                            let resource = plan.resource.filter(|_| plan.ordered.contains(dest));
                            let mut held = false;
                            if let Some(resource) = resource {
                                // Per-resource order: join the record's queue; only its
                                // head is ever scheduled.
                                record.resource = Some(keys::resource_hex(&resource));
                                let qk = keys::order(dest, &resource);
                                match ordering.get(&qk)?.and_then(|v| keys::decode_order(&v)) {
                                    None => {
                                        ordering
                                            .insert(qk, &keys::encode_order(plan.id, plan.id, 1))?;
                                    }
                                    Some((head, tail, len)) => {
                                        let tk = keys::delivery(tail, dest);
                                        if let Some(v) = deliveries.get(&tk)? {
                                            let mut prev: DeliveryRecord =
                                                serde_json::from_slice(&v).map_err(|e| {
                                                    Txe::Abort(StoreError::Encode(e))
                                                })?;
                                            prev.next_in_order = Some(plan.id);
                                            deliveries.insert(tk, encode(&prev)?)?;
                                        }
                                        ordering.insert(
                                            qk,
                                            &keys::encode_order(head, plan.id, len + 1),
                                        )?;
                                        record.state = DeliveryState::Held;
                                        record.next_attempt_us = None;
                                        held = true;
                                    }
                                }
                            }
                            deliveries.insert(keys::delivery(plan.id, dest), encode(&record)?)?;
                            if !held {
                                schedule.insert(
                                    keys::schedule(dest, now_us, plan.id),
                                    &[SCHEDULED_PENDING],
                                )?;
                            }
                        }
                        DispatchOutcome::Dispatched(plan.destinations.len())
                    };
                    let meta =
                        serde_json::to_vec(&meta).map_err(|e| Txe::Abort(StoreError::Encode(e)))?;
                    events.insert(&key, meta)?;
                    bodies.insert(&key, body)?;
                    inbox.remove(&key)?;
                    outcomes.push(outcome);
                }
                Ok((outcomes, new_keys))
            })
            .map_err(tx_error)?;
        let removed = outcomes.iter().filter(|o| **o != DispatchOutcome::Gone).count();
        self.inbox_count.fetch_sub(removed, Ordering::Relaxed);
        self.dedup_count.fetch_add(new_keys, Ordering::Relaxed);
        Ok(outcomes)
    }

    fn purge_dedup(&self, now_us: u64) -> Result<usize, StoreError> {
        let mut purged = 0;
        for item in self.dedup.iter() {
            let (key, value) = item?;
            let expired = match decode_dedup(&value) {
                Some((_, until)) => until <= now_us,
                None => {
                    tracing::warn!(tree = DEDUP, key = %hex(&key), "unreadable dedup entry removed");
                    true
                }
            };
            // Only remove the entry we looked at: dispatch may have renewed it since.
            if expired && self.dedup.compare_and_swap(&key, Some(&value), None::<&[u8]>)?.is_ok() {
                purged += 1;
            }
        }
        self.dedup_count
            .fetch_sub(purged.min(self.dedup_count.load(Ordering::Relaxed)), Ordering::Relaxed);
        Ok(purged)
    }

    fn dedup_len(&self) -> usize {
        self.dedup_count.load(Ordering::Relaxed)
    }
}
