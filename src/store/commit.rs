//! Group commit: callbacks that arrive together share one write batch and one fsync.
//!
//! Ingress handlers send their event to a single committer thread and wait for its
//! answer. While one group is being written and flushed, the next callbacks queue up
//! in the channel; the committer then takes all of them (up to `max_batch`) as the
//! next group. No timer is involved: under light load a group is one event and is
//! flushed at once, under heavy load groups grow by themselves. The committer is a
//! plain thread because all it does is blocking I/O: no async hop per group.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::{EventId, EventStore, NewEvent};
use crate::config::Durability;
use crate::metrics::Metrics;

/// Why an event was not committed.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum CommitError {
    #[error("store write failed: {0}")]
    Store(String),
    #[error("the committer has stopped")]
    Closed,
}

// `Close` is sent once per process; boxing `Append` would cost an allocation per callback.
#[allow(clippy::large_enum_variant)]
enum Command {
    Append(NewEvent, oneshot::Sender<Result<EventId, CommitError>>),
    /// Make everything written so far durable (shares the group's fsync).
    Flush(oneshot::Sender<Result<(), CommitError>>),
    /// Commit everything queued before this, flush, and stop.
    Close(oneshot::Sender<()>),
}

/// Handle to the committer thread; cheap to clone.
#[derive(Clone)]
pub(crate) struct Committer {
    tx: mpsc::Sender<Command>,
}

/// Settings of the committer.
pub(crate) struct CommitterOptions {
    pub(crate) durability: Durability,
    pub(crate) max_batch: usize,
    /// Notified after each successful group (the dispatcher waits on it).
    pub(crate) committed: Option<Arc<tokio::sync::Notify>>,
}

impl Committer {
    /// Starts the committer thread.
    pub(crate) fn start(
        store: Arc<dyn EventStore>,
        opts: CommitterOptions,
        metrics: Arc<Metrics>,
    ) -> Result<(Self, std::thread::JoinHandle<()>), super::StoreError> {
        let last_id = store.last_event_id()?.map_or(0, EventId::raw);
        // Enough room for every worker's connections without unbounded growth.
        let (tx, rx) = mpsc::channel(opts.max_batch.max(1) * 8);
        let task = Task { store, opts, metrics, rx, last_id };
        let thread = std::thread::Builder::new()
            .name("hookrelay-committer".into())
            .spawn(move || task.run())
            .map_err(|e| super::StoreError::Thread(e.to_string()))?;
        Ok((Self { tx }, thread))
    }

    /// Stores `event` and returns its id once it is as durable as configured.
    pub(crate) async fn submit(&self, event: NewEvent) -> Result<EventId, CommitError> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Command::Append(event, reply)).await.map_err(|_| CommitError::Closed)?;
        answer.await.map_err(|_| CommitError::Closed)?
    }

    /// Waits until everything written to the store before this call is durable.
    /// Concurrent callers share one fsync, with each other and with callbacks.
    pub(crate) async fn flush(&self) -> Result<(), CommitError> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Command::Flush(reply)).await.map_err(|_| CommitError::Closed)?;
        answer.await.map_err(|_| CommitError::Closed)?
    }

    /// Commits what is queued, flushes, and stops the thread.
    pub(crate) async fn close(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Command::Close(ack)).await.is_ok() {
            let _ = done.await;
        }
    }
}

type Waiter = oneshot::Sender<Result<EventId, CommitError>>;

struct Task {
    store: Arc<dyn EventStore>,
    opts: CommitterOptions,
    metrics: Arc<Metrics>,
    rx: mpsc::Receiver<Command>,
    last_id: u64,
}

impl Task {
    fn run(mut self) {
        let mut events: Vec<(EventId, NewEvent)> = Vec::new();
        let mut waiters: Vec<Waiter> = Vec::new();
        let mut flushes: Vec<oneshot::Sender<Result<(), CommitError>>> = Vec::new();
        while let Some(first) = self.rx.blocking_recv() {
            let mut close = None;
            let mut next = Some(first);
            while let Some(cmd) = next.take() {
                match cmd {
                    Command::Append(event, reply) => {
                        events.push((self.assign_id(&event), event));
                        waiters.push(reply);
                    }
                    Command::Flush(reply) => flushes.push(reply),
                    Command::Close(ack) => {
                        close = Some(ack);
                        break;
                    }
                }
                if events.len() + flushes.len() < self.opts.max_batch {
                    next = self.rx.try_recv().ok();
                }
            }
            let mut flushed = false;
            if !events.is_empty() {
                flushed = self.commit(&mut events, &mut waiters)
                    && self.opts.durability == Durability::Durable;
            }
            if !flushes.is_empty() {
                // A durable group has just been flushed; otherwise flush now.
                let result = if flushed { Ok(()) } else { self.store.flush() }
                    .map_err(|e| CommitError::Store(e.to_string()));
                for reply in flushes.drain(..) {
                    let _ = reply.send(result.clone());
                }
            }
            if let Some(ack) = close {
                if let Err(e) = self.store.flush() {
                    tracing::error!(error = %e, "final store flush failed");
                }
                let _ = ack.send(());
                return;
            }
        }
    }

    /// Ids start from the receive time in microseconds and always increase, even if the
    /// clock steps back.
    fn assign_id(&mut self, event: &NewEvent) -> EventId {
        self.last_id = event.meta.received_at_us.max(self.last_id + 1);
        EventId::new(self.last_id)
    }

    /// Writes and (when durable) flushes one group, then answers its waiters. Both
    /// vectors are left empty, their capacity kept for the next group. Returns whether
    /// the group was stored.
    fn commit(&self, events: &mut Vec<(EventId, NewEvent)>, waiters: &mut Vec<Waiter>) -> bool {
        let started = Instant::now();
        let refs: Vec<(EventId, &NewEvent)> = events.iter().map(|(id, e)| (*id, e)).collect();
        let result = self
            .store
            .append(&refs)
            .and_then(|()| match self.opts.durability {
                Durability::Durable => self.store.flush(),
                Durability::Buffered => Ok(()),
            })
            .map_err(|e| CommitError::Store(e.to_string()));
        let m = &self.metrics;
        m.store_commit_duration.observe(started.elapsed().as_secs_f64());
        m.store_commit_batch_size.observe(waiters.len() as f64);
        if let Err(e) = &result {
            m.store_commit_failures.inc();
            tracing::error!(error = %e, events = waiters.len(), "group commit failed");
        }
        if let (Ok(()), Some(notify)) = (&result, &self.opts.committed) {
            notify.notify_one();
        }
        for ((id, event), reply) in events.drain(..).zip(waiters.drain(..)) {
            if result.is_ok() {
                m.event_stored(&event.meta);
            }
            let _ = reply.send(result.clone().map(|()| id));
        }
        result.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::store::{
        EventFilter, EventMeta, EventNameOrigin, EventRecord, EventStatus, StoreError,
    };

    /// Records what it is asked to do; each flush takes a while, like an fsync.
    #[derive(Default)]
    struct SlowStore {
        appended: Mutex<Vec<EventId>>,
        appends: AtomicUsize,
        flushes: AtomicUsize,
    }

    impl EventStore for SlowStore {
        fn append(&self, events: &[(EventId, &NewEvent)]) -> Result<(), StoreError> {
            self.appends.fetch_add(1, Ordering::SeqCst);
            self.appended.lock().unwrap().extend(events.iter().map(|(id, _)| *id));
            Ok(())
        }
        fn flush(&self) -> Result<(), StoreError> {
            std::thread::sleep(Duration::from_millis(20));
            self.flushes.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn last_event_id(&self) -> Result<Option<EventId>, StoreError> {
            Ok(Some(EventId::new(1000)))
        }
        fn event(&self, _: EventId) -> Result<Option<EventRecord>, StoreError> {
            Ok(None)
        }
        fn body(&self, _: EventId) -> Result<Option<Vec<u8>>, StoreError> {
            Ok(None)
        }
        fn list_events(&self, _: &EventFilter) -> Result<Vec<EventRecord>, StoreError> {
            Ok(Vec::new())
        }
        fn inbox_len(&self) -> usize {
            0
        }
        fn size_on_disk(&self) -> Result<u64, StoreError> {
            Ok(0)
        }
    }

    fn event(received_at_us: u64) -> NewEvent {
        NewEvent {
            meta: EventMeta {
                source: "demo".into(),
                event: "ActionCreated".into(),
                event_from: EventNameOrigin::Path,
                received_at_us,
                size: 0,
                content_type: None,
                headers: Vec::new(),
                remote_addr: None,
                status: EventStatus::Received,
                flags: Vec::new(),
                reason: None,
                duplicate_of: None,
                destinations: Vec::new(),
            },
            body: Some(bytes::Bytes::new()),
        }
    }

    fn start(store: Arc<SlowStore>, durability: Durability) -> (Committer, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new().unwrap());
        let opts = CommitterOptions { durability, max_batch: 512, committed: None };
        let (committer, _task) = Committer::start(store, opts, metrics.clone()).unwrap();
        (committer, metrics)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_submits_share_flushes() {
        let store = Arc::new(SlowStore::default());
        let (committer, metrics) = start(store.clone(), Durability::Durable);
        let submits = (0..64).map(|_| {
            let c = committer.clone();
            tokio::spawn(async move { c.submit(event(5)).await })
        });
        let mut ids = Vec::new();
        for s in submits.collect::<Vec<_>>() {
            ids.push(s.await.unwrap().unwrap());
        }
        let flushes = store.flushes.load(Ordering::SeqCst);
        assert!(flushes < 16, "64 concurrent events took {flushes} flushes");
        assert_eq!(flushes, store.appends.load(Ordering::SeqCst), "one flush per group");
        // Every acknowledged id was appended, and ids continue after the stored ones.
        let appended = store.appended.lock().unwrap().clone();
        ids.sort();
        let mut sorted = appended.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        assert!(ids[0] > EventId::new(1000));
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids are unique");
        assert!(metrics
            .render()
            .contains("hookrelay_events_stored_total{event=\"ActionCreated\",source=\"demo\"} 64"));
    }

    #[tokio::test]
    async fn ids_increase_even_when_the_clock_steps_back() {
        let store = Arc::new(SlowStore::default());
        let (committer, _) = start(store, Durability::Buffered);
        let a = committer.submit(event(5_000_000)).await.unwrap();
        let b = committer.submit(event(4_000_000)).await.unwrap();
        let c = committer.submit(event(6_000_000)).await.unwrap();
        assert_eq!(a, EventId::new(5_000_000));
        assert_eq!(b, EventId::new(5_000_001));
        assert_eq!(c, EventId::new(6_000_000));
    }

    #[tokio::test]
    async fn buffered_mode_acknowledges_without_flushing_and_close_flushes() {
        let store = Arc::new(SlowStore::default());
        let (committer, _) = start(store.clone(), Durability::Buffered);
        committer.submit(event(1)).await.unwrap();
        committer.submit(event(2)).await.unwrap();
        assert_eq!(store.flushes.load(Ordering::SeqCst), 0);
        committer.close().await;
        assert_eq!(store.flushes.load(Ordering::SeqCst), 1, "close flushes once");
        assert!(matches!(committer.submit(event(3)).await, Err(CommitError::Closed)));
    }
}
