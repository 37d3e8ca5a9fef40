//! Writes a rule's [`Changes`] in the deciding transaction. Indexes are columns here:
//! a delivery's `due_us` is its schedule entry ([`lifecycle::schedule_entry`]) and its
//! `state` makes it a dead letter, so they move with the record by construction.
//! A row the rule saw absent is inserted, not upserted: if another relay inserted it
//! meanwhile, the primary key fails this transaction instead of overwriting that
//! relay's decision.

use tokio_postgres::types::ToSql;

use super::cached::Cached;
use super::combine::{combine, Write};
use super::tx::Tx;
use super::view::Prefetch;
use super::{pg, sql_id, sql_us};
use crate::store::lifecycle::ledger::{self, LedgerEdits};
use crate::store::lifecycle::{self, Changes, Queue};
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

/// Writes `changes` with their ledger edits, tells the other relays of the
/// destinations they make due (`listen.rs`), and commits `tx`.
pub(super) async fn commit(
    tx: Tx<'_>,
    seen: &Prefetch,
    changes: &Changes,
    state: &super::PgState,
) -> Result<(), StoreError> {
    commit_releasing(tx, seen, changes, state, &Releases::new()).await
}

/// [`commit`], giving back the claims of `releases`: on the delivery rows it updates,
/// and by a write of their own for the others (a record left as it was).
///
/// One statement per table and kind of write, whatever the batch size, combined
/// ([`combine`]) and sent with the wake-ups and the `COMMIT` (`tx.rs`): a group of
/// attempts or a dispatch batch costs one round trip to write and commit, not one
/// per statement (nor per row).
pub(super) async fn commit_releasing(
    tx: Tx<'_>,
    seen: &Prefetch,
    changes: &Changes,
    state: &super::PgState,
    releases: &Releases,
) -> Result<(), StoreError> {
    let mut dispatched = (Vec::new(), Vec::new(), Vec::new());
    for (id, meta) in &changes.dispatched {
        dispatched.0.push(sql_id(*id));
        dispatched.1.push(meta.status.as_str());
        dispatched.2.push(serde_json::to_vec(meta)?);
    }
    let (mut new_dedup, mut old_dedup) = (Batch3::default(), Batch3::default());
    for (hash, entry) in &changes.dedup {
        let batch = match seen.dedup.get(hash) {
            Some(Some(_)) => &mut old_dedup,
            _ => &mut new_dedup,
        };
        batch.push(hash.to_vec(), sql_id(entry.original), sql_us(entry.until_us));
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
    let mut queues = QueueRows::default();
    for ((dest, resource), queue) in &changes.queues {
        let existed = matches!(seen.queues.get(&(dest.clone(), *resource)), Some(Some(_)));
        queues.push(dest, resource, queue.as_ref(), existed);
    }
    // Claims whose delivery the rule left as it was: given back on their own.
    let mut kept = (Vec::new(), Vec::new(), Vec::new());
    for ((event, dest), token) in releases {
        if !changes.deliveries.contains_key(&(*event, dest.clone())) {
            kept.0.push(sql_id(*event));
            kept.1.push(dest.as_str());
            kept.2.push(sql_us(*token));
        }
    }
    let pruned: Vec<i64> = changes.pruned.iter().map(|(id, _)| sql_id(*id)).collect();
    let bodies_dropped: Vec<i64> = changes.bodies_dropped.iter().map(|id| sql_id(*id)).collect();
    let ledger_edits = ledger::edits(changes, state.ledger_start);
    let ledger = LedgerRows::of(&ledger_edits);

    // In this order, as each was written after the one before.
    let mut writes: Vec<Write<'_>> = Vec::new();
    if !dispatched.0.is_empty() {
        writes.push(Write::new(
            "events",
            "UPDATE events e SET inbox = false, status = k.status, meta = k.meta
             FROM unnest($1::bigint[], $2::text[], $3::bytea[]) AS k(id, status, meta)
             WHERE e.id = k.id AND e.inbox",
            vec![&dispatched.0, &dispatched.1, &dispatched.2],
        ));
    }
    if !new_dedup.is_empty() {
        writes.push(Write::new(
            "dedup",
            "INSERT INTO dedup (hash, original, until_us)
             SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::bigint[])",
            vec![&new_dedup.keys, &new_dedup.a, &new_dedup.b],
        ));
    }
    if !old_dedup.is_empty() {
        writes.push(Write::new(
            "dedup",
            "UPDATE dedup d SET original = k.original, until_us = k.until_us
             FROM unnest($1::bytea[], $2::bigint[], $3::bigint[]) AS k(hash, original, until_us)
             WHERE d.hash = k.hash",
            vec![&old_dedup.keys, &old_dedup.a, &old_dedup.b],
        ));
    }
    if !gone_events.is_empty() {
        writes.push(Write::new(
            "deliveries",
            "DELETE FROM deliveries d USING unnest($1::bigint[], $2::text[]) AS k(event, destination)
             WHERE d.event = k.event AND d.destination = k.destination",
            vec![&gone_events, &gone_dests],
        ));
    }
    if !updates.events.is_empty() {
        writes.push(Write::new(
            "deliveries",
            "UPDATE deliveries d SET state = k.state, due_us = k.due_us, record = k.record,
                 claim_owner = CASE WHEN d.claim_token = k.release THEN NULL ELSE d.claim_owner END,
                 claim_expires_us = CASE WHEN d.claim_token = k.release THEN NULL ELSE d.claim_expires_us END,
                 claim_token = CASE WHEN d.claim_token = k.release THEN NULL ELSE d.claim_token END
             FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::bytea[], $6::bigint[])
               AS k(event, destination, state, due_us, record, release)
             WHERE d.event = k.event AND d.destination = k.destination",
            vec![
                &updates.events,
                &updates.dests,
                &updates.states,
                &updates.dues,
                &updates.records,
                &updates.releases,
            ],
        ));
    }
    if !inserts.events.is_empty() {
        writes.push(Write::new(
            "deliveries",
            "INSERT INTO deliveries (event, destination, state, due_us, record)
             SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::bytea[])",
            vec![&inserts.events, &inserts.dests, &inserts.states, &inserts.dues, &inserts.records],
        ));
    }
    if !kept.0.is_empty() {
        writes.push(Write::new(
            "deliveries",
            "UPDATE deliveries d SET claim_owner = NULL, claim_token = NULL, claim_expires_us = NULL
             FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS k(event, destination, token)
             WHERE d.event = k.event AND d.destination = k.destination AND d.claim_token = k.token",
            vec![&kept.0, &kept.1, &kept.2],
        ));
    }
    if !queues.gone.0.is_empty() {
        writes.push(Write::new(
            "queues",
            "DELETE FROM queues q USING unnest($1::text[], $2::bytea[]) AS k(destination, resource)
             WHERE q.destination = k.destination AND q.resource = k.resource",
            vec![&queues.gone.0, &queues.gone.1],
        ));
    }
    if !queues.updates.dests.is_empty() {
        writes.push(Write::new(
            "queues",
            "UPDATE queues q SET head = k.head, tail = k.tail, len = k.len
             FROM unnest($1::text[], $2::bytea[], $3::bigint[], $4::bigint[], $5::bigint[])
               AS k(destination, resource, head, tail, len)
             WHERE q.destination = k.destination AND q.resource = k.resource",
            queues.updates.params(),
        ));
    }
    if !queues.inserts.dests.is_empty() {
        writes.push(Write::new(
            "queues",
            "INSERT INTO queues (destination, resource, head, tail, len)
             SELECT * FROM unnest($1::text[], $2::bytea[], $3::bigint[], $4::bigint[], $5::bigint[])",
            queues.inserts.params(),
        ));
    }
    if !pruned.is_empty() {
        writes.push(Write::new(
            "events",
            "DELETE FROM events WHERE id = ANY($1) AND NOT inbox",
            vec![&pruned],
        ));
    }
    if !bodies_dropped.is_empty() {
        writes.push(Write::new(
            "events",
            "UPDATE events SET body = NULL WHERE id = ANY($1) AND NOT inbox AND body IS NOT NULL",
            vec![&bodies_dropped],
        ));
    }
    // Last: the counters are the rows most transactions share, held for the least time,
    // and taken in key order (no two transactions wait on each other in a cycle).
    if let Some(ledger) = &ledger {
        writes.push(Write::new("audit", LEDGER_SQL, ledger.params()));
    }
    let notify = state.notifier().due(changes);
    if let Some(notify) = &notify {
        writes.push(Write::new("", super::listen::NOTIFY_DUE, notify.params()));
    }
    let statements = combine(&writes);
    let statements: Vec<(&str, Vec<&(dyn ToSql + Sync)>)> =
        statements.iter().map(|(sql, params)| (sql.as_str(), params.clone())).collect();
    tx.commit_with(&statements).await?;
    Ok(())
}

/// Queue rows to write, in one statement per kind: gone, updated, inserted.
#[derive(Default)]
struct QueueRows<'a> {
    gone: (Vec<&'a str>, Vec<&'a [u8]>),
    updates: QueueColumns<'a>,
    inserts: QueueColumns<'a>,
}

impl<'a> QueueRows<'a> {
    fn push(&mut self, dest: &'a str, resource: &'a [u8], queue: Option<&Queue>, existed: bool) {
        let Some(q) = queue else {
            self.gone.0.push(dest);
            self.gone.1.push(resource);
            return;
        };
        let rows = if existed { &mut self.updates } else { &mut self.inserts };
        rows.dests.push(dest);
        rows.resources.push(resource);
        rows.heads.push(sql_id(q.head));
        rows.tails.push(sql_id(q.tail));
        rows.lens.push(i64::try_from(q.len).unwrap_or(i64::MAX));
    }
}

/// A queue's columns as the statements bind them.
#[derive(Default)]
struct QueueColumns<'a> {
    dests: Vec<&'a str>,
    resources: Vec<&'a [u8]>,
    heads: Vec<i64>,
    tails: Vec<i64>,
    lens: Vec<i64>,
}

impl QueueColumns<'_> {
    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![&self.dests, &self.resources, &self.heads, &self.tails, &self.lens]
    }
}

/// Adds a rule's edits to the `audit` counters, on one shard picked at random.
const LEDGER_SQL: &str = "INSERT INTO audit (hour, source, event, destination, count, shard, n)
     SELECT k.hour, k.source, k.event, k.destination, k.count, $6, k.n
     FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $7::bigint[])
       AS k(hour, source, event, destination, count, n)
     ON CONFLICT (hour, source, event, destination, count, shard)
     DO UPDATE SET n = audit.n + excluded.n";

/// Ledger edits as [`LEDGER_SQL`] binds them, with the shard they go to.
struct LedgerRows<'a> {
    hour: Vec<i64>,
    source: Vec<&'a str>,
    event: Vec<&'a str>,
    destination: Vec<&'a str>,
    count: Vec<&'a str>,
    n: Vec<i64>,
    shard: i16,
}

impl<'a> LedgerRows<'a> {
    /// `edits` as rows, `None` when there is nothing to add.
    fn of(edits: &'a LedgerEdits) -> Option<Self> {
        if edits.is_empty() {
            return None;
        }
        let mut rows = LedgerRows {
            hour: Vec::new(),
            source: Vec::new(),
            event: Vec::new(),
            destination: Vec::new(),
            count: Vec::new(),
            n: Vec::new(),
            shard: fastrand::i16(0..LEDGER_SHARDS),
        };
        for (key, n) in edits {
            rows.hour.push(i64::try_from(key.hour).unwrap_or(i64::MAX));
            rows.source.push(key.source.as_str());
            rows.event.push(key.event.as_str());
            rows.destination.push(key.destination.as_str());
            rows.count.push(key.count.as_str());
            rows.n.push(*n);
        }
        Some(rows)
    }

    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![
            &self.hour,
            &self.source,
            &self.event,
            &self.destination,
            &self.count,
            &self.shard,
            &self.n,
        ]
    }
}

/// Adds `edits` to the `audit` counters, on one shard picked at random.
pub(super) async fn add_to_ledger(
    tx: &pg::Transaction<'_>,
    edits: &LedgerEdits,
) -> Result<(), StoreError> {
    if let Some(rows) = LedgerRows::of(edits) {
        tx.cached_execute(LEDGER_SQL, &rows.params()).await?;
    }
    Ok(())
}

/// Rows one counter is spread over.
pub(super) const LEDGER_SHARDS: i16 = 16;
