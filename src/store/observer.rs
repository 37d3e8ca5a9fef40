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
    /// A written group left events waiting for the dispatcher (after the group's
    /// callers are answered; not when the committer dispatched them in the write,
    /// `store::CommitDispatch`).
    fn waiting(&self) {}
    /// The store stopped taking writes (see [`super::Health`]); called once, from
    /// whichever thread saw it first. The store never recovers in this process.
    fn failed(&self, reason: &str);
    /// Something went wrong that the store works around (a connection it reopens, an
    /// unreadable entry it drops, a count it tries again): `what` says what and what
    /// follows, in words.
    fn trouble(&self, kind: Trouble, what: &str, error: &dyn std::fmt::Display);
    /// The embedded store on redb made its writes durable in the database file (a
    /// checkpoint, `embedded/engine/redo/`) after `took`, writers waiting meanwhile.
    fn checkpoint(&self, _took: Duration, _ok: bool) {}
}

/// What kind of trouble the store worked around: the daemon maps it onto the relay's
/// error taxonomy (the store sits below it, and knows nothing of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trouble {
    /// The database did not answer.
    Unreachable,
    /// A read or write of the store failed.
    Storage,
    /// Something stored cannot be read back.
    Corrupt,
}

/// An observer that reports nowhere (tests).
#[cfg(test)]
pub(crate) struct NoObserver;

#[cfg(test)]
impl StoreObserver for NoObserver {
    fn group(&self, _: usize, _: Duration, _: bool) {}
    fn stored(&self, _: &EventMeta) {}
    fn failed(&self, _: &str) {}
    fn trouble(&self, _: Trouble, _: &str, _: &dyn std::fmt::Display) {}
}
