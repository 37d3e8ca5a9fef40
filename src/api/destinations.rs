//! The destinations as the admin API shows them: their queues, circuits and history.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Timestamp;
use crate::delivery::Phase;

/// A destination's queue.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Queue {
    pub(crate) pending: u64,
    pub(crate) held: u64,
    pub(crate) retrying: u64,
    pub(crate) dead: u64,
    /// The relay is still counting this queue after a restart (the embedded store
    /// counts a large backlog behind the open: seconds per million deliveries). The
    /// numbers are a lower bound until it is done.
    #[serde(default)]
    pub(crate) counting: bool,
}

/// One destination as `GET /admin/destinations` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DestinationStatus {
    pub(crate) name: String,
    /// How deliveries reach it: `http`, `nats`, `amqp`, `redis-stream` or `pull`.
    #[serde(default)]
    pub(crate) kind: String,
    /// Without any password.
    pub(crate) url: String,
    pub(crate) paused: bool,
    pub(crate) circuit: Phase,
    /// The progress watchdog finds deliveries due and no attempt starting on this
    /// relay (see `hookrelay_destination_stalled`).
    pub(crate) stalled: bool,
    /// Requests in flight from this relay.
    pub(crate) in_flight: u64,
    pub(crate) queue: Queue,
    /// Age of the oldest pending or retrying delivery's event.
    pub(crate) oldest_age_seconds: Option<f64>,
    /// Deliveries made by this relay in the last minute.
    #[serde(default)]
    pub(crate) deliveries_per_minute: u64,
    /// The last failed attempt's error (or HTTP status) on this relay.
    #[serde(default)]
    pub(crate) last_error: Option<String>,
    /// When that attempt was recorded.
    #[serde(default)]
    #[schemars(with = "Option<Timestamp>")]
    pub(crate) last_error_at: Option<String>,
    /// When a delivery first succeeded after that error (absent while the destination
    /// still fails): the error is history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Timestamp>")]
    pub(crate) recovered_at: Option<String>,
    /// When the circuit last opened or closed on this relay; none: closed since the
    /// relay started.
    #[serde(default)]
    #[schemars(with = "Option<Timestamp>")]
    pub(crate) circuit_since: Option<String>,
    /// Requests at once across the fleet (`max_concurrency`).
    #[serde(default)]
    pub(crate) max_concurrency: u64,
    /// This relay's share of them (the relays divide it; 0 while a relay joins).
    #[serde(default)]
    pub(crate) fleet_share: u64,
    /// The sources it takes (`*` globs; empty: all).
    #[serde(default)]
    pub(crate) sources: Vec<String>,
    /// The event names it takes (`*` globs; empty: all).
    #[serde(default)]
    pub(crate) events: Vec<String>,
    /// `per-resource` or `none`.
    #[serde(default)]
    pub(crate) ordering: String,
}

/// `GET /admin/destinations`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DestinationList {
    pub(crate) destinations: Vec<DestinationStatus>,
}

/// `GET /admin/destinations/history`: what each destination did over the last hour,
/// sampled by this relay (the console's charts).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DestinationHistory {
    /// Seconds between two samples.
    pub(crate) interval_seconds: u64,
    pub(crate) destinations: Vec<DestinationSeries>,
}

/// One destination's samples, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DestinationSeries {
    pub(crate) name: String,
    pub(crate) points: Vec<HistoryPoint>,
}

/// One sample of a destination.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct HistoryPoint {
    #[schemars(with = "Timestamp")]
    pub(crate) at: String,
    /// Deliveries not settled yet: pending, held and retrying (every relay's).
    pub(crate) backlog: u64,
    /// How long the oldest of them has waited, in seconds (none: nothing waits).
    pub(crate) oldest_pending_seconds: Option<u64>,
    /// Deliveries this relay made in the minute before the sample.
    pub(crate) per_minute: u64,
}

/// The answer to pausing or resuming a destination.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Paused {
    pub(crate) name: String,
    pub(crate) paused: bool,
}
