//! Writes a rule's [`Changes`] in the deciding transaction. Indexes are columns here:
//! a delivery's `due_us` is its schedule entry ([`lifecycle::schedule_entry`]) and its
//! `state` makes it a dead letter, so they move with the record by construction.
//! A row the rule saw absent is inserted, not upserted: if another relay inserted it
//! meanwhile, the primary key fails this transaction instead of overwriting that
//! relay's decision.

use super::cached::Cached;
use super::view::Prefetch;
use super::{pg, sql_id, sql_us};
use crate::store::lifecycle::ledger::{self, LedgerEdits};
use crate::store::lifecycle::{self, Changes};
use crate::store::StoreError;

/// Delivery rows to write in one statement, column by column.
#[derive(Default)]
struct Rows<'a> {
    events: Vec<i64>,
    dests: Vec<&'a str>,
    states: Vec<&'static str>,
    dues: Vec<Option<i64>>,
    records: Vec<Vec<u8>>,
    /// The claim to give back with the write, by its token (see [`Releases`]).
    releases: Vec<Option<i64>>,
}

/// Claims to give back where their delivery's row is written anyway (an attempt's
/// record): by (event, destination), the claim's token. The row is then written once,
/// not twice, and the claim goes only if it is still that one.
pub(super) type Releases = std::collections::HashMap<(crate::store::EventId, String), u64>;

/// Dedup rows to write in one statement.
#[derive(Default)]
struct Batch3 {
    keys: Vec<Vec<u8>>,
    a: Vec<i64>,
    b: Vec<i64>,
}

impl Batch3 {
    fn push(&mut self, key: Vec<u8>, a: i64, b: i64) {
        self.keys.push(key);
        self.a.push(a);
        self.b.push(b);
    }

    fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Writes `changes` with their ledger edits, and tells the other relays of the
/// destinations they make due (`listen.rs`).
pub(super) async fn apply(
    tx: &pg::Transaction<'_>,
    seen: &Prefetch,
    changes: &Changes,
    state: &super::PgState,
) -> Result<(), StoreError> {
    apply_releasing(tx, seen, changes, state, &Releases::new()).await
}

/// [`apply`], giving back the claims of `releases` on the delivery rows it updates.
pub(super) async fn apply_releasing(
    tx: &pg::Transaction<'_>,
    seen: &Prefetch,
    changes: &Changes,
    state: &super::PgState,
    releases: &Releases,
) -> Result<(), StoreError> {
    state.notifier().notify_due(tx, changes).await?;
    // One statement per table and kind of write, whatever the batch size: a group of
    // attempts or a dispatch batch costs a few round trips, not one per row.
    if !changes.dispatched.is_empty() {
        let mut ids = Vec::new();
        let mut statuses = Vec::new();
        let mut metas = Vec::new();
        for (id, meta) in &changes.dispatched {
            ids.push(sql_id(*id));
            statuses.push(meta.status.as_str());
            metas.push(serde_json::to_vec(meta)?);
        }
        tx.cached_execute(
            "UPDATE events e SET inbox = false, status = k.status, meta = k.meta
             FROM unnest($1::bigint[], $2::text[], $3::bytea[]) AS k(id, status, meta)
             WHERE e.id = k.id AND e.inbox",
            &[&ids, &statuses, &metas],
        )
        .await?;
    }
    let (mut new_dedup, mut old_dedup) = (Batch3::default(), Batch3::default());
    for (hash, entry) in &changes.dedup {
        let batch = match seen.dedup.get(hash) {
            Some(Some(_)) => &mut old_dedup,
            _ => &mut new_dedup,
        };
        batch.push(hash.to_vec(), sql_id(entry.original), sql_us(entry.until_us));
    }
    if !new_dedup.is_empty() {
        tx.cached_execute(
            "INSERT INTO dedup (hash, original, until_us)
             SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::bigint[])",
            &[&new_dedup.keys, &new_dedup.a, &new_dedup.b],
        )
        .await?;
    }
    if !old_dedup.is_empty() {
        tx.cached_execute(
            "UPDATE dedup d SET original = k.original, until_us = k.until_us
             FROM unnest($1::bytea[], $2::bigint[], $3::bigint[]) AS k(hash, original, until_us)
             WHERE d.hash = k.hash",
            &[&old_dedup.keys, &old_dedup.a, &old_dedup.b],
        )
        .await?;
    }
    let (mut inserts, mut updates) = (Rows::default(), Rows::default());
    let (mut gone_events, mut gone_dests) = (Vec::new(), Vec::new());
    for ((event, dest), change) in &changes.deliveries {
        match (&change.before, &change.after) {
            (_, None) => {
                gone_events.push(sql_id(*event));
                gone_dests.push(dest.as_str());
            }
            (before, Some(after)) => {
                let rows = if before.is_some() { &mut updates } else { &mut inserts };
                rows.events.push(sql_id(*event));
                rows.dests.push(dest.as_str());
                rows.states.push(after.state.as_str());
                rows.dues.push(lifecycle::schedule_entry(after).map(sql_us));
                rows.records.push(serde_json::to_vec(after)?);
                rows.releases.push(releases.get(&(*event, dest.clone())).map(|t| sql_us(*t)));
            }
        }
    }
    if !gone_events.is_empty() {
        tx.cached_execute(
            "DELETE FROM deliveries d USING unnest($1::bigint[], $2::text[]) AS k(event, destination)
             WHERE d.event = k.event AND d.destination = k.destination",
            &[&gone_events, &gone_dests],
        )
        .await?;
    }
    if !updates.events.is_empty() {
        tx.cached_execute(
            "UPDATE deliveries d SET state = k.state, due_us = k.due_us, record = k.record,
                 claim_owner = CASE WHEN d.claim_token = k.release THEN NULL ELSE d.claim_owner END,
                 claim_expires_us = CASE WHEN d.claim_token = k.release THEN NULL ELSE d.claim_expires_us END,
                 claim_token = CASE WHEN d.claim_token = k.release THEN NULL ELSE d.claim_token END
             FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::bytea[], $6::bigint[])
               AS k(event, destination, state, due_us, record, release)
             WHERE d.event = k.event AND d.destination = k.destination",
            &[
                &updates.events,
                &updates.dests,
                &updates.states,
                &updates.dues,
                &updates.records,
                &updates.releases,
            ],
        )
        .await?;
    }
    if !inserts.events.is_empty() {
        tx.cached_execute(
            "INSERT INTO deliveries (event, destination, state, due_us, record)
             SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::bytea[])",
            &[&inserts.events, &inserts.dests, &inserts.states, &inserts.dues, &inserts.records],
        )
        .await?;
    }
    for ((dest, resource), queue) in &changes.queues {
        let existed = matches!(seen.queues.get(&(dest.clone(), *resource)), Some(Some(_)));
        match queue {
            None => {
                tx.cached_execute(
                    "DELETE FROM queues WHERE destination = $1 AND resource = $2",
                    &[dest, &resource.as_slice()],
                )
                .await?;
            }
            Some(q) => {
                let sql = if existed {
                    "UPDATE queues SET head = $3, tail = $4, len = $5
                     WHERE destination = $1 AND resource = $2"
                } else {
                    "INSERT INTO queues (destination, resource, head, tail, len)
                     VALUES ($1, $2, $3, $4, $5)"
                };
                let len = i64::try_from(q.len).unwrap_or(i64::MAX);
                tx.cached_execute(
                    sql,
                    &[dest, &resource.as_slice(), &sql_id(q.head), &sql_id(q.tail), &len],
                )
                .await?;
            }
        }
    }
    if !changes.pruned.is_empty() {
        let ids: Vec<i64> = changes.pruned.iter().map(|(id, _)| sql_id(*id)).collect();
        tx.cached_execute("DELETE FROM events WHERE id = ANY($1) AND NOT inbox", &[&ids]).await?;
    }
    if !changes.bodies_dropped.is_empty() {
        let ids: Vec<i64> = changes.bodies_dropped.iter().map(|id| sql_id(*id)).collect();
        tx.cached_execute(
            "UPDATE events SET body = NULL WHERE id = ANY($1) AND NOT inbox AND body IS NOT NULL",
            &[&ids],
        )
        .await?;
    }
    // Last: the counters are the rows most transactions share, held for the least time,
    // and taken in key order (no two transactions wait on each other in a cycle).
    add_to_ledger(tx, &ledger::edits(changes, state.ledger_start)).await
}

/// Adds `edits` to the `audit` counters, on one shard picked at random.
pub(super) async fn add_to_ledger(
    tx: &pg::Transaction<'_>,
    edits: &LedgerEdits,
) -> Result<(), StoreError> {
    if edits.is_empty() {
        return Ok(());
    }
    let shard = fastrand::i16(0..LEDGER_SHARDS);
    let mut cols = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (key, n) in edits {
        cols.0.push(i64::try_from(key.hour).unwrap_or(i64::MAX));
        cols.1.push(key.source.as_str());
        cols.2.push(key.event.as_str());
        cols.3.push(key.destination.as_str());
        cols.4.push(key.count.as_str());
        cols.5.push(*n);
    }
    tx.cached_execute(
        "INSERT INTO audit (hour, source, event, destination, count, shard, n)
         SELECT k.hour, k.source, k.event, k.destination, k.count, $6, k.n
         FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $7::bigint[])
           AS k(hour, source, event, destination, count, n)
         ON CONFLICT (hour, source, event, destination, count, shard)
         DO UPDATE SET n = audit.n + excluded.n",
        &[&cols.0, &cols.1, &cols.2, &cols.3, &cols.4, &shard, &cols.5],
    )
    .await?;
    Ok(())
}

/// Rows one counter is spread over.
pub(super) const LEDGER_SHARDS: i16 = 16;
