//! Fail-stop for a store whose writes fail or stop returning.
//!
//! A write error from an embedded engine (ENOSPC, EIO) leaves it in a state no later
//! write should build on: sled, for one, keeps a sticky global error after a failed
//! log write, and a write can also block for ever inside its flush (seen on a full
//! tmpfs). Either way the store is [failed](Health::fail) at once:
//! - every later write, and every caller still waiting on one, gets
//!   [`StoreError::Failed`] (the ingress closes those callbacks' connections; nothing
//!   unacknowledged is answered 200);
//! - the [`StoreObserver`] hears of it, and the daemon turns unready and exits non-zero
//!   so that systemd or Kubernetes restarts the relay on a freshly opened store.
//!
//! Reopening in-process is not attempted: a write blocked in the engine cannot be
//! cancelled, and what an engine recovers at open is exactly what was durable.
//!
//! "Stops returning" is the watchdog's job: every write registers its start and its
//! return; a thread looks every [`TICK`] and fails the store once writes have waited
//! longer than the configured bound (`storage.write_timeout`) with none returning.
//! For the embedded engines ([`Writers::OneAtATime`]) that is measured from the later
//! of the oldest write's start and the last return: a write queued behind others (redb
//! takes one writer at a time, and its lock is not fair) while they keep returning is
//! a slow store, not a hung one; PostgreSQL's writes go side by side, and the oldest
//! one's wait is the measure. That distinction was
//! measured: a 64-connection flood at 3.5 M events on redb failed the store on a write
//! that waited 10.1 s while the rest went on.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{StoreError, StoreObserver, Ticker};
use crate::lock::lock;

/// How often the watchdog looks at the writes in flight.
const TICK: Duration = Duration::from_millis(250);

/// See the module docs; shared by a backend's write paths.
pub(crate) struct Health {
    backend: &'static str,
    failed: OnceLock<String>,
    /// Wakes async callers waiting on a write that will never answer.
    failed_tx: watch::Sender<bool>,
    /// The writes in flight and the last return.
    inflight: Mutex<InFlight>,
    next_ticket: AtomicU64,
    timeout: Duration,
    writers: Writers,
    observer: Arc<dyn StoreObserver>,
    /// Shared by every write, taken whole by [`Self::exclusive`] (a backup of an engine
    /// that takes no snapshot across trees). Taken before a write is in flight: a write
    /// waiting on it is not a stalled one.
    gate: std::sync::RwLock<()>,
}

/// Start of each write in flight, by ticket, and when a write last returned.
#[derive(Default)]
struct InFlight {
    started: BTreeMap<u64, Instant>,
    last_return: Option<Instant>,
}

/// How a backend's writes wait on each other, which says what a stall is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Writers {
    /// One at a time (the embedded engines: redb's single writer, whose lock is not
    /// fair): a write queued while others return is slow, not hung.
    OneAtATime,
    /// Each on its own connection (PostgreSQL's pool): one call stuck while others
    /// return is caught all the same.
    Concurrent,
}

/// How long writes have waited with none returning, at `now` (`Writers::OneAtATime`:
/// from the later of the oldest write's start and the last return), or how long the
/// oldest has waited (`Writers::Concurrent`). `None` with no write in flight.
fn stalled_for(
    writers: Writers,
    oldest: Option<Instant>,
    last_return: Option<Instant>,
    now: Instant,
) -> Option<Duration> {
    let oldest = oldest?;
    let since = match (writers, last_return) {
        (Writers::OneAtATime, Some(returned)) => returned.max(oldest),
        _ => oldest,
    };
    Some(now.saturating_duration_since(since))
}

/// A write in flight; dropping it ends it.
pub(crate) struct Ticket<'a> {
    health: &'a Health,
    id: u64,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut inflight = lock(&self.health.inflight);
        inflight.started.remove(&self.id);
        inflight.last_return = Some(Instant::now());
    }
}

impl Health {
    /// A healthy store whose writes may take up to `timeout`.
    pub(crate) fn new(
        backend: &'static str,
        timeout: Duration,
        writers: Writers,
        observer: Arc<dyn StoreObserver>,
    ) -> Arc<Self> {
        Arc::new(Self {
            backend,
            failed: OnceLock::new(),
            failed_tx: watch::channel(false).0,
            inflight: Mutex::new(InFlight::default()),
            next_ticket: AtomicU64::new(0),
            timeout,
            writers,
            observer,
            gate: std::sync::RwLock::new(()),
        })
    }

    /// Starts the watchdog thread, owned by the returned [`Ticker`] (the store keeps it
    /// and stops it at close); it also ends with the last handle to `health`, or once
    /// the store failed.
    pub(crate) fn start_watchdog(health: &Arc<Self>) -> Result<Ticker, StoreError> {
        let weak: Weak<Self> = Arc::downgrade(health);
        Ticker::start("hookrelay-store-watchdog", TICK, move || {
            let Some(health) = weak.upgrade() else { return ControlFlow::Break(()) };
            if health.failed.get().is_some() {
                return ControlFlow::Break(());
            }
            health.check_overdue(Instant::now());
            ControlFlow::Continue(())
        })
        .map_err(|e| StoreError::Task(format!("cannot start the store watchdog: {e}")))
    }

    /// Fails the store if writes have waited longer than the bound at `now` with none
    /// returning.
    fn check_overdue(&self, now: Instant) {
        let (waiting, stalled) = {
            let inflight = lock(&self.inflight);
            let oldest = inflight.started.values().min().copied();
            (inflight.started.len(), stalled_for(self.writers, oldest, inflight.last_return, now))
        };
        if let Some(waited) = stalled.filter(|w| *w > self.timeout) {
            self.fail(format!(
                "no {} write has returned for {:.1} s, {waiting} waiting (storage.write_timeout \
                 is {:?}): the disk is full, failing or hung",
                self.backend,
                waited.as_secs_f64(),
                self.timeout
            ));
        }
    }

    /// Marks the store failed for good, for `reason`; only the first call counts.
    pub(crate) fn fail(&self, reason: String) {
        let mut first = false;
        let reason = self.failed.get_or_init(|| {
            first = true;
            reason
        });
        if first {
            // The observer logs and counts it; first (readiness goes false) (readiness goes false), then the waiters are freed:
            // by the time a callback's connection is closed, the relay is unready.
            self.observer.failed(reason);
            self.failed_tx.send_replace(true);
        }
    }

    /// Reports trouble the store worked around to its observer (see
    /// [`StoreObserver::trouble`]).
    pub(crate) fn trouble(&self, kind: super::Trouble, what: &str, error: &dyn std::fmt::Display) {
        self.observer.trouble(kind, what, error);
    }

    /// Why the store failed, if it has.
    pub(crate) fn failure(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }

    /// `Err` once the store has failed.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        match self.failed.get() {
            Some(reason) => Err(StoreError::Failed(reason.clone())),
            None => Ok(()),
        }
    }

    /// Registers a write in flight for the watchdog.
    pub(crate) fn begin(&self) -> Ticket<'_> {
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        lock(&self.inflight).started.insert(id, Instant::now());
        Ticket { health: self, id }
    }

    /// Runs the blocking write `f` under the watchdog. A failed write fails the store
    /// when `fatal` says the error is the backend's own (not a record we could not
    /// encode, say).
    pub(crate) fn write<T>(
        &self,
        fatal: impl Fn(&StoreError) -> bool,
        f: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let _open = self.gate.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.check()?;
        let ticket = self.begin();
        let result = f();
        drop(ticket);
        if let Err(e) = &result {
            if fatal(e) {
                self.fail(format!("a {} write failed: {e}", self.backend));
            }
        }
        // A write that returned after the store failed (the watchdog gave up on it)
        // does not count: its callers were already told it failed.
        self.check()?;
        result
    }

    /// Runs `f` with every write kept out (they wait, not in flight, until it returns):
    /// a read of every tree that no write changes meanwhile, on an engine that takes no
    /// snapshot of its own.
    pub(crate) fn exclusive<T>(&self, f: impl FnOnce() -> T) -> T {
        let _closed = self.gate.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        f()
    }

    /// Waits for `work`, or returns [`StoreError::Failed`] as soon as the store fails:
    /// a caller never waits on a write the watchdog gave up on.
    pub(crate) async fn or_failed<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.check()?;
        let mut failed = self.failed_tx.subscribe();
        tokio::select! {
            biased;
            result = work => result,
            _ = failed.wait_for(|f| *f) => Err(StoreError::Failed(
                self.failure().unwrap_or("the store failed").to_owned(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::store::EventMeta;

    #[derive(Default)]
    struct Seen(AtomicUsize, Mutex<String>);

    impl StoreObserver for Seen {
        fn group(&self, _: usize, _: Duration, _: bool) {}
        fn stored(&self, _: &EventMeta) {}
        fn failed(&self, reason: &str) {
            self.0.fetch_add(1, Ordering::SeqCst);
            *lock(&self.1) = reason.to_owned();
        }
        fn trouble(&self, _: crate::store::Trouble, _: &str, _: &dyn std::fmt::Display) {}
    }

    #[test]
    fn a_fatal_error_fails_the_store_once_and_later_writes_refuse() {
        let seen = Arc::new(Seen::default());
        let health =
            Health::new("test", Duration::from_secs(10), Writers::OneAtATime, seen.clone());
        assert_eq!(health.write(|_| true, || Ok(1)).unwrap(), 1);
        // Not fatal: an encoding problem of one record.
        let not_fatal = health.write(|_| false, || Err::<(), _>(StoreError::Injected("bad")));
        assert!(not_fatal.is_err());
        assert!(health.failure().is_none());
        let fatal = health.write(|_| true, || Err::<(), _>(StoreError::Injected("ENOSPC")));
        assert!(fatal.unwrap_err().to_string().contains("ENOSPC"));
        assert!(health.failure().unwrap().contains("ENOSPC"));
        let mut ran = false;
        let later = health.write(
            |_| true,
            || {
                ran = true;
                Ok(())
            },
        );
        assert!(!ran, "no write after the store failed");
        assert!(matches!(later, Err(StoreError::Failed(_))));
        health.fail("again".into());
        assert_eq!(seen.0.load(Ordering::SeqCst), 1, "reported once");
        assert!(lock(&seen.1).contains("ENOSPC"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_watchdog_fails_a_hung_write_and_frees_its_waiters() {
        let seen = Arc::new(Seen::default());
        let health =
            Health::new("test", Duration::from_millis(300), Writers::OneAtATime, seen.clone());
        let _watchdog = Health::start_watchdog(&health).unwrap();
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        let writer = health.clone();
        // A write that blocks until released, like sled's flush on a full tmpfs.
        let hung = tokio::task::spawn_blocking(move || {
            writer.write(
                |_| true,
                || {
                    let _ = blocked.recv();
                    Ok(())
                },
            )
        });
        let started = Instant::now();
        let waited = health
            .or_failed(async { hung.await.map_err(|e| StoreError::Task(e.to_string()))? })
            .await;
        assert!(matches!(waited, Err(StoreError::Failed(_))), "{waited:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert!(health.failure().unwrap().contains("has returned for"));
        assert_eq!(seen.0.load(Ordering::SeqCst), 1);
        // Released late, the write still reports the failure, not its own success.
        let _ = release.send(());
    }

    /// An embedded engine's health, bounded by `timeout`, nobody listening.
    fn one_writer(timeout: Duration) -> Arc<Health> {
        Health::new("test", timeout, Writers::OneAtATime, Arc::new(Seen::default()))
    }

    #[test]
    fn a_write_queued_behind_writes_that_return_is_not_overdue() {
        let health = one_writer(Duration::from_secs(10));
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // One write waits from t0; others take their turn and return, the last at t0 + 20 s.
        {
            let mut inflight = lock(&health.inflight);
            inflight.started.insert(u64::MAX, t0);
            inflight.last_return = Some(t0 + s(20));
        }
        health.check_overdue(t0 + s(25));
        assert!(health.failure().is_none(), "waiting 25 s behind writes that return: slow");
        // Then nothing returns for longer than the bound: hung.
        health.check_overdue(t0 + s(31));
        assert!(health.failure().unwrap().contains("1 waiting"), "{:?}", health.failure());
    }

    #[test]
    fn the_stall_runs_from_the_later_of_the_oldest_start_and_the_last_return() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let one = Writers::OneAtATime;
        assert_eq!(stalled_for(one, None, Some(t0), t0 + s(60)), None, "nothing in flight");
        assert_eq!(stalled_for(one, Some(t0), None, t0 + s(5)), Some(s(5)));
        // A return before the oldest write started does not move the start.
        assert_eq!(stalled_for(one, Some(t0 + s(10)), Some(t0), t0 + s(15)), Some(s(5)));
        // A return after it does.
        assert_eq!(stalled_for(one, Some(t0), Some(t0 + s(20)), t0 + s(25)), Some(s(5)));
        // With writes side by side, the oldest one's wait is the stall, whatever returned.
        let side = Writers::Concurrent;
        assert_eq!(stalled_for(side, Some(t0), Some(t0 + s(20)), t0 + s(25)), Some(s(25)));
    }

    #[test]
    fn a_write_within_the_bound_is_not_overdue() {
        let health = one_writer(Duration::from_secs(60));
        let _ticket = health.begin();
        health.check_overdue(Instant::now());
        assert!(health.failure().is_none());
        health.check_overdue(Instant::now() + Duration::from_secs(61));
        assert!(health.failure().is_some());
    }
}
