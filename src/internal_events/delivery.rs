//! Delivery: attempts and what the store made of them, the circuit, stalls and
//! recoveries, a destination that answered 410 Gone.

use std::time::Duration;

use super::taxonomy::{self, ErrorType, Stage, ERRORS};
use super::InternalEvent;
use crate::metrics::Metrics;
use crate::operational::OperationalEvent;
use crate::store::lifecycle::AttemptVerdict;
use crate::store::{EventId, EventMeta};

/// An attempt ended (answered, failed or timed out), before it is recorded.
pub(crate) struct AttemptFinished<'a> {
    pub(crate) destination: &'a str,
    pub(crate) took: Duration,
}

impl InternalEvent for AttemptFinished<'_> {
    const FAMILIES: &'static [&'static str] = &["hookrelay_delivery_attempt_duration_seconds"];
    fn emit(self, m: &Metrics) {
        let d = &m.delivery.delivery_attempt_duration;
        d.with_label_values(&[self.destination]).observe(self.took.as_secs_f64());
    }
}

/// An attempt recorded under its claim, with the verdict of the lifecycle rules.
pub(crate) struct AttemptRecorded<'a> {
    pub(crate) event: EventId,
    /// The event's record, when it is still stored (its lag is measured from its
    /// receipt).
    pub(crate) meta: Option<&'a EventMeta>,
    pub(crate) destination: &'a str,
    /// Which attempt of the delivery this was, from 1.
    pub(crate) attempt: u32,
    pub(crate) status: Option<u16>,
    pub(crate) error: Option<&'a str>,
    pub(crate) verdict: AttemptVerdict,
}

impl InternalEvent for AttemptRecorded<'_> {
    const FAMILIES: &'static [&'static str] =
        &["hookrelay_deliveries_total", "hookrelay_delivery_lag_seconds"];
    fn emit(self, m: &Metrics) {
        let Self { event, meta, destination, attempt, status, error, verdict } = self;
        m.delivery.deliveries.with_label_values(&[destination, verdict.label()]).inc();
        if let (AttemptVerdict::Success, Some(meta)) = (verdict, meta) {
            let lag = crate::clock::now().duration_since(meta.received_at()).unwrap_or_default();
            m.delivery.delivery_lag.with_label_values(&[destination]).observe(lag.as_secs_f64());
        }
        tracing::debug!(attempt, status, error, verdict = verdict.label(), "delivery attempt");
        if matches!(verdict, AttemptVerdict::Dead | AttemptVerdict::Failed) {
            let (source, name) = meta.map_or(("", ""), |m| (m.source.as_str(), m.event.as_str()));
            tracing::warn!(id = %event, source, event = name, destination, status, error,
                "delivery is dead: see the dead letters");
            m.operational.raise(&OperationalEvent::DeliveryDead {
                destination,
                event,
                source,
                event_name: name,
                resource: meta.and_then(|m| m.resource.as_deref()),
                status,
                error,
            });
        }
    }
}

/// A destination's transform gave no body for an event: the delivery is dead (its
/// attempt says why) until a replay once the transform is fixed.
pub(crate) struct TransformFailed<'a> {
    pub(crate) event: EventId,
    pub(crate) destination: &'a str,
    pub(crate) reason: &'a str,
}

impl InternalEvent for TransformFailed<'_> {
    const FAMILIES: &'static [&'static str] = &["hookrelay_transforms_failed_total", ERRORS];
    fn emit(self, m: &Metrics) {
        taxonomy::count(m, Stage::Shape, ErrorType::Invalid);
        let Self { event, destination, reason } = self;
        m.delivery.transforms_failed.with_label_values(&[destination]).inc();
        tracing::warn!(id = %event, destination, reason,
            "the destination's transform failed: the delivery is dead; fix it, then replay");
    }
}

/// A destination's circuit opened (probing once per interval) or closed.
pub(crate) struct CircuitChanged<'a> {
    pub(crate) destination: &'a str,
    pub(crate) open: bool,
}

impl InternalEvent for CircuitChanged<'_> {
    const FAMILIES: &'static [&'static str] = &["hookrelay_destination_circuit_open"];
    fn emit(self, m: &Metrics) {
        let destination = self.destination;
        m.delivery.circuit_open.with_label_values(&[destination]).set(i64::from(self.open));
        if self.open {
            m.operational.raise(&OperationalEvent::CircuitOpened { destination });
        } else {
            m.operational.raise(&OperationalEvent::CircuitClosed { destination });
        }
        if self.open {
            tracing::warn!(destination, "circuit open: probing once per interval");
        } else {
            tracing::info!(destination, "circuit closed");
        }
    }
}

/// Deliveries are due and no attempt started within the stall bound.
pub(crate) struct DestinationStalled<'a> {
    pub(crate) destination: &'a str,
    pub(crate) idle: Duration,
    /// The pacer's phase, as text.
    pub(crate) circuit: &'a dyn std::fmt::Debug,
    pub(crate) in_flight: usize,
    pub(crate) share: usize,
    pub(crate) free: usize,
    /// Whether the worker is restarted (false: restarts spent, an operator looks).
    pub(crate) restart: bool,
}

impl InternalEvent for DestinationStalled<'_> {
    const FAMILIES: &'static [&'static str] =
        &["hookrelay_destination_stalled", "hookrelay_destination_worker_restarts_total", ERRORS];
    fn emit(self, m: &Metrics) {
        let destination = self.destination;
        taxonomy::count(m, Stage::Delivery, ErrorType::Stalled);
        m.delivery.destination_stalled.with_label_values(&[destination]).set(1);
        if self.restart {
            m.delivery.worker_restarts.with_label_values(&[destination]).inc();
        }
        tracing::error!(destination, idle_seconds = self.idle.as_secs(), circuit = ?self.circuit,
            in_flight = self.in_flight, share = self.share, free = self.free, restart = self.restart,
            "destination stalled: deliveries are due and no attempt started; {}",
            if self.restart { "restarting its worker" } else { "restarts did not help: see docs/runbook.md" });
        m.operational.raise(&OperationalEvent::DestinationStalled {
            destination,
            idle_s: self.idle.as_secs(),
        });
    }
}

/// A stalled destination started attempts again.
pub(crate) struct DestinationRecovered<'a> {
    pub(crate) destination: &'a str,
}

impl InternalEvent for DestinationRecovered<'_> {
    const FAMILIES: &'static [&'static str] = &["hookrelay_destination_stalled"];
    fn emit(self, m: &Metrics) {
        m.delivery.destination_stalled.with_label_values(&[self.destination]).set(0);
        tracing::info!(destination = self.destination, "destination makes progress again");
    }
}

/// A destination answered 410 Gone: it is paused (its gauge follows from the store's
/// pauses, read by the health refresh).
pub(crate) struct DestinationGone<'a> {
    pub(crate) destination: &'a str,
}

impl InternalEvent for DestinationGone<'_> {
    const FAMILIES: &'static [&'static str] = &[];
    fn emit(self, m: &Metrics) {
        tracing::warn!(destination = self.destination, "destination answered 410 Gone: pausing it");
        m.operational.raise(&OperationalEvent::DestinationPaused {
            destination: self.destination,
            by: "gone",
        });
    }
}

/// Deliveries are owed to a destination no longer in the config: noted once, when
/// retention first finds it; they go dead after `grace` unless it comes back.
pub(crate) struct RemovedDestinationFound<'a> {
    pub(crate) destination: &'a str,
    pub(crate) pending: u64,
    pub(crate) retrying: u64,
    pub(crate) held: u64,
    pub(crate) grace: std::time::Duration,
}

impl InternalEvent for RemovedDestinationFound<'_> {
    const FAMILIES: &'static [&'static str] = &[];
    fn emit(self, _: &Metrics) {
        let Self { destination, pending, retrying, held, grace } = self;
        tracing::warn!(
            destination,
            pending,
            retrying,
            held,
            ?grace,
            "a destination with deliveries to make is no longer in the config: they go dead \
             after retention.removed_destinations unless it comes back"
        );
    }
}

/// Deliveries to a destination removed for longer than its grace were made dead
/// letters: counted as dead deliveries of it.
pub(crate) struct RemovedDestinationRetired<'a> {
    pub(crate) destination: &'a str,
    pub(crate) dead: usize,
}

impl InternalEvent for RemovedDestinationRetired<'_> {
    const FAMILIES: &'static [&'static str] = &["hookrelay_deliveries_total"];
    fn emit(self, m: &Metrics) {
        let Self { destination, dead } = self;
        if dead == 0 {
            return;
        }
        let labels = [destination, "dead"];
        m.delivery.deliveries.with_label_values(&labels).inc_by(dead as u64);
        tracing::warn!(
            destination,
            dead,
            "deliveries to a removed destination are now dead \
            letters: replay them once it is back in the config, or delete them"
        );
    }
}

/// An operator paused or resumed a destination through the admin API or the console.
pub(crate) struct DestinationPauseSet<'a> {
    pub(crate) destination: &'a str,
    pub(crate) paused: bool,
    /// The admin token's name.
    pub(crate) by: &'a str,
}

impl InternalEvent for DestinationPauseSet<'_> {
    const FAMILIES: &'static [&'static str] = &[];
    fn emit(self, m: &Metrics) {
        let what = if self.paused { "paused" } else { "resumed" };
        tracing::info!(
            destination = self.destination,
            paused = self.paused,
            by = self.by,
            "destination {what}"
        );
        if self.paused {
            m.operational.raise(&OperationalEvent::DestinationPaused {
                destination: self.destination,
                by: "admin",
            });
        }
    }
}
