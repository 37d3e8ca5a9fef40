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
//!
//! A backend may also hand the committer *riders* ([`Committer::ride`]): writes that
//! can wait a little (the embedded store's attempt records), written in the next
//! group's write, its transaction and its fsync. A rider waits beside the channel,
//! without waking the committer, when a group is expected within [`RECORD_LINGER`]
//! ([`Cadence`]); when none is, or none came by then, it wakes the committer, which
//! writes it alone.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::cadence::{Cadence, RECORD_LINGER};
use super::{EventId, Health, NewEvent, StoreError, StoreObserver};
use crate::lock::lock;

type Reply = oneshot::Sender<Result<EventId, StoreError>>;

/// The rider of a backend that has none (PostgreSQL): never made.
pub(crate) enum NoRider {}

// `Close` is sent once per process; boxing `Append` would cost an allocation per callback.
#[allow(clippy::large_enum_variant)]
enum Command {
    Append(NewEvent, Reply),
    /// Riders wait (see the module docs): write them, with a group or alone.
    Riders,
    /// Commit everything queued before this, and stop.
    Close(oneshot::Sender<()>),
}

/// What the committer shares with its handles beside the channel.
struct Shared<R> {
    /// The riders waiting for the next write; `None` once the committer stopped.
    riders: Mutex<Option<Vec<R>>>,
    /// When the groups come: whether a rider waits for the next.
    groups: Mutex<Cadence>,
}

/// Handle to the committer thread; cheap to clone.
pub(crate) struct Committer<R: Send + 'static = NoRider> {
    tx: mpsc::Sender<Command>,
    shared: Arc<Shared<R>>,
    backend: &'static str,
    /// Callers stop waiting as soon as the store fails (a group that never returns).
    health: Arc<Health>,
}

impl<R: Send + 'static> Clone for Committer<R> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            shared: self.shared.clone(),
            backend: self.backend,
            health: self.health.clone(),
        }
    }
}

/// Writes one group, and the riders that came with it. Told whether the group is
/// *quiet* ([`quiet`]): a few callbacks with none waiting behind them, which a write
/// may dispatch along with storing them (the embedded store, `store::CommitDispatch`).
/// The group may be empty when riders came alone. The write answers its riders
/// itself, whatever becomes of the group.
pub(crate) type WriteGroup<R = NoRider> =
    Box<dyn FnMut(&[NewEvent], bool, Vec<R>) -> Result<Written, StoreError> + Send + 'static>;

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

impl<R: Send + 'static> Committer<R> {
    /// Starts the committer thread over `write`.
    pub(crate) fn start(
        backend: &'static str,
        write: WriteGroup<R>,
        max_batch: usize,
        observer: Arc<dyn StoreObserver>,
        health: Arc<Health>,
    ) -> Result<(Self, std::thread::JoinHandle<()>), StoreError> {
        // Enough room for every worker's connections without unbounded growth.
        let (tx, rx) = mpsc::channel(max_batch.max(1) * 8);
        let shared = Arc::new(Shared {
            riders: Mutex::new(Some(Vec::new())),
            groups: Mutex::new(Cadence::default()),
        });
        let task =
            Task { write, max_batch: max_batch.max(1), observer, rx, shared: shared.clone() };
        let thread = std::thread::Builder::new()
            .name("hookrelay-committer".into())
            .spawn(move || task.run())
            .map_err(|e| StoreError::Task(format!("cannot start the committer thread: {e}")))?;
        Ok((Self { tx, shared, backend, health }, thread))
    }

    fn stopped(&self) -> StoreError {
        StoreError::Backend { backend: self.backend, message: "the store is closed".into() }
    }

    /// Stores `event` (with whatever arrives meanwhile) and returns its id once the
    /// group is written as durably as the write makes it. Fails at once if the store
    /// has failed, and as soon as it fails while this waits.
    pub(crate) async fn submit(&self, event: NewEvent) -> Result<EventId, StoreError> {
        self.health
            .or_failed(async {
                let (reply, answer) = oneshot::channel();
                self.tx.send(Command::Append(event, reply)).await.map_err(|_| self.stopped())?;
                answer.await.map_err(|_| self.stopped())?
            })
            .await
    }

    /// Hands `rider` to the committer, to be written with the next group (see the
    /// module docs), and returns what the write answers on `answer`, the rider's own
    /// way to be answered. Fails if the committer has stopped.
    pub(crate) async fn ride<T>(
        &self,
        rider: R,
        mut answer: oneshot::Receiver<T>,
    ) -> Result<T, StoreError> {
        let now = Instant::now();
        let linger_until = {
            let mut riders = lock(&self.shared.riders);
            riders.as_mut().ok_or_else(|| self.stopped())?.push(rider);
            lock(&self.shared.groups).linger_until(now, RECORD_LINGER)
        };
        if let Some(until) = linger_until {
            let waited = tokio::time::timeout_at(until.into(), &mut answer).await;
            if let Ok(answered) = waited {
                return answered.map_err(|_| self.stopped());
            }
        }
        // No group expected, or none came in time: the committer writes it now.
        self.tx.send(Command::Riders).await.map_err(|_| self.stopped())?;
        answer.await.map_err(|_| self.stopped())
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

/// What the committer has taken from its channel for the next write.
struct Next {
    events: Vec<NewEvent>,
    waiters: Vec<Reply>,
    close: Option<oneshot::Sender<()>>,
}

impl Next {
    fn take(&mut self, cmd: Command) {
        match cmd {
            Command::Append(event, reply) => {
                self.events.push(event);
                self.waiters.push(reply);
            }
            // Only a wake-up: every write takes the riders waiting.
            Command::Riders => {}
            Command::Close(ack) => self.close = Some(ack),
        }
    }
}

struct Task<R> {
    write: WriteGroup<R>,
    max_batch: usize,
    observer: Arc<dyn StoreObserver>,
    rx: mpsc::Receiver<Command>,
    shared: Arc<Shared<R>>,
}

impl<R: Send + 'static> Task<R> {
    fn run(mut self) {
        let mut next = Next { events: Vec::new(), waiters: Vec::new(), close: None };
        while let Some(first) = self.rx.blocking_recv() {
            next.take(first);
            self.take_queued(&mut next);
            if !next.events.is_empty() {
                lock(&self.shared.groups).noted(Instant::now());
            }
            self.commit(&mut next);
            if let Some(ack) = next.close.take() {
                self.stop();
                let _ = ack.send(());
                return;
            }
        }
        self.stop();
    }

    /// No rider is taken from now on: the last ones written, any later one refused.
    fn stop(&mut self) {
        let last = lock(&self.shared.riders).take().unwrap_or_default();
        if !last.is_empty() {
            self.write_group(&mut Vec::new(), &mut Vec::new(), last);
        }
    }

    /// Takes what is queued, up to a group of `max_batch` or a close.
    fn take_queued(&mut self, next: &mut Next) {
        while next.events.len() < self.max_batch && next.close.is_none() {
            match self.rx.try_recv() {
                Ok(cmd) => next.take(cmd),
                Err(_) => break,
            }
        }
    }

    /// Writes the group taken (quiet or not, see [`quiet`]) with the riders waiting,
    /// if either there is.
    fn commit(&mut self, next: &mut Next) {
        let riders = lock(&self.shared.riders).as_mut().map(std::mem::take).unwrap_or_default();
        if !next.events.is_empty() || !riders.is_empty() {
            self.write_group(&mut next.events, &mut next.waiters, riders);
        }
    }

    /// Writes one group with `riders`, then answers the group's waiters, and tells
    /// the observer when events wait for the dispatcher. The vectors are left empty,
    /// their capacity kept for the next.
    fn write_group(
        &mut self,
        events: &mut Vec<NewEvent>,
        waiters: &mut Vec<Reply>,
        riders: Vec<R>,
    ) {
        let (started, size) = (Instant::now(), events.len());
        let result = (self.write)(events, quiet(size, !self.rx.is_empty()), riders);
        if size == 0 {
            // Riders alone: no group to count or answer.
            if let Err(e) = result {
                tracing::error!(error = %e, "writing attempt records alone failed");
            }
            return;
        }
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
#[path = "commit_tests.rs"]
mod tests;
