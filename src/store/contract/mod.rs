//! What the relay asks of its storage, one trait per part of the product:
//!
//! | trait | the part of the product | its conformance section |
//! |---|---|---|
//! | [`EventLog`] | callbacks as stored (or refused): ids, bodies, search, retention | `conformance/event_log.rs` |
//! | [`Dispatch`] | the inbox, dedup, turning an event into its deliveries | `conformance/dispatch.rs` |
//! | [`DeliveryQueue`] | claims, attempts, retries, dead letters, pauses | `conformance/delivery_queue.rs` |
//! | [`Coordination`] | the relays sharing a store: leads, holds, heartbeats, wake-ups | `conformance/coordination.rs` |
//! | [`SharedState`] | the hook lifecycle's small state (tokens, gaps, account status) | `conformance/shared_state.rs` |
//! | [`Upkeep`] | the store as a resource: whether it answers, its size, closing it | `conformance/upkeep.rs` |
//! | [`Audit`] | the ledger accounting for every callback, per hour | `conformance/audit.rs` |
//! | [`Journal`] | every change made through the admin API or the console | `conformance/journal.rs` |
//!
//! [`Store`] is their sum, what a backend implements and the relay holds. The promises
//! every trait keeps, written so that a shared database can keep them for several
//! relays at once:
//! - the store allocates event ids (unique across processes, time-ordered);
//! - deliveries are claimed with an owner and a lease, and recording an attempt
//!   checks the claim ([`Claim`](super::Claim));
//! - shared state (pauses, counts) is read from the store, and every read can fail;
//! - durability belongs to the backend: each write returns once it is as durable as
//!   configured; no caller asks for an fsync. Three writes whose loss a crash only
//!   makes the relay do again are exempt, so that they never hold up an
//!   acknowledgement behind their own fsync: [`Dispatch::dispatch`] (redone from the
//!   durable inbox), [`Dispatch::purge_dedup`], [`EventLog::prune`] and
//!   [`Journal::journal_prune`] (redone on the next pass). Each of them is durable with the next durable write, since every
//!   later write is ordered after it (sled's dedup purge happens to fsync anyway);
//! - every method is async: a backend with blocking I/O runs it on the blocking pool.

mod audit;
mod coordination;
mod delivery_queue;
mod dispatch;
mod event_log;
mod journal;
mod shared_state;
mod upkeep;

pub(crate) use audit::{Audit, LedgerReading};
pub(crate) use coordination::{Coordination, Exclusive, Fleet, Wake, DISPATCH_LEAD};
pub(crate) use delivery_queue::{owner_silence, DeliveryQueue, QueueChange, CLAIM_MARGIN};
pub(crate) use dispatch::{CommitDispatch, Dispatch, DispatchWrite, Planner};
pub(crate) use event_log::{EventFilter, EventLog};
pub(crate) use journal::{Journal, JournalEntry, JournalFilter};
pub(crate) use shared_state::SharedState;
pub(crate) use upkeep::Upkeep;

/// Everything the relay needs from its storage: the sum of the traits above, which a
/// backend implements one by one (one file per trait in `postgres/`).
pub(crate) trait Store:
    EventLog
    + Dispatch
    + DeliveryQueue
    + Coordination
    + SharedState
    + Upkeep
    + Audit
    + Journal
    + Send
    + Sync
    + 'static
{
}

impl<T> Store for T where
    T: EventLog
        + Dispatch
        + DeliveryQueue
        + Coordination
        + SharedState
        + Upkeep
        + Audit
        + Journal
        + Send
        + Sync
        + 'static
{
}
