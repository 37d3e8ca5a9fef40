//! Work that runs on one relay of a fleet: session advisory locks held on a connection
//! of the relay's own, which die with it (see [`crate::store::Store::lead`]).

use super::Inner;
use crate::store::StoreError;

/// The leadership connection and the locks it holds.
pub(super) struct Leader {
    client: tokio_postgres::Client,
    held: std::collections::HashSet<i64>,
}

/// The advisory lock key of `task` in `schema`: relays of one fleet agree on it, other
/// schemas' fleets on the same server do not collide with it.
pub(super) fn lock_key(schema: &str, task: &str) -> i64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("hookrelay\0{schema}\0{task}"));
    let mut key = [0u8; 8];
    key.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(key)
}

impl Inner {
    /// The advisory lock key of `task` in this schema.
    pub(super) fn lock_key(&self, task: &str) -> i64 {
        lock_key(&self.schema, task)
    }

    /// See [`crate::store::Store::lead`].
    pub(super) async fn lead(&self, task: &str) -> Result<bool, StoreError> {
        let key = self.lock_key(task);
        let mut slot = self.leader.lock().await;
        // A closed connection took every lock with it.
        if slot.as_ref().is_some_and(|l| l.client.is_closed()) {
            *slot = None;
        }
        if slot.is_none() {
            let (client, connection) = self.config.connect(tokio_postgres::NoTls).await?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::warn!(error = %e, "the leadership connection to PostgreSQL ended");
                }
            });
            *slot = Some(Leader { client, held: std::collections::HashSet::new() });
        }
        let Some(leader) = slot.as_mut() else { return Ok(false) };
        if leader.held.contains(&key) {
            // Still ours while the connection lives: check that it does.
            if leader.client.query_one("SELECT 1", &[]).await.is_ok() {
                return Ok(true);
            }
            *slot = None;
            return Ok(false);
        }
        let got: bool =
            leader.client.query_one("SELECT pg_try_advisory_lock($1)", &[&key]).await?.get(0);
        if got {
            leader.held.insert(key);
            tracing::info!(task, "this relay now leads the task");
        }
        Ok(got)
    }
}
