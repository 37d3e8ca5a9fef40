//! Async tasks with an owner: spawned through [`Tasks`], stopped (aborted, or let end
//! within a bound first: [`Tasks::finish`]) and waited for. A store's, at its close or
//! when it is dropped, so a closed store leaves no task behind to renew a lease or
//! hold a database connection (the PostgreSQL lease renewal and its notification
//! listener run on one); the admin's backups, at the relay's stop.

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

    /// Aborts every task and waits until each has ended (its resources dropped):
    /// [`Tasks::finish`] with no time to end by itself.
    pub(crate) async fn stop(&self) {
        self.finish(std::time::Duration::ZERO).await;
    }

    /// Lets every task end by itself within `within` (the caller has told them to),
    /// then aborts those left and waits until each has ended; a task spawned after it
    /// is aborted at once. Returns how many were running when it was called.
    pub(crate) async fn finish(&self, within: std::time::Duration) -> usize {
        self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        let running: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&self.running))
            .into_iter()
            .filter(|h| !h.is_finished())
            .collect();
        let ended = running.len();
        let deadline = tokio::time::Instant::now() + within;
        for mut handle in running {
            if tokio::time::timeout_at(deadline, &mut handle).await.is_err() {
                handle.abort();
                let _ = handle.await;
            }
        }
        ended
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

    /// `finish` lets a task that ends by itself within the bound finish its work, and
    /// aborts one that does not; it counts both.
    #[tokio::test]
    async fn finish_lets_tasks_end_within_the_bound_and_aborts_the_rest() {
        let tasks = Tasks::default();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = done.clone();
        tasks.spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let held = Arc::new(());
        let mine = held.clone();
        tasks.spawn(async move {
            let _mine = mine;
            std::future::pending::<()>().await
        });
        assert_eq!(tasks.finish(Duration::from_secs(1)).await, 2);
        assert!(done.load(std::sync::atomic::Ordering::SeqCst), "cut before it ended");
        assert_eq!(Arc::strong_count(&held), 1, "the endless one was not aborted");
    }
}
