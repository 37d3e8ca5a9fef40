//! The in-memory backend's dispatch: the inbox, dedup and routing, through the lifecycle rules.

use async_trait::async_trait;

use crate::lock::lock;
use crate::store::lifecycle::{self, Staged};
use crate::store::{Dispatch, DispatchPlan, DispatchVerdict, InboxStats, PendingEvent, StoreError};

use super::{Locked, MemoryStore};

#[async_trait]
impl Dispatch for MemoryStore {
    async fn inbox(&self) -> Result<InboxStats, StoreError> {
        Ok(InboxStats { events: lock(&self.data).inbox.len() as u64, counting: false })
    }

    async fn pending(&self, limit: usize) -> Result<Vec<PendingEvent>, StoreError> {
        let d = lock(&self.data);
        Ok(d.inbox
            .iter()
            .take(limit)
            .map(|(id, (meta, body))| PendingEvent {
                id: *id,
                meta: meta.clone(),
                body: body.clone(),
            })
            .collect())
    }

    async fn dispatch(
        &self,
        plans: Vec<DispatchPlan>,
        now_us: u64,
    ) -> Result<Vec<DispatchVerdict>, StoreError> {
        let mut d = lock(&self.data);
        let view = Locked { data: &d, claims: &self.claims };
        let mut st = Staged::new(&view);
        let mut outcomes = Vec::with_capacity(plans.len());
        for plan in &plans {
            let Some((meta, _)) = d.inbox.get(&plan.id) else {
                outcomes.push(DispatchVerdict::Gone);
                continue;
            };
            outcomes.push(lifecycle::dispatch(&mut st, meta.clone(), plan, now_us)?);
        }
        let changes = st.into_changes();
        d.apply(changes);
        Ok(outcomes)
    }

    async fn purge_dedup(&self, now_us: u64, limit: usize) -> Result<usize, StoreError> {
        let mut d = lock(&self.data);
        let mut left = limit;
        d.dedup.retain(|_, e| {
            let goes = left > 0 && e.until_us <= now_us;
            left -= usize::from(goes);
            !goes
        });
        Ok(limit - left)
    }

    async fn dedup_len(&self) -> Result<u64, StoreError> {
        Ok(lock(&self.data).dedup.len() as u64)
    }
}
