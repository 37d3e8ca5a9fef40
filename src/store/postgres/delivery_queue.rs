//! The delivery queue on PostgreSQL: claims as leased columns of `deliveries`,
//! attempts recorded by the lifecycle rules in one transaction per batch.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;

use super::apply::{commit_releasing, Releases};
use super::cached::Cached;
use super::store::{id_of, limit, us_of};
use super::tx::Tx;
use super::view::{decode_meta, decode_record, Prefetch};
use super::{sql_id, sql_us, PostgresStore};
use crate::config::RetryPolicy;
use crate::store::lifecycle::{self, AttemptReport};
use crate::store::{
    Claim, DeadLetterFilter, DeliveryQueue, DeliveryRecord, EventId, JournalEntry, QueueChange,
    QueueStats, Recorded, StoreError,
};

#[async_trait]
impl DeliveryQueue for PostgresStore {
    async fn claim_due(
        &self,
        destination: &str,
        owner: &str,
        now_us: u64,
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Claim>, StoreError> {
        self.write(async {
            let client = self.client().await?;
            let (claims, _) =
                claim_with(&client, CLAIM, &self.inner, destination, owner, now_us, lease, limit)
                    .await?;
            Ok(claims)
        })
        .await
    }

    async fn claim_due_and_next(
        &self,
        destination: &str,
        owner: &str,
        now_us: u64,
        lease: Duration,
        limit: usize,
    ) -> Result<(Vec<Claim>, Option<u64>), StoreError> {
        self.write(async {
            let client = self.client().await?;
            // One statement: the claims and, beside them, when the next delivery is due.
            let sql = &*CLAIM_AND_NEXT;
            let (claims, next) =
                claim_with(&client, sql, &self.inner, destination, owner, now_us, lease, limit)
                    .await?;
            Ok((claims, next))
        })
        .await
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        self.write(async {
            let client = self.client().await?;
            client
                .cached_execute(
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
                .cached_execute(
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
        next_due(&client, destination, now_us).await
    }

    async fn record_attempts(
        &self,
        attempts: Vec<(Claim, AttemptReport)>,
        policy: &RetryPolicy,
        bodies_before_us: Option<u64>,
    ) -> Result<Recorded, StoreError> {
        self.write(self.retrying(|| async {
            let client = self.client().await?;
            let tx = Tx::begin(&client)?;
            let events: Vec<i64> = attempts.iter().map(|(c, _)| sql_id(c.event)).collect();
            let dests: Vec<&str> = attempts.iter().map(|(c, _)| c.destination.as_str()).collect();
            // The claims and the records the rule reads, in one statement: the rule's
            // first pass needs no fetch of its own for them.
            let rows = tx
                .cached_query(
                    "SELECT d.event, d.destination, d.claim_token, d.record, d.claim_expires_us
                     FROM deliveries d
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
            let keys = attempts.iter().map(|(c, _)| (c.event, c.destination.clone()));
            seen.seed_deliveries(keys, &rows, 3)?;
            let (out, changes) = seen
                .decide(&tx, |st| {
                    lifecycle::record_attempts(st, &attempts, policy, bodies_before_us, holds)
                })
                .await?;
            // Each claim goes with its delivery's record where the rule writes it,
            // the others by a write of their own, all with the commit.
            let releases: Releases =
                attempts.iter().map(|(c, _)| ((c.event, c.destination.clone()), c.token)).collect();
            commit_releasing(tx, &seen, &changes, &self.inner, &releases).await?;
            Ok(out)
        }))
        .await
    }

    async fn deliveries_of(&self, event: EventId) -> Result<Vec<DeliveryRecord>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .cached_query(
                "SELECT record FROM deliveries WHERE event = $1 ORDER BY destination",
                &[&sql_id(event)],
            )
            .await?;
        rows.iter().map(|r| decode_record(r.get(0))).collect()
    }

    async fn change(
        &self,
        change: QueueChange,
        journal: Option<JournalEntry>,
    ) -> Result<u64, StoreError> {
        let with_count = |count: &u64| journal.clone().map(|e| JournalEntry { count: *count, ..e });
        match change {
            QueueChange::Deliveries { each, how, now_us } => {
                self.manage(|st| lifecycle::manage(st, &each, how, now_us), with_count).await
            }
            QueueChange::Pause { destination, paused } => {
                self.write(async {
                    let mut client = self.client().await?;
                    let tx = client.transaction().await?;
                    let sql = if paused {
                        "INSERT INTO paused (destination) VALUES ($1) ON CONFLICT DO NOTHING"
                    } else {
                        "DELETE FROM paused WHERE destination = $1"
                    };
                    tx.cached_execute(sql, &[&destination]).await?;
                    if let Some(entry) = with_count(&1) {
                        super::journal::insert(&tx, &entry).await?;
                    }
                    tx.commit().await?;
                    Ok(1)
                })
                .await
            }
        }
    }

    async fn dead_letters(
        &self,
        filter: DeadLetterFilter,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .cached_query(
                "SELECT d.record FROM deliveries d LEFT JOIN events e ON e.id = d.event
                 WHERE d.state = 'dead' AND ($1::bigint IS NULL OR d.event < $1)
                   AND ($2::text IS NULL OR d.destination = $2)
                   AND ($3::text IS NULL OR e.source = $3) AND ($4::text IS NULL OR e.event = $4)
                   AND ($6::bigint IS NULL OR d.event >= $6)
                 ORDER BY d.event DESC, d.destination DESC LIMIT $5",
                &[
                    &filter.after.map(sql_id),
                    &filter.destination,
                    &filter.source,
                    &filter.event,
                    &limit(filter.limit),
                    &filter.since.map(sql_id),
                ],
            )
            .await?;
        rows.iter().map(|r| decode_record(r.get(0))).collect()
    }

    async fn queue_stats(&self, destination: &str) -> Result<QueueStats, StoreError> {
        let client = self.client().await?;
        let r = client
            .cached_query_one(
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
            oldest: r.get::<_, Option<i64>>(4).map(id_of).map(QueueStats::second_of),
            counting: false,
        })
    }

    async fn open_destinations(&self) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .cached_query(
                "SELECT DISTINCT destination FROM deliveries
                 WHERE state IN ('pending', 'retrying', 'held') ORDER BY destination",
                &[],
            )
            .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn paused(&self) -> Result<HashSet<String>, StoreError> {
        let client = self.client().await?;
        let rows = client.cached_query("SELECT destination FROM paused", &[]).await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}

/// Claims `destination`'s due deliveries: the one rule (due, and either unclaimed,
/// its lease expired, or its owner silent), oldest first. Returns the columns that
/// [`claim_with`] reads; `$1` destination, `$2` now, `$3` limit, `$4` owner, `$5` the
/// lease's end, `$6` when an owner counts as silent.
const CLAIM: &str = "WITH due AS (
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
         (SELECT e.body FROM events e WHERE e.id = d.event AND NOT e.inbox)";

/// When `$1`'s next delivery after `$2` is due. Beside [`CLAIM`] in one statement it
/// reads the same snapshot, in which the claimed rows are due at or before `$2`
/// (a claim does not move `due_us`): so it is the same answer as read after it.
const NEXT_DUE: &str = "SELECT min(due_us) FROM deliveries WHERE destination = $1 AND due_us > $2";

/// [`CLAIM`]'s rows, each with [`NEXT_DUE`]'s answer beside it; a row of NULLs
/// and that answer when nothing was claimed.
static CLAIM_AND_NEXT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH claimed AS ({CLAIM}), next AS ({NEXT_DUE})
         SELECT c.*, next.min FROM next LEFT JOIN claimed c ON true"
    )
});

/// Claims up to `limit` of `destination`'s due deliveries for `owner` on `client`
/// ([`DeliveryQueue::claim_due`]) by `sql`: [`CLAIM`], or a statement around it whose
/// rows are [`CLAIM`]'s columns (NULLs where nothing was claimed) and one more. Returns
/// the claims, sorted, and the next due time, if that one more column of the first row
/// holds one.
#[allow(clippy::too_many_arguments)]
async fn claim_with<C: Cached + Sync>(
    client: &C,
    sql: &str,
    state: &super::PgState,
    destination: &str,
    owner: &str,
    now_us: u64,
    lease: Duration,
    limit_n: usize,
) -> Result<(Vec<Claim>, Option<u64>), StoreError> {
    let expires_us = now_us.saturating_add(crate::clock::micros(lease));
    let silence = crate::clock::micros(crate::store::owner_silence(lease, state.live_for));
    let silent_since = now_us.saturating_sub(silence);
    // `now_us` is the store's clock as the relay reads it (crate::clock), as are the
    // heartbeats' `seen_us`.
    let rows = client
        .cached_query(
            sql,
            &[
                &destination,
                &sql_us(now_us),
                &limit(limit_n),
                &owner,
                &sql_us(expires_us),
                &sql_us(silent_since),
            ],
        )
        .await?;
    let extra =
        rows.first().and_then(|r| (r.len() > 6).then(|| r.get::<_, Option<i64>>(6))).flatten();
    let mut claims = rows
        .iter()
        .filter(|r| r.get::<_, Option<i64>>(0).is_some())
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
    Ok((claims, extra.map(us_of)))
}

/// When `destination`'s next delivery after `now_us` is due, read on `client`.
async fn next_due<C: Cached + Sync>(
    client: &C,
    destination: &str,
    now_us: u64,
) -> Result<Option<u64>, StoreError> {
    let row = client.cached_query_one(NEXT_DUE, &[&destination, &sql_us(now_us)]).await?;
    Ok(row.get::<_, Option<i64>>(0).map(us_of))
}
