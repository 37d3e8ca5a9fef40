//! Waiting for the signal to stop, and for what the stopped parts shared to be let go of.

/// Resolves with the name of the first SIGTERM or SIGINT received.
pub(crate) async fn signal() -> std::io::Result<&'static str> {
    Ok(signals()?.await)
}

/// Installs the handlers of SIGTERM and SIGINT now (an error here is the caller's to
/// report), and resolves with the name of the first that comes.
pub(crate) fn signals() -> std::io::Result<impl std::future::Future<Output = &'static str>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

/// Tells background tasks (dispatcher, delivery workers, purgers) to stop. Cloned
/// into each task; the daemon triggers it once.
#[derive(Clone)]
pub(crate) struct Stop(tokio::sync::watch::Receiver<Option<&'static str>>);

/// The daemon's side of [`Stop`].
pub(crate) struct StopTrigger(tokio::sync::watch::Sender<Option<&'static str>>);

impl StopTrigger {
    pub(crate) fn new() -> (Self, Stop) {
        let (tx, rx) = tokio::sync::watch::channel(None);
        (Self(tx), Stop(rx))
    }

    pub(crate) fn stop(&self) {
        self.stop_for("stop requested");
    }

    /// Requests the stop, saying why (a signal's name), unless one was requested.
    pub(crate) fn stop_for(&self, reason: &'static str) {
        self.0.send_if_modified(|r| r.is_none() && r.replace(reason).is_none());
    }
}

impl Stop {
    pub(crate) fn is_stopped(&self) -> bool {
        self.0.borrow().is_some()
    }

    /// Resolves once stopping was requested (or the trigger is gone).
    pub(crate) async fn wait(&mut self) {
        let _ = self.0.wait_for(Option::is_some).await;
    }

    /// Why stopping was requested, once it was.
    pub(crate) fn reason(&self) -> Option<&'static str> {
        *self.0.borrow()
    }
}

/// Waits, at most `bound`, until the caller's is the only handle on `shared`; returns
/// how many others are left. For a stop that has joined every part but must not go on
/// while one is still letting go of what it shared: a store closed and dropped while
/// another handle lives keeps its file open (the daemon's stop waits for actix's
/// workers, which drop their app data after answering their stop; the embedded
/// store's close, for calls given up on that still run on the blocking pool).
pub(crate) async fn let_go<T: ?Sized>(
    shared: &std::sync::Arc<T>,
    bound: std::time::Duration,
) -> usize {
    let deadline = tokio::time::Instant::now() + bound;
    while std::sync::Arc::strong_count(shared) > 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    std::sync::Arc::strong_count(shared) - 1
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::let_go;

    /// A handle let go of shortly after is waited for; one kept is not waited for
    /// past the bound, and is counted.
    #[tokio::test]
    async fn the_wait_for_other_holders_ends_when_they_let_go_or_at_its_bound() {
        let shared = Arc::new(());
        let late = shared.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(late);
        });
        assert_eq!(let_go(&shared, Duration::from_secs(5)).await, 0);
        let kept = shared.clone();
        let began = tokio::time::Instant::now();
        assert_eq!(let_go(&shared, Duration::from_millis(100)).await, 1);
        assert!(began.elapsed() >= Duration::from_millis(100));
        drop(kept);
    }
}
