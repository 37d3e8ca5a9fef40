//! Dispatch on sled: the inbox read, the rules applied under the lifecycle lock, one
//! transaction for the whole batch.

use std::sync::atomic::Ordering;

use super::codec::decode_pending;
use super::{hex, keys, Inner, DEDUP, INBOX};
use crate::lock::lock;
use crate::store::lifecycle::{self, Staged};
use crate::store::{DispatchOutcome, DispatchPlan, EventId, PendingEvent, StoreError};

impl Inner {
    pub(super) fn pending(&self, limit: usize) -> Result<Vec<PendingEvent>, StoreError> {
        let mut out = Vec::new();
        for item in self.inbox.iter().take(limit) {
            let (key, value) = item?;
            let corrupt =
                |reason: String| StoreError::Corrupt { table: INBOX, key: hex(&key), reason };
            let id = EventId::from_key(&key).ok_or_else(|| corrupt("key is not 8 bytes".into()))?;
            let (meta, body) = decode_pending(&value).map_err(corrupt)?;
            out.push(PendingEvent { id, meta, body: bytes::Bytes::copy_from_slice(body) });
        }
        Ok(out)
    }

    pub(super) fn dispatch(
        &self,
        plans: &[DispatchPlan],
        now_us: u64,
    ) -> Result<Vec<DispatchOutcome>, StoreError> {
        let guard = lock(&self.lifecycle);
        let mut st = Staged::new(self);
        let mut outcomes = Vec::with_capacity(plans.len());
        for plan in plans {
            let key = plan.id.to_key();
            let Some(raw) = self.inbox.get(key)? else {
                outcomes.push(DispatchOutcome::Gone);
                continue;
            };
            let meta = super::decode(super::Source::Inbox, &key, &raw)?.meta;
            outcomes.push(lifecycle::dispatch(&mut st, meta, plan, now_us)?);
        }
        self.apply(&st.into_changes())?;
        drop(guard);
        // Not flushed here (see `Store::dispatch`): the next durable write covers it.
        Ok(outcomes)
    }

    pub(super) fn purge_dedup(&self, now_us: u64) -> Result<usize, StoreError> {
        let mut purged = 0;
        for item in self.dedup.iter() {
            let (key, value) = item?;
            let expired = match keys::decode_dedup(&value) {
                Some(entry) => entry.until_us <= now_us,
                None => {
                    tracing::warn!(tree = DEDUP, key = %hex(&key), "unreadable dedup entry removed");
                    true
                }
            };
            // Only remove the entry we looked at: dispatch may have renewed it since.
            if expired && self.dedup.compare_and_swap(&key, Some(&value), None::<&[u8]>)?.is_ok() {
                purged += 1;
            }
        }
        let n = purged as u64;
        self.dedup_count
            .fetch_sub(n.min(self.dedup_count.load(Ordering::Relaxed)), Ordering::Relaxed);
        self.durable()?;
        Ok(purged)
    }
}
