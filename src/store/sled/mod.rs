//! The sled backend: one named tree per concept, big-endian keys (see ARCHITECTURE.md).
//!
//! A received event lives in `inbox` (meta and body in one value) until dispatch moves
//! it to `events` and `bodies`; a rejected one goes straight to `events`. So an ack
//! costs one sled insert per event: sled 0.34 spends several microseconds per insert
//! whatever the value size, which makes the insert count the cost of the ack path.

mod deliveries;
#[cfg(test)]
mod delivery_tests;
mod dispatch;
mod events;
mod ordering;

use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use super::codec::decode_meta;
use super::{EventId, EventMeta, EventRecord, StoreError};

/// Version of the on-disk layout; bumped on incompatible changes.
const SCHEMA_VERSION: u32 = 1;
const SCHEMA_KEY: &[u8] = b"schema_version";

/// Tree names. Trees the current code does not write yet are opened anyway so the
/// layout is fixed from the first version on.
const EVENTS: &str = "events";
const BODIES: &str = "bodies";
const INBOX: &str = "inbox";
const META: &str = "meta";
const DELIVERIES: &str = "deliveries";
const SCHEDULE: &str = "schedule";
const DEDUP: &str = "dedup";
const DEAD_LETTERS: &str = "dead_letters";
const ORDERING: &str = "ordering";
const UPSTREAM: &str = "upstream";
/// `schedule` values: what kind of entry it is, for queue counts without reading the
/// delivery records.
const SCHEDULED_PENDING: u8 = 0;
const SCHEDULED_RETRYING: u8 = 1;
/// Keys of `meta` holding a paused destination: `paused/{name}`.
const PAUSED_PREFIX: &[u8] = b"paused/";

/// sled-backed [`Store`].
pub(crate) struct SledStore {
    db: sled::Db,
    events: sled::Tree,
    bodies: sled::Tree,
    inbox: sled::Tree,
    deliveries: sled::Tree,
    schedule: sled::Tree,
    dedup: sled::Tree,
    dead_letters: sled::Tree,
    ordering: sled::Tree,
    upstream: sled::Tree,
    meta: sled::Tree,
    /// Entries in `inbox` and `dedup`: sled's own `len()` walks the whole tree.
    inbox_count: AtomicUsize,
    dedup_count: AtomicUsize,
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
        let inbox = db.open_tree(INBOX)?;
        let dedup = db.open_tree(DEDUP)?;
        Ok(Self {
            events: db.open_tree(EVENTS)?,
            bodies: db.open_tree(BODIES)?,
            deliveries: db.open_tree(DELIVERIES)?,
            schedule: db.open_tree(SCHEDULE)?,
            dead_letters: db.open_tree(DEAD_LETTERS)?,
            ordering: db.open_tree(ORDERING)?,
            upstream: db.open_tree(UPSTREAM)?,
            inbox_count: AtomicUsize::new(inbox.len()),
            dedup_count: AtomicUsize::new(dedup.len()),
            inbox,
            dedup,
            meta,
            db,
        })
    }
}

impl crate::store::UpstreamStore for SledStore {
    fn upstream_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.upstream.get(key.as_bytes())?.map(|v| v.to_vec()))
    }

    fn upstream_put(&self, key: &str, value: Option<&[u8]>) -> Result<(), StoreError> {
        match value {
            Some(v) => self.upstream.insert(key.as_bytes(), v)?,
            None => self.upstream.remove(key.as_bytes())?,
        };
        self.db.flush()?;
        Ok(())
    }

    fn upstream_scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.upstream
            .scan_prefix(prefix.as_bytes())
            .map(|item| {
                let (k, v) = item?;
                Ok((String::from_utf8_lossy(&k).into_owned(), v.to_vec()))
            })
            .collect()
    }
}

/// Which tree a record was read from: they encode their values differently.
#[derive(Clone, Copy)]
pub(super) enum Source {
    Events,
    Inbox,
}

pub(super) fn decode(source: Source, key: &[u8], value: &[u8]) -> Result<EventRecord, StoreError> {
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

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
pub(super) mod testutil {
    use std::path::Path;
    use std::time::Duration;

    use super::super::{unix_micros, EventFlag, EventMeta, EventNameOrigin, EventStatus, NewEvent};
    use super::{SledOptions, SledStore};

    /// Opens the store in `dir`. A store dropped just before may still be held by
    /// sled's flusher thread for a moment (its file lock): retry briefly.
    pub(crate) fn open(dir: &Path) -> SledStore {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match SledStore::open(&SledOptions {
                path: dir,
                cache_capacity_bytes: 1 << 20,
                flush_interval: Duration::from_millis(500),
            }) {
                Ok(store) => return store,
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("cannot open the test store: {e}"),
            }
        }
    }

    pub(crate) fn event(
        source: &str,
        name: &str,
        status: EventStatus,
        body: Option<&str>,
    ) -> NewEvent {
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
                duplicate_of: None,
                destinations: Vec::new(),
            },
            body: body.map(|b| bytes::Bytes::copy_from_slice(b.as_bytes())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
