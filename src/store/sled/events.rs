//! [`EventStore`] on sled: ingest into the inbox, reads across `inbox` and `events`.

use std::sync::atomic::Ordering;

use super::super::codec::{decode_pending, encode_pending};
use super::super::{
    EventFilter, EventId, EventRecord, EventStatus, EventStore, NewEvent, StoreError,
};
use super::{decode, hex, SledStore, Source, INBOX};

impl EventStore for SledStore {
    fn append(&self, batch: &[(EventId, &NewEvent)]) -> Result<(), StoreError> {
        let (mut inbox, mut events) = (sled::Batch::default(), sled::Batch::default());
        let (mut to_inbox, mut to_events) = (0, 0);
        for (id, ev) in batch {
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
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    fn last_event_id(&self) -> Result<Option<EventId>, StoreError> {
        let last = |tree: &sled::Tree| -> Result<Option<EventId>, StoreError> {
            Ok(tree.last()?.and_then(|(k, _)| EventId::from_key(&k)))
        };
        Ok(last(&self.events)?.max(last(&self.inbox)?))
    }

    // Readers look in `inbox` first, then in `events`/`bodies`: dispatch moves events
    // in that direction, so an event moved meanwhile is found in the second place.
    // (The other order can miss it in both.)

    fn event(&self, id: EventId) -> Result<Option<EventRecord>, StoreError> {
        let key = id.to_key();
        if let Some(v) = self.inbox.get(key)? {
            return decode(Source::Inbox, &key, &v).map(Some);
        }
        self.events.get(key)?.map(|v| decode(Source::Events, &key, &v)).transpose()
    }

    fn body(&self, id: EventId) -> Result<Option<Vec<u8>>, StoreError> {
        let key = id.to_key();
        if let Some(v) = self.inbox.get(key)? {
            return decode_pending(&v)
                .map(|(_, body)| Some(body.to_vec()))
                .map_err(|reason| StoreError::Corrupt { tree: INBOX, key: hex(&key), reason });
        }
        Ok(self.bodies.get(key)?.map(|b| b.to_vec()))
    }

    fn list_events(&self, filter: &EventFilter) -> Result<Vec<EventRecord>, StoreError> {
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

    fn inbox_len(&self) -> usize {
        self.inbox_count.load(Ordering::Relaxed)
    }

    fn size_on_disk(&self) -> Result<u64, StoreError> {
        Ok(self.db.size_on_disk()?)
    }
}

impl SledStore {
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

#[cfg(test)]
mod tests {
    use super::super::testutil::{event, open};
    use super::*;

    #[test]
    fn append_list_get_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let a = event("demo", "ActionCreated", EventStatus::Received, Some("{\"a\":1}"));
        let b = event("demo", "TaskCreated", EventStatus::Rejected, None);
        let c = event("other", "ActionCreated", EventStatus::Received, Some(""));
        {
            let store = open(dir.path());
            assert_eq!(store.last_event_id().unwrap(), None);
            let ids = [EventId::new(10), EventId::new(11), EventId::new(12)];
            store.append(&[(ids[0], &a), (ids[1], &b)]).unwrap();
            store.append(&[(ids[2], &c)]).unwrap();
            store.flush().unwrap();
        }
        let store = open(dir.path());
        assert_eq!(store.last_event_id().unwrap(), Some(EventId::new(12)));
        // Rejected events never enter the inbox.
        assert_eq!(store.inbox_len(), 2);

        let all = store.list_events(&EventFilter { limit: 10, ..Default::default() }).unwrap();
        let ids: Vec<u64> = all.iter().map(|r| r.id.raw()).collect();
        assert_eq!(ids, [12, 11, 10], "newest first");
        assert_eq!(all[2].meta, a.meta);

        let page = EventFilter { limit: 1, after: Some(EventId::new(12)), ..Default::default() };
        assert_eq!(store.list_events(&page).unwrap()[0].id, EventId::new(11));

        let demo_received = EventFilter {
            source: Some("demo".into()),
            status: Some(EventStatus::Received),
            limit: 10,
            ..Default::default()
        };
        let only = store.list_events(&demo_received).unwrap();
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].id, EventId::new(10));
        let by_event =
            EventFilter { event: Some("TaskCreated".into()), limit: 10, ..Default::default() };
        assert_eq!(store.list_events(&by_event).unwrap()[0].id, EventId::new(11));

        assert_eq!(store.body(EventId::new(10)).unwrap().unwrap(), b"{\"a\":1}");
        assert_eq!(store.body(EventId::new(11)).unwrap(), None);
        assert_eq!(store.body(EventId::new(12)).unwrap().unwrap(), b"");
        assert_eq!(store.event(EventId::new(99)).unwrap(), None);
        assert!(store.size_on_disk().unwrap() > 0);
    }
}
