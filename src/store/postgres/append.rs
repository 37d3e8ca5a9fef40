//! Appending a commit group on PostgreSQL: one statement, its own transaction, which
//! inserts the events, decides their ids, and adds to the audit ledger's `received`
//! and `rejected` and to this relay's counts of what it received (one round trip);
//! a transaction of several only when another relay took one of its ids meanwhile.
//!
//! Ids are the receive time in µs, unique per relay by a counter seeded from `max(id)`,
//! across relays by the primary key (`ON CONFLICT DO NOTHING`, then the next id), raised
//! above every id committed before the insert (the upstream's order across relays) and
//! capped at the database's clock plus `clock::MAX_SKEW` (a relay running ahead cannot
//! push the fleet's ids).

use super::cached::Cached;
use super::{apply, pg, EventId, EventStatus, NewEvent, PgState, StoreError};

/// How far beyond the database's clock an id may be proposed, in µs.
const MAX_SKEW_US: i64 = crate::clock::MAX_SKEW.as_micros() as i64;

/// One hour in µs, as the ledger's SQL divides ids by it.
const HOUR_US: i64 = crate::store::lifecycle::ledger::HOUR_US as i64;

/// The statement that inserts a group, `$conflict` deciding what an id another relay
/// took meanwhile does.
///
/// An id is above every id committed before the insert's snapshot, whatever this
/// relay's clock says: a callback the upstream sends once it has the answer to
/// another (through any relay of the fleet) gets a larger id, and the dispatcher,
/// reading the inbox in id order, sees it after that one. And no id is proposed beyond
/// the database's clock by more than `clock::MAX_SKEW`: a relay whose clock runs ahead
/// (before its first heartbeat sets it) cannot push the fleet's ids, which every later
/// id must exceed, into the future. Ids of a group keep the group's order (every term
/// grows with the ordinal). The ledger's `received` and `rejected` of the rows stored
/// go in the same statement (their ids decide their hour), with this relay's counts,
/// and so does the fleet dispatcher's wake-up when `$17`, the channel, is not NULL
/// (`PgState::inbox_channel`): a notification is sent when its transaction commits.
macro_rules! insert_group_sql {
    ($conflict:literal) => {
        concat!(
            "WITH top AS (SELECT coalesce(max(id), 0) AS top,
                                 (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + $11 AS cap
                          FROM events),
             k AS (SELECT greatest(least(k.proposed, top.cap + k.n), top.top + k.n) AS id, k.*
                   FROM unnest($1::bigint[], $2::bool[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::bytea[], $8::text[], $12::text[])
                        WITH ORDINALITY AS k(proposed, inbox, source, event, status, meta, body, record, bucket, n), top),
             ins AS (INSERT INTO events (id, inbox, source, event, status, meta, body, record)
                     SELECT id, inbox, source, event, status, meta, body, record FROM k
                     ",
            $conflict,
            " RETURNING id),
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
             SELECT k.id, EXISTS (SELECT 1 FROM ins WHERE ins.id = k.id),
                    (SELECT count(*) FROM (SELECT pg_notify($17::text, $16)
                                           WHERE $17::text IS NOT NULL) AS wake)
             FROM k ORDER BY k.n"
        )
    };
}

/// Fails on an id another relay took meanwhile (a unique violation): run on its own,
/// the statement is its own transaction, and its group is stored whole or not at all.
const STRICT: &str = insert_group_sql!("");

/// Skips an id another relay took meanwhile (that row's `stored` is false), to be
/// placed again by the next statement of the same transaction.
const TOLERANT: &str = insert_group_sql!("ON CONFLICT (id) DO NOTHING");

/// A group's columns, as the insert binds them.
struct Columns<'a> {
    inbox: Vec<bool>,
    source: Vec<&'a str>,
    event: Vec<&'a str>,
    /// The ledger's name for each (`LedgerKey::event`).
    bucket: Vec<&'a str>,
    status: Vec<&'a str>,
    resource: Vec<Option<&'a str>>,
    meta: Vec<Vec<u8>>,
    body: Vec<Option<&'a [u8]>>,
}

impl<'a> Columns<'a> {
    fn of(batch: &'a [NewEvent]) -> Result<Self, StoreError> {
        let event: Vec<&str> = batch.iter().map(|e| e.meta.event.as_str()).collect();
        Ok(Self {
            inbox: batch.iter().map(|e| e.meta.status == EventStatus::Received).collect(),
            source: batch.iter().map(|e| e.meta.source.as_str()).collect(),
            bucket: event.iter().map(|e| crate::event_names::metric_label(e)).collect(),
            event,
            status: batch.iter().map(|e| e.meta.status.as_str()).collect(),
            resource: batch.iter().map(|e| e.meta.resource.as_deref()).collect(),
            meta: batch
                .iter()
                .map(|e| serde_json::to_vec(&e.meta))
                .collect::<Result<Vec<_>, _>>()?,
            body: batch.iter().map(|e| e.body.as_deref()).collect(),
        })
    }
}

/// One run of `sql` ([`STRICT`] or [`TOLERANT`]) on `client` for the events at `todo`
/// with the ids `ids`, adding `counted` to this relay's counts and notifying `wake`,
/// the fleet's channel, if any; one row per event, in the order of `todo`: its id and
/// whether it was stored.
#[allow(clippy::too_many_arguments)]
async fn insert<C: Cached + Sync>(
    client: &C,
    sql: &str,
    group: &Columns<'_>,
    ids: &[i64],
    todo: &[usize],
    counted: &(Vec<&str>, Vec<&str>, Vec<i64>),
    shard: i16,
    instance: &str,
    wake: Option<&str>,
) -> Result<Vec<pg::Row>, StoreError> {
    let columns = (
        todo.iter().map(|&i| ids[i]).collect::<Vec<i64>>(),
        pick(todo, &group.inbox),
        pick(todo, &group.source),
        pick(todo, &group.event),
        pick(todo, &group.status),
        todo.iter().map(|&i| group.meta[i].as_slice()).collect::<Vec<&[u8]>>(),
        pick(todo, &group.body),
        pick(todo, &group.resource),
        pick(todo, &group.bucket),
    );
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 17] = [
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
        &columns.8,
        &counted.0,
        &counted.1,
        &counted.2,
        &instance,
        &wake,
    ];
    Ok(client.cached_query(sql, &params).await?)
}

impl PgState {
    /// Stores one group, whole or not at all; returns the ids in order.
    ///
    /// Most groups take one round trip: the [`STRICT`] statement on its own (its own
    /// transaction, committed with it), the fleet dispatcher's wake-up in it. Only
    /// when another relay took one of the group's ids meanwhile (the same µs, or both
    /// raised above the same committed id) does the group go again, in a transaction
    /// that places each such event on the next id until all fit.
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
        let group = Columns::of(batch)?;
        let shard = fastrand::i16(0..apply::LEDGER_SHARDS);
        // The group's counts go with the insert that stores it (a later one only
        // places the ids another relay took meanwhile).
        let counts = received(batch);
        let no_counts: (Vec<&str>, Vec<&str>, Vec<i64>) = Default::default();
        let all: Vec<usize> = (0..batch.len()).collect();
        let mut client = self.pool.get().await?;
        {
            let wake = self.inbox_channel();
            match insert(&client, STRICT, &group, &ids, &all, &counts, shard, &self.instance, wake)
                .await
            {
                // Every row stored: the strict form stores all or fails.
                Ok(rows) => {
                    self.take_ids(&mut ids, &all, &rows);
                    return Ok(event_ids(ids));
                }
                // An id taken meanwhile: nothing of the group was stored; the same
                // proposals go again below, each taken one then moved on.
                Err(StoreError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let tx = client.transaction().await?;
        let mut todo = all;
        for attempt in 0..16 {
            let counted = if attempt == 0 { &counts } else { &no_counts };
            // The wake-up is sent once every event is placed, below.
            let rows =
                insert(&tx, TOLERANT, &group, &ids, &todo, counted, shard, &self.instance, None)
                    .await?;
            todo = self.take_ids(&mut ids, &todo, &rows);
            if todo.is_empty() {
                self.notify_inbox(&tx).await?;
                tx.commit().await?;
                return Ok(event_ids(ids));
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

    /// Takes an insert's rows (one per event of `todo`, in the order sent: the id it
    /// got, whether it was stored) into `ids`; returns the events not stored.
    fn take_ids(&self, ids: &mut [i64], todo: &[usize], rows: &[pg::Row]) -> Vec<usize> {
        let mut left = Vec::new();
        for (&i, row) in todo.iter().zip(rows) {
            let (id, stored): (i64, bool) = (row.get(0), row.get(1));
            self.last_id
                .fetch_max(u64::try_from(id).unwrap_or(0), std::sync::atomic::Ordering::SeqCst);
            ids[i] = id;
            if !stored {
                left.push(i);
            }
        }
        left
    }
}

/// The group's ids as the store hands them back.
fn event_ids(ids: Vec<i64>) -> Vec<EventId> {
    ids.into_iter().map(|id| EventId::new(id as u64)).collect()
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

    /// A group one of whose ids another relay holds, not yet committed, waits for
    /// it; once that is committed, the group is stored whole on other ids and counted
    /// once (its first, one-statement try stored nothing).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_whose_id_another_relay_took_meanwhile_is_stored_whole_and_once() {
        use crate::store::fixtures::received;
        let (a, b) = two_relays("taken").await;
        let at = crate::clock::unix_micros(std::time::SystemTime::now());
        // Another relay's transaction has inserted the id of the group's second event.
        let mut other = a.client().await.unwrap();
        let hold = other.transaction().await.unwrap();
        hold.batch_execute(&format!(
            "INSERT INTO events (id, inbox, source, event, status, meta) \
             VALUES ({}, false, 'other', 'ActionUpdated', 'received', ''::bytea)",
            at + 1
        ))
        .await
        .unwrap();
        let group: Vec<_> =
            (0..3).map(|i| received("demo", "ActionUpdated", at + i, "{}")).collect();
        let inner = b.inner.clone();
        let appending = tokio::spawn(async move { inner.append(&group).await });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!appending.is_finished(), "the insert did not wait for the other relay's id");
        hold.commit().await.unwrap();
        let ids = tokio::time::timeout(std::time::Duration::from_secs(10), appending)
            .await
            .expect("the group was never stored")
            .unwrap()
            .unwrap();
        let ids: Vec<u64> = ids.iter().map(|id| id.raw()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]) && ids[0] > at + 1, "{ids:?}");
        let client = a.client().await.unwrap();
        let stored: Vec<i64> = client
            .query("SELECT id FROM events WHERE source = 'demo' ORDER BY id", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(stored, ids.iter().map(|&id| id as i64).collect::<Vec<_>>());
        let counted: i64 = client
            .query_one(
                "SELECT coalesce(sum(n), 0)::bigint FROM received WHERE source = 'demo'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let ledger: i64 = client
            .query_one(
                "SELECT coalesce(sum(n), 0)::bigint FROM audit WHERE source = 'demo' AND count = 'received'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!((counted, ledger), (3, 3), "counted once: (relay's counts, ledger)");
    }

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
