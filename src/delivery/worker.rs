//! The worker of one destination.

use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tracing::Instrument;

use super::circuit::Gate;
use super::verdict::{self, Verdict};
use super::DestinationState;
use crate::destinations::{Outcome, Request};
use crate::metrics::Metrics;
use crate::shutdown::Stop;
use crate::store::{unix_micros, Committer, DeliveryState, Scheduled, SharedStore};

/// Longest sleep between two looks at the schedule (new entries also wake it).
const MAX_IDLE: Duration = Duration::from_secs(1);

pub(super) struct Worker {
    /// Makes recorded attempts durable, sharing fsyncs with ingest.
    pub(super) committer: Committer,
    pub(super) state: Arc<DestinationState>,
    /// Earliest start of the next request under `rate_limit`.
    pub(super) next_slot: std::sync::Mutex<std::time::Instant>,
    pub(super) store: SharedStore,
    pub(super) metrics: Arc<Metrics>,
    pub(super) client: reqwest::Client,
}

impl Worker {
    /// Claims due entries while permits are free; sleeps until the next due time, a
    /// wake-up (new deliveries, a finished attempt, resume) or `stop`.
    pub(super) async fn run(self, mut stop: Stop) {
        let this = Arc::new(self);
        while !stop.is_stopped() {
            let idle = match this.claim_due().await {
                Ok(idle) => idle,
                Err(e) => {
                    tracing::error!(destination = %this.state.dest.name, error = %e, "reading the schedule failed");
                    MAX_IDLE
                }
            };
            tokio::select! {
                _ = this.state.wake.notified() => {}
                _ = tokio::time::sleep(idle) => {}
                _ = stop.wait() => {}
            }
        }
        // Let attempts in flight finish and be recorded (the daemon bounds this by
        // its grace period; one cut short stays scheduled and is made again).
        while this.state.in_flight() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts attempts for due entries; returns how long to sleep at most.
    async fn claim_due(self: &Arc<Self>) -> anyhow::Result<Duration> {
        let state = &self.state;
        if state.is_paused() {
            return Ok(MAX_IDLE);
        }
        let mut free = state.permits.available_permits();
        if free == 0 {
            return Ok(MAX_IDLE);
        }

        let now = unix_micros(SystemTime::now());
        let name = &state.dest.name;
        let limit = free + state.in_flight();
        // Direct store calls (here and below): sled answers these from memory in
        // microseconds; the one slow operation, fsync, runs on the committer thread.
        // A hop to the blocking pool per call cost more than the calls themselves.
        let due = self.store.due(name, now, limit)?;
        let next = self.store.next_due_after(name, now)?;
        let mut claimable = due.into_iter().filter(|e| !state.is_in_flight(e)).peekable();
        if claimable.peek().is_none() {
            return Ok(next_sleep(next, now));
        }
        let probe = match state.circuit.gate() {
            Gate::Open => false,
            Gate::Probe => true,
            Gate::Wait(d) => return Ok(d.min(MAX_IDLE)),
        };
        if probe {
            free = 1;
        }
        let (started, rate_wait) = self.start_attempts(claimable.take(free))?;
        if probe && started == 0 {
            // Nothing could start after all: hand the probe back.
            state.circuit.cancel_probe();
        }
        Ok(rate_wait.unwrap_or_else(|| next_sleep(next, now)))
    }

    /// Starts attempts for `entries` while permits and the rate limit allow; returns how
    /// many started and, if the rate limit stopped it, how long until the next slot.
    fn start_attempts(
        self: &Arc<Self>,
        entries: impl Iterator<Item = Scheduled>,
    ) -> anyhow::Result<(usize, Option<Duration>)> {
        let state = &self.state;
        let interval = state.dest.rate_limit.map(|r| Duration::from_secs_f64(1.0 / r));
        let mut started = 0;
        for entry in entries {
            if let Some(interval) = interval {
                // One request per interval, no burst: a rate limit is a promise to the
                // consumer.
                let now = std::time::Instant::now();
                let mut slot =
                    self.next_slot.lock().map_err(|_| anyhow::anyhow!("rate limiter poisoned"))?;
                if *slot > now {
                    return Ok((started, Some((*slot - now).min(MAX_IDLE))));
                }
                *slot = now + interval;
            }
            let Ok(permit) = state.permits.clone().try_acquire_owned() else { break };
            if let Ok(mut s) = state.in_flight.lock() {
                s.insert(entry);
            }
            started += 1;
            let this = self.clone();
            tokio::spawn(async move {
                this.attempt(entry).await;
                if let Ok(mut s) = this.state.in_flight.lock() {
                    s.remove(&entry);
                }
                drop(permit);
                this.state.wake.notify_one();
            });
        }
        Ok((started, None))
    }

    /// Makes one attempt for a schedule entry and records its outcome, in a span that
    /// names the event (id, source, name) and the destination. A debug span, free at
    /// info level; warnings name their event and destination themselves.
    async fn attempt(&self, entry: Scheduled) {
        let span = tracing::debug_span!("delivery", id = %entry.event, destination = %self.state.dest.name,
            source = tracing::field::Empty, event = tracing::field::Empty);
        if let Err(e) = self.try_attempt(entry).instrument(span.clone()).await {
            // Nothing was recorded: the entry stays due and is tried again.
            span.in_scope(|| tracing::error!(id = %entry.event, destination = %self.state.dest.name, error = %e, "delivery attempt not recorded"));
            tokio::time::sleep(MAX_IDLE).await;
        }
    }

    async fn try_attempt(&self, entry: Scheduled) -> anyhow::Result<()> {
        let dest = &self.state.dest;
        let record = self.store.delivery(entry.event, &dest.name)?;
        let event = self.store.event(entry.event)?;
        let body = self.store.body(entry.event)?;
        let Some(mut record) = record else {
            anyhow::bail!("schedule entry without a delivery record");
        };
        let attempted_us = unix_micros(SystemTime::now());
        let current = record.state.is_scheduled() && record.next_attempt_us == Some(entry.due_us);
        let verdict = match (current, event, body) {
            // A stale entry (a replay moved the delivery): recording the unchanged
            // record removes it.
            (false, _, _) => None,
            (true, Some(event), Some(body)) => {
                let span = tracing::Span::current();
                span.record("source", event.meta.source.as_str());
                span.record("event", event.meta.event.as_str());
                let webhook_id = format!("evt_{}_{}", entry.event, dest.name);
                let answer = dest
                    .send(
                        &self.client,
                        Request {
                            webhook_id: &webhook_id,
                            source: &event.meta.source,
                            event: &event.meta.event,
                            content_type: event.meta.content_type.as_deref(),
                            body: body.into(),
                            attempt: record.total_attempts + 1,
                        },
                    )
                    .await;
                let m = &self.metrics;
                m.delivery_attempt_duration
                    .with_label_values(&[&dest.name])
                    .observe(answer.duration.as_secs_f64());
                let verdict = verdict::apply(&mut record, &answer, &dest.retry, attempted_us);
                let healthy = !matches!(answer.outcome, Outcome::Retry { .. });
                if self.state.circuit.report(healthy) {
                    let open = self.state.circuit.is_open();
                    m.circuit_open.with_label_values(&[&dest.name]).set(i64::from(open));
                    if open {
                        tracing::warn!(destination = %dest.name, "circuit open: probing once per interval");
                    } else {
                        tracing::info!(destination = %dest.name, "circuit closed");
                    }
                }
                if verdict == Verdict::Success {
                    let lag = SystemTime::now()
                        .duration_since(event.meta.received_at())
                        .unwrap_or_default();
                    m.delivery_lag.with_label_values(&[&dest.name]).observe(lag.as_secs_f64());
                }
                if answer.outcome == Outcome::Gone {
                    tracing::warn!(destination = %dest.name, "destination answered 410 Gone: pausing it");
                }
                tracing::debug!(attempt = record.total_attempts, status = ?answer.status,
                    error = ?answer.error, verdict = verdict.label(), "delivery attempt");
                if matches!(verdict, Verdict::Dead | Verdict::Failed) {
                    tracing::warn!(id = %entry.event, source = %event.meta.source, event = %event.meta.event,
                        destination = %dest.name, status = ?answer.status, error = ?answer.error,
                        "delivery is dead: see the dead letters");
                }
                Some((verdict, answer.outcome == Outcome::Gone))
            }
            (true, _, _) => {
                record.state = DeliveryState::Dead;
                record.next_attempt_us = None;
                record.last_response = Some("the event is no longer stored".into());
                Some((Verdict::Dead, false))
            }
        };
        self.store.record_attempt(entry, &record)?;
        // Durable before it counts: a crash must not roll a retry's due time back.
        if let Err(e) = self.committer.flush().await {
            tracing::warn!(destination = %dest.name, error = %e, "attempt recorded but not flushed");
        }
        if let Some((verdict, gone)) = verdict {
            self.metrics.deliveries.with_label_values(&[&dest.name, verdict.label()]).inc();
            if gone {
                self.store.set_paused(&dest.name, true)?;
                self.state.paused.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        Ok(())
    }
}

/// How long to sleep before the next due entry (at most [`MAX_IDLE`]).
fn next_sleep(next_due: Option<u64>, now: u64) -> Duration {
    next_due.map_or(MAX_IDLE, |due| Duration::from_micros(due.saturating_sub(now)).min(MAX_IDLE))
}
