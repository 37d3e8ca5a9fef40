//! Appending a commit group on PostgreSQL: one statement in one transaction, which
//! inserts the events, decides their ids, and adds to the audit ledger's `received`
//! and `rejected` and to this relay's counts of what it received.
//!
//! Ids are the receive time in µs, unique per relay by a counter seeded from `max(id)`,
//! across relays by the primary key (`ON CONFLICT DO NOTHING`, then the next id), raised
//! above every id committed before the insert (the upstream's order across relays) and
//! capped at the database's clock plus `clock::MAX_SKEW` (a relay running ahead cannot
//! push the fleet's ids).

use super::{apply, EventId, EventStatus, NewEvent, PgState, StoreError};

/// How far beyond the database's clock an id may be proposed, in µs.
const MAX_SKEW_US: i64 = crate::clock::MAX_SKEW.as_micros() as i64;

/// One hour in µs, as the ledger's SQL divides ids by it.
const HOUR_US: i64 = crate::store::lifecycle::ledger::HOUR_US as i64;

impl PgState {
    /// Inserts one group in one transaction; returns the ids in order.
    pub(super) async fn append(&self, batch: &[NewEvent]) -> Result<Vec<EventId>, StoreError> {
        use std::sync::atomic::Ordering;
        let mut ids: Vec<i64> = Vec::with_capacity(batch.len());
        let next_id = |at: u64| -> i64 {
            let mut last = self.last_id.load(Ordering::Relaxed);
            loop {
                let id = EventId::allocate(last, at).raw();
                match self.last_id.compare_exchange(last, id, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(_) => return i64::try_from(id).unwrap_or(i64::MAX),
                    Err(now) => last = now,
                }
            }
        };
        for ev in batch {
            ids.push(next_id(ev.meta.received_at_us));
        }
        let inbox: Vec<bool> =
            batch.iter().map(|e| e.meta.status == EventStatus::Received).collect();
        let source: Vec<&str> = batch.iter().map(|e| e.meta.source.as_str()).collect();
        let event: Vec<&str> = batch.iter().map(|e| e.meta.event.as_str()).collect();
        // The ledger's name for each (`LedgerKey::event`).
        let bucket: Vec<&str> = event.iter().map(|e| crate::event_names::metric_label(e)).collect();
        let status: Vec<&str> = batch.iter().map(|e| e.meta.status.as_str()).collect();
        let resource: Vec<Option<&str>> =
            batch.iter().map(|e| e.meta.resource.as_deref()).collect();
        let meta =
            batch.iter().map(|e| serde_json::to_vec(&e.meta)).collect::<Result<Vec<_>, _>>()?;
        let body: Vec<Option<&[u8]>> = batch.iter().map(|e| e.body.as_deref()).collect();
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        // An id is above every id committed before the insert's snapshot, whatever
        // this relay's clock says: a callback the upstream sends once it has the
        // answer to another (through any relay of the fleet) gets a larger id, and the
        // dispatcher, reading the inbox in id order, sees it after that one. And no id
        // is proposed beyond the database's clock by more than `clock::MAX_SKEW`: a
        // relay whose clock runs ahead (before its first heartbeat sets it) cannot push
        // the fleet's ids, which every later id must exceed, into the future. Ids of a
        // group keep the group's order (every term grows with the ordinal).
        let insert = tx
            .prepare_cached(
                "WITH top AS (SELECT coalesce(max(id), 0) AS top,
                                     (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + $11 AS cap
                              FROM events),
                 k AS (SELECT greatest(least(k.proposed, top.cap + k.n), top.top + k.n) AS id, k.*
                       FROM unnest($1::bigint[], $2::bool[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::bytea[], $8::text[], $12::text[])
                            WITH ORDINALITY AS k(proposed, inbox, source, event, status, meta, body, record, bucket, n), top),
                 ins AS (INSERT INTO events (id, inbox, source, event, status, meta, body, record)
                         SELECT id, inbox, source, event, status, meta, body, record FROM k
                         ON CONFLICT (id) DO NOTHING RETURNING id),
                 led AS (INSERT INTO audit (hour, source, event, destination, count, shard, n)
                         SELECT k.id / $10, k.source, k.bucket, '', c.count, $9, count(*)
                         FROM k JOIN ins USING (id)
                              CROSS JOIN (VALUES ('received'), ('rejected')) AS c(count)
                         WHERE c.count = 'received' OR k.status = 'rejected'
                         GROUP BY 1, 2, 3, 5 ORDER BY 1, 2, 3, 5
                         ON CONFLICT (hour, source, event, destination, count, shard)
                         DO UPDATE SET n = audit.n + excluded.n),
                 rec AS (INSERT INTO received (source, event, relay, n)
                         SELECT r.source, r.event, $16, r.n
                         FROM unnest($13::text[], $14::text[], $15::bigint[]) AS r(source, event, n)
                         ON CONFLICT (source, event, relay) DO UPDATE SET n = received.n + excluded.n)
                 SELECT k.id, EXISTS (SELECT 1 FROM ins WHERE ins.id = k.id) FROM k ORDER BY k.n",
            )
            .await?;
        let shard = fastrand::i16(0..apply::LEDGER_SHARDS);
        // The group's counts go with its first insert (later ones only place the ids
        // another relay took meanwhile).
        let counts = received(batch);
        let no_counts: (Vec<&str>, Vec<&str>, Vec<i64>) = Default::default();
        // Ids another relay took meanwhile (same µs) get the next ones, until all fit.
        let mut todo: Vec<usize> = (0..batch.len()).collect();
        for attempt in 0..16 {
            let columns = (
                todo.iter().map(|&i| ids[i]).collect::<Vec<i64>>(),
                pick(&todo, &inbox),
                pick(&todo, &source),
                pick(&todo, &event),
                pick(&todo, &status),
                todo.iter().map(|&i| meta[i].as_slice()).collect::<Vec<&[u8]>>(),
                todo.iter().map(|&i| body[i]).collect::<Vec<Option<&[u8]>>>(),
                pick(&todo, &resource),
            );
            // The ledger's `received` and `rejected` of the rows stored, in the same
            // statement (their ids decide their hour).
            let buckets = pick(&todo, &bucket);
            let counted = if attempt == 0 { &counts } else { &no_counts };
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 16] = [
                &columns.0,
                &columns.1,
                &columns.2,
                &columns.3,
                &columns.4,
                &columns.5,
                &columns.6,
                &columns.7,
                &shard,
                &HOUR_US,
                &MAX_SKEW_US,
                &buckets,
                &counted.0,
                &counted.1,
                &counted.2,
                &self.instance,
            ];
            let insert = tx.query(&insert, &params);
            // The fleet's dispatcher's wake-up goes with the first insert, pipelined on
            // the connection (no round trip of its own).
            let rows = if attempt == 0 {
                let insert = async { insert.await.map_err(StoreError::from) };
                tokio::try_join!(insert, self.notify_inbox(&tx))?.0
            } else {
                insert.await?
            };
            // One row per proposed id, in the order sent.
            let mut left = Vec::new();
            for (&i, row) in todo.iter().zip(&rows) {
                let (id, stored): (i64, bool) = (row.get(0), row.get(1));
                self.last_id.fetch_max(u64::try_from(id).unwrap_or(0), Ordering::SeqCst);
                ids[i] = id;
                if !stored {
                    left.push(i);
                }
            }
            todo = left;
            if todo.is_empty() {
                tx.commit().await?;
                return Ok(ids.into_iter().map(|id| EventId::new(id as u64)).collect());
            }
            for &i in &todo {
                ids[i] = next_id(batch[i].meta.received_at_us);
            }
        }
        Err(StoreError::Backend {
            backend: "postgres",
            message: "could not find free event ids after 16 tries".into(),
        })
    }
}

/// A group's callbacks per (source, event), as columns: what the append adds to this
/// relay's counts (`Store::received_counts`) in its statement. Names the relay does
/// not know share one row (`other`): callers inventing names cannot grow the table
/// (only known names are compared with the upstream's).
fn received(batch: &[NewEvent]) -> (Vec<&str>, Vec<&str>, Vec<i64>) {
    let mut counts: std::collections::BTreeMap<(&str, &str), i64> = Default::default();
    for e in batch {
        let bucket = crate::event_names::metric_label(&e.meta.event);
        *counts.entry((e.meta.source.as_str(), bucket)).or_default() += 1;
    }
    let mut columns = (Vec::new(), Vec::new(), Vec::new());
    for ((source, event), n) in counts {
        columns.0.push(source);
        columns.1.push(event);
        columns.2.push(n);
    }
    columns
}

/// The elements of `v` at `at`.
fn pick<T: Copy>(at: &[usize], v: &[T]) -> Vec<T> {
    at.iter().map(|&i| v[i]).collect()
}

#[cfg(test)]
mod tests {
    use crate::store::postgres::tests::two_relays;
    use crate::store::EventLog;

    /// An event stored after another was stored gets the larger id, whatever the two
    /// relays' clocks say: the dispatcher sees them in the upstream's order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_event_stored_after_another_gets_the_larger_id_whatever_the_clocks() {
        use crate::store::fixtures::received;
        let (a, b) = two_relays("ids").await;
        let ahead = 4_000_000_000_000_000; // a clock decades ahead
        let first = a.append(received("demo", "ActionUpdated", ahead, "{}")).await.unwrap();
        // ...whose ids the database holds to its own clock, give or take the bound.
        let here = crate::clock::unix_micros(std::time::SystemTime::now());
        let bound = crate::clock::micros(crate::clock::MAX_SKEW) + 5_000_000;
        assert!(
            first.raw() < here + bound,
            "{first:?}: pushed {} s ahead",
            (first.raw() - here) / 1_000_000
        );
        let second = b.append(received("demo", "ActionUpdated", 1_000, "{}")).await.unwrap();
        assert!(second.raw() > first.raw(), "{second:?} after {first:?}");
        // A group from a relay far ahead keeps its order under the cap.
        let ahead_group: Vec<u64> = futures_util::future::join_all(
            (0..5).map(|i| a.append(received("demo", "ActionUpdated", ahead + i, "{}"))),
        )
        .await
        .into_iter()
        .map(|r| r.unwrap().raw())
        .collect();
        assert!(
            ahead_group.iter().all(|id| *id > second.raw() && *id < here + bound),
            "{ahead_group:?}"
        );
        let mut sorted = ahead_group.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 5, "unique: {ahead_group:?}");
        // A group keeps its order too.
        let mut group = Vec::new();
        for at in [5, 3, 4] {
            group.push(b.append(received("demo", "ActionUpdated", at, "{}")));
        }
        let ids: Vec<u64> = futures_util::future::join_all(group)
            .await
            .into_iter()
            .map(|r| r.unwrap().raw())
            .collect();
        let top = ahead_group.iter().max().copied().unwrap_or(0);
        assert!(ids.iter().all(|id| *id > top), "{ids:?}");
    }
}
