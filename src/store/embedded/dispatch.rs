//! Dispatch in the embedded store: the events awaiting dispatch read after the cursor, the rules
//! applied under the lifecycle lock, one transaction for the whole batch (outcomes,
//! dedup keys, deliveries, schedule, queues and the cursor).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::codec::{decode_meta, parse_meta, split_record};
use super::engine::read_scope;
use super::{EmbeddedState, RECORDS};
use crate::lock::lock;
use crate::store::hex;
use crate::store::lifecycle::{self, Staged};
use crate::store::{
    CommitDispatch, DispatchPlan, DispatchVerdict, EventId, PendingEvent, StoreError,
};

impl EmbeddedState {
    /// The committer's dispatch of the `group` it stored, on its thread, after the
    /// group's callers are answered (`Dispatch::dispatch_after_commits`): a write like
    /// any other, under the store's health. Only when the inbox holds that group alone:
    /// a backlog is the dispatcher's, which was woken for it (two readers of the same
    /// batch would both read it, and one find it `Gone`). Returns whether events are
    /// left for the dispatcher: a backlog, no hook, a hook that declines or fails (the
    /// dispatcher meets the same failure and reports it).
    pub(super) fn dispatch_after_commit(&self, group: usize) -> bool {
        let Some(hook) = lock(&self.commit_dispatch).clone() else { return true };
        let run = || {
            let pending = self.pending(group + 1)?;
            if pending.is_empty() {
                return Ok(false);
            }
            if pending.len() > group {
                return Ok(true);
            }
            let dispatched =
                hook.dispatch(&pending, &mut |plans, now| self.dispatch(plans, now))?;
            Ok(!dispatched)
        };
        // A panic in the dispatcher's rules is the dispatcher's to meet (its task is
        // supervised), never the committer's, which every ack needs.
        let call = std::panic::AssertUnwindSafe(|| {
            self.health.write(StoreError::is_engine_failure, || read_scope(run))
        });
        !matches!(std::panic::catch_unwind(call), Ok(Ok(false)))
    }

    /// Lends the dispatcher's rules to the committer, or takes them back (`None`).
    pub(super) fn set_commit_dispatch(&self, hook: Option<Arc<dyn CommitDispatch>>) {
        *lock(&self.commit_dispatch) = hook;
    }

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

    /// Counts the groups that left events waiting for the dispatcher.
    #[derive(Default)]
    struct Waits(std::sync::atomic::AtomicUsize);

    impl crate::store::StoreObserver for Waits {
        fn group(&self, _: usize, _: std::time::Duration, _: bool) {}
        fn stored(&self, _: &crate::store::EventMeta) {}
        fn failed(&self, _: &str) {}
        fn trouble(&self, _: crate::store::Trouble, _: &str, _: &dyn std::fmt::Display) {}
        fn waiting(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// What the test's dispatcher does with a batch the committer offers it.
    #[derive(Clone, Copy, PartialEq)]
    enum Mode {
        Dispatch,
        Decline,
        Panic,
    }

    /// The dispatcher's side, as the test drives it: the batches it dispatched.
    struct Hook {
        mode: std::sync::Mutex<Mode>,
        batches: std::sync::Mutex<Vec<Vec<EventId>>>,
    }

    impl crate::store::CommitDispatch for Hook {
        fn dispatch(
            &self,
            pending: &[crate::store::PendingEvent],
            write: crate::store::DispatchWrite<'_>,
        ) -> Result<bool, crate::store::StoreError> {
            let mode = *self.mode.lock().unwrap();
            match mode {
                Mode::Decline => return Ok(false),
                Mode::Panic => panic!("the dispatcher's rules panicked"),
                Mode::Dispatch => {}
            }
            let plans: Vec<_> = pending.iter().map(|p| plan_for(p.id)).collect();
            write(&plans, 1_000)?;
            self.batches.lock().unwrap().push(pending.iter().map(|p| p.id).collect());
            Ok(true)
        }
    }

    /// The test's plan of an event: to destination `a`, no dedup key.
    fn plan_for(id: EventId) -> crate::store::DispatchPlan {
        crate::store::DispatchPlan { dedup: None, ..crate::store::fixtures::plan(id, 0, &["a"]) }
    }

    /// Waits up to 5 s for `done`.
    async fn until(what: &str, done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "not within 5 s: {what}");
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    /// With the dispatcher's rules lent, the committer dispatches each group it
    /// stored (after answering it) and does not wake the dispatcher; a batch the
    /// rules decline, or panic on, is left in the inbox and wakes it, and the
    /// committer goes on answering callbacks; a backlog is left to the dispatcher;
    /// the rules taken back, every group wakes it again. On both engines.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_committer_dispatches_what_it_stored_and_wakes_the_dispatcher_for_the_rest() {
        use crate::store::{Dispatch, EventLog, EventStatus, Upkeep};
        use std::sync::Arc;
        for engine in [super::super::Engine::Redb, super::super::Engine::Sled] {
            let dir = tempfile::tempdir().unwrap();
            let waits = Arc::new(Waits::default());
            let opts = super::super::EmbeddedOptions {
                observer: waits.clone(),
                ..super::super::testutil::options(engine, dir.path())
            };
            let store = super::super::EmbeddedStore::open(&opts).unwrap();
            let hook = Arc::new(Hook {
                mode: std::sync::Mutex::new(Mode::Dispatch),
                batches: std::sync::Mutex::default(),
            });
            assert!(store.dispatch_after_commits(Some(hook.clone())));
            let waited = || waits.0.load(Ordering::SeqCst);
            let append = |at| store.append(crate::store::fixtures::received("demo", "A", at, "{}"));
            let set = |mode| *hook.mode.lock().unwrap() = mode;

            let first = append(1_000).await.unwrap();
            until("the first event dispatched", || hook.batches.lock().unwrap().len() == 1).await;
            assert_eq!(hook.batches.lock().unwrap()[0], [first]);
            let event = store.event(first).await.unwrap().unwrap();
            assert_eq!(event.meta.status, EventStatus::Dispatched, "{engine:?}");
            assert!(store.pending(10).await.unwrap().is_empty());
            assert_eq!(waited(), 0, "{engine:?}: the dispatcher was woken for nothing");

            set(Mode::Decline);
            let declined = append(2_000).await.unwrap();
            until("the dispatcher woken for the declined", || waited() == 1).await;
            set(Mode::Panic);
            let panicked = append(3_000).await.unwrap();
            until("the dispatcher woken for the one the rules panicked on", || waited() == 2).await;
            let pending: Vec<_> = store.pending(10).await.unwrap().iter().map(|p| p.id).collect();
            assert_eq!(pending, [declined, panicked], "{engine:?}: left in the inbox");

            // The committer survived the panic: the next group is stored. The inbox
            // held more than that group: a backlog, left to the dispatcher.
            set(Mode::Dispatch);
            let next = append(4_000).await.unwrap();
            until("the dispatcher woken for the backlog", || waited() == 3).await;
            let pending: Vec<_> = store.pending(10).await.unwrap().iter().map(|p| p.id).collect();
            assert_eq!(pending, [declined, panicked, next], "{engine:?}: a backlog taken");
            assert_eq!(hook.batches.lock().unwrap().len(), 1, "{engine:?}");
            // Once the dispatcher has it, the committer's next group is its own again.
            store.dispatch(pending.iter().map(|&id| plan_for(id)).collect(), 1_000).await.unwrap();
            let alone = append(5_000).await.unwrap();
            until("a group alone dispatched", || hook.batches.lock().unwrap().len() == 2).await;
            assert_eq!(hook.batches.lock().unwrap()[1], [alone]);
            assert_eq!(waited(), 3, "{engine:?}");

            assert!(store.dispatch_after_commits(None));
            let last = append(6_000).await.unwrap();
            until("the dispatcher woken once the rules are taken back", || waited() == 4).await;
            let pending: Vec<_> = store.pending(10).await.unwrap().iter().map(|p| p.id).collect();
            assert_eq!(pending, [last], "{engine:?}");
            store.close().await.unwrap();
        }
    }
}
