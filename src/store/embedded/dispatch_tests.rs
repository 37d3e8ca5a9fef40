//! The embedded store's dispatch: the cursor and the committed watermark, and the
//! committer's dispatch of what it stores.

use std::sync::atomic::Ordering;

use std::time::Duration;

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
    /// A store and a directory: at each report (where the dispatcher wakes the
    /// workers), what a power cut would leave of the store is copied there.
    image_at_report: std::sync::Mutex<Option<(super::super::EmbeddedStore, std::path::PathBuf)>>,
}

impl Hook {
    fn new() -> Self {
        Self {
            mode: std::sync::Mutex::new(Mode::Dispatch),
            batches: std::sync::Mutex::default(),
            image_at_report: std::sync::Mutex::default(),
        }
    }
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
        if let Some((store, dir)) = &*self.image_at_report.lock().unwrap() {
            assert!(store.crash_image(dir).unwrap(), "redb makes crash images");
        }
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
/// stores (in the same write) and does not wake the dispatcher; a batch the
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
        let hook = Arc::new(Hook::new());
        assert!(store.dispatch_with_commits(Some(hook.clone())));
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

        assert!(store.dispatch_with_commits(None));
        let last = append(6_000).await.unwrap();
        until("the dispatcher woken once the rules are taken back", || waited() == 4).await;
        let pending: Vec<_> = store.pending(10).await.unwrap().iter().map(|p| p.id).collect();
        assert_eq!(pending, [last], "{engine:?}");
        store.close().await.unwrap();
    }
}

/// A group stored with its dispatch (`append_dispatched`) is durable, dispatched
/// and accounted for by the time the rules report it (and wake the workers): a
/// power cut then leaves the event, its outcome and its delivery; the inbox is
/// empty, and the ledger balances with nothing waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_dispatched_as_stored_is_durable_and_accounted_for_when_reported() {
    use crate::store::lifecycle::balance::balance;
    use crate::store::{Audit, DeliveryQueue, Dispatch, EventLog, EventStatus, Upkeep};
    use std::sync::Arc;
    let (dir, image) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let engine = super::super::Engine::Redb;
    let store = super::super::testutil::open_on(engine, dir.path());
    let hook = Arc::new(Hook::new());
    *hook.image_at_report.lock().unwrap() = Some((store.clone(), image.path().to_owned()));
    assert!(store.dispatch_with_commits(Some(hook.clone())));
    let mut ids = Vec::new();
    for at in [1_000, 2_000, 3_000] {
        ids.push(
            store
                .append(crate::store::fixtures::received("demo", "ActionCreated", at, "{}"))
                .await
                .unwrap(),
        );
        let batches = hook.batches.lock().unwrap().clone();
        assert_eq!(batches.last(), Some(&vec![*ids.last().unwrap()]), "dispatched as stored");
        // What a power cut at the report leaves.
        let cut = super::super::testutil::open_on(engine, image.path());
        for id in &ids {
            let event = cut.event(*id).await.unwrap().expect("the event is durable");
            assert_eq!(event.meta.status, EventStatus::Dispatched, "and its outcome");
        }
        let claims = cut.claim_due("a", "test", 10_000, Duration::from_secs(30), 10).await.unwrap();
        assert_eq!(claims.len(), ids.len(), "and its delivery");
        cut.close().await.unwrap();
        drop(cut);
        for entry in std::fs::read_dir(image.path()).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
    }
    *hook.image_at_report.lock().unwrap() = None;
    assert_eq!(store.inbox().await.unwrap().events, 0, "nothing left in the inbox");
    assert!(store.pending(10).await.unwrap().is_empty());
    let r = balance(&store.ledger(0, 1).await.unwrap(), 0, 1, None);
    assert!(r.imbalances.is_empty(), "{:?}", r.imbalances);
    let row = r
        .events
        .get(&("demo".to_owned(), "ActionCreated".to_owned()))
        .unwrap_or_else(|| panic!("{r:#?}"));
    assert_eq!((row.received, row.routed, row.waiting), (3, 3, 0), "{row:?}");
    let to_a = &r.destinations["a"];
    assert_eq!((to_a.routed, to_a.pending), (3, 3), "{to_a:?}");
    store.close().await.unwrap();
}
