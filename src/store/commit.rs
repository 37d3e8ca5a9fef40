//! Group commit for a backend with blocking writes: callbacks that arrive together
//! share one store write (and with it, one fsync).
//!
//! `Store::append` hands each event to the committer thread and waits for its answer.
//! While one group is being written, the next events queue up in the channel; the
//! committer then takes all of them (up to `max_batch`) as the next group. No timer is
//! involved: under light load a group is one event and is written at once, under heavy
//! load groups grow by themselves. The committer is a plain thread that calls the
//! backend's blocking write directly: one hop from the handler and back, which
//! measured 0.1–0.16 ms per group less than an async task hopping to the blocking pool
//! (BENCHMARKS.md).

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::{EventId, Health, NewEvent, StoreError, StoreObserver};

type Reply = oneshot::Sender<Result<EventId, StoreError>>;

// `Close` is sent once per process; boxing `Append` would cost an allocation per callback.
#[allow(clippy::large_enum_variant)]
enum Command {
    Append(NewEvent, Reply),
    /// Commit everything queued before this, and stop.
    Close(oneshot::Sender<()>),
}

/// Handle to the committer thread; cheap to clone.
#[derive(Clone)]
pub(crate) struct Committer {
    tx: mpsc::Sender<Command>,
    backend: &'static str,
    /// Callers stop waiting as soon as the store fails (a group that never returns).
    health: Arc<Health>,
}

/// Writes one group. Told whether the group is *quiet* ([`quiet`]): a few callbacks
/// with none waiting behind them, which a write may dispatch along with storing them
/// (the embedded store, `store::CommitDispatch`).
pub(crate) type WriteGroup =
    Box<dyn FnMut(&[NewEvent], bool) -> Result<Written, StoreError> + Send + 'static>;

/// A group written: its ids in order, and whether it left events waiting for the
/// dispatcher (false when the write dispatched them itself), which then is woken.
#[derive(Debug)]
pub(crate) struct Written {
    pub(crate) ids: Vec<EventId>,
    pub(crate) waiting: bool,
}

impl Written {
    /// A group stored and left in the inbox for the dispatcher.
    pub(crate) fn waiting(ids: Vec<EventId>) -> Self {
        Self { ids, waiting: true }
    }
}

/// The largest group a write may dispatch itself: at a gentle rate a group is one or
/// two callbacks; under held ingest, ten or more.
const QUIET_GROUP_MAX: usize = 4;

/// Whether a group of `size` with `queued` callbacks behind it is quiet: the write
/// may dispatch it as it stores it. Not while callbacks queue, nor for a larger
/// group: under load the acks come first, and the dispatcher's own thread, beside the
/// committer, batches better (held ingest lost 12% when the committer took its
/// share, BENCHMARKS.md).
fn quiet(size: usize, queued: bool) -> bool {
    size <= QUIET_GROUP_MAX && !queued
}

impl Committer {
    /// Starts the committer thread over `write`.
    pub(crate) fn start(
        backend: &'static str,
        write: WriteGroup,
        max_batch: usize,
        observer: Arc<dyn StoreObserver>,
        health: Arc<Health>,
    ) -> Result<(Self, std::thread::JoinHandle<()>), StoreError> {
        // Enough room for every worker's connections without unbounded growth.
        let (tx, rx) = mpsc::channel(max_batch.max(1) * 8);
        let task = Task { write, max_batch: max_batch.max(1), observer, rx };
        let thread = std::thread::Builder::new()
            .name("hookrelay-committer".into())
            .spawn(move || task.run())
            .map_err(|e| StoreError::Task(format!("cannot start the committer thread: {e}")))?;
        Ok((Self { tx, backend, health }, thread))
    }

    /// Stores `event` (with whatever arrives meanwhile) and returns its id once the
    /// group is written as durably as the write makes it. Fails at once if the store
    /// has failed, and as soon as it fails while this waits.
    pub(crate) async fn submit(&self, event: NewEvent) -> Result<EventId, StoreError> {
        let stopped =
            || StoreError::Backend { backend: self.backend, message: "the store is closed".into() };
        self.health
            .or_failed(async {
                let (reply, answer) = oneshot::channel();
                self.tx.send(Command::Append(event, reply)).await.map_err(|_| stopped())?;
                answer.await.map_err(|_| stopped())?
            })
            .await
    }

    /// Commits what is queued and stops the thread.
    pub(crate) async fn close(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Command::Close(ack)).await.is_ok() {
            let _ = done.await;
        }
    }

    /// At a backend's `close`: commits what is queued, stops the thread and joins it
    /// (taken from `thread`), unless the store fails meanwhile (a group stuck in the
    /// engine must not hold the shutdown).
    pub(crate) async fn close_and_join(
        &self,
        thread: &std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    ) -> Result<(), StoreError> {
        self.health.check()?;
        self.health
            .or_failed(async {
                self.close().await;
                let thread = crate::lock::lock(thread).take();
                if let Some(thread) = thread {
                    let joined = tokio::task::spawn_blocking(move || thread.join()).await;
                    if !matches!(joined, Ok(Ok(()))) {
                        let what = "the committer thread panicked; what it had not committed \
                                    was not acknowledged either";
                        let why = "it ended on a panic (see the log above)";
                        self.health.trouble(crate::store::Trouble::Storage, what, &why);
                    }
                }
                Ok(())
            })
            .await
    }
}

struct Task {
    write: WriteGroup,
    max_batch: usize,
    observer: Arc<dyn StoreObserver>,
    rx: mpsc::Receiver<Command>,
}

impl Task {
    fn run(mut self) {
        let mut events: Vec<NewEvent> = Vec::new();
        let mut waiters: Vec<Reply> = Vec::new();
        while let Some(first) = self.rx.blocking_recv() {
            let mut close = None;
            let mut next = Some(first);
            while let Some(cmd) = next.take() {
                match cmd {
                    Command::Append(event, reply) => {
                        events.push(event);
                        waiters.push(reply);
                    }
                    Command::Close(ack) => {
                        close = Some(ack);
                        break;
                    }
                }
                if events.len() < self.max_batch {
                    next = self.rx.try_recv().ok();
                }
            }
            if !events.is_empty() {
                self.commit(&mut events, &mut waiters);
            }
            if let Some(ack) = close {
                let _ = ack.send(());
                return;
            }
        }
    }

    /// Writes one group (quiet or not, see [`quiet`]), then answers its waiters, and
    /// tells the observer when events wait for the dispatcher. Both vectors are left
    /// empty, their capacity kept for the next group.
    fn commit(&mut self, events: &mut Vec<NewEvent>, waiters: &mut Vec<Reply>) {
        let (started, size) = (Instant::now(), events.len());
        let result = (self.write)(events, quiet(size, !self.rx.is_empty()));
        self.observer.group(size, started.elapsed(), result.is_ok());
        match result {
            Ok(written) => {
                for ((id, event), reply) in
                    written.ids.into_iter().zip(events.drain(..)).zip(waiters.drain(..))
                {
                    self.observer.stored(&event.meta);
                    let _ = reply.send(Ok(id));
                }
                if written.waiting {
                    self.observer.waiting();
                }
            }
            Err(e) => {
                tracing::error!(error = %e, events = events.len(), "group commit failed");
                events.clear();
                for reply in waiters.drain(..) {
                    let _ = reply.send(Err(e.duplicate()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::store::{EventMeta, Writers};

    /// Counts groups, stored events and groups that left events waiting.
    #[derive(Default)]
    struct Seen {
        groups: Mutex<Vec<(usize, bool)>>,
        stored: AtomicUsize,
        waiting: AtomicUsize,
    }

    impl StoreObserver for Seen {
        fn group(&self, size: usize, _took: Duration, ok: bool) {
            self.groups.lock().unwrap().push((size, ok));
        }
        fn stored(&self, _meta: &EventMeta) {
            self.stored.fetch_add(1, Ordering::SeqCst);
        }
        fn failed(&self, _reason: &str) {}
        fn trouble(&self, _: crate::store::Trouble, _: &str, _: &dyn std::fmt::Display) {}
        fn waiting(&self) {
            self.waiting.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn healthy() -> Arc<Health> {
        Health::new(
            "test",
            Duration::from_secs(60),
            Writers::OneAtATime,
            Arc::new(crate::store::NoObserver),
        )
    }

    fn event() -> NewEvent {
        crate::store::fixtures::received("demo", "ActionCreated", 5, "")
    }

    /// A write that takes a while, like an fsync, and numbers the events.
    fn slow_write(written: Arc<AtomicUsize>) -> WriteGroup {
        Box::new(move |events: &[NewEvent], _quiet| {
            std::thread::sleep(Duration::from_millis(20));
            let first = written.fetch_add(events.len(), Ordering::SeqCst) as u64;
            Ok(Written::waiting(
                (0..events.len() as u64).map(|i| EventId::new(first + i + 1)).collect(),
            ))
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_submits_share_groups() {
        let written = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Seen::default());
        let (committer, _thread) =
            Committer::start("test", slow_write(written.clone()), 512, seen.clone(), healthy())
                .unwrap();
        let submits: Vec<_> = (0..64)
            .map(|_| {
                let c = committer.clone();
                tokio::spawn(async move { c.submit(event()).await })
            })
            .collect();
        let mut ids = Vec::new();
        for s in submits {
            ids.push(s.await.unwrap().unwrap());
        }
        ids.sort();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "each waiter got its own id");
        assert_eq!(written.load(Ordering::SeqCst), 64);
        assert_eq!(seen.stored.load(Ordering::SeqCst), 64);
        let groups = seen.groups.lock().unwrap().clone();
        assert!(groups.len() < 16, "64 concurrent events took {} groups", groups.len());
        committer.close().await;
        assert!(committer.submit(event()).await.is_err(), "closed");
    }

    /// A write is told its group is quiet only when the group is small and no
    /// callback waits behind it (a lone callback is); a group it does not dispatch
    /// itself wakes the dispatcher, one it dispatched does not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_may_dispatch_only_small_groups_with_nothing_queued_behind() {
        let seen = Arc::new(Seen::default());
        // Each group's size and whether it was quiet.
        let told: Arc<Mutex<Vec<(usize, bool)>>> = Arc::default();
        let (log, written) = (told.clone(), Arc::new(AtomicUsize::new(0)));
        let mut slow = slow_write(written);
        let write: WriteGroup = Box::new(move |events: &[NewEvent], quiet| {
            let mut told = log.lock().unwrap();
            told.push((events.len(), quiet));
            let mut group = slow(events, quiet)?;
            // Dispatches every other quiet group itself.
            group.waiting = !quiet || told.iter().filter(|(_, q)| *q).count() % 2 == 0;
            Ok(group)
        });
        let (committer, _thread) =
            Committer::start("test", write, 512, seen.clone(), healthy()).unwrap();
        // One alone, nothing behind it.
        committer.submit(event()).await.unwrap();
        // Then 64 at once: groups larger than the bound, and callbacks queued behind.
        let submits: Vec<_> = (0..64)
            .map(|_| {
                let c = committer.clone();
                tokio::spawn(async move { c.submit(event()).await })
            })
            .collect();
        for s in submits {
            s.await.unwrap().unwrap();
        }
        committer.close().await;
        let told = told.lock().unwrap().clone();
        assert_eq!(told.first(), Some(&(1, true)), "a lone callback is quiet: {told:?}");
        assert!(told.iter().all(|(size, quiet)| !quiet || *size <= QUIET_GROUP_MAX), "{told:?}");
        assert!(told.iter().any(|(size, quiet)| *size > QUIET_GROUP_MAX && !quiet), "{told:?}");
        let quiet = told.iter().filter(|(_, q)| *q).count();
        let dispatched = quiet.div_ceil(2);
        assert_eq!(
            seen.waiting.load(Ordering::SeqCst),
            told.len() - dispatched,
            "only the groups the write dispatched itself leave the dispatcher asleep: {told:?}"
        );
    }

    #[tokio::test]
    async fn a_failed_write_fails_every_waiter_of_its_group() {
        let seen = Arc::new(Seen::default());
        let write: WriteGroup =
            Box::new(|_: &[NewEvent], _| Err(StoreError::Injected("disk full")));
        let (committer, _thread) =
            Committer::start("test", write, 8, seen.clone(), healthy()).unwrap();
        let err = committer.submit(event()).await.unwrap_err();
        assert!(err.to_string().contains("disk full"), "{err}");
        assert_eq!(*seen.groups.lock().unwrap(), [(1, false)]);
        assert_eq!(seen.stored.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_that_never_returns_fails_its_callers_within_the_bound() {
        let health = Health::new(
            "test",
            Duration::from_millis(300),
            Writers::OneAtATime,
            Arc::new(crate::store::NoObserver),
        );
        let _watchdog = Health::start_watchdog(&health).unwrap();
        let guard = health.clone();
        // Blocks like sled's flush on a full tmpfs did: for ever.
        let write: WriteGroup = Box::new(move |_: &[NewEvent], _| {
            guard.write(StoreError::is_engine_failure, || {
                std::thread::park();
                Ok(Written::waiting(Vec::new()))
            })
        });
        let (committer, _thread) =
            Committer::start("test", write, 8, Arc::new(Seen::default()), health.clone()).unwrap();
        let started = std::time::Instant::now();
        let err = committer.submit(event()).await.unwrap_err();
        assert!(matches!(err, StoreError::Failed(_)), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        // Later callers are refused at once, without queueing behind the stuck group.
        let started = std::time::Instant::now();
        assert!(matches!(committer.submit(event()).await, Err(StoreError::Failed(_))));
        assert!(started.elapsed() < Duration::from_millis(100));
    }
}
