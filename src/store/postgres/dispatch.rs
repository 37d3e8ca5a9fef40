//! Dispatch on PostgreSQL: the inbox read in id order by the fleet's one dispatcher,
//! each batch one transaction fenced by its lease.

use std::collections::HashMap;

use async_trait::async_trait;

use super::apply::commit;
use super::cached::Cached;
use super::lead::DISPATCH_HOLDER;
use super::store::{id_of, limit, us_of};
use super::tx::Tx;
use super::view::{decode_meta, Prefetch};
use super::{sql_id, sql_us, PostgresStore};
use crate::store::lifecycle::{self};
use crate::store::{Dispatch, DispatchPlan, DispatchVerdict, InboxStats, PendingEvent, StoreError};

/// Dispatch's first statement: the dispatcher's lease holder ([`DISPATCH_HOLDER`])
/// beside each of the inbox rows `$1` that no other transaction holds, locked; the
/// holder beside NULLs when there is none.
static HOLDER_AND_INBOX: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT l.holder, e.id, e.meta FROM (SELECT 1) AS one
         LEFT JOIN ({DISPATCH_HOLDER}) AS l ON true
         LEFT JOIN (SELECT id, meta FROM events WHERE id = ANY($1) AND inbox
                    FOR UPDATE SKIP LOCKED) AS e ON true"
    )
});

#[async_trait]
impl Dispatch for PostgresStore {
    async fn inbox(&self) -> Result<InboxStats, StoreError> {
        let client = self.client().await?;
        let row = client.cached_query_one("SELECT count(*) FROM events WHERE inbox", &[]).await?;
        Ok(InboxStats { events: us_of(row.get(0)), counting: false })
    }

    async fn pending(&self, n: usize) -> Result<Vec<PendingEvent>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .cached_query(
                "SELECT id, meta, body FROM events WHERE inbox ORDER BY id LIMIT $1",
                &[&limit(n)],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let body: Option<Vec<u8>> = r.get(2);
                Ok(PendingEvent {
                    id: id_of(r.get(0)),
                    meta: decode_meta(r.get(1))?,
                    body: body.map(bytes::Bytes::from).unwrap_or_default(),
                })
            })
            .collect()
    }

    async fn dispatch(
        &self,
        plans: Vec<DispatchPlan>,
        now_us: u64,
    ) -> Result<Vec<DispatchVerdict>, StoreError> {
        self.write(self.retrying(|| async {
            let client = self.client().await?;
            let tx = Tx::begin(&client)?;
            let ids: Vec<i64> = plans.iter().map(|p| sql_id(p.id)).collect();
            // The lease check and the inbox rows in one statement; rows a relay
            // without the lease locked go with its rollback. Another relay
            // dispatching the same events holds their rows: they are skipped.
            // Pipelined with it (one round trip for both), the dedup keys and queues the
            // rule's first pass asks for: it then needs no read of its own for them.
            let mut seen = Prefetch::default();
            let dedup: Vec<[u8; 16]> =
                plans.iter().filter_map(|p| p.dedup.as_ref().map(|k| k.hash)).collect();
            let mut queues: Vec<(String, [u8; 16])> = Vec::new();
            for plan in &plans {
                if let Some(resource) = plan.resource {
                    queues.extend(plan.ordered.iter().map(|d| (d.clone(), resource)));
                }
            }
            let ahead = seen.fetch_ahead(&tx, dedup, queues);
            let holder_and_inbox = async {
                tx.cached_query(&HOLDER_AND_INBOX, &[&ids, &crate::store::DISPATCH_LEAD])
                    .await
                    .map_err(StoreError::from)
            };
            let (rows, ()) = tokio::try_join!(holder_and_inbox, ahead)?;
            let holder = rows.first().and_then(|r| r.get::<_, Option<&str>>(0));
            let may = self.inner.may_dispatch(holder);
            if !may {
                // Another relay leads dispatch now: it takes these (in order). The
                // rows this transaction locked are let go before returning: a dropped
                // transaction rolls back only when its connection next runs, and the
                // leader's `SKIP LOCKED` would meanwhile skip them (seen as a flaky
                // `a_relay_that_lost_the_dispatch_lease_dispatches_nothing` under load).
                tx.rollback().await?;
                return Ok(plans.iter().map(|_| DispatchVerdict::Gone).collect());
            }
            let mut inbox = HashMap::new();
            for r in &rows {
                if let Some(id) = r.get::<_, Option<i64>>(1) {
                    inbox.insert(id_of(id), decode_meta(r.get(2))?);
                }
            }
            seen.undispatched = inbox.keys().copied().collect();
            let (outcomes, changes) = seen
                .decide(&tx, |st| {
                    plans
                        .iter()
                        .map(|plan| match inbox.get(&plan.id) {
                            Some(meta) => lifecycle::dispatch(st, meta.clone(), plan, now_us),
                            None => Ok(DispatchVerdict::Gone),
                        })
                        .collect::<Result<Vec<_>, _>>()
                })
                .await?;
            commit(tx, &seen, &changes, &self.inner).await?;
            Ok(outcomes)
        }))
        .await
    }

    async fn purge_dedup(&self, now_us: u64, limit: usize) -> Result<usize, StoreError> {
        self.write(async {
            let client = self.client().await?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let n = client
                .cached_execute(
                    "DELETE FROM dedup WHERE hash IN \
                     (SELECT hash FROM dedup WHERE until_us <= $1 ORDER BY until_us LIMIT $2)",
                    &[&sql_us(now_us), &limit],
                )
                .await?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
        .await
    }

    async fn dedup_len(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let row = client.cached_query_one("SELECT count(*) FROM dedup", &[]).await?;
        Ok(us_of(row.get(0)))
    }
}
