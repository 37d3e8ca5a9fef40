//! The async [`Store`] contract over PostgreSQL: each call is one statement, or one
//! transaction in which a lifecycle rule decides on locked rows ([`Prefetch::decide`])
//! and its changes are applied and committed ([`commit`]), in a [`Tx`].

use std::time::Duration;

use super::apply::commit;
use super::tx::Tx;
use super::view::Prefetch;
use super::PostgresStore;
use crate::store::lifecycle::{self};
use crate::store::{EventId, JournalEntry, StoreError};

/// Times a conflicting transaction is redone before the error goes to the caller.
const MAX_RETRIES: u64 = 8;

pub(super) fn id_of(raw: i64) -> EventId {
    EventId::new(u64::try_from(raw).unwrap_or(0))
}

pub(super) fn us_of(raw: i64) -> u64 {
    u64::try_from(raw).unwrap_or(0)
}

pub(super) fn limit(n: usize) -> i64 {
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

    /// Runs a lifecycle rule in one transaction, adding in it the journal entry that
    /// `entry` makes of the rule's result, if any (an admin's change).
    pub(super) async fn manage<T: Send>(
        &self,
        rule: impl FnMut(&mut lifecycle::Staged<'_, Prefetch>) -> Result<T, StoreError> + Send,
        entry: impl Fn(&T) -> Option<JournalEntry> + Send + Sync,
    ) -> Result<T, StoreError> {
        let rule = std::sync::Mutex::new(rule);
        self.write(self.retrying(|| async {
            let client = self.client().await?;
            let tx = Tx::begin(&client)?;
            let mut seen = Prefetch::default();
            let (result, changes) = seen.decide(&tx, |st| (crate::lock::lock(&rule))(st)).await?;
            if let Some(entry) = entry(&result) {
                super::journal::insert(&*tx, &entry).await?;
            }
            commit(tx, &seen, &changes, &self.inner).await?;
            Ok(result)
        }))
        .await
    }
}
