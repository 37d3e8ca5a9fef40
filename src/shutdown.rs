//! Waiting for the signal to stop.

/// Resolves with the name of the first SIGTERM or SIGINT received.
pub(crate) async fn signal() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

/// Tells background tasks (dispatcher, delivery workers, purgers) to stop. Cloned
/// into each task; the daemon triggers it once.
#[derive(Clone)]
pub(crate) struct Stop(tokio::sync::watch::Receiver<bool>);

/// The daemon's side of [`Stop`].
pub(crate) struct StopTrigger(tokio::sync::watch::Sender<bool>);

impl StopTrigger {
    pub(crate) fn new() -> (Self, Stop) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        (Self(tx), Stop(rx))
    }

    pub(crate) fn stop(&self) {
        let _ = self.0.send(true);
    }
}

impl Stop {
    pub(crate) fn is_stopped(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once stopping was requested (or the trigger is gone).
    pub(crate) async fn wait(&mut self) {
        let _ = self.0.wait_for(|stopped| *stopped).await;
    }
}
