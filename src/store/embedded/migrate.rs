//! Migration of a version-1 database (hookrelay before the single-write layout), run
//! at open so that an upgrade keeps every stored event.
//!
//! Version 1 kept a received event in `inbox` as `[u32 meta length][meta JSON][body]`
//! and moved it at dispatch into `events` (meta JSON, final status) and `bodies`; a
//! rejected event went straight to `events`. Each becomes one `records` value:
//! inbox entries still awaiting dispatch, the others final. The copy is idempotent:
//! a crash before the schema version is bumped just runs it again; the old trees are
//! dropped only after the bump is durable.

use super::codec::encode_raw;
use super::engine::{Batch, Db, Engine};
use super::RECORDS;
use crate::store::hex;
use crate::store::StoreError;

const V1_INBOX: &str = "inbox";
const V1_EVENTS: &str = "events";
const V1_BODIES: &str = "bodies";
/// Records written per batch: bounded memory for a large store.
const BATCH: usize = 1024;

/// Copies every version-1 event into `records` and flushes.
pub(super) fn from_v1(db: &Db) -> Result<(), StoreError> {
    // Only sled ever held layout 1.
    if db.engine() != Engine::Sled {
        return Ok(());
    }
    let records = db.open_tree(RECORDS)?;
    let (inbox, events, bodies) =
        (db.open_tree(V1_INBOX)?, db.open_tree(V1_EVENTS)?, db.open_tree(V1_BODIES)?);
    let mut batch = Batch::default();
    let mut in_batch = 0;
    let mut copied = 0usize;
    let corrupt = |table: &'static str, key: &[u8], reason: String| StoreError::Corrupt {
        table,
        key: hex(key),
        reason,
    };
    for item in events.iter() {
        let (key, meta) = item?;
        let body = bodies.get(&key)?;
        batch.insert(&key, encode_raw(false, None, &meta, body.as_deref())?);
        in_batch += 1;
        if in_batch == BATCH {
            records.apply_batch(std::mem::take(&mut batch))?;
            copied += in_batch;
            in_batch = 0;
        }
    }
    for item in inbox.iter() {
        let (key, value) = item?;
        let (len, rest) = value
            .split_first_chunk::<4>()
            .ok_or_else(|| corrupt(V1_INBOX, &key, "entry shorter than its header".into()))?;
        let len = u32::from_be_bytes(*len) as usize;
        if rest.len() < len {
            return Err(corrupt(V1_INBOX, &key, format!("meta length {len} exceeds the entry")));
        }
        let (meta, body) = rest.split_at(len);
        batch.insert(&key, encode_raw(true, None, meta, Some(body))?);
        in_batch += 1;
        if in_batch == BATCH {
            records.apply_batch(std::mem::take(&mut batch))?;
            copied += in_batch;
            in_batch = 0;
        }
    }
    records.apply_batch(batch)?;
    copied += in_batch;
    db.flush()?;
    tracing::info!(events = copied, "store migrated from layout version 1 to 2");
    Ok(())
}

/// Drops the version-1 trees once the migration is durable (a no-op when absent).
pub(super) fn drop_v1_trees(db: &Db) -> Result<(), StoreError> {
    let mut dropped = false;
    for name in [V1_INBOX, V1_EVENTS, V1_BODIES] {
        dropped |= db.drop_tree(name)?;
    }
    if dropped {
        db.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::testutil;
    use crate::store::{
        Dispatch, EventFilter, EventId, EventLog, EventMeta, EventNameOrigin, EventStatus,
    };

    /// Version 1 stored `EventMeta` as serde JSON, as today.
    fn meta_json(status: EventStatus, destinations: &[&str]) -> Vec<u8> {
        serde_json::to_vec(&EventMeta {
            source: "demo".into(),
            event: "ActionCreated".into(),
            event_from: EventNameOrigin::Body,
            received_at_us: 42,
            size: 7,
            content_type: None,
            headers: Vec::new(),
            remote_addr: None,
            status,
            flags: Vec::new(),
            reason: None,
            duplicate_of: None,
            destinations: destinations.iter().map(|d| (*d).to_owned()).collect(),
            resource: None,
        })
        .unwrap()
    }

    /// A version-1 database written byte for byte as the old build did: one
    /// dispatched event, one rejected, one still in the inbox.
    #[tokio::test]
    async fn a_version_1_store_opens_with_every_event_and_body() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = testutil::engine_db(crate::store::embedded::engine::Engine::Sled, dir.path());
            db.open_tree("meta").unwrap().insert("schema_version", b"1").unwrap();
            let (events, bodies, inbox) = (
                db.open_tree(V1_EVENTS).unwrap(),
                db.open_tree(V1_BODIES).unwrap(),
                db.open_tree(V1_INBOX).unwrap(),
            );
            let dispatched = meta_json(EventStatus::Dispatched, &["crm"]);
            events.insert(EventId::new(1).to_key(), dispatched).unwrap();
            bodies.insert(EventId::new(1).to_key(), &b"{\"a\":1}"[..]).unwrap();
            events.insert(EventId::new(2).to_key(), meta_json(EventStatus::Rejected, &[])).unwrap();
            let pending = meta_json(EventStatus::Received, &[]);
            let mut entry = (pending.len() as u32).to_be_bytes().to_vec();
            entry.extend_from_slice(&pending);
            entry.extend_from_slice(b"{\"b\":2}");
            inbox.insert(EventId::new(3).to_key(), entry).unwrap();
            db.flush().unwrap();
        }
        let store = testutil::open(dir.path());
        let read = |id| {
            let store = store.clone();
            async move { store.event(EventId::new(id)).await.unwrap().unwrap().meta }
        };
        assert_eq!(read(1).await.status, EventStatus::Dispatched);
        assert_eq!(read(1).await.destinations, vec!["crm".to_owned()]);
        assert_eq!(read(2).await.status, EventStatus::Rejected);
        assert_eq!(read(3).await.status, EventStatus::Received);
        assert_eq!(store.body(EventId::new(1)).await.unwrap().unwrap(), b"{\"a\":1}");
        assert_eq!(store.body(EventId::new(2)).await.unwrap(), None);
        assert_eq!(store.body(EventId::new(3)).await.unwrap().unwrap(), b"{\"b\":2}");
        let inbox = store.inbox().await.unwrap();
        assert_eq!((inbox.events, inbox.counting), (1, false));
        let pending = store.pending(10).await.unwrap();
        assert_eq!(pending.iter().map(|p| p.id).collect::<Vec<_>>(), vec![EventId::new(3)]);
        let all = store.list_events(EventFilter { limit: 10, ..Default::default() }).await;
        assert_eq!(all.unwrap().len(), 3);
        // The next id follows the migrated ones; the old trees are gone.
        let names = store.inner.db.tree_names().unwrap();
        assert!(!names.iter().any(|n| n == V1_INBOX), "{names:?}");
        assert_eq!(*crate::lock::lock(&store.inner.last_id), 3);
    }
}
