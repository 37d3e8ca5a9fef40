//! The event log on PostgreSQL: appends through the group committer, reads by
//! id, search over the `events` table, retention.

use std::collections::HashMap;

use async_trait::async_trait;

use super::cached::Cached;
use super::store::{id_of, limit, us_of};
use super::view::decode_meta;
use super::{sql_id, PostgresStore};
use crate::store::{EventFilter, EventId, EventLog, EventRecord, NewEvent, StoreError};

#[async_trait]
impl EventLog for PostgresStore {
    async fn append(&self, event: NewEvent) -> Result<EventId, StoreError> {
        self.committer.submit(event).await
    }

    async fn event(&self, id: EventId) -> Result<Option<EventRecord>, StoreError> {
        let client = self.client().await?;
        let row = client
            .cached_query_opt("SELECT meta FROM events WHERE id = $1", &[&sql_id(id)])
            .await?;
        row.map(|r| Ok(EventRecord { id, meta: decode_meta(r.get(0))? })).transpose()
    }

    async fn body(&self, id: EventId) -> Result<Option<Vec<u8>>, StoreError> {
        let client = self.client().await?;
        let row = client
            .cached_query_opt("SELECT body FROM events WHERE id = $1", &[&sql_id(id)])
            .await?;
        Ok(row.and_then(|r| r.get::<_, Option<Vec<u8>>>(0)))
    }

    async fn list_events(&self, filter: EventFilter) -> Result<Vec<EventRecord>, StoreError> {
        let client = self.client().await?;
        // By resource: from `events_record` (record, id), newest first, whatever else
        // is filtered (the condition is spelled out so that the index is certain to
        // serve it); otherwise along the primary key. The column keeps the name of
        // the first builds (`schema.rs`, migration 5): renaming it would stop the
        // relays of a fleet that are not upgraded yet.
        let resource = if filter.resource.is_some() { "record = $6" } else { "$6::text IS NULL" };
        let sql = format!(
            "SELECT id, meta FROM events
             WHERE {resource} AND ($1::bigint IS NULL OR id < $1) AND ($2::text IS NULL OR source = $2)
               AND ($3::text IS NULL OR event = $3) AND ($4::text IS NULL OR status = $4)
               AND ($7::bigint IS NULL OR id >= $7)
             ORDER BY id DESC LIMIT $5"
        );
        let rows = client
            .cached_query(
                &sql,
                &[
                    &filter.after.map(sql_id),
                    &filter.source,
                    &filter.event,
                    &filter.status.map(|s| s.as_str()),
                    &limit(filter.limit),
                    &filter.resource,
                    &filter.since.map(sql_id),
                ],
            )
            .await?;
        rows.iter()
            .map(|r| Ok(EventRecord { id: id_of(r.get(0)), meta: decode_meta(r.get(1))? }))
            .collect()
    }

    async fn prune(&self, before_us: u64, n: usize) -> Result<usize, StoreError> {
        self.prune_chunks(before_us, n).await
    }

    async fn prune_bodies(
        &self,
        after: EventId,
        before_us: u64,
        limit: usize,
    ) -> Result<(usize, Option<EventId>), StoreError> {
        self.prune_bodies_after(after, before_us, limit).await
    }

    async fn received_counts(
        &self,
        source: &str,
    ) -> Result<Option<HashMap<String, u64>>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .cached_query(
                "SELECT event, sum(n)::bigint FROM received WHERE source = $1 GROUP BY event",
                &[&source],
            )
            .await?;
        Ok(Some(rows.iter().map(|r| (r.get::<_, String>(0), us_of(r.get(1)))).collect()))
    }
}
