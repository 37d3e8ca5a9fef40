//! [`EventStore`] on sled: ingest into the inbox, reads across `inbox` and `events`.

use std::sync::atomic::Ordering;

use super::codec::{decode_pending, encode_pending};
use super::{decode, hex, Inner, Source, INBOX};
use crate::lock::lock;
use crate::store::{EventFilter, EventId, EventRecord, EventStatus, NewEvent, StoreError};

impl Inner {
    /// Assigns ids and writes the group: received events into `inbox`, rejected ones
    /// into `events`, each in one atomic batch; then waits for durability.
    pub(super) fn append(&self, batch: &[NewEvent]) -> Result<Vec<EventId>, StoreError> {
        let (mut inbox, mut events) = (sled::Batch::default(), sled::Batch::default());
        let (mut to_inbox, mut to_events) = (0, 0);
        let mut ids = Vec::with_capacity(batch.len());
        // Held across the write: ids reach the trees in the order they were handed out.
        let mut last = lock(&self.last_id);
        for ev in batch {
            // From the receive time, always increasing, even if the clock steps back.
            *last = ev.meta.received_at_us.max(*last + 1);
            let id = EventId::new(*last);
            ids.push(id);
            let key = id.to_key();
            match ev.meta.status {
                EventStatus::Received => {
                    let body = ev.body.as_deref().unwrap_or_default();
                    inbox.insert(&key, encode_pending(&ev.meta, body)?);
                    to_inbox += 1;
                }
                // Only the ingress appends: anything but `received` is final already.
                _ => {
                    events.insert(&key, serde_json::to_vec(&ev.meta)?);
                    to_events += 1;
                }
            }
        }
        // Each batch is atomic; the two hold different events.
        if to_inbox > 0 {
            self.inbox.apply_batch(inbox)?;
            self.inbox_count.fetch_add(to_inbox, Ordering::Relaxed);
        }
        if to_events > 0 {
            self.events.apply_batch(events)?;
        }
        drop(last);
        self.durable()?;
        Ok(ids)
    }

    // Readers look in `inbox` first, then in `events`/`bodies`: dispatch moves events
    // in that direction, so an event moved meanwhile is found in the second place.
    // (The other order can miss it in both.)

    pub(super) fn event(&self, id: EventId) -> Result<Option<EventRecord>, StoreError> {
        let key = id.to_key();
        if let Some(v) = self.inbox.get(key)? {
            return decode(Source::Inbox, &key, &v).map(Some);
        }
        self.events.get(key)?.map(|v| decode(Source::Events, &key, &v)).transpose()
    }

    pub(super) fn body(&self, id: EventId) -> Result<Option<Vec<u8>>, StoreError> {
        let key = id.to_key();
        if let Some(v) = self.inbox.get(key)? {
            return decode_pending(&v)
                .map(|(_, body)| Some(body.to_vec()))
                .map_err(|reason| StoreError::Corrupt { table: INBOX, key: hex(&key), reason });
        }
        Ok(self.bodies.get(key)?.map(|b| b.to_vec()))
    }

    pub(super) fn list_events(&self, filter: &EventFilter) -> Result<Vec<EventRecord>, StoreError> {
        // Two passes, inbox first (see above), each taking its newest `limit` matches;
        // an event moved between the passes shows up twice and is kept once.
        let mut out = self.scan_newest(&self.inbox, Source::Inbox, filter)?;
        out.extend(self.scan_newest(&self.events, Source::Events, filter)?);
        // Newest first; of two copies of one event, the dispatched one first.
        out.sort_by_key(|r| std::cmp::Reverse((r.id, r.meta.status != EventStatus::Received)));
        out.dedup_by_key(|r| r.id);
        out.truncate(filter.limit);
        Ok(out)
    }

    /// The newest `filter.limit` records of one tree that match `filter`.
    fn scan_newest(
        &self,
        tree: &sled::Tree,
        source: Source,
        filter: &EventFilter,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let iter = match filter.after {
            Some(after) => tree.range(..after.to_key()),
            None => tree.iter(),
        };
        let mut out = Vec::new();
        for item in iter.rev() {
            if out.len() >= filter.limit {
                break;
            }
            let (key, value) = item?;
            let record = decode(source, &key, &value)?;
            let m = &record.meta;
            if filter.source.as_ref().is_some_and(|s| *s != m.source)
                || filter.event.as_ref().is_some_and(|e| *e != m.event)
                || filter.status.is_some_and(|s| s != m.status)
            {
                continue;
            }
            out.push(record);
        }
        Ok(out)
    }
}
