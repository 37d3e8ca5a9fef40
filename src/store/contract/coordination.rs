//! Coordination of the relays sharing a store (the fleet): who leads which task, holds
//! that make relays take turns, heartbeats, and wake-ups between relays.

use std::time::Duration;

use async_trait::async_trait;

use crate::store::StoreError;

/// The task whose leader dispatches the inbox ([`Coordination::lead`]): one dispatcher
/// for the fleet, reading the inbox in id order, keeps one order per resource.
pub(crate) const DISPATCH_LEAD: &str = "dispatch";

/// The relays sharing a store (see [`Coordination::heartbeat`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fleet {
    /// This relay's place among the live ones, from 0.
    pub(crate) rank: usize,
    /// How many are live, this one included.
    pub(crate) size: usize,
    /// The store's clock when it counted, in µs since the epoch: the fleet's one
    /// clock ([`crate::clock`]).
    pub(crate) store_us: u64,
}

/// A wake-up from another relay (see [`Coordination::wakeups`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// This destination has deliveries due now.
    Due(String),
    /// Another relay stored events: the dispatcher, where it runs, looks at the inbox
    /// now (the storing relay's own commits wake only its own dispatcher).
    Inbox,
    /// Anything may be due: wake-ups may have been missed (a reconnection, a
    /// subscriber that fell behind).
    All,
}

/// Holds a task for this relay (see [`Coordination::exclusive`]) until dropped:
/// whatever holds it (a database connection with a lock) is dropped with it.
#[derive(Default)]
pub(crate) struct Exclusive {
    _hold: Option<Box<dyn Send>>,
}

impl Exclusive {
    /// A hold that ends when `hold` is dropped.
    pub(crate) fn new(hold: impl Send + 'static) -> Self {
        Self { _hold: Some(Box::new(hold)) }
    }
}

/// What relays sharing a store know of each other. Every method has the answer of a
/// store that one process owns (that process is the whole fleet), which the embedded
/// backends keep.
#[async_trait]
pub(crate) trait Coordination: Send + Sync {
    /// Whether this relay leads `task`: work that one relay of those sharing the store
    /// does for all (dispatch, retention, the dedup purge, the hook reconciler). Asked
    /// before each pass; the lead is a lease the store renews while the relay lives: a
    /// relay that dies or is cut off loses it within seconds, and another takes it at
    /// its next ask. A single-process store always leads.
    async fn lead(&self, _task: &str) -> Result<bool, StoreError> {
        Ok(true)
    }

    /// Waits until no other relay runs `task`, and holds it until the returned guard is
    /// dropped (a hook sync asked of several relays at once runs one after the other).
    /// A single-process store has nothing to hold.
    async fn exclusive(&self, _task: &str) -> Result<Exclusive, StoreError> {
        Ok(Exclusive::default())
    }

    /// Announces this relay (`owner`) to the others sharing the store, and returns the
    /// fleet as it is now: the live relays (announced within `live_for`) and this
    /// one's rank among them, in the order they joined. The fleet is read after the
    /// announcement is stored, so of two relays joining at once one sees the other:
    /// they never both find themselves alone (a relay alone takes its share at once:
    /// `fleet.rs`).
    /// `None` for a store that one process owns: that process is the whole fleet.
    async fn heartbeat(
        &self,
        _owner: &str,
        _live_for: Duration,
    ) -> Result<Option<Fleet>, StoreError> {
        Ok(None)
    }

    /// Wake-ups from the other relays sharing the store: destinations whose deliveries
    /// they made due (so this relay's workers need not wait for their poll), or
    /// [`Wake::All`] when some may have been missed. `None` for a store that one
    /// process writes: that process wakes its own workers.
    fn wakeups(&self) -> Option<tokio::sync::broadcast::Receiver<Wake>> {
        None
    }
}
