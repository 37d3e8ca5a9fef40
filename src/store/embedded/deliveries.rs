//! Deliveries in the embedded store: claims, attempts, operator actions, retention, pauses, and the
//! hook lifecycle's small state. Every change goes through the lifecycle rules under
//! the lifecycle lock, then [`EmbeddedState::apply`].

use std::collections::HashSet;
use std::time::Duration;

use super::codec::{self, split_record};
use super::engine::Batch;
use super::{keys, EmbeddedState, DELIVERIES, PAUSED_PREFIX, RECORDS};
use crate::clock::micros;
use crate::config::RetryPolicy;
use crate::lock::lock;
use crate::store::hex;
use crate::store::lifecycle::{self, AttemptReport, Staged, View};
use crate::store::{
    Claim, DeadLetterFilter, DeliveryRecord, EventId, EventMeta, JournalEntry, QueueChange,
    QueueStats, Recorded, StoreError,
};

/// Decodes a `deliveries` value (`record.rs`) under its key.
pub(super) fn decode_record(key: &[u8], value: &[u8]) -> Result<DeliveryRecord, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt { table: DELIVERIES, key: hex(key), reason };
    let (event, dest) =
        keys::split_delivery(key).ok_or_else(|| corrupt("unreadable delivery key".into()))?;
    super::record::decode(event, &dest, value).map_err(corrupt)
}

impl EmbeddedState {
    pub(super) fn claim_due(
        &self,
        dest: &str,
        owner: &str,
        now_us: u64,
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Claim>, StoreError> {
        let prefix = keys::schedule_prefix(dest);
        let mut end = prefix.clone();
        end.extend_from_slice(&now_us.saturating_add(1).to_be_bytes());
        let expires_us = now_us.saturating_add(micros(lease));
        let mut out = Vec::new();
        for item in self.schedule.range(prefix.clone()..end) {
            if out.len() >= limit {
                break;
            }
            let (key, _) = item?;
            let Some((due_us, event)) = keys::split_schedule_tail(&key[prefix.len()..]) else {
                continue;
            };
            // Claimed before its record is read: a record read first could be one
            // another worker has attempted, recorded and released meanwhile (a
            // record is written before its claim is released), and the delivery would
            // be sent twice. Read after the claim, it is either still due or seen moved.
            let Some(token) = self.claims.try_claim(dest, event, now_us, expires_us) else {
                continue;
            };
            let record = match View::delivery(self, event, dest) {
                Ok(Some(record)) if lifecycle::schedule_entry(&record) == Some(due_us) => record,
                // Moved since the scan read its key.
                Ok(_) => {
                    self.claims.release(dest, event, token);
                    continue;
                }
                Err(e) => {
                    self.claims.release(dest, event, token);
                    return Err(e);
                }
            };
            // An ordered delivery may be superseded by a dispatch (`ordering =
            // "latest"`), which asks whether it is claimed under the lifecycle lock:
            // looked at again under that lock, it is either claimed before the
            // dispatch asked, or seen superseded here and given back.
            if record.resource.is_some() {
                let _decided = lock(&self.lifecycle);
                let now = View::delivery(self, event, dest)?;
                if now.as_ref().and_then(lifecycle::schedule_entry) != Some(due_us) {
                    self.claims.release(dest, event, token);
                    continue;
                }
            }
            let (meta, body) = self.meta_and_body(event)?;
            out.push(Claim {
                event,
                destination: dest.to_owned(),
                due_us,
                owner: owner.to_owned(),
                token,
                expires_us,
                record,
                meta,
                body,
            });
        }
        Ok(out)
    }

    /// An event's meta (with its outcome) and body, from one read of its record.
    fn meta_and_body(
        &self,
        event: EventId,
    ) -> Result<(Option<EventMeta>, Option<bytes::Bytes>), StoreError> {
        let key = event.to_key();
        let Some(value) = self.records.get(key)? else { return Ok((None, None)) };
        let meta = self.decode(&key, &value)?.meta;
        let body = split_record(&value)
            .map_err(|reason| StoreError::Corrupt { table: RECORDS, key: hex(&key), reason })?
            .body
            .map(bytes::Bytes::copy_from_slice);
        Ok((Some(meta), body))
    }

    pub(super) fn release(&self, claim: &Claim) {
        self.claims.release(&claim.destination, claim.event, claim.token);
    }

    pub(super) fn next_due_after(
        &self,
        dest: &str,
        now_us: u64,
    ) -> Result<Option<u64>, StoreError> {
        let prefix = keys::schedule_prefix(dest);
        let mut start = prefix.clone();
        start.extend_from_slice(&now_us.saturating_add(1).to_be_bytes());
        match self.schedule.range(start..).next() {
            Some(item) => {
                let (key, _) = item?;
                Ok(key
                    .strip_prefix(prefix.as_slice())
                    .and_then(keys::split_schedule_tail)
                    .map(|(due, _)| due))
            }
            None => Ok(None),
        }
    }

    /// Records `attempts` in a transaction of their own: those of ordered deliveries,
    /// whose record may release the next delivery of a resource's queue (the others
    /// ride the committer's next group: `ride.rs`).
    pub(super) fn record_attempts(
        &self,
        attempts: &[(Claim, AttemptReport)],
        policy: &RetryPolicy,
        bodies_before_us: Option<u64>,
    ) -> Result<Recorded, StoreError> {
        let guard = lock(&self.lifecycle);
        let mut st = Staged::new(self);
        let out = lifecycle::record_attempts(&mut st, attempts, policy, bodies_before_us, |c| {
            self.claims.holds(&c.destination, c.event, c.token)
        })?;
        let changes = st.into_changes();
        // A record that releases the next delivery of a resource's queue is flushed at
        // once: that delivery waits for it. Any other may wait for an ack's flush.
        let releases = !changes.made_due().is_empty();
        self.apply(&changes)?;
        for (claim, _) in attempts {
            self.release(claim);
        }
        drop(guard);
        if releases {
            self.durable()?;
        } else {
            self.durable_lingering()?;
        }
        Ok(out)
    }

    pub(super) fn deliveries_of(&self, event: EventId) -> Result<Vec<DeliveryRecord>, StoreError> {
        self.deliveries
            .scan_prefix(event.to_key())
            .map(|item| {
                let (key, value) = item?;
                decode_record(&key, &value)
            })
            .collect()
    }

    /// [`crate::store::DeliveryQueue::change`]: the change and its journal entry in
    /// one transaction, flushed whatever the durability setting when journalled.
    pub(super) fn change(
        &self,
        change: &QueueChange,
        journal: Option<&JournalEntry>,
    ) -> Result<u64, StoreError> {
        let entry = |count| {
            journal
                .map(|e| super::journal::encoded(&JournalEntry { count, ..e.clone() }))
                .transpose()
        };
        match change {
            QueueChange::Deliveries { each, how, now_us } => {
                let guard = lock(&self.lifecycle);
                let mut st = Staged::new(self);
                let count = lifecycle::manage(&mut st, each, *how, *now_us)?;
                self.apply_journalled(&st.into_changes(), entry(count)?)?;
                drop(guard);
                self.made_durable(journal.is_some())?;
                Ok(count)
            }
            QueueChange::Pause { destination, paused } => {
                let mut key = PAUSED_PREFIX.to_vec();
                key.extend_from_slice(destination.as_bytes());
                let journalled = entry(1)?;
                self.db.transaction(&[&self.meta, &self.journal], |t| {
                    if *paused {
                        t[0].insert(&key, [])?;
                    } else {
                        t[0].remove(&key)?;
                    }
                    if let Some((key, value)) = &journalled {
                        t[1].insert(key, value.as_slice())?;
                    }
                    Ok(())
                })?;
                self.made_durable(journal.is_some())?;
                Ok(1)
            }
        }
    }

    /// Flushed now when `always` (a journal entry is durable when written), else as
    /// the durability setting says.
    fn made_durable(&self, always: bool) -> Result<(), StoreError> {
        if always {
            self.flush_now()
        } else {
            self.durable()
        }
    }

    pub(super) fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        let iter = match filter.after {
            Some(after) => self.dead_letters.range(..after.to_key()),
            None => self.dead_letters.iter(),
        };
        let mut out = Vec::new();
        for item in iter.rev() {
            if out.len() >= filter.limit {
                break;
            }
            let (key, _) = item?;
            let Some((event, dest)) = keys::split_delivery(&key) else { continue };
            // Newest event first: once older than `since`, every later one is too.
            if filter.since.is_some_and(|s| event < s) {
                break;
            }
            if filter.destination.as_ref().is_some_and(|d| *d != dest) {
                continue;
            }
            if filter.source.is_some() || filter.event.is_some() {
                let Some(meta) = self.event(event)?.map(|r| r.meta) else { continue };
                if filter.source.as_ref().is_some_and(|s| *s != meta.source)
                    || filter.event.as_ref().is_some_and(|e| *e != meta.event)
                {
                    continue;
                }
            }
            if let Some(record) = View::delivery(self, event, &dest)? {
                out.push(record);
            }
        }
        Ok(out)
    }

    pub(super) fn queue_stats(&self, dest: &str) -> QueueStats {
        self.counts.stats(dest)
    }

    pub(super) fn open_destinations(&self) -> Result<Vec<String>, StoreError> {
        self.counts.open_destinations()
    }

    /// Decides and deletes under the lifecycle lock, one event at a time, so a replay
    /// can never slip between the decision and the delete.
    pub(super) fn prune(&self, before_us: u64, limit: usize) -> Result<usize, StoreError> {
        // The appends' ledger counts not saved yet would be recounted from their records
        // after a crash: save them before any record goes.
        self.save_appended()?;
        let mut pruned = 0;
        let mut from = EventId::new(0);
        let end = EventId::new(before_us).to_key();
        while pruned < limit {
            // A short read-only scan for candidates, then each one decided again
            // under the lock.
            let candidates: Vec<EventId> = self
                .records
                .range(from.to_key()..end)
                .map(|entry| entry.map(|(key, _)| key))
                .take(256)
                .filter_map(|k| k.ok().and_then(|k| EventId::from_key(&k)))
                .collect();
            let Some(last) = candidates.last().copied() else { break };
            for id in candidates {
                if pruned >= limit {
                    break;
                }
                let guard = lock(&self.lifecycle);
                let Some(meta) = View::event(self, id)? else { continue };
                let deliveries = self.deliveries_of(id)?;
                let mut st = Staged::new(self);
                if lifecycle::prune(&mut st, id, &meta, &deliveries, before_us)? {
                    self.apply(&st.into_changes())?;
                    pruned += 1;
                }
                drop(guard);
            }
            from = EventId::new(last.raw().saturating_add(1));
        }
        Ok(pruned)
    }

    /// Drops the bodies of settled events after `after` and before `before_us`: the
    /// chunk decided and rewritten under the lifecycle lock (a replay cannot slip
    /// between), in one write that frees the pages the bodies held
    /// ([`Tree::apply_shrinking`](super::engine::Tree::apply_shrinking)).
    pub(super) fn prune_bodies(
        &self,
        after: EventId,
        before_us: u64,
        limit: usize,
    ) -> Result<(usize, Option<EventId>), StoreError> {
        let start = EventId::new(after.raw().saturating_add(1)).to_key();
        let end = EventId::new(before_us).to_key();
        let candidates: Vec<EventId> = self
            .records
            .range(start..end)
            .map(|entry| entry.map(|(key, _)| key))
            .take(limit)
            .filter_map(|k| k.ok().and_then(|k| EventId::from_key(&k)))
            .collect();
        let guard = lock(&self.lifecycle);
        let mut stripped = Batch::default();
        let mut gone = 0;
        for id in &candidates {
            let Some(meta) = View::event(self, *id)? else { continue };
            if !lifecycle::prunable(&meta, &self.deliveries_of(*id)?, before_us) {
                continue;
            }
            let key = id.to_key();
            let Some(value) = self.records.get(key)? else { continue };
            let body_gone = codec::strip_body(&value).map_err(|reason| StoreError::Corrupt {
                table: RECORDS,
                key: hex(&key),
                reason,
            })?;
            if let Some(body_gone) = body_gone {
                stripped.insert(key, body_gone);
                gone += 1;
            }
        }
        if gone > 0 {
            self.records.apply_shrinking(stripped)?;
        }
        drop(guard);
        Ok((gone, candidates.last().copied()))
    }

    pub(super) fn paused(&self) -> Result<HashSet<String>, StoreError> {
        self.meta
            .scan_prefix(PAUSED_PREFIX)
            .map(|item| {
                let (key, _) = item?;
                Ok(String::from_utf8_lossy(&key[PAUSED_PREFIX.len()..]).into_owned())
            })
            .collect()
    }

    pub(super) fn upstream_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.upstream.get(key.as_bytes())?.map(|v| v.to_vec()))
    }

    /// Always flushed, whatever the durability setting: the upstream call that follows
    /// depends on it (a rotated refresh token, a gap recorded before a delete).
    pub(super) fn upstream_put(&self, key: &str, value: Option<&[u8]>) -> Result<(), StoreError> {
        match value {
            Some(v) => self.upstream.insert(key.as_bytes(), v)?,
            None => self.upstream.remove(key.as_bytes())?,
        };
        self.flush_now()
    }

    pub(super) fn upstream_scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.upstream
            .scan_prefix(prefix.as_bytes())
            .map(|item| {
                let (k, v) = item?;
                Ok((String::from_utf8_lossy(&k).into_owned(), v.to_vec()))
            })
            .collect()
    }

    pub(super) fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.db.size_on_disk()
    }
}
