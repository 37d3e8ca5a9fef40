//! A store thread with an owner: it does its work every period until its owner stops
//! it (or drops it), and the stop wakes it at once and waits for it to end. The
//! store's write watchdog and redb's periodic flush run on one each, so that closing
//! or dropping a store leaves no thread of it behind (`daemon/tests.rs` counts).

use std::ops::ControlFlow;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::lock::lock;

/// An owned periodic thread; stopped and joined on [`Ticker::stop`] or drop.
#[must_use = "dropping a Ticker stops its thread"]
pub(crate) struct Ticker {
    stopped: Arc<(Mutex<bool>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Ticker {
    /// Starts thread `name`, running `tick` every `every` until stopped or until `tick`
    /// says to break.
    pub(crate) fn start(
        name: &str,
        every: Duration,
        mut tick: impl FnMut() -> ControlFlow<()> + Send + 'static,
    ) -> std::io::Result<Self> {
        let stopped = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stopped.clone();
        let thread = std::thread::Builder::new().name(name.to_owned()).spawn(move || loop {
            let (mutex, wake) = &*flag;
            let guard = lock(mutex);
            let (guard, _) = wake
                .wait_timeout_while(guard, every, |stopped| !*stopped)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if *guard {
                return;
            }
            drop(guard);
            if tick().is_break() {
                return;
            }
        })?;
        Ok(Self { stopped, thread: Mutex::new(Some(thread)) })
    }

    /// Stops the thread and waits for it to end (at once, unless a tick is running:
    /// then after it). Called on its own thread, it only asks.
    pub(crate) fn stop(&self) {
        let (mutex, wake) = &*self.stopped;
        *lock(mutex) = true;
        wake.notify_all();
        let Some(thread) = lock(&self.thread).take() else { return };
        if thread.thread().id() == std::thread::current().id() {
            return;
        }
        let _ = thread.join();
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    use super::*;

    #[test]
    fn it_ticks_until_stopped_and_the_stop_does_not_wait_for_the_period() {
        let ticks = Arc::new(AtomicUsize::new(0));
        let counted = ticks.clone();
        let ticker = Ticker::start("test-ticker", Duration::from_millis(10), move || {
            counted.fetch_add(1, Ordering::SeqCst);
            ControlFlow::Continue(())
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        ticker.stop();
        let seen = ticks.load(Ordering::SeqCst);
        assert!(seen >= 3, "ticked {seen} times in 100 ms");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(ticks.load(Ordering::SeqCst), seen, "a tick after the stop");
        // A long period: the stop wakes it, it does not sleep it out.
        let slow =
            Ticker::start("test-slow", Duration::from_secs(3600), || ControlFlow::Continue(()))
                .unwrap();
        let started = Instant::now();
        drop(slow);
        assert!(started.elapsed() < Duration::from_secs(5), "the drop waited the period");
    }
}
