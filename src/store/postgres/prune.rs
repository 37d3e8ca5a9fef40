//! Retention on PostgreSQL: finished events past their time, in chunks, each decided
//! by [`lifecycle::prune`] on locked rows and deleted in the same transaction.

use std::collections::HashMap;

use super::apply::commit;
use super::cached::Cached;
use super::store::id_of;
use super::tx::Tx;
use super::view::{decode_meta, decode_record, Prefetch};
use super::{sql_id, sql_us, PostgresStore};
use crate::store::lifecycle;
use crate::store::{DeliveryRecord, EventId, StoreError};

impl PostgresStore {
    /// [`crate::store::Store::prune`]: events looked at in chunks, each decided and
    /// deleted in one transaction.
    pub(super) async fn prune_chunks(&self, before_us: u64, n: usize) -> Result<usize, StoreError> {
        /// Events looked at per transaction.
        const CHUNK: i64 = 500;
        let mut pruned = 0;
        let mut cursor: i64 = -1;
        while pruned < n {
            let (done, last) = self
                .write(self.retrying(|| async {
                    let client = self.client().await?;
                    let tx = Tx::begin(&client)?;
                    let rows = tx
                        .cached_query(
                            "SELECT id, meta FROM events WHERE NOT inbox AND id > $1 AND id < $2
                             ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED",
                            &[&cursor, &sql_us(before_us), &CHUNK],
                        )
                        .await?;
                    let Some(last) = rows.last().map(|r| r.get::<_, i64>(0)) else {
                        return Ok((0, None));
                    };
                    let events = rows
                        .iter()
                        .map(|r| Ok((id_of(r.get(0)), decode_meta(r.get(1))?)))
                        .collect::<Result<Vec<_>, StoreError>>()?;
                    let ids: Vec<i64> = events.iter().map(|(id, _)| sql_id(*id)).collect();
                    let mut seen = Prefetch::default();
                    let mut by_event: HashMap<EventId, Vec<DeliveryRecord>> = HashMap::new();
                    for r in tx
                        .cached_query(
                            "SELECT record FROM deliveries WHERE event = ANY($1) FOR UPDATE",
                            &[&ids],
                        )
                        .await?
                    {
                        let record = decode_record(r.get(0))?;
                        seen.deliveries.insert(
                            (record.event, record.destination.clone()),
                            Some(record.clone()),
                        );
                        by_event.entry(record.event).or_default().push(record);
                    }
                    for (id, meta) in &events {
                        seen.events.insert(*id, Some(meta.clone()));
                    }
                    let room = n - pruned;
                    let (count, changes) = seen
                        .decide(&tx, |st| {
                            let mut count = 0;
                            for (id, meta) in &events {
                                if count >= room {
                                    break;
                                }
                                let deliveries = by_event.get(id).cloned().unwrap_or_default();
                                if lifecycle::prune(st, *id, meta, &deliveries, before_us)? {
                                    count += 1;
                                }
                            }
                            Ok(count)
                        })
                        .await?;
                    commit(tx, &seen, &changes, &self.inner).await?;
                    Ok((count, Some(last)))
                }))
                .await?;
            pruned += done;
            match last {
                Some(last) => cursor = last,
                None => break,
            }
        }
        Ok(pruned)
    }

    /// [`crate::store::EventLog::prune_bodies`]: the events after `after` locked with
    /// their deliveries (a replay waits, or is waited for), each decided by
    /// [`lifecycle::prunable`], and the settled ones' bodies set to NULL, in one
    /// transaction.
    pub(super) async fn prune_bodies_after(
        &self,
        after: EventId,
        before_us: u64,
        limit: usize,
    ) -> Result<(usize, Option<EventId>), StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.write(self.retrying(|| async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let rows = tx
                .cached_query(
                    "SELECT id, meta FROM events WHERE NOT inbox AND id > $1 AND id < $2
                     ORDER BY id LIMIT $3 FOR UPDATE",
                    &[&sql_id(after), &sql_us(before_us), &limit],
                )
                .await?;
            let Some(last) = rows.last().map(|r| id_of(r.get(0))) else {
                return Ok((0, None));
            };
            let ids: Vec<i64> = rows.iter().map(|r| r.get::<_, i64>(0)).collect();
            let mut by_event: HashMap<EventId, Vec<DeliveryRecord>> = HashMap::new();
            for r in tx
                .cached_query(
                    "SELECT record FROM deliveries WHERE event = ANY($1) FOR SHARE",
                    &[&ids],
                )
                .await?
            {
                let record = decode_record(r.get(0))?;
                by_event.entry(record.event).or_default().push(record);
            }
            let mut settled = Vec::new();
            for r in &rows {
                let id = id_of(r.get(0));
                let deliveries = by_event.get(&id).map_or(&[][..], Vec::as_slice);
                if lifecycle::prunable(&decode_meta(r.get(1))?, deliveries, before_us) {
                    settled.push(sql_id(id));
                }
            }
            let gone = tx
                .cached_execute(
                    "UPDATE events SET body = NULL WHERE id = ANY($1) AND body IS NOT NULL",
                    &[&settled],
                )
                .await?;
            tx.commit().await?;
            Ok((usize::try_from(gone).unwrap_or(usize::MAX), Some(last)))
        }))
        .await
    }
}
