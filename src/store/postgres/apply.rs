//! Writes a rule's [`Changes`] in the deciding transaction. Indexes are columns here:
//! a delivery's `due_us` is its schedule entry ([`lifecycle::schedule_entry`]) and its
//! `state` makes it a dead letter, so they move with the record by construction.
//! A row the rule saw absent is inserted, not upserted: if another relay inserted it
//! meanwhile, the primary key fails this transaction instead of overwriting that
//! relay's decision.

use super::view::Prefetch;
use super::{pg, sql_id, sql_us};
use crate::store::lifecycle::{self, Changes};
use crate::store::StoreError;

fn state_name(state: crate::store::DeliveryState) -> &'static str {
    use crate::store::DeliveryState::*;
    match state {
        Pending => "pending",
        Retrying => "retrying",
        Delivered => "delivered",
        Dead => "dead",
        Discarded => "discarded",
        Held => "held",
    }
}

pub(super) async fn apply(
    tx: &pg::Transaction<'_>,
    seen: &Prefetch,
    changes: &Changes,
) -> Result<(), StoreError> {
    for (id, meta) in &changes.dispatched {
        tx.execute(
            "UPDATE events SET inbox = false, status = $2, meta = $3 WHERE id = $1 AND inbox",
            &[&sql_id(*id), &meta.status.as_str(), &serde_json::to_vec(meta)?],
        )
        .await?;
    }
    for (hash, entry) in &changes.dedup {
        let (original, until) = (sql_id(entry.original), sql_us(entry.until_us));
        let sql = match seen.dedup.get(hash) {
            Some(Some(_)) => "UPDATE dedup SET original = $2, until_us = $3 WHERE hash = $1",
            _ => "INSERT INTO dedup (hash, original, until_us) VALUES ($1, $2, $3)",
        };
        tx.execute(sql, &[&hash.as_slice(), &original, &until]).await?;
    }
    for ((event, dest), change) in &changes.deliveries {
        let event = sql_id(*event);
        match (&change.before, &change.after) {
            (_, None) => {
                tx.execute(
                    "DELETE FROM deliveries WHERE event = $1 AND destination = $2",
                    &[&event, dest],
                )
                .await?;
            }
            (before, Some(after)) => {
                let due = lifecycle::schedule_entry(after).map(sql_us);
                let record = serde_json::to_vec(after)?;
                let state = state_name(after.state);
                let sql = if before.is_some() {
                    "UPDATE deliveries SET state = $3, due_us = $4, record = $5
                     WHERE event = $1 AND destination = $2"
                } else {
                    "INSERT INTO deliveries (event, destination, state, due_us, record)
                     VALUES ($1, $2, $3, $4, $5)"
                };
                tx.execute(sql, &[&event, dest, &state, &due, &record]).await?;
            }
        }
    }
    for ((dest, resource), queue) in &changes.queues {
        let existed = matches!(seen.queues.get(&(dest.clone(), *resource)), Some(Some(_)));
        match queue {
            None => {
                tx.execute(
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
                tx.execute(
                    sql,
                    &[dest, &resource.as_slice(), &sql_id(q.head), &sql_id(q.tail), &len],
                )
                .await?;
            }
        }
    }
    if !changes.pruned.is_empty() {
        let ids: Vec<i64> = changes.pruned.iter().map(|id| sql_id(*id)).collect();
        tx.execute("DELETE FROM events WHERE id = ANY($1) AND NOT inbox", &[&ids]).await?;
    }
    Ok(())
}
