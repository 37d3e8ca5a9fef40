//! Dispatch: what became of each event taken from the inbox, and which relay
//! dispatches.

use super::InternalEvent;
use crate::event_names;
use crate::metrics::Metrics;
use crate::store::{DispatchPlan, DispatchVerdict, PendingEvent};

/// One event taken from the inbox: dispatched to its destinations, dropped as a
/// duplicate, or wanted by no destination. (`Gone`, taken by another dispatcher
/// meanwhile, is not an occurrence of this relay's.)
pub(crate) struct EventDispatched<'a> {
    pub(crate) event: &'a PendingEvent,
    pub(crate) plan: &'a DispatchPlan,
    pub(crate) outcome: &'a DispatchVerdict,
}

impl InternalEvent for EventDispatched<'_> {
    const FAMILIES: &'static [&'static str] = &[
        "hookrelay_events_dispatched_total",
        "hookrelay_events_deduplicated_total",
        "hookrelay_events_unrouted_total",
        "hookrelay_deliveries_filtered_total",
        "hookrelay_deliveries_superseded_total",
    ];
    fn emit(self, m: &Metrics) {
        let Self { event, plan, outcome } = self;
        let (id, source, name) = (event.id, event.meta.source.as_str(), &event.meta.event);
        let labels = [source, event_names::metric_label(name)];
        match outcome {
            DispatchVerdict::Dispatched { superseded, .. } => {
                for dest in superseded {
                    m.dispatch.deliveries_superseded.with_label_values(&[dest]).inc();
                }
                m.dispatch.events_dispatched.with_label_values(&labels).inc();
                tracing::debug!(%id, source, event = %name, destinations = ?plan.destinations,
                    "event dispatched");
                for f in &plan.filtered {
                    let cause = if f.error { "error" } else { "no_match" };
                    m.dispatch
                        .deliveries_filtered
                        .with_label_values(&[&f.destination, cause])
                        .inc();
                    if f.error {
                        tracing::warn!(%id, destination = %f.destination, reason = %f.reason,
                            "the destination's filter failed: the delivery is filtered");
                    } else {
                        tracing::debug!(%id, destination = %f.destination, reason = %f.reason,
                            "filtered");
                    }
                }
            }
            DispatchVerdict::Duplicate { original } => {
                m.dispatch.events_deduplicated.with_label_values(&labels).inc();
                tracing::debug!(%id, source, event = %name, %original, "duplicate event");
            }
            DispatchVerdict::Unrouted => {
                m.dispatch.events_unrouted.with_label_values(&labels).inc();
                tracing::debug!(%id, source, event = %name, "no destination wants this event");
            }
            DispatchVerdict::Gone => {}
        }
    }
}

/// The answer to "does this relay dispatch the inbox?" ([`crate::store::DISPATCH_LEAD`]),
/// as it changes.
pub(crate) enum DispatchLead<'a> {
    /// This relay dispatches from now on.
    Taken,
    /// Another relay dispatches now (this one did until now).
    Lost,
    /// Another relay dispatches, as before.
    Elsewhere,
    /// The store could not tell; asked again shortly.
    Unknown(&'a dyn std::fmt::Display),
}

impl InternalEvent for DispatchLead<'_> {
    const FAMILIES: &'static [&'static str] = &["hookrelay_dispatch_leader"];
    fn emit(self, m: &Metrics) {
        m.dispatch.dispatch_leader.set(i64::from(matches!(self, Self::Taken)));
        match self {
            Self::Lost => tracing::info!("another relay dispatches the inbox now"),
            Self::Unknown(error) => tracing::warn!(%error,
                "cannot tell which relay dispatches the inbox; asking again in 1s"),
            Self::Taken | Self::Elsewhere => {}
        }
    }
}

/// The dedup keys held, counted after a purge pass (a state gauge, set here because
/// the purge is the one that reads it).
pub(crate) struct DedupKeysCounted(pub(crate) u64);

impl InternalEvent for DedupKeysCounted {
    const FAMILIES: &'static [&'static str] = &["hookrelay_dedup_keys"];
    fn emit(self, m: &Metrics) {
        m.dispatch.dedup_keys.set(i64::try_from(self.0).unwrap_or(i64::MAX));
    }
}

/// Expired dedup keys removed by one step of a purge pass: counted as they go, so that
/// a long pass shows while it runs (and what it costs the acks can be read beside it).
pub(crate) struct DedupKeysPurged(pub(crate) usize);

impl InternalEvent for DedupKeysPurged {
    const FAMILIES: &'static [&'static str] = &["hookrelay_dedup_keys_purged_total"];
    fn emit(self, m: &Metrics) {
        m.dispatch.dedup_keys_purged.inc_by(u64::try_from(self.0).unwrap_or(u64::MAX));
    }
}
