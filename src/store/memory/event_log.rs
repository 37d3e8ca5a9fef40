//! The in-memory backend's event log: appends, reads, search, pruning.

use std::collections::BTreeMap;

use async_trait::async_trait;

use crate::lock::lock;
use crate::store::lifecycle::ledger::{self, LedgerEdits};
use crate::store::lifecycle::{self, Staged};
use crate::store::{
    DeliveryRecord, EventFilter, EventId, EventLog, EventRecord, EventStatus, NewEvent, StoreError,
};

use super::{Locked, MemoryStore};

#[async_trait]
impl EventLog for MemoryStore {
    async fn append(&self, event: NewEvent) -> Result<EventId, StoreError> {
        let started = std::time::Instant::now();
        let failure = *lock(&self.fail_appends);
        if let Some(observer) = &self.observer {
            observer.group(1, started.elapsed(), failure.is_none());
        }
        if let Some(message) = failure {
            self.failed_appends.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return Err(StoreError::Injected(message));
        }
        let mut d = lock(&self.data);
        let id = EventId::allocate(d.last_id, event.meta.received_at_us);
        d.last_id = id.raw();
        if let Some(observer) = &self.observer {
            observer.stored(&event.meta);
        }
        let mut edits = LedgerEdits::new();
        ledger::appended(&mut edits, id, &event.meta, EventId::new(0));
        ledger::merge(&mut d.ledger, &edits);
        if event.meta.status == EventStatus::Received {
            d.inbox.insert(id, (event.meta, event.body.unwrap_or_default()));
        } else {
            d.events.insert(id, event.meta);
        }
        self.durable_point(&d);
        Ok(id)
    }

    async fn event(&self, id: EventId) -> Result<Option<EventRecord>, StoreError> {
        let d = lock(&self.data);
        let meta = d.inbox.get(&id).map(|(m, _)| m).or_else(|| d.events.get(&id));
        Ok(meta.map(|m| EventRecord { id, meta: m.clone() }))
    }

    async fn body(&self, id: EventId) -> Result<Option<Vec<u8>>, StoreError> {
        let d = lock(&self.data);
        let body = d.inbox.get(&id).map(|(_, b)| b).or_else(|| d.bodies.get(&id));
        Ok(body.map(|b| b.to_vec()))
    }

    async fn list_events(&self, filter: EventFilter) -> Result<Vec<EventRecord>, StoreError> {
        let d = lock(&self.data);
        let all = d
            .inbox
            .iter()
            .map(|(id, (m, _))| (*id, m))
            .chain(d.events.iter().map(|(id, m)| (*id, m)))
            .collect::<BTreeMap<_, _>>();
        Ok(all
            .into_iter()
            .rev()
            .filter(|(id, m)| filter.in_window(*id) && filter.matches(m))
            .take(filter.limit)
            .map(|(id, m)| EventRecord { id, meta: m.clone() })
            .collect())
    }

    async fn prune(&self, before_us: u64, limit: usize) -> Result<usize, StoreError> {
        let mut d = lock(&self.data);
        let candidates: Vec<EventId> =
            d.events.range(..EventId::new(before_us)).map(|(id, _)| *id).collect();
        let mut pruned = 0;
        for id in candidates {
            if pruned >= limit {
                break;
            }
            let meta = d.events[&id].clone();
            let deliveries: Vec<DeliveryRecord> = d
                .deliveries
                .range((id, String::new())..)
                .take_while(|((e, _), _)| *e == id)
                .map(|(_, r)| r.clone())
                .collect();
            let view = Locked { data: &d, claims: &self.claims };
            let mut st = Staged::new(&view);
            if lifecycle::prune(&mut st, id, &meta, &deliveries, before_us)? {
                let changes = st.into_changes();
                d.apply(changes);
                pruned += 1;
            }
        }
        Ok(pruned)
    }

    async fn prune_bodies(
        &self,
        after: EventId,
        before_us: u64,
        limit: usize,
    ) -> Result<(usize, Option<EventId>), StoreError> {
        let mut d = lock(&self.data);
        let start = EventId::new(after.raw().saturating_add(1));
        let candidates: Vec<EventId> =
            d.events.range(start..EventId::new(before_us)).map(|(id, _)| *id).take(limit).collect();
        let mut gone = 0;
        for id in &candidates {
            let deliveries: Vec<DeliveryRecord> = d
                .deliveries
                .range((*id, String::new())..)
                .take_while(|((e, _), _)| e == id)
                .map(|(_, r)| r.clone())
                .collect();
            if lifecycle::prunable(&d.events[id], &deliveries, before_us)
                && d.bodies.remove(id).is_some()
            {
                gone += 1;
            }
        }
        Ok((gone, candidates.last().copied()))
    }
}
