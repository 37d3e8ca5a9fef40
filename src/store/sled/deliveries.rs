//! [`DeliveryStore`] on sled: per-destination schedules, delivery records, dead
//! letters and the paused set.

use std::collections::HashSet;

use sled::transaction::{ConflictableTransactionError as Txe, TransactionalTree};
use sled::Transactional;

use super::super::{
    keys, DeadLetterFilter, DeliveryRecord, DeliveryState, DeliveryStore, EventId, QueueStats,
    Scheduled, StoreError,
};
use super::dispatch::tx_error;
use super::{hex, SledStore, DELIVERIES, PAUSED_PREFIX, SCHEDULED_PENDING, SCHEDULED_RETRYING};

fn decode_record(key: &[u8], value: &[u8]) -> Result<DeliveryRecord, StoreError> {
    serde_json::from_slice(value).map_err(|e| StoreError::Corrupt {
        tree: DELIVERIES,
        key: hex(key),
        reason: e.to_string(),
    })
}

/// A finished delivery at the head of its record's queue hands the turn to the next
/// one (scheduled now), or removes the queue if it was the last.
fn advance_queue(
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
                || deliveries.iter().any(|d| d.state != DeliveryState::Delivered)
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

#[cfg(test)]
mod tests {
    use super::super::super::{
        DedupKey, DispatchOutcome, DispatchPlan, DispatchStore, EventStatus, EventStore,
    };
    use super::super::testutil::{event, open};
    use super::*;

    const S: u64 = 1_000_000;

    fn plan(id: u64, hash: u8, dests: &[&str]) -> DispatchPlan {
        DispatchPlan {
            id: EventId::new(id),
            dedup: Some(DedupKey { hash: [hash; 16], window_us: 600 * S }),
            destinations: dests.iter().map(|d| d.to_string()).collect(),
            ordered: Vec::new(),
            resource: None,
        }
    }

    /// Appends received events with the given ids and receive times.
    fn ingest(store: &SledStore, events: &[(u64, u64)]) {
        let mut evs = Vec::new();
        for (_, at) in events {
            let mut e = event("demo", "ActionCreated", EventStatus::Received, Some("{}"));
            e.meta.received_at_us = *at;
            evs.push(e);
        }
        let batch: Vec<(EventId, &_)> =
            events.iter().zip(&evs).map(|((id, _), e)| (EventId::new(*id), e)).collect();
        store.append(&batch).unwrap();
    }

    #[test]
    fn dispatch_dedups_within_the_window_and_schedules_deliveries() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        ingest(&store, &[(1, 10 * S), (2, 11 * S), (3, 700 * S), (4, 12 * S), (5, 13 * S)]);
        assert_eq!(store.inbox_len(), 5);
        assert_eq!(store.pending(10).unwrap().len(), 5);
        let outcomes = store
            .dispatch(
                &[
                    plan(1, 7, &["a", "b"]),
                    plan(2, 7, &["a", "b"]), // same key, in the window: duplicate
                    plan(3, 7, &["a"]),      // same key, window over: new original
                    plan(4, 8, &[]),         // nobody wants it
                    DispatchPlan { dedup: None, ..plan(5, 7, &["b"]) }, // dedup off
                    plan(99, 9, &["a"]),     // not in the inbox
                ],
                20 * S,
            )
            .unwrap();
        assert_eq!(
            outcomes,
            [
                DispatchOutcome::Dispatched(2),
                DispatchOutcome::Duplicate { original: EventId::new(1) },
                DispatchOutcome::Dispatched(1),
                DispatchOutcome::Unrouted,
                DispatchOutcome::Dispatched(1),
                DispatchOutcome::Gone,
            ]
        );
        assert_eq!(store.inbox_len(), 0);
        assert_eq!(store.dedup_len(), 2);
        let dup = store.event(EventId::new(2)).unwrap().unwrap();
        assert_eq!(
            (dup.meta.status, dup.meta.duplicate_of),
            (EventStatus::Duplicate, Some(EventId::new(1)))
        );
        assert_eq!(
            store.body(EventId::new(2)).unwrap().unwrap(),
            b"{}",
            "duplicates keep their body"
        );
        assert_eq!(
            store.event(EventId::new(4)).unwrap().unwrap().meta.status,
            EventStatus::Unrouted
        );
        assert_eq!(store.event(EventId::new(1)).unwrap().unwrap().meta.destinations, ["a", "b"]);

        let due = store.due("a", 20 * S, 10).unwrap();
        assert_eq!(due.iter().map(|d| d.event.raw()).collect::<Vec<_>>(), [1, 3]);
        assert!(store.due("a", 19 * S, 10).unwrap().is_empty(), "not due before now");
        assert_eq!(store.due("b", 20 * S, 1).unwrap().len(), 1, "limit");
        assert_eq!(
            store.queue_stats("a").unwrap(),
            QueueStats { pending: 2, held: 0, retrying: 0, dead: 0, oldest: Some(EventId::new(1)) }
        );

        // Keys expire: the purge removes the ones whose window has ended.
        assert_eq!(store.purge_dedup(700 * S).unwrap(), 1);
        assert_eq!(store.dedup_len(), 1);
    }

    #[test]
    fn attempts_move_schedule_entries_and_dead_letters_then_replay_and_prune() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        ingest(&store, &[(1, S), (2, 2 * S), (3, 3 * S)]);
        store.dispatch(&[plan(1, 1, &["a"]), plan(2, 2, &["a"]), plan(3, 3, &[])], 10 * S).unwrap();
        let first = Scheduled { due_us: 10 * S, event: EventId::new(1) };
        let second = Scheduled { due_us: 10 * S, event: EventId::new(2) };

        // Event 1: fails once (retry at 15 s), then succeeds.
        let mut r1 = store.delivery(EventId::new(1), "a").unwrap().unwrap();
        r1.state = DeliveryState::Retrying;
        r1.next_attempt_us = Some(15 * S);
        store.record_attempt(first, &r1).unwrap();
        assert_eq!(store.next_due_after("a", 10 * S).unwrap(), Some(15 * S));
        assert_eq!(store.queue_stats("a").unwrap().retrying, 1);
        r1.state = DeliveryState::Delivered;
        r1.next_attempt_us = None;
        store.record_attempt(Scheduled { due_us: 15 * S, event: EventId::new(1) }, &r1).unwrap();

        // Event 2: dead.
        let mut r2 = store.delivery(EventId::new(2), "a").unwrap().unwrap();
        r2.state = DeliveryState::Dead;
        r2.next_attempt_us = None;
        store.record_attempt(second, &r2).unwrap();
        assert!(store.due("a", u64::MAX - 1, 10).unwrap().is_empty());
        let dead =
            store.dead_letters(&DeadLetterFilter { limit: 10, ..Default::default() }).unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].event, EventId::new(2));
        let none =
            DeadLetterFilter { source: Some("other".into()), limit: 10, ..Default::default() };
        assert!(store.dead_letters(&none).unwrap().is_empty());
        assert_eq!(store.queue_stats("a").unwrap().dead, 1);

        // Retention: 1 (delivered) and 3 (unrouted) go; 2 (dead) stays.
        assert_eq!(store.prune(100 * S, 100).unwrap(), 2);
        assert!(store.event(EventId::new(1)).unwrap().is_none());
        assert!(store.deliveries_of(EventId::new(1)).unwrap().is_empty());
        assert!(store.body(EventId::new(3)).unwrap().is_none());
        assert!(store.event(EventId::new(2)).unwrap().is_some());
        assert_eq!(store.prune(100 * S, 100).unwrap(), 0);

        // Replay: back in the schedule, out of the dead letters, a new round.
        assert_eq!(store.replay(EventId::new(2), &["a".into()], 200 * S).unwrap(), 1);
        assert!(store
            .dead_letters(&DeadLetterFilter { limit: 10, ..Default::default() })
            .unwrap()
            .is_empty());
        let r = store.delivery(EventId::new(2), "a").unwrap().unwrap();
        assert_eq!(
            (r.state, r.next_attempt_us, r.round_started_us),
            (DeliveryState::Pending, Some(200 * S), 200 * S)
        );
        assert_eq!(
            store.due("a", 200 * S, 10).unwrap(),
            [Scheduled { due_us: 200 * S, event: EventId::new(2) }]
        );
        // Replaying again replaces the entry instead of adding one.
        store.replay(EventId::new(2), &["a".into()], 201 * S).unwrap();
        assert_eq!(store.due("a", 300 * S, 10).unwrap().len(), 1);
    }

    /// Three events about one record and one about another, to an ordered destination.
    #[test]
    fn per_resource_queues_hold_later_deliveries_until_the_head_finishes() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        ingest(&store, &[(1, S), (2, 2 * S), (3, 3 * S), (4, 4 * S)]);
        let ordered = |id: u64, resource: u8| DispatchPlan {
            dedup: None,
            ordered: vec!["a".into()],
            resource: Some([resource; 16]),
            ..plan(id, 0, &["a"])
        };
        store
            .dispatch(&[ordered(1, 7), ordered(2, 7), ordered(3, 8), ordered(4, 7)], 10 * S)
            .unwrap();
        let due: Vec<u64> =
            store.due("a", 10 * S, 10).unwrap().iter().map(|d| d.event.raw()).collect();
        assert_eq!(due, [1, 3], "only each record's head is scheduled");
        assert_eq!(
            store.delivery(EventId::new(2), "a").unwrap().unwrap().state,
            DeliveryState::Held
        );
        assert_eq!(store.queue_stats("a").unwrap().held, 2);
        // Replaying a held delivery does not jump the queue.
        assert_eq!(store.replay(EventId::new(4), &["a".into()], 10 * S).unwrap(), 0);

        // The head fails and retries: the others of its record stay held.
        let mut r1 = store.delivery(EventId::new(1), "a").unwrap().unwrap();
        let stale = r1.clone(); // as read before its attempt
        r1.state = DeliveryState::Retrying;
        r1.next_attempt_us = Some(20 * S);
        store.record_attempt(Scheduled { due_us: 10 * S, event: EventId::new(1) }, &r1).unwrap();
        assert_eq!(
            store.delivery(EventId::new(2), "a").unwrap().unwrap().state,
            DeliveryState::Held
        );

        // It succeeds; its in-memory copy predates the link to event 2, which survives.
        let mut done = stale;
        done.state = DeliveryState::Delivered;
        done.next_attempt_us = None;
        store.record_attempt(Scheduled { due_us: 20 * S, event: EventId::new(1) }, &done).unwrap();
        let r2 = store.delivery(EventId::new(2), "a").unwrap().unwrap();
        assert_eq!(r2.state, DeliveryState::Pending);
        let due: Vec<u64> =
            store.due("a", u64::MAX - 1, 10).unwrap().iter().map(|d| d.event.raw()).collect();
        assert_eq!(due, [3, 2]);

        // Event 2 goes dead: event 4 gets its turn all the same.
        let mut r2 = r2;
        r2.state = DeliveryState::Dead;
        r2.next_attempt_us = None;
        let due2 = store.due("a", u64::MAX - 1, 10).unwrap()[1];
        store.record_attempt(due2, &r2).unwrap();
        assert_eq!(
            store.delivery(EventId::new(4), "a").unwrap().unwrap().state,
            DeliveryState::Pending
        );
        assert_eq!(store.queue_stats("a").unwrap().held, 0);
    }

    #[test]
    fn pauses_persist() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = open(dir.path());
            store.set_paused("a", true).unwrap();
            store.set_paused("b", true).unwrap();
            store.set_paused("b", false).unwrap();
        }
        let store = open(dir.path());
        assert_eq!(store.paused().unwrap(), HashSet::from(["a".to_owned()]));
    }
}
