//! Whether the relay should take traffic, and why not: set by the daemon, the
//! supervisor and the database probe, read by `/readyz` and the ingress. A leaf, so
//! that every room below the admin listener can say why the relay is not ready.

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the relay should receive traffic: false until the store is open and
/// recovery has finished, from the moment shutdown begins, and for good once a
/// background task has died (with the reason, shown by `/readyz`).
#[derive(Default)]
pub(crate) struct Readiness {
    ready: AtomicBool,
    failure: std::sync::Mutex<Option<String>>,
    /// A passing reason not to take traffic (the database is unreachable), cleared
    /// when it passes.
    degraded: std::sync::Mutex<Option<String>>,
}

impl Readiness {
    pub(crate) fn set(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Marks the relay not ready until it restarts, for `reason`.
    pub(crate) fn fail(&self, reason: String) {
        crate::lock::lock(&self.failure).get_or_insert(reason);
    }

    /// Marks the relay not ready for `reason` until called again with `None`.
    pub(crate) fn set_degraded(&self, reason: Option<String>) {
        *crate::lock::lock(&self.degraded) = reason;
    }

    pub(crate) fn get(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
            && crate::lock::lock(&self.failure).is_none()
            && crate::lock::lock(&self.degraded).is_none()
    }

    /// Why the relay is not ready, if a failure or a passing condition says so.
    pub(crate) fn failure(&self) -> Option<String> {
        crate::lock::lock(&self.failure)
            .clone()
            .or_else(|| crate::lock::lock(&self.degraded).clone())
    }
}
