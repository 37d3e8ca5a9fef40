//! The journal on PostgreSQL: the `journal` table, one for the whole fleet, read
//! newest first by its key `(at_us, tie)`.

use async_trait::async_trait;

use super::cached::Cached;
use super::PostgresStore;
use crate::store::{Journal, JournalEntry, JournalFilter, StoreError};

/// A place's part as a column: every value the relay writes fits (`tie` is drawn
/// below 2⁶³, times are µs since 1970).
fn column(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Adds `entry` on `client`: alone, or inside the transaction of the change it
/// records ([`crate::store::DeliveryQueue::change`]).
pub(super) async fn insert(
    client: &impl deadpool_postgres::GenericClient,
    entry: &JournalEntry,
) -> Result<(), StoreError> {
    let bytes = serde_json::to_vec(entry)?;
    client
        .cached_execute(
            "INSERT INTO journal (at_us, tie, who, action, entry) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (at_us, tie) DO NOTHING",
            &[&column(entry.at_us), &column(entry.tie), &entry.who, &entry.action, &bytes],
        )
        .await?;
    Ok(())
}

#[async_trait]
impl Journal for PostgresStore {
    async fn journal_append(&self, entry: JournalEntry) -> Result<(), StoreError> {
        self.write(async { insert(&self.client().await?, &entry).await }).await
    }

    async fn journal_list(&self, filter: JournalFilter) -> Result<Vec<JournalEntry>, StoreError> {
        let client = self.client().await?;
        let since = column(filter.since_us.unwrap_or(0));
        let (before_at, before_tie) =
            filter.before.map_or((i64::MAX, i64::MAX), |(at, tie)| (column(at), column(tie)));
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let rows = client
            .cached_query(
                "SELECT entry FROM journal
                 WHERE at_us >= $1 AND (at_us, tie) < ($2, $3)
                   AND ($4::text IS NULL OR who = $4) AND ($5::text IS NULL OR action = $5)
                 ORDER BY at_us DESC, tie DESC LIMIT $6",
                &[&since, &before_at, &before_tie, &filter.who, &filter.action, &limit],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let bytes: Vec<u8> = r.get(0);
                serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
                    table: "journal",
                    key: String::new(),
                    reason: e.to_string(),
                })
            })
            .collect()
    }

    async fn journal_prune(&self, before_us: u64) -> Result<usize, StoreError> {
        self.write(async {
            let client = self.client().await?;
            let n = client
                .cached_execute("DELETE FROM journal WHERE at_us < $1", &[&column(before_us)])
                .await?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
        .await
    }
}
