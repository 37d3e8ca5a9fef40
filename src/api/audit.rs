//! The audit's report (`GET /admin/audit`, `hookrelay audit`): the ledger's two
//! equations over a window, per source and event name and per destination.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `GET /admin/audit`: every callback received in a window accounted for, from the
/// audit ledger (counts kept per hour of receive time as the states change).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct AuditReport {
    /// The window's start, widened to a whole hour (RFC 3339, UTC).
    pub(crate) since: String,
    /// The window's end, widened to a whole hour.
    pub(crate) until: String,
    /// The first event the ledger counts, when the window starts before it (the store
    /// held events before it had a ledger: those are not accounted).
    pub(crate) accounted_from: Option<String>,
    /// Whether every equation below holds.
    pub(crate) balanced: bool,
    /// Each equation that does not hold, in words.
    pub(crate) imbalances: Vec<String>,
    /// Per source and event name: `received = rejected + unrouted + duplicate + routed
    /// + waiting`.
    pub(crate) events: Vec<EventAudit>,
    /// Per destination (all sources): `routed = delivered + filtered + superseded +
    /// dead + discarded + pending + retrying + held`.
    pub(crate) destinations: Vec<DestinationAudit>,
}

/// The callbacks of one source and event name received in the window.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub(crate) struct EventAudit {
    pub(crate) source: String,
    pub(crate) event: String,
    /// Stored and acknowledged.
    pub(crate) received: i64,
    /// Acknowledged but refused (see each event's reason).
    pub(crate) rejected: i64,
    /// Dispatched to no destination.
    pub(crate) unrouted: i64,
    /// Another copy of an occurrence already dispatched.
    pub(crate) duplicate: i64,
    /// Dispatched to at least one destination.
    pub(crate) routed: i64,
    /// Still in the inbox, waiting for dispatch.
    pub(crate) waiting: i64,
    pub(crate) balanced: bool,
    /// Calls the upstream counted on its hooks (`triggeredCount`'s growth seen by the
    /// reconciles of the window), for a source with accounts.
    pub(crate) triggered: Option<i64>,
    /// `triggered - received`: calls the upstream made that the relay did not store
    /// (a reconcile's interval late at the window's edges).
    pub(crate) not_received: Option<i64>,
}

/// The deliveries to one destination of the events received in the window.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DestinationAudit {
    pub(crate) destination: String,
    /// Deliveries created (at dispatch, or by a replay to this destination).
    pub(crate) routed: i64,
    pub(crate) delivered: i64,
    pub(crate) filtered: i64,
    pub(crate) superseded: i64,
    pub(crate) dead: i64,
    pub(crate) discarded: i64,
    pub(crate) pending: i64,
    pub(crate) retrying: i64,
    pub(crate) held: i64,
    pub(crate) balanced: bool,
}

impl DestinationAudit {
    /// The states the deliveries are in, in the order the equation and the tables
    /// give them: delivered, filtered, superseded, dead, discarded, pending, retrying,
    /// held.
    pub(crate) fn states(&self) -> [i64; 8] {
        [
            self.delivered,
            self.filtered,
            self.superseded,
            self.dead,
            self.discarded,
            self.pending,
            self.retrying,
            self.held,
        ]
    }
}
