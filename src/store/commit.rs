//! Group commit: callbacks that arrive together share one store write (and with it,
//! one fsync or one database commit).
//!
//! Ingress handlers send their event to the committer task and wait for its answer.
//! While one group is being written, the next callbacks queue up in the channel; the
//! committer then takes all of them (up to `max_batch`) as the next group. No timer is
//! involved: under light load a group is one event and is written at once, under heavy
//! load groups grow by themselves. How durable a written group is, is the backend's
//! business ([`Store::append`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::{EventId, EventMeta, NewEvent, SharedStore};

/// Why an event was not committed.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum CommitError {
    #[error("store write failed: {0}")]
    Store(String),
    #[error("the committer has stopped")]
    Closed,
}

/// What the committer reports upward (metrics, logs), so that the store depends on
/// nothing above it.
pub(crate) trait CommitObserver: Send + Sync + 'static {
    /// A group was written (`ok`) or failed, after `took`.
    fn group(&self, size: usize, took: Duration, ok: bool);
    /// One event of a written group.
    fn stored(&self, meta: &EventMeta);
}

// `Close` is sent once per process; boxing `Append` would cost an allocation per callback.
#[allow(clippy::large_enum_variant)]
enum Command {
    Append(NewEvent, oneshot::Sender<Result<EventId, CommitError>>),
    /// Commit everything queued before this, and stop.
    Close(oneshot::Sender<()>),
}

/// Handle to the committer task; cheap to clone.
#[derive(Clone)]
pub(crate) struct Committer {
    tx: mpsc::Sender<Command>,
}

/// Settings of the committer.
pub(crate) struct CommitterOptions {
    pub(crate) max_batch: usize,
    /// Notified after each successful group (the dispatcher waits on it).
    pub(crate) committed: Option<Arc<tokio::sync::Notify>>,
}

impl Committer {
    /// Starts the committer task on the current runtime.
    pub(crate) fn start(
        store: SharedStore,
        opts: CommitterOptions,
        observer: Arc<dyn CommitObserver>,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        // Enough room for every worker's connections without unbounded growth.
        let (tx, rx) = mpsc::channel(opts.max_batch.max(1) * 8);
        let task = Task { store, opts, observer, rx };
        (Self { tx }, tokio::spawn(task.run()))
    }

    /// Stores `event` and returns its id once it is as durable as configured.
    pub(crate) async fn submit(&self, event: NewEvent) -> Result<EventId, CommitError> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Command::Append(event, reply)).await.map_err(|_| CommitError::Closed)?;
        answer.await.map_err(|_| CommitError::Closed)?
    }

    /// Commits what is queued and stops the task.
    pub(crate) async fn close(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Command::Close(ack)).await.is_ok() {
            let _ = done.await;
        }
    }
}

type Waiter = oneshot::Sender<Result<EventId, CommitError>>;

struct Task {
    store: SharedStore,
    opts: CommitterOptions,
    observer: Arc<dyn CommitObserver>,
    rx: mpsc::Receiver<Command>,
}

impl Task {
    async fn run(mut self) {
        while let Some(first) = self.rx.recv().await {
            let (mut events, mut waiters) = (Vec::new(), Vec::new());
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
                if events.len() < self.opts.max_batch {
                    next = self.rx.try_recv().ok();
                }
            }
            if !events.is_empty() {
                self.commit(events, waiters).await;
            }
            if let Some(ack) = close {
                let _ = ack.send(());
                return;
            }
        }
    }

    /// Writes one group, then answers its waiters.
    async fn commit(&self, events: Vec<NewEvent>, waiters: Vec<Waiter>) {
        let started = Instant::now();
        let size = events.len();
        let metas: Vec<EventMeta> = events.iter().map(|e| e.meta.clone()).collect();
        let result = self.store.append(events).await;
        let ok = result.is_ok();
        self.observer.group(size, started.elapsed(), ok);
        match result {
            Ok(ids) => {
                if let Some(notify) = &self.opts.committed {
                    notify.notify_one();
                }
                for ((id, meta), reply) in ids.into_iter().zip(&metas).zip(waiters) {
                    self.observer.stored(meta);
                    let _ = reply.send(Ok(id));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, events = size, "group commit failed");
                let e = CommitError::Store(e.to_string());
                for reply in waiters {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::{EventNameOrigin, EventStatus, Store};

    /// Counts groups and stored events.
    #[derive(Default)]
    struct Seen {
        groups: Mutex<Vec<(usize, bool)>>,
        stored: AtomicUsize,
    }

    impl CommitObserver for Seen {
        fn group(&self, size: usize, _took: Duration, ok: bool) {
            self.groups.lock().unwrap().push((size, ok));
        }
        fn stored(&self, _meta: &EventMeta) {
            self.stored.fetch_add(1, Ordering::SeqCst);
        }
    }

    pub(crate) fn event(received_at_us: u64) -> NewEvent {
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_submits_are_grouped_and_get_unique_ids() {
        let store = MemoryStore::default();
        let seen = Arc::new(Seen::default());
        let opts = CommitterOptions { max_batch: 512, committed: None };
        let (committer, _task) = Committer::start(Arc::new(store.clone()), opts, seen.clone());
        let submits: Vec<_> = (0..64)
            .map(|_| {
                let c = committer.clone();
                tokio::spawn(async move { c.submit(event(5)).await })
            })
            .collect();
        let mut ids = Vec::new();
        for s in submits {
            ids.push(s.await.unwrap().unwrap());
        }
        ids.sort();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids are unique");
        assert_eq!(seen.stored.load(Ordering::SeqCst), 64);
        let groups = seen.groups.lock().unwrap().clone();
        assert_eq!(groups.iter().map(|g| g.0).sum::<usize>(), 64);
        assert!(groups.iter().all(|g| g.1));
        assert_eq!(store.inbox_len().await.unwrap(), 64, "every acknowledged id was stored");
        committer.close().await;
        assert!(matches!(committer.submit(event(3)).await, Err(CommitError::Closed)));
    }
}
