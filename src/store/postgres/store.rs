//! The async [`Store`] contract over PostgreSQL: each call is one statement, or one
//! transaction in which a lifecycle rule decides on locked rows ([`Prefetch::decide`])
//! and its changes are applied ([`apply::apply`]).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;

use super::apply::apply;
use super::view::{decode_meta, decode_record, Prefetch};
use super::{sql_id, sql_us, PostgresStore};
use crate::config::RetryPolicy;
use crate::store::lifecycle::{self, AttemptReport};
use crate::store::{
    Claim, DeadLetterFilter, DeliveryRecord, DispatchOutcome, DispatchPlan, EventFilter, EventId,
    EventRecord, Exclusive, NewEvent, PendingEvent, QueueStats, Recorded, Store, StoreError,
};

/// Times a conflicting transaction is redone before the error goes to the caller.
const MAX_RETRIES: u64 = 8;

pub(super) fn id_of(raw: i64) -> EventId {
    EventId::new(u64::try_from(raw).unwrap_or(0))
}

fn us_of(raw: i64) -> u64 {
    u64::try_from(raw).unwrap_or(0)
}

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl PostgresStore {
    /// Runs the write `work` under the store's health: bounded by `write_timeout`
    /// (an error, not a failed store), watched, and given up on if the store fails.
    pub(super) async fn write<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let health = &self.inner.health;
        health.check()?;
        let _ticket = health.begin();
        health.or_failed(self.inner.bounded(work)).await
    }

    /// Runs the transaction `attempt` again (a few times) when it lost a race with
    /// another relay's ([`StoreError::Conflict`]): it then decides again on the rows
    /// as that transaction left them.
    pub(super) async fn retrying<T, F, Fut>(&self, mut attempt: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let mut tries = 0;
        loop {
            match attempt().await {
                Err(StoreError::Conflict(message)) if tries < MAX_RETRIES => {
                    tries += 1;
                    tracing::debug!(%message, tries, "transaction conflicted with another; redoing it");
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(1..10 * tries))).await;
                }
                other => return other,
            }
        }
    }

    pub(super) async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.inner.pool.get().await
    }

    /// Runs a rule over `event`'s deliveries to `destinations` in one transaction.
    async fn manage<T: Send>(
        &self,
        rule: impl FnMut(&mut lifecycle::Staged<'_, Prefetch>) -> Result<T, StoreError> + Send,
    ) -> Result<T, StoreError> {
        let rule = std::sync::Mutex::new(rule);
        self.write(self.retrying(|| async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let mut seen = Prefetch::default();
            let (result, changes) = seen.decide(&tx, |st| (crate::lock::lock(&rule))(st)).await?;
            apply(&tx, &seen, &changes, &self.inner.notifier()).await?;
            tx.commit().await?;
            Ok(result)
        }))
        .await
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn append(&self, event: NewEvent) -> Result<EventId, StoreError> {
        self.committer.submit(event).await
    }

    async fn event(&self, id: EventId) -> Result<Option<EventRecord>, StoreError> {
        let client = self.client().await?;
        let row = client.query_opt("SELECT meta FROM events WHERE id = $1", &[&sql_id(id)]).await?;
        row.map(|r| Ok(EventRecord { id, meta: decode_meta(r.get(0))? })).transpose()
    }

    async fn body(&self, id: EventId) -> Result<Option<Vec<u8>>, StoreError> {
        let client = self.client().await?;
        let row = client.query_opt("SELECT body FROM events WHERE id = $1", &[&sql_id(id)]).await?;
        Ok(row.and_then(|r| r.get::<_, Option<Vec<u8>>>(0)))
    }

    async fn list_events(&self, filter: EventFilter) -> Result<Vec<EventRecord>, StoreError> {
        let client = self.client().await?;
        // By record: from `events_record` (record, id), newest first, whatever else
        // is filtered (the record condition is spelled out so that the index is
        // certain to serve it); otherwise along the primary key.
        let record = if filter.record.is_some() { "record = $6" } else { "$6::text IS NULL" };
        let sql = format!(
            "SELECT id, meta FROM events
             WHERE {record} AND ($1::bigint IS NULL OR id < $1) AND ($2::text IS NULL OR source = $2)
               AND ($3::text IS NULL OR event = $3) AND ($4::text IS NULL OR status = $4)
             ORDER BY id DESC LIMIT $5"
        );
        let rows = client
            .query(
                &sql,
                &[
                    &filter.after.map(sql_id),
                    &filter.source,
                    &filter.event,
                    &filter.status.map(|s| s.as_str()),
                    &limit(filter.limit),
                    &filter.record,
                ],
            )
            .await?;
        rows.iter()
            .map(|r| Ok(EventRecord { id: id_of(r.get(0)), meta: decode_meta(r.get(1))? }))
            .collect()
    }

    async fn inbox_len(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let row = client.query_one("SELECT count(*) FROM events WHERE inbox", &[]).await?;
        Ok(us_of(row.get(0)))
    }

    async fn size_on_disk(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = current_schema() AND c.relkind = 'r'",
                &[],
            )
            .await?;
        Ok(us_of(row.get(0)))
    }

    async fn pending(&self, n: usize) -> Result<Vec<PendingEvent>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
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
    ) -> Result<Vec<DispatchOutcome>, StoreError> {
        self.write(self.retrying(|| async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let ids: Vec<i64> = plans.iter().map(|p| sql_id(p.id)).collect();
            // The lease check and the inbox rows in one round trip (pipelined, run in
            // this order); rows a relay without the lease locked go with its rollback.
            // Another relay dispatching the same events holds their rows: skip them.
            let inbox = async {
                tx.query(
                    "SELECT id, meta FROM events WHERE id = ANY($1) AND inbox FOR UPDATE SKIP LOCKED",
                    &[&ids],
                )
                .await
                .map_err(StoreError::from)
            };
            let (may, rows) = tokio::try_join!(self.inner.may_dispatch(&tx), inbox)?;
            if !may {
                // Another relay leads dispatch now: it takes these (in order).
                return Ok(plans.iter().map(|_| DispatchOutcome::Gone).collect());
            }
            let mut inbox = HashMap::new();
            for r in &rows {
                inbox.insert(id_of(r.get(0)), decode_meta(r.get(1))?);
            }
            let mut seen = Prefetch::default();
            let (outcomes, changes) = seen
                .decide(&tx, |st| {
                    plans
                        .iter()
                        .map(|plan| match inbox.get(&plan.id) {
                            Some(meta) => lifecycle::dispatch(st, meta.clone(), plan, now_us),
                            None => Ok(DispatchOutcome::Gone),
                        })
                        .collect::<Result<Vec<_>, _>>()
                })
                .await?;
            apply(&tx, &seen, &changes, &self.inner.notifier()).await?;
            tx.commit().await?;
            Ok(outcomes)
        }))
        .await
    }

    async fn purge_dedup(&self, now_us: u64) -> Result<usize, StoreError> {
        self.write(async {
            let client = self.client().await?;
            let n = client
                .execute("DELETE FROM dedup WHERE until_us <= $1", &[&sql_us(now_us)])
                .await?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
        .await
    }

    async fn dedup_len(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let row = client.query_one("SELECT count(*) FROM dedup", &[]).await?;
        Ok(us_of(row.get(0)))
    }

    async fn claim_due(
        &self,
        destination: &str,
        owner: &str,
        now_us: u64,
        lease: Duration,
        n: usize,
    ) -> Result<Vec<Claim>, StoreError> {
        let expires_us =
            now_us.saturating_add(u64::try_from(lease.as_micros()).unwrap_or(u64::MAX));
        let silence = u64::try_from(crate::store::owner_silence(lease).as_micros());
        let silent_since = now_us.saturating_sub(silence.unwrap_or(u64::MAX));
        self.write(async {
            let client = self.client().await?;
            // `now_us` is the store's clock as the relay reads it (crate::clock), as
            // are the heartbeats' `seen_us`.
            let rows = client
                .query(
                    "WITH due AS (
                         SELECT event, destination FROM deliveries d
                         WHERE destination = $1 AND due_us IS NOT NULL AND due_us <= $2
                           AND (claim_expires_us IS NULL OR claim_expires_us <= $2
                                OR EXISTS (SELECT 1 FROM relays r
                                           WHERE r.owner = d.claim_owner AND r.seen_us < $6))
                         ORDER BY due_us, event LIMIT $3
                         FOR UPDATE SKIP LOCKED)
                     UPDATE deliveries d
                     SET claim_owner = $4, claim_token = nextval('claim_tokens'), claim_expires_us = $5
                     FROM due WHERE d.event = due.event AND d.destination = due.destination
                     RETURNING d.event, d.due_us, d.claim_token, d.record,
                         (SELECT e.meta FROM events e WHERE e.id = d.event AND NOT e.inbox),
                         (SELECT e.body FROM events e WHERE e.id = d.event AND NOT e.inbox)",
                    &[
                        &destination,
                        &sql_us(now_us),
                        &limit(n),
                        &owner,
                        &sql_us(expires_us),
                        &sql_us(silent_since),
                    ],
                )
                .await?;
            let mut claims = rows
                .iter()
                .map(|r| {
                    let meta: Option<&[u8]> = r.get(4);
                    let body: Option<Vec<u8>> = r.get(5);
                    Ok(Claim {
                        event: id_of(r.get(0)),
                        destination: destination.to_owned(),
                        due_us: us_of(r.get(1)),
                        owner: owner.to_owned(),
                        token: us_of(r.get(2)),
                        expires_us,
                        record: decode_record(r.get(3))?,
                        meta: meta.map(decode_meta).transpose()?,
                        body: body.map(bytes::Bytes::from),
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            claims.sort_by_key(|c| (c.due_us, c.event));
            Ok(claims)
        })
        .await
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        self.write(async {
            let client = self.client().await?;
            client
                .execute(
                    "UPDATE deliveries SET claim_owner = NULL, claim_token = NULL, claim_expires_us = NULL
                     WHERE event = $1 AND destination = $2 AND claim_token = $3",
                    &[&sql_id(claim.event), &claim.destination, &sql_us(claim.token)],
                )
                .await?;
            Ok(())
        })
        .await
    }

    async fn release_unknown(
        &self,
        destination: &str,
        owner: &str,
        keep: &[u64],
    ) -> Result<usize, StoreError> {
        let keep: Vec<i64> = keep.iter().map(|t| sql_us(*t)).collect();
        self.write(async {
            let client = self.client().await?;
            let n = client
                .execute(
                    "UPDATE deliveries SET claim_owner = NULL, claim_token = NULL, claim_expires_us = NULL
                     WHERE destination = $1 AND claim_owner = $2 AND NOT (claim_token = ANY($3))",
                    &[&destination, &owner, &keep],
                )
                .await?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
        .await
    }

    async fn next_due_after(
        &self,
        destination: &str,
        now_us: u64,
    ) -> Result<Option<u64>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT min(due_us) FROM deliveries WHERE destination = $1 AND due_us > $2",
                &[&destination, &sql_us(now_us)],
            )
            .await?;
        Ok(row.get::<_, Option<i64>>(0).map(us_of))
    }

    async fn record_attempts(
        &self,
        attempts: Vec<(Claim, AttemptReport)>,
        policy: &RetryPolicy,
    ) -> Result<Vec<Recorded>, StoreError> {
        self.write(self.retrying(|| async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let events: Vec<i64> = attempts.iter().map(|(c, _)| sql_id(c.event)).collect();
            let dests: Vec<&str> = attempts.iter().map(|(c, _)| c.destination.as_str()).collect();
            let rows = tx
                .query(
                    "SELECT d.event, d.destination, d.claim_token FROM deliveries d
                     JOIN unnest($1::bigint[], $2::text[]) AS k(event, destination)
                       ON d.event = k.event AND d.destination = k.destination
                     FOR UPDATE OF d",
                    &[&events, &dests],
                )
                .await?;
            let mut tokens = HashMap::new();
            for r in &rows {
                let token: Option<i64> = r.get(2);
                tokens.insert((id_of(r.get(0)), r.get::<_, String>(1)), token.map(us_of));
            }
            let holds = |c: &Claim| {
                tokens.get(&(c.event, c.destination.clone())).copied().flatten() == Some(c.token)
            };
            let mut seen = Prefetch::default();
            let (out, changes) = seen
                .decide(&tx, |st| lifecycle::record_attempts(st, &attempts, policy, holds))
                .await?;
            apply(&tx, &seen, &changes, &self.inner.notifier()).await?;
            let tokens: Vec<i64> = attempts.iter().map(|(c, _)| sql_us(c.token)).collect();
            tx.execute(
                "UPDATE deliveries d SET claim_owner = NULL, claim_token = NULL, claim_expires_us = NULL
                 FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS k(event, destination, token)
                 WHERE d.event = k.event AND d.destination = k.destination AND d.claim_token = k.token",
                &[&events, &dests, &tokens],
            )
            .await?;
            tx.commit().await?;
            Ok(out)
        }))
        .await
    }

    async fn deliveries_of(&self, event: EventId) -> Result<Vec<DeliveryRecord>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT record FROM deliveries WHERE event = $1 ORDER BY destination",
                &[&sql_id(event)],
            )
            .await?;
        rows.iter().map(|r| decode_record(r.get(0))).collect()
    }

    async fn replay(
        &self,
        event: EventId,
        destinations: Vec<String>,
        now_us: u64,
    ) -> Result<usize, StoreError> {
        self.manage(|st| {
            let mut n = 0;
            for dest in &destinations {
                n += usize::from(lifecycle::replay(st, event, dest, now_us)?);
            }
            Ok(n)
        })
        .await
    }

    async fn discard(&self, event: EventId, destination: &str) -> Result<bool, StoreError> {
        self.manage(|st| lifecycle::discard(st, event, destination)).await
    }

    async fn dead_letters(
        &self,
        filter: DeadLetterFilter,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT d.record FROM deliveries d LEFT JOIN events e ON e.id = d.event
                 WHERE d.state = 'dead' AND ($1::bigint IS NULL OR d.event < $1)
                   AND ($2::text IS NULL OR d.destination = $2)
                   AND ($3::text IS NULL OR e.source = $3) AND ($4::text IS NULL OR e.event = $4)
                 ORDER BY d.event DESC, d.destination DESC LIMIT $5",
                &[
                    &filter.after.map(sql_id),
                    &filter.destination,
                    &filter.source,
                    &filter.event,
                    &limit(filter.limit),
                ],
            )
            .await?;
        rows.iter().map(|r| decode_record(r.get(0))).collect()
    }

    async fn queue_stats(&self, destination: &str) -> Result<QueueStats, StoreError> {
        let client = self.client().await?;
        let r = client
            .query_one(
                "SELECT count(*) FILTER (WHERE state = 'pending'),
                        count(*) FILTER (WHERE state = 'held'),
                        count(*) FILTER (WHERE state = 'retrying'),
                        count(*) FILTER (WHERE state = 'dead'),
                        min(event) FILTER (WHERE state IN ('pending', 'retrying'))
                 FROM deliveries
                 WHERE destination = $1 AND state IN ('pending', 'retrying', 'held', 'dead')",
                &[&destination],
            )
            .await?;
        Ok(QueueStats {
            pending: us_of(r.get(0)),
            held: us_of(r.get(1)),
            retrying: us_of(r.get(2)),
            dead: us_of(r.get(3)),
            oldest: r.get::<_, Option<i64>>(4).map(id_of),
        })
    }

    async fn open_destinations(&self) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT DISTINCT destination FROM deliveries
                 WHERE state IN ('pending', 'retrying', 'held') ORDER BY destination",
                &[],
            )
            .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn paused(&self) -> Result<HashSet<String>, StoreError> {
        let client = self.client().await?;
        let rows = client.query("SELECT destination FROM paused", &[]).await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn set_paused(&self, destination: &str, paused: bool) -> Result<(), StoreError> {
        self.write(async {
            let client = self.client().await?;
            let sql = if paused {
                "INSERT INTO paused (destination) VALUES ($1) ON CONFLICT DO NOTHING"
            } else {
                "DELETE FROM paused WHERE destination = $1"
            };
            client.execute(sql, &[&destination]).await?;
            Ok(())
        })
        .await
    }

    async fn prune(&self, before_us: u64, n: usize) -> Result<usize, StoreError> {
        self.prune_chunks(before_us, n).await
    }

    async fn upstream_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let client = self.client().await?;
        let row = client.query_opt("SELECT value FROM upstream WHERE key = $1", &[&key]).await?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn upstream_put(&self, key: &str, value: Option<Vec<u8>>) -> Result<(), StoreError> {
        self.write(async {
            let client = self.client().await?;
            match value {
                Some(v) => {
                    client
                        .execute(
                            "INSERT INTO upstream (key, value) VALUES ($1, $2)
                             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                            &[&key, &v],
                        )
                        .await?
                }
                None => client.execute("DELETE FROM upstream WHERE key = $1", &[&key]).await?,
            };
            Ok(())
        })
        .await
    }

    async fn upstream_scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let client = self.client().await?;
        // starts_with, not LIKE: a prefix may hold `%` or `_`.
        let rows = client
            .query(
                "SELECT key, value FROM upstream WHERE starts_with(key, $1) ORDER BY key",
                &[&prefix],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn lead(&self, task: &str) -> Result<bool, StoreError> {
        self.inner.lead(task).await
    }

    async fn exclusive(&self, task: &str) -> Result<Exclusive, StoreError> {
        // Not the key of `lead(task)`: the leader holds that one on another connection
        // and takes this one too for each pass.
        let key = self.inner.lock_key(&format!("{task}\0pass"));
        // A connection of its own, out of the pool: closing it (dropping the hold) ends
        // the transaction and its lock, even where no runtime is left to roll back.
        let client = deadpool_postgres::Object::take(self.client().await?);
        // Waited for (not bounded by statement_timeout; a minute at most), and held
        // through the pass's calls to the upstream (the session may sit idle in it).
        client
            .batch_execute(
                "BEGIN; SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = '60s';
                 SET LOCAL idle_in_transaction_session_timeout = 0",
            )
            .await?;
        client.execute("SELECT pg_advisory_xact_lock($1)", &[&key]).await?;
        Ok(Exclusive::new(client))
    }

    async fn heartbeat(
        &self,
        owner: &str,
        live_for: Duration,
    ) -> Result<Option<crate::store::Fleet>, StoreError> {
        let live_us = sql_us(u64::try_from(live_for.as_micros()).unwrap_or(u64::MAX));
        let client = self.client().await?;
        // The database's clock, not the relays': they need not agree.
        let rows = client
            .query(
                "WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us),
                 me AS (
                     INSERT INTO relays (owner, started_us, seen_us)
                     SELECT $1, us, us FROM now
                     -- A relay the others stopped counting joins again at the back.
                     ON CONFLICT (owner) DO UPDATE SET seen_us = excluded.seen_us,
                         started_us = CASE WHEN relays.seen_us < excluded.seen_us - $2
                             THEN excluded.started_us ELSE relays.started_us END
                     RETURNING owner, started_us)
                 SELECT owner, (SELECT us FROM now) FROM (
                     SELECT owner, started_us FROM relays, now
                     WHERE seen_us >= now.us - $2 AND owner <> $1
                     UNION ALL SELECT owner, started_us FROM me) AS live
                 ORDER BY started_us, owner",
                &[&owner, &live_us],
            )
            .await?;
        // Long gone relays are forgotten (best effort: any relay may do it).
        client
            .execute(
                "DELETE FROM relays WHERE seen_us < (extract(epoch FROM clock_timestamp()) * 1000000)::bigint - $1",
                &[&live_us.saturating_mul(60)],
            )
            .await?;
        let owners: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        let store_us = rows.first().map_or(0, |r| us_of(r.get(1)));
        let rank = owners.iter().position(|o| o == owner).unwrap_or(owners.len());
        let size = owners.len().max(rank + 1);
        self.inner.fleet_size.store(size, std::sync::atomic::Ordering::Relaxed);
        Ok(Some(crate::store::Fleet { rank, size, store_us }))
    }

    async fn received_counts(
        &self,
        source: &str,
    ) -> Result<Option<HashMap<String, u64>>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT event, sum(n)::bigint FROM received WHERE source = $1 GROUP BY event",
                &[&source],
            )
            .await?;
        Ok(Some(rows.iter().map(|r| (r.get::<_, String>(0), us_of(r.get(1)))).collect()))
    }

    fn wakeups(&self) -> Option<tokio::sync::broadcast::Receiver<crate::store::Wake>> {
        Some(self.inner.subscribe())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.client().await?.query_one("SELECT 1", &[]).await?;
        Ok(())
    }

    async fn close(&self) -> Result<(), StoreError> {
        self.committer.close_and_join(&self.committer_thread).await?;
        // Best effort: unreleased leases run out by themselves.
        if let Err(e) = self.inner.give_up_leases().await {
            tracing::debug!(error = %e, "could not hand this relay's leases over");
        }
        self.inner.pool.close();
        Ok(())
    }
}
