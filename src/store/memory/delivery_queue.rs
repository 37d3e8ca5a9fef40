//! The in-memory backend's delivery queue: claims, attempts, dead letters, pauses.

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::micros;
use crate::config::RetryPolicy;
use crate::lock::lock;
use crate::store::lifecycle::{self, AttemptReport, Staged};
use crate::store::{
    Claim, DeadLetterFilter, DeliveryQueue, DeliveryRecord, EventId, JournalEntry, QueueChange,
    QueueStats, Recorded, StoreError,
};

use super::{Locked, MemoryStore};

#[async_trait]
impl DeliveryQueue for MemoryStore {
    async fn claim_due(
        &self,
        destination: &str,
        owner: &str,
        now_us: u64,
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Claim>, StoreError> {
        let d = lock(&self.data);
        let expires_us = now_us.saturating_add(micros(lease));
        let from = (destination.to_owned(), 0, EventId::new(0));
        let mut out = Vec::new();
        for (dest, due_us, event) in d.schedule.range(from..) {
            if dest != destination || *due_us > now_us || out.len() >= limit {
                break;
            }
            let Some(record) = d.deliveries.get(&(*event, dest.clone())).cloned() else {
                continue;
            };
            let Some(token) = self.claims.try_claim(dest, *event, now_us, expires_us) else {
                continue;
            };
            out.push(Claim {
                event: *event,
                destination: dest.clone(),
                due_us: *due_us,
                owner: owner.to_owned(),
                token,
                expires_us,
                record,
                meta: d.events.get(event).cloned(),
                body: d.bodies.get(event).cloned(),
            });
        }
        Ok(out)
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        self.claims.release(&claim.destination, claim.event, claim.token);
        Ok(())
    }

    async fn release_unknown(
        &self,
        destination: &str,
        _owner: &str,
        keep: &[u64],
    ) -> Result<usize, StoreError> {
        Ok(self.claims.release_except(destination, keep))
    }

    async fn next_due_after(
        &self,
        destination: &str,
        now_us: u64,
    ) -> Result<Option<u64>, StoreError> {
        let d = lock(&self.data);
        let from = (destination.to_owned(), now_us.saturating_add(1), EventId::new(0));
        Ok(d.schedule.range(from..).next().filter(|(dest, _, _)| dest == destination).map(|e| e.1))
    }

    async fn record_attempts(
        &self,
        attempts: Vec<(Claim, AttemptReport)>,
        policy: &RetryPolicy,
        bodies_before_us: Option<u64>,
    ) -> Result<Recorded, StoreError> {
        let mut d = lock(&self.data);
        let view = Locked { data: &d, claims: &self.claims };
        let mut st = Staged::new(&view);
        let out = lifecycle::record_attempts(&mut st, &attempts, policy, bodies_before_us, |c| {
            self.claims.holds(&c.destination, c.event, c.token)
        })?;
        let changes = st.into_changes();
        d.apply(changes);
        for (claim, _) in &attempts {
            self.claims.release(&claim.destination, claim.event, claim.token);
        }
        self.durable_point(&d);
        Ok(out)
    }

    async fn deliveries_of(&self, event: EventId) -> Result<Vec<DeliveryRecord>, StoreError> {
        let d = lock(&self.data);
        Ok(d.deliveries
            .range((event, String::new())..)
            .take_while(|((e, _), _)| *e == event)
            .map(|(_, r)| r.clone())
            .collect())
    }

    async fn change(
        &self,
        change: QueueChange,
        journal: Option<JournalEntry>,
    ) -> Result<u64, StoreError> {
        let mut d = lock(&self.data);
        let count = match change {
            QueueChange::Deliveries { each, how, now_us } => {
                let view = Locked { data: &d, claims: &self.claims };
                let mut st = Staged::new(&view);
                let n = lifecycle::manage(&mut st, &each, how, now_us)?;
                let changes = st.into_changes();
                d.apply(changes);
                n
            }
            QueueChange::Pause { destination, paused } => {
                if paused {
                    d.paused.insert(destination);
                } else {
                    d.paused.remove(&destination);
                }
                1
            }
        };
        if let Some(entry) = journal {
            d.journal.insert((entry.at_us, entry.tie), JournalEntry { count, ..entry });
        }
        self.durable_point(&d);
        Ok(count)
    }

    async fn dead_letters(
        &self,
        filter: DeadLetterFilter,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        let d = lock(&self.data);
        Ok(d.dead
            .iter()
            .rev()
            .filter(|(event, dest)| {
                let meta = d.events.get(event);
                filter.after.is_none_or(|a| *event < a)
                    && filter.since.is_none_or(|s| *event >= s)
                    && filter.destination.as_ref().is_none_or(|x| x == dest)
                    && filter.source.as_ref().is_none_or(|s| meta.is_some_and(|m| m.source == *s))
                    && filter.event.as_ref().is_none_or(|e| meta.is_some_and(|m| m.event == *e))
            })
            .take(filter.limit)
            .filter_map(|k| d.deliveries.get(&(k.0, k.1.clone())).cloned())
            .collect())
    }

    async fn queue_stats(&self, destination: &str) -> Result<QueueStats, StoreError> {
        Ok(lock(&self.data).counts.stats(destination))
    }

    async fn open_destinations(&self) -> Result<Vec<String>, StoreError> {
        Ok(lock(&self.data).counts.open_destinations())
    }

    async fn paused(&self) -> Result<HashSet<String>, StoreError> {
        Ok(lock(&self.data).paused.iter().cloned().collect())
    }
}
