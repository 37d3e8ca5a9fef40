//! [`DeliveryStore`] on sled: per-destination schedules, delivery records, dead
//! letters and the paused set.

use std::collections::HashSet;

use sled::transaction::ConflictableTransactionError as Txe;
use sled::Transactional;

use super::super::{
    keys, DeadLetterFilter, DeliveryRecord, DeliveryState, DeliveryStore, EventId, QueueStats,
    Scheduled, StoreError,
};
use super::dispatch::tx_error;
use super::ordering::advance_queue;
use super::{hex, SledStore, DELIVERIES, PAUSED_PREFIX, SCHEDULED_PENDING, SCHEDULED_RETRYING};

pub(super) fn decode_record(key: &[u8], value: &[u8]) -> Result<DeliveryRecord, StoreError> {
    serde_json::from_slice(value).map_err(|e| StoreError::Corrupt {
        tree: DELIVERIES,
        key: hex(key),
        reason: e.to_string(),
    })
}

fn schedule_marker(state: DeliveryState) -> u8 {
    if state == DeliveryState::Retrying {
        SCHEDULED_RETRYING
    } else {
        SCHEDULED_PENDING
    }
}

impl DeliveryStore for SledStore {
    fn due(
        &self,
        destination: &str,
        now_us: u64,
        limit: usize,
    ) -> Result<Vec<Scheduled>, StoreError> {
        let prefix = keys::schedule_prefix(destination);
        let mut end = prefix.clone();
        end.extend_from_slice(&now_us.saturating_add(1).to_be_bytes());
        let mut out = Vec::new();
        for item in self.schedule.range(prefix.clone()..end).take(limit) {
            let (key, _) = item?;
            if let Some((due_us, event)) = keys::split_schedule_tail(&key[prefix.len()..]) {
                out.push(Scheduled { due_us, event });
            }
        }
        Ok(out)
    }

    fn next_due_after(&self, destination: &str, now_us: u64) -> Result<Option<u64>, StoreError> {
        let prefix = keys::schedule_prefix(destination);
        let mut start = prefix.clone();
        start.extend_from_slice(&now_us.saturating_add(1).to_be_bytes());
        match self.schedule.range(start..).next() {
            Some(item) => {
                let (key, _) = item?;
                Ok(key
                    .strip_prefix(prefix.as_slice())
                    .and_then(keys::split_schedule_tail)
                    .map(|(due, _)| due))
            }
            None => Ok(None),
        }
    }

    fn delivery(
        &self,
        event: EventId,
        destination: &str,
    ) -> Result<Option<DeliveryRecord>, StoreError> {
        let key = keys::delivery(event, destination);
        self.deliveries.get(&key)?.map(|v| decode_record(&key, &v)).transpose()
    }

    fn deliveries_of(&self, event: EventId) -> Result<Vec<DeliveryRecord>, StoreError> {
        self.deliveries
            .scan_prefix(event.to_key())
            .map(|item| {
                let (key, value) = item?;
                decode_record(&key, &value)
            })
            .collect()
    }

    fn record_attempt(&self, done: Scheduled, record: &DeliveryRecord) -> Result<(), StoreError> {
        let dest = record.destination.as_str();
        let trees = (&self.deliveries, &self.schedule, &self.dead_letters, &self.ordering);
        trees
            .transaction(|(deliveries, schedule, dead, ordering)| {
                let key = keys::delivery(record.event, dest);
                let mut record = record.clone();
                // Dispatch may have linked a later delivery of the same record while
                // this attempt was in flight: the stored link wins.
                if let Some(v) = deliveries.get(&key)? {
                    record.next_in_order =
                        decode_record(&key, &v).map_err(Txe::Abort)?.next_in_order;
                }
                schedule.remove(keys::schedule(dest, done.due_us, done.event))?;
                if let (true, Some(next)) = (record.state.is_scheduled(), record.next_attempt_us) {
                    schedule.insert(
                        keys::schedule(dest, next, record.event),
                        &[schedule_marker(record.state)],
                    )?;
                }
                if record.state == DeliveryState::Dead {
                    dead.insert(key.as_slice(), &[])?;
                } else {
                    dead.remove(key.as_slice())?;
                }
                let finished =
                    matches!(record.state, DeliveryState::Delivered | DeliveryState::Dead);
                if let (true, Some(resource)) =
                    (finished, record.resource.as_deref().and_then(keys::resource_from_hex))
                {
                    advance_queue(deliveries, schedule, ordering, &record, &resource)?;
                }
                let value =
                    serde_json::to_vec(&record).map_err(|e| Txe::Abort(StoreError::Encode(e)))?;
                deliveries.insert(key, value)?;
                Ok::<(), Txe<StoreError>>(())
            })
            .map_err(tx_error)
    }

    fn replay(
        &self,
        event: EventId,
        destinations: &[String],
        now_us: u64,
    ) -> Result<usize, StoreError> {
        (&self.deliveries, &self.schedule, &self.dead_letters)
            .transaction(|(deliveries, schedule, dead)| {
                let mut replayed = 0;
                for dest in destinations {
                    let key = keys::delivery(event, dest);
                    let mut record = match deliveries.get(&key)? {
                        Some(v) => decode_record(&key, &v).map_err(Txe::Abort)?,
                        None => DeliveryRecord::new(event, dest, now_us),
                    };
                    if record.state == DeliveryState::Held {
                        // Already waiting for its turn: it is delivered then.
                        continue;
                    }
                    if let (true, Some(due)) = (record.state.is_scheduled(), record.next_attempt_us)
                    {
                        schedule.remove(keys::schedule(dest, due, event))?;
                    }
                    record.restart(now_us);
                    schedule.insert(keys::schedule(dest, now_us, event), &[SCHEDULED_PENDING])?;
                    dead.remove(key.as_slice())?;
                    let value = serde_json::to_vec(&record)
                        .map_err(|e| Txe::Abort(StoreError::Encode(e)))?;
                    deliveries.insert(key, value)?;
                    replayed += 1;
                }
                Ok(replayed)
            })
            .map_err(tx_error)
    }

    fn discard(&self, event: EventId, destination: &str) -> Result<bool, StoreError> {
        (&self.deliveries, &self.dead_letters)
            .transaction(|(deliveries, dead)| {
                let key = keys::delivery(event, destination);
                if dead.remove(key.as_slice())?.is_none() {
                    return Ok(false);
                }
                if let Some(v) = deliveries.get(&key)? {
                    let mut record = decode_record(&key, &v).map_err(Txe::Abort)?;
                    record.state = DeliveryState::Discarded;
                    let value = serde_json::to_vec(&record)
                        .map_err(|e| Txe::Abort(StoreError::Encode(e)))?;
                    deliveries.insert(key, value)?;
                }
                Ok(true)
            })
            .map_err(tx_error)
    }

    fn dead_letters(&self, filter: &DeadLetterFilter) -> Result<Vec<DeliveryRecord>, StoreError> {
        let iter = match filter.after {
            Some(after) => self.dead_letters.range(..after.to_key()),
            None => self.dead_letters.iter(),
        };
        let mut out = Vec::new();
        for item in iter.rev() {
            if out.len() >= filter.limit {
                break;
            }
            let (key, _) = item?;
            let Some((event, dest)) = keys::split_delivery(&key) else { continue };
            if filter.destination.as_ref().is_some_and(|d| *d != dest) {
                continue;
            }
            if filter.source.is_some() || filter.event.is_some() {
                let Some(meta) = super::super::EventStore::event(self, event)?.map(|r| r.meta)
                else {
                    continue;
                };
                if filter.source.as_ref().is_some_and(|s| *s != meta.source)
                    || filter.event.as_ref().is_some_and(|e| *e != meta.event)
                {
                    continue;
                }
            }
            if let Some(record) = self.delivery(event, &dest)? {
                out.push(record);
            }
        }
        Ok(out)
    }

    fn queue_stats(&self, destination: &str) -> Result<QueueStats, StoreError> {
        let prefix = keys::schedule_prefix(destination);
        let mut stats = QueueStats::default();
        for item in self.schedule.scan_prefix(&prefix) {
            let (key, value) = item?;
            if value.first() == Some(&SCHEDULED_RETRYING) {
                stats.retrying += 1;
            } else {
                stats.pending += 1;
            }
            if let Some((_, event)) = keys::split_schedule_tail(&key[prefix.len()..]) {
                stats.oldest = Some(stats.oldest.map_or(event, |o| o.min(event)));
            }
        }
        for item in self.dead_letters.iter() {
            let (key, _) = item?;
            if keys::split_delivery(&key).is_some_and(|(_, d)| d == destination) {
                stats.dead += 1;
            }
        }
        for item in self.ordering.scan_prefix(&prefix) {
            let (_, value) = item?;
            if let Some((_, _, len)) = keys::decode_order(&value) {
                stats.held += len.saturating_sub(1);
            }
        }
        Ok(stats)
    }

    fn prune(&self, before_us: u64, limit: usize) -> Result<usize, StoreError> {
        let mut pruned = 0;
        for item in self.events.range(..EventId::new(before_us).to_key()) {
            if pruned >= limit {
                break;
            }
            let (key, value) = item?;
            let record = super::decode(super::Source::Events, &key, &value)?;
            let deliveries = self.deliveries_of(record.id)?;
            if record.meta.received_at_us >= before_us
                || deliveries.iter().any(|d| {
                    !matches!(d.state, DeliveryState::Delivered | DeliveryState::Discarded)
                })
            {
                continue;
            }
            (&self.events, &self.bodies, &self.deliveries)
                .transaction(|(events, bodies, dels)| {
                    events.remove(key.as_ref())?;
                    bodies.remove(key.as_ref())?;
                    for d in &deliveries {
                        dels.remove(keys::delivery(d.event, &d.destination))?;
                    }
                    Ok::<(), Txe<StoreError>>(())
                })
                .map_err(tx_error)?;
            pruned += 1;
        }
        Ok(pruned)
    }

    fn paused(&self) -> Result<HashSet<String>, StoreError> {
        self.meta
            .scan_prefix(PAUSED_PREFIX)
            .map(|item| {
                let (key, _) = item?;
                Ok(String::from_utf8_lossy(&key[PAUSED_PREFIX.len()..]).into_owned())
            })
            .collect()
    }

    fn set_paused(&self, destination: &str, paused: bool) -> Result<(), StoreError> {
        let mut key = PAUSED_PREFIX.to_vec();
        key.extend_from_slice(destination.as_bytes());
        if paused {
            self.meta.insert(key, &[])?;
        } else {
            self.meta.remove(key)?;
        }
        self.db.flush()?;
        Ok(())
    }
}
