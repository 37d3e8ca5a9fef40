//! A store's async tasks with an owner: spawned through [`Tasks`], stopped (aborted
//! and waited for) at the store's close or when the store is dropped, so a closed
//! store leaves no task behind to renew a lease or hold a database connection (the
//! PostgreSQL lease renewal and its notification listener run on one).

use std::future::Future;
use std::sync::Mutex;

use tokio::task::JoinHandle;

use crate::lock::lock;

/// The tasks a store started; each one ends at [`Tasks::stop`] or on drop.
#[derive(Default)]
pub(crate) struct Tasks {
    running: Mutex<Vec<JoinHandle<()>>>,
    /// Set by the stop: a task spawned after it is aborted at once.
    stopped: std::sync::atomic::AtomicBool,
}

impl Tasks {
    /// Spawns `task` on the current runtime, owned by this set.
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(task);
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            handle.abort();
            return;
        }
        let mut running = lock(&self.running);
        running.retain(|h| !h.is_finished());
        running.push(handle);
    }

    /// Aborts every task and waits until each has ended (its resources dropped).
    pub(crate) async fn stop(&self) {
        self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        let running = std::mem::take(&mut *lock(&self.running));
        for handle in &running {
            handle.abort();
        }
        for handle in running {
            let _ = handle.await;
        }
    }

    /// How many are running (tests).
    #[cfg(test)]
    pub(crate) fn running(&self) -> usize {
        lock(&self.running).iter().filter(|h| !h.is_finished()).count()
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for handle in lock(&self.running).iter() {
            handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// A task that would run for ever is ended by the stop, and what it held is
    /// dropped by the time the stop returns; one spawned after the stop never runs.
    #[tokio::test]
    async fn the_stop_ends_every_task_and_drops_what_it_held() {
        let tasks = Tasks::default();
        let held = Arc::new(());
        for _ in 0..3 {
            let mine = held.clone();
            tasks.spawn(async move {
                let _mine = mine;
                std::future::pending::<()>().await
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(tasks.running(), 3);
        assert_eq!(Arc::strong_count(&held), 4);
        tasks.stop().await;
        assert_eq!(Arc::strong_count(&held), 1, "every task dropped what it held");
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        tasks.spawn(async move { flag.store(true, std::sync::atomic::Ordering::SeqCst) });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst), "a task after the stop ran");
    }
}
