//! What the store reports upward (metrics, the dispatcher's wake-up, the daemon's
//! fail-stop), so that `store/` depends on nothing above it.

use std::time::Duration;

use super::EventMeta;

/// Hears of group commits and of the store failing for good.
pub(crate) trait StoreObserver: Send + Sync + 'static {
    /// A group was written (`ok`) or failed, after `took`.
    fn group(&self, size: usize, took: Duration, ok: bool);
    /// One event of a written group.
    fn stored(&self, meta: &EventMeta);
    /// The store stopped taking writes (see [`super::Health`]); called once, from
    /// whichever thread saw it first. The store never recovers in this process.
    fn failed(&self, reason: &str);
}

/// An observer that reports nowhere (tests).
#[cfg(test)]
pub(crate) struct NoObserver;

#[cfg(test)]
impl StoreObserver for NoObserver {
    fn group(&self, _: usize, _: Duration, _: bool) {}
    fn stored(&self, _: &EventMeta) {}
    fn failed(&self, _: &str) {}
}
