//! A long task on a thread of its own, which runs the embedded store's calls itself
//! ([`run_calls_here`]) instead of handing each to the blocking pool: for a task whose
//! every step is a store call (dispatch), the hop there and back is most of a step's
//! cost at a gentle rate (BENCHMARKS.md, "Dispatch on a thread of its own"). The task's
//! timers and sockets stay with the runtime, and so do the tasks it spawns.

use std::future::Future;

use tokio::task::JoinHandle;

use super::run_calls_here;

/// Runs `task` on a new thread named `name`; the handle ends as the task does, a panic
/// included (as `tokio::spawn`'s would). A thread stuck in a store call on a disk that
/// hangs is not waited for: the process's exit does not join it.
pub(crate) fn spawn(
    name: &str,
    task: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    let runtime = tokio::runtime::Handle::current();
    let (done, finished) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new().name(name.to_owned()).spawn(move || {
        run_calls_here();
        let run = std::panic::AssertUnwindSafe(|| runtime.block_on(task));
        let _ = done.send(std::panic::catch_unwind(run));
    })?;
    Ok(tokio::spawn(async move {
        let ended = finished.await;
        // It has sent its last word: the join is immediate.
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        if let Ok(Err(panic)) = ended {
            std::panic::resume_unwind(panic);
        }
    }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The task runs on its named thread, with the runtime's timers; the handle ends
    /// as it does, and a panic reaches the handle as a panic (the supervisor says so).
    #[tokio::test]
    async fn the_handle_ends_as_the_task_does_a_panic_included() {
        let named = spawn("hookrelay-test", async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(std::thread::current().name(), Some("hookrelay-test"));
        })
        .unwrap();
        named.await.unwrap();
        let panicked = spawn("hookrelay-test", async { panic!("the task's own words") }).unwrap();
        let err = panicked.await.unwrap_err();
        assert!(err.is_panic(), "{err}");
        let payload = err.into_panic();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"the task's own words"));
    }
}
