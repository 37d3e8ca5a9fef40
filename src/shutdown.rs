//! Waiting for the signal to stop.

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
