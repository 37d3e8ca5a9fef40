//! What tests build stores and events from, below every backend's own tests and the
//! conformance suite (which all import it; it imports none of them but the store it
//! opens).

use std::sync::Arc;
use std::time::Duration;

use super::{DedupKey, DispatchPlan, EventId, EventMeta, EventNameOrigin, EventStatus, NewEvent};

/// An event of `source` named `name`, received at `at_us`, with `body`.
pub(crate) fn received(source: &str, name: &str, at_us: u64, body: &str) -> NewEvent {
    NewEvent {
        meta: EventMeta {
            source: source.into(),
            event: name.into(),
            event_from: EventNameOrigin::Path,
            received_at_us: at_us,
            size: body.len() as u64,
            content_type: Some("application/json".into()),
            headers: vec![("user-agent".into(), "test".into())],
            remote_addr: None,
            status: EventStatus::Received,
            flags: Vec::new(),
            reason: None,
            duplicate_of: None,
            destinations: Vec::new(),
            resource: None,
        },
        body: Some(bytes::Bytes::copy_from_slice(body.as_bytes())),
    }
}

/// Dispatch to `dests`, deduplicated by a key of `hash` bytes.
pub(crate) fn plan(id: EventId, hash: u8, dests: &[&str]) -> DispatchPlan {
    DispatchPlan {
        latest: Vec::new(),
        filtered: Vec::new(),
        id,
        dedup: Some(DedupKey { hash: [hash; 16], window_us: 600 * 1_000_000 }),
        destinations: dests.iter().map(|d| (*d).to_owned()).collect(),
        ordered: Vec::new(),
        resource: None,
    }
}

/// A store on the PostgreSQL database `url` (a new relay process each call).
pub(crate) async fn postgres(url: &str) -> super::postgres::PostgresStore {
    super::postgres::PostgresStore::open(super::postgres::PostgresOptions {
        url: url.to_owned(),
        pool_size: 4,
        schema: "hookrelay".into(),
        statement_timeout: Duration::from_secs(30),
        tls: super::postgres::TlsSettings::default(),
        commit_max_batch: 64,
        write_timeout: Duration::from_secs(60),
        live_for: Duration::from_secs(10),
        observer: Arc::new(super::NoObserver),
    })
    .await
    .expect("open the PostgreSQL store")
}
