//! The sled backend: one named tree per concept, big-endian keys (see ARCHITECTURE.md).
//!
//! A received event lives in `inbox` (meta and body in one value) until dispatch moves
//! it to `events` and `bodies`; a rejected one goes straight to `events`. So an ack
//! costs one sled insert per event: sled 0.34 spends several microseconds per insert
//! whatever the value size, which makes the insert count the cost of the ack path.

use std::iter::{Peekable, Rev};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::codec::{decode_meta, decode_pending, encode_pending};
use super::{
    EventFilter, EventId, EventMeta, EventRecord, EventStatus, NewEvent, Store, StoreError,
};

/// Version of the on-disk layout; bumped on incompatible changes.
const SCHEMA_VERSION: u32 = 1;
const SCHEMA_KEY: &[u8] = b"schema_version";

/// Tree names. Trees the current code does not write yet are opened anyway so the
/// layout is fixed from the first version on.
const EVENTS: &str = "events";
const BODIES: &str = "bodies";
const INBOX: &str = "inbox";
const META: &str = "meta";
const RESERVED: [&str; 4] = ["deliveries", "schedule", "dedup", "dead_letters"];

/// sled-backed [`Store`].
pub(crate) struct SledStore {
    db: sled::Db,
    events: sled::Tree,
    bodies: sled::Tree,
    inbox: sled::Tree,
    /// Entries in `inbox`: sled's own `len()` walks the whole tree.
    inbox_count: AtomicUsize,
}

/// How to open the store.
pub(crate) struct SledOptions<'a> {
    pub(crate) path: &'a Path,
    pub(crate) cache_capacity_bytes: u64,
    pub(crate) flush_interval: Duration,
}

impl SledStore {
    /// Opens (or creates) the store at `path` and checks its schema version.
    pub(crate) fn open(opts: &SledOptions<'_>) -> Result<Self, StoreError> {
        let flush_ms = u64::try_from(opts.flush_interval.as_millis()).unwrap_or(u64::MAX).max(1);
        let db = sled::Config::new()
            .path(opts.path)
            .cache_capacity(opts.cache_capacity_bytes)
            .flush_every_ms(Some(flush_ms))
            .mode(sled::Mode::HighThroughput)
            .open()?;
        let meta = db.open_tree(META)?;
        match meta.get(SCHEMA_KEY)? {
            None => {
                meta.insert(SCHEMA_KEY, SCHEMA_VERSION.to_string().as_bytes())?;
                db.flush()?;
            }
            Some(v) if v.as_ref() == SCHEMA_VERSION.to_string().as_bytes() => {}
            Some(v) => {
                return Err(StoreError::Schema {
                    found: String::from_utf8_lossy(&v).into_owned(),
                    supported: SCHEMA_VERSION,
                })
            }
        }
        for name in RESERVED {
            db.open_tree(name)?;
        }
        let inbox = db.open_tree(INBOX)?;
        Ok(Self {
            events: db.open_tree(EVENTS)?,
            bodies: db.open_tree(BODIES)?,
            inbox_count: AtomicUsize::new(inbox.len()),
            inbox,
            db,
        })
    }
}

/// Which tree a record was read from: they encode their values differently.
#[derive(Clone, Copy)]
enum Source {
    Events,
    Inbox,
}

fn decode(source: Source, key: &[u8], value: &[u8]) -> Result<EventRecord, StoreError> {
    let tree = match source {
        Source::Events => EVENTS,
        Source::Inbox => INBOX,
    };
    let corrupt = |reason: String| StoreError::Corrupt { tree, key: hex(key), reason };
    let id = EventId::from_key(key).ok_or_else(|| corrupt("key is not 8 bytes".into()))?;
    let meta: EventMeta = match source {
        Source::Events => serde_json::from_slice(value).map_err(|e| corrupt(e.to_string()))?,
        Source::Inbox => decode_meta(value).map_err(corrupt)?,
    };
    Ok(EventRecord { id, meta })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

type Scan = Peekable<Rev<sled::Iter>>;

/// Takes the newer (larger key) of the two scans' next items.
fn next_newest(
    events: &mut Scan,
    inbox: &mut Scan,
) -> Option<Result<(Source, sled::IVec, sled::IVec), StoreError>> {
    let key_of = |s: &mut Scan| match s.peek() {
        Some(Ok((k, _))) => Some(Some(k.clone())),
        Some(Err(_)) => Some(None), // an error: surface it first
        None => None,
    };
    let (source, scan) = match (key_of(events), key_of(inbox)) {
        (None, None) => return None,
        (Some(None), _) | (Some(Some(_)), None) => (Source::Events, events),
        (_, Some(None)) | (None, Some(Some(_))) => (Source::Inbox, inbox),
        (Some(Some(e)), Some(Some(i))) if e > i => (Source::Events, events),
        (Some(Some(_)), Some(Some(_))) => (Source::Inbox, inbox),
    };
    scan.next().map(|item| item.map(|(k, v)| (source, k, v)).map_err(StoreError::from))
}

impl Store for SledStore {
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
                EventStatus::Rejected => {
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

    fn event(&self, id: EventId) -> Result<Option<EventRecord>, StoreError> {
        let key = id.to_key();
        if let Some(v) = self.events.get(key)? {
            return decode(Source::Events, &key, &v).map(Some);
        }
        self.inbox.get(key)?.map(|v| decode(Source::Inbox, &key, &v)).transpose()
    }

    fn body(&self, id: EventId) -> Result<Option<Vec<u8>>, StoreError> {
        let key = id.to_key();
        if let Some(body) = self.bodies.get(key)? {
            return Ok(Some(body.to_vec()));
        }
        match self.inbox.get(key)? {
            None => Ok(None),
            Some(v) => decode_pending(&v)
                .map(|(_, body)| Some(body.to_vec()))
                .map_err(|reason| StoreError::Corrupt { tree: INBOX, key: hex(&key), reason }),
        }
    }

    fn list_events(&self, filter: &EventFilter) -> Result<Vec<EventRecord>, StoreError> {
        let scan = |tree: &sled::Tree| match filter.after {
            Some(after) => tree.range(..after.to_key()).rev().peekable(),
            None => tree.iter().rev().peekable(),
        };
        let (mut events, mut inbox) = (scan(&self.events), scan(&self.inbox));
        let mut out = Vec::with_capacity(filter.limit.min(1024));
        while out.len() < filter.limit {
            let Some(item) = next_newest(&mut events, &mut inbox) else { break };
            let (source, key, value) = item?;
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

    fn inbox_len(&self) -> usize {
        self.inbox_count.load(Ordering::Relaxed)
    }

    fn size_on_disk(&self) -> Result<u64, StoreError> {
        Ok(self.db.size_on_disk()?)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{unix_micros, EventFlag, EventNameOrigin};
    use super::*;

    fn open(dir: &Path) -> SledStore {
        SledStore::open(&SledOptions {
            path: dir,
            cache_capacity_bytes: 1 << 20,
            flush_interval: Duration::from_millis(500),
        })
        .unwrap()
    }

    fn event(source: &str, name: &str, status: EventStatus, body: Option<&str>) -> NewEvent {
        NewEvent {
            meta: EventMeta {
                source: source.into(),
                event: name.into(),
                event_from: EventNameOrigin::Path,
                received_at_us: unix_micros(std::time::SystemTime::now()),
                size: body.map_or(0, |b| b.len() as u64),
                content_type: Some("application/json".into()),
                headers: vec![("user-agent".into(), "test".into())],
                remote_addr: None,
                status,
                flags: if body.is_none() { vec![EventFlag::Oversized] } else { vec![] },
                reason: None,
            },
            body: body.map(|b| bytes::Bytes::copy_from_slice(b.as_bytes())),
        }
    }

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

    #[test]
    fn refuses_a_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = sled::open(dir.path()).unwrap();
            db.open_tree(META).unwrap().insert(SCHEMA_KEY, b"99").unwrap();
            db.flush().unwrap();
        }
        let err = SledStore::open(&SledOptions {
            path: dir.path(),
            cache_capacity_bytes: 1 << 20,
            flush_interval: Duration::from_millis(500),
        })
        .err()
        .unwrap();
        assert!(err.to_string().contains("schema version 99"), "{err}");
    }
}
