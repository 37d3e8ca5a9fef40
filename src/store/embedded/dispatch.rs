//! Dispatch in the embedded store: the events awaiting dispatch read after the cursor, the rules
//! applied under the lifecycle lock, one transaction for the whole batch (outcomes,
//! dedup keys, deliveries, schedule, queues and the cursor).

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use super::codec::{decode_meta, parse_meta, split_record};
use super::{EmbeddedState, RECORDS};
use crate::lock::lock;
use crate::store::hex;
use crate::store::lifecycle::{self, Staged};
use crate::store::{DispatchPlan, DispatchVerdict, EventId, PendingEvent, StoreError};

impl EmbeddedState {
    /// The first `limit` events awaiting dispatch, oldest first.
    pub(super) fn pending(&self, limit: usize) -> Result<Vec<PendingEvent>, StoreError> {
        let mut out = Vec::new();
        let from = self.cursor.load(Ordering::Acquire).saturating_add(1);
        // Read before the scan: every id up to it was visible when the scan began.
        let committed = self.committed.load(Ordering::Acquire);
        // Settled records right after the cursor (rejected ones, say) are stepped over
        // once, not at every poll.
        let mut settled_run = Some(from.saturating_sub(1));
        for item in self.records.range(EventId::new(from).to_key()..) {
            if out.len() >= limit {
                break;
            }
            let (key, value) = item?;
            let corrupt =
                |reason: String| StoreError::Corrupt { table: RECORDS, key: hex(&key), reason };
            let id = EventId::from_key(&key).ok_or_else(|| corrupt("key is not 8 bytes".into()))?;
            // Not before its group is published: the append tallies the group in the
            // ledger's `waiting` after writing it, and a dispatch taking the event in
            // between left it waiting for ever (an audit imbalance seen under load).
            if id.raw() > committed {
                break;
            }
            if !self.awaits_dispatch(&key, &value)? {
                if let Some(run) = settled_run.as_mut() {
                    *run = id.raw();
                }
                continue;
            }
            settled_run = None;
            let record = split_record(&value).map_err(corrupt)?;
            let mut meta = parse_meta(record.meta).map_err(corrupt)?;
            meta.resource = record.resource.map(str::to_owned);
            // The body shares the value the engine read (no copy): it ends the record.
            let body_len = record.body.map_or(0, <[u8]>::len);
            let len = value.len();
            let body = bytes::Bytes::from_owner(value).slice(len - body_len..);
            out.push(PendingEvent { id, meta, body });
        }
        if let Some(run) = settled_run {
            self.cursor.fetch_max(run.min(committed), Ordering::AcqRel);
        }
        Ok(out)
    }

    pub(super) fn dispatch(
        &self,
        plans: &[DispatchPlan],
        now_us: u64,
    ) -> Result<Vec<DispatchVerdict>, StoreError> {
        let guard = lock(&self.lifecycle);
        self.dedup_buckets.forget_found();
        let mut st = Staged::new(self);
        let mut outcomes = Vec::with_capacity(plans.len());
        for plan in plans {
            let key = plan.id.to_key();
            let corrupt =
                |reason: String| StoreError::Corrupt { table: RECORDS, key: hex(&key), reason };
            let value = match self.records.get(key)? {
                Some(v) if self.awaits_dispatch(&key, &v)? => v,
                _ => {
                    outcomes.push(DispatchVerdict::Gone);
                    continue;
                }
            };
            // No outcome yet (just checked): the meta as stored is the event's.
            let meta = decode_meta(&value).map_err(corrupt)?;
            outcomes.push(lifecycle::dispatch(&mut st, meta, plan, now_us)?);
        }
        let changes = st.into_changes();
        let cursor = self.cursor_after(&changes.dispatched.keys().copied().collect())?;
        self.apply_dispatch(&changes, cursor, now_us)?;
        drop(guard);
        // Not flushed here (see `Store::dispatch`): the next durable write covers it.
        Ok(outcomes)
    }

    /// Where the cursor can move once `dispatched` have their outcomes: over every
    /// following record that is settled, never past the committed watermark. `None`
    /// when it stays.
    fn cursor_after(&self, dispatched: &HashSet<EventId>) -> Result<Option<u64>, StoreError> {
        let start = self.cursor.load(Ordering::Acquire);
        // Read before the scan: every id up to it was visible when the scan began.
        let committed = self.committed.load(Ordering::Acquire);
        let mut cursor = start;
        for item in self.records.range(EventId::new(start.saturating_add(1)).to_key()..) {
            let (key, value) = item?;
            let Some(id) = EventId::from_key(&key) else { break };
            if id.raw() > committed {
                break;
            }
            let settled = dispatched.contains(&id) || !self.awaits_dispatch(&key, &value)?;
            if !settled {
                break;
            }
            cursor = id.raw();
        }
        Ok((cursor > start).then_some(cursor))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use crate::store::EventId;

    /// sled's iterators are not snapshots: a group's later id can be seen before an
    /// earlier one. The cursor, which steps over settled records, must not pass an id
    /// whose group is not all written yet, or that event is never dispatched.
    #[test]
    fn the_cursor_never_passes_an_id_whose_group_is_not_written_yet() {
        use crate::store::fixtures::received;
        let dir = tempfile::tempdir().unwrap();
        let store = super::super::testutil::open(dir.path());
        let inner = &store.inner;
        let (first, second) = (EventId::new(1_000), EventId::new(1_001));
        // Mid-group: the second event (stored final: rejected) is visible, the first
        // is not yet.
        let mut rejected = received("demo", "TaskCreated", 1_001, "").meta;
        rejected.status = crate::store::EventStatus::Rejected;
        inner
            .records
            .insert(second.to_key(), super::super::codec::encode_record(&rejected, None).unwrap())
            .unwrap();
        assert!(inner.pending(10).unwrap().is_empty());
        assert!(
            inner.cursor.load(Ordering::Acquire) < first.raw(),
            "the cursor passed an id whose group is not written yet"
        );
        // The group is written and published.
        let meta = received("demo", "TaskCreated", 1_000, "{}").meta;
        inner
            .records
            .insert(first.to_key(), super::super::codec::encode_record(&meta, Some(b"{}")).unwrap())
            .unwrap();
        inner.committed.fetch_max(second.raw(), Ordering::AcqRel);
        let pending: Vec<EventId> = inner.pending(10).unwrap().iter().map(|p| p.id).collect();
        assert_eq!(pending, [first], "the first event is still found");
    }

    /// An event written but not yet published by its append (its group not yet
    /// tallied in the ledger's `waiting`) is not dispatched: a dispatch in between
    /// would leave it counted as waiting for ever.
    #[test]
    fn an_event_is_not_dispatched_before_its_group_is_published() {
        use crate::store::fixtures::received;
        let dir = tempfile::tempdir().unwrap();
        let store = super::super::testutil::open(dir.path());
        let inner = &store.inner;
        let id = EventId::new(2_000);
        let meta = received("demo", "TaskCreated", 2_000, "{}").meta;
        inner
            .records
            .insert(id.to_key(), super::super::codec::encode_record(&meta, Some(b"{}")).unwrap())
            .unwrap();
        assert!(inner.pending(10).unwrap().is_empty(), "taken before its append ended");
        inner.committed.fetch_max(id.raw(), Ordering::AcqRel);
        let pending: Vec<EventId> = inner.pending(10).unwrap().iter().map(|p| p.id).collect();
        assert_eq!(pending, [id]);
    }
}
