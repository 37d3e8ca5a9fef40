//! Supervision of the background tasks: a dispatcher, delivery worker, retention or
//! reconciler task that ends before shutdown (a panic, an early return) would
//! otherwise leave `/readyz` at 200 while the inbox grows. Its watcher logs the
//! reason, counts it, and turns readiness false for good, so the orchestrator sends no
//! more traffic and an operator (or a liveness policy) restarts the relay.

use crate::internal_events::{InternalEvent, TaskDied};
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::metrics::Metrics;
use crate::readiness::Readiness;
use crate::shutdown::Stop;

/// What a watcher needs to report a death.
#[derive(Clone)]
pub(crate) struct Supervisor {
    pub(crate) readiness: Arc<Readiness>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) stop: Stop,
}

impl Supervisor {
    /// The same supervisor for a task stopped by `stop` (its own, not the relay's: a
    /// part a reload replaces), so that its stop is not taken for a death.
    pub(crate) fn stopped_by(&self, stop: Stop) -> Self {
        Self { stop, ..self.clone() }
    }

    /// Watches `handle`; the returned handle ends when the task does. `kind` is the
    /// metric label (bounded), `name` says which one in the log.
    pub(crate) fn watch(
        &self,
        kind: &'static str,
        name: String,
        handle: JoinHandle<()>,
    ) -> JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let result = handle.await;
            if this.stop.is_stopped() {
                return;
            }
            let why = match result {
                Ok(()) => "it returned before shutdown".to_owned(),
                Err(e) if e.is_panic() => format!("it panicked: {}", panic_message(e.into_panic())),
                Err(e) => format!("it was cancelled: {e}"),
            };
            TaskDied { kind, name: &name, why: &why }.emit(&this.metrics);
            let reason = format!("background task {name} died ({why}); restart the relay");
            this.readiness.fail(reason);
        })
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shutdown::StopTrigger;

    #[tokio::test]
    async fn a_dead_task_turns_readiness_false_and_is_counted() {
        let readiness = Arc::new(Readiness::default());
        readiness.set(true);
        let metrics = Arc::new(Metrics::new().unwrap());
        let (trigger, stop) = StopTrigger::new();
        let sup = Supervisor { readiness: readiness.clone(), metrics: metrics.clone(), stop };
        let died =
            sup.watch("dispatcher", "dispatcher".into(), tokio::spawn(async { panic!("boom") }));
        died.await.unwrap();
        assert!(!readiness.get());
        assert!(readiness.failure().unwrap().contains("boom"), "{:?}", readiness.failure());
        assert!(metrics.render().contains("hookrelay_task_failures_total{task=\"dispatcher\"} 1"));
        // A task ending at shutdown is no failure.
        let (trigger2, stop2) = StopTrigger::new();
        let readiness2 = Arc::new(Readiness::default());
        readiness2.set(true);
        let sup2 = Supervisor { readiness: readiness2.clone(), metrics, stop: stop2 };
        trigger2.stop();
        sup2.watch("retention", "retention".into(), tokio::spawn(async {})).await.unwrap();
        assert!(readiness2.get());
        drop(trigger);
    }
}
