//! The worker of one destination: claim due deliveries, send, have the store record.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tracing::Instrument;

use std::collections::VecDeque;

use super::circuit::Gate;
use super::recorder::Recorder;
use super::DestinationState;
use crate::destinations::{Outcome, Request};
use crate::lock::lock;
use crate::metrics::Metrics;
use crate::shutdown::Stop;
use crate::store::lifecycle::{AttemptReport, Verdict};
use crate::store::{unix_micros, Attempt, Claim, Recorded, SharedStore};

/// Longest sleep between two looks at the schedule (new entries also wake it).
const MAX_IDLE: Duration = Duration::from_secs(1);
/// How old the pause state may be: a pause made through any relay stops this one
/// within this long.
const PAUSE_REFRESH: Duration = Duration::from_millis(500);

pub(super) struct Worker {
    /// This relay's name on its claims.
    pub(super) owner: String,
    /// This relay's share of the destination's limits (all of them, alone).
    pub(super) fleet: Arc<crate::fleet::FleetShare>,
    /// Claimed deliveries waiting for a permit: claimed a few at a time, ahead of the
    /// permits, so that a claim costs a fraction of a store call.
    pub(super) ready: std::sync::Mutex<VecDeque<Claim>>,
    /// Records finished attempts in groups.
    pub(super) recorder: Recorder,
    pub(super) state: Arc<DestinationState>,
    /// Earliest start of the next request under `rate_limit`.
    pub(super) next_slot: std::sync::Mutex<Instant>,
    /// When the pause state was last read from the store.
    pub(super) pause_read: std::sync::Mutex<Option<Instant>>,
    pub(super) store: SharedStore,
    pub(super) metrics: Arc<Metrics>,
    pub(super) client: reqwest::Client,
}

impl Worker {
    /// Claims due deliveries while permits are free; sleeps until the next due time, a
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
        // Give back what was claimed but not started, and let attempts in flight
        // finish and be recorded (the daemon bounds this by its grace period; one cut
        // short stays scheduled and is made again).
        this.release_ready().await;
        while this.state.in_flight() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How long a claim is held: the request's timeout plus room to record it. An
    /// attempt outliving it (a stalled relay) may be made again by another.
    fn lease(&self) -> Duration {
        self.state.dest.timeout + Duration::from_secs(60)
    }

    /// Reads the shared pause state when the cached one is older than [`PAUSE_REFRESH`].
    async fn refresh_pause(&self) -> anyhow::Result<()> {
        let stale = lock(&self.pause_read).is_none_or(|t| t.elapsed() >= PAUSE_REFRESH);
        if stale {
            let paused = self.store.paused().await?.contains(&self.state.dest.name);
            self.state.paused.store(paused, Ordering::SeqCst);
            *lock(&self.pause_read) = Some(Instant::now());
        }
        Ok(())
    }

    /// Gives every claim waiting in [`Worker::ready`] back to the store.
    async fn release_ready(&self) {
        let waiting: Vec<Claim> = lock(&self.ready).drain(..).collect();
        for claim in waiting {
            if let Err(e) = self.store.release(&claim).await {
                tracing::warn!(destination = %self.state.dest.name, error = %e, "cannot release a claim; it expires with its lease");
            }
        }
    }

    /// Starts attempts for due deliveries; returns how long to sleep at most.
    async fn claim_due(self: &Arc<Self>) -> anyhow::Result<Duration> {
        let state = &self.state;
        self.refresh_pause().await?;
        if state.is_paused() {
            self.release_ready().await;
            return Ok(PAUSE_REFRESH);
        }
        let mut free = self.free_permits();
        if free == 0 {
            return Ok(MAX_IDLE);
        }
        let probe = match state.circuit.gate() {
            Gate::Open => false,
            Gate::Probe => true,
            Gate::Wait(d) => return Ok(d.min(MAX_IDLE)),
        };
        if probe {
            free = 1;
        }
        let now = unix_micros(SystemTime::now());
        let name = &state.dest.name;
        let queued = lock(&self.ready).len();
        if queued < free {
            // Claim ahead: up to twice this relay's permits, so the next free permits
            // find a claim waiting.
            let want =
                (2 * self.fleet.concurrency(state.dest.max_concurrency)).saturating_sub(queued);
            let claims = self.store.claim_due(name, &self.owner, now, self.lease(), want).await?;
            lock(&self.ready).extend(claims);
        }
        if lock(&self.ready).is_empty() {
            if probe {
                // Nothing to send after all: hand the probe back.
                state.circuit.cancel_probe();
            }
            let next = self.store.next_due_after(name, now).await?;
            return Ok(next_sleep(next, now));
        }
        let rate_wait = self.start_attempts(free, now).await?;
        Ok(rate_wait.unwrap_or(Duration::ZERO))
    }

    /// Requests this relay may start now: its share of `max_concurrency` (all of it,
    /// alone) less the requests in flight.
    fn free_permits(&self) -> usize {
        let (max, available) =
            (self.state.dest.max_concurrency, self.state.permits.available_permits());
        let in_flight = max.saturating_sub(available);
        self.fleet.concurrency(max).saturating_sub(in_flight).min(available)
    }

    /// Starts up to `n` waiting claims while permits and the rate limit allow; returns
    /// how long until the next rate-limit slot, if it stopped there.
    async fn start_attempts(
        self: &Arc<Self>,
        n: usize,
        now_us: u64,
    ) -> anyhow::Result<Option<Duration>> {
        let state = &self.state;
        // This relay's part of the fleet's rate: N relays, each every N intervals.
        let interval =
            state.dest.rate_limit.map(|r| Duration::from_secs_f64(1.0 / self.fleet.rate(r)));
        // A claim whose lease would end during its request is given back and claimed
        // afresh: an attempt never outlives its claim.
        let must_last = u64::try_from(state.dest.timeout.as_micros()).unwrap_or(u64::MAX);
        for _ in 0..n {
            if let Some(interval) = interval {
                // One request per interval, no burst: a rate limit is a promise to the
                // consumer.
                let now = Instant::now();
                let mut slot = lock(&self.next_slot);
                if *slot > now {
                    return Ok(Some((*slot - now).min(MAX_IDLE)));
                }
                *slot = now + interval;
            }
            let Some(claim) = lock(&self.ready).pop_front() else { break };
            if claim.expires_us.saturating_sub(now_us) <= must_last {
                self.store.release(&claim).await?;
                continue;
            }
            let permit = match self.free_permits() {
                0 => None,
                _ => state.permits.clone().try_acquire_owned().ok(),
            };
            let Some(permit) = permit else {
                lock(&self.ready).push_front(claim);
                break;
            };
            state.in_flight.fetch_add(1, Ordering::SeqCst);
            let this = self.clone();
            tokio::spawn(async move {
                this.attempt(claim, permit).await;
                this.state.in_flight.fetch_sub(1, Ordering::SeqCst);
            });
        }
        Ok(None)
    }

    /// Makes one attempt for a claimed delivery and records its outcome, in a span
    /// that names the event (id, source, name) and the destination. A debug span,
    /// free at info level; warnings name their event and destination themselves.
    async fn attempt(&self, claim: Claim, permit: tokio::sync::OwnedSemaphorePermit) {
        let span = tracing::debug_span!("delivery", id = %claim.event, destination = %self.state.dest.name,
            source = tracing::field::Empty, event = tracing::field::Empty);
        if let Err(e) = self.try_attempt(&claim, permit).instrument(span.clone()).await {
            // Nothing was recorded: the claim expires and the delivery is tried again.
            span.in_scope(|| tracing::error!(id = %claim.event, destination = %self.state.dest.name, error = %e, "delivery attempt not recorded"));
        }
    }

    async fn try_attempt(
        &self,
        claim: &Claim,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> anyhow::Result<()> {
        let dest = &self.state.dest;
        let started_us = unix_micros(SystemTime::now());
        let (report, meta) = match (&claim.meta, &claim.body) {
            (Some(meta), Some(body)) => {
                let span = tracing::Span::current();
                span.record("source", meta.source.as_str());
                span.record("event", meta.event.as_str());
                // The same id on every attempt, by any relay: consumers dedup on it.
                let webhook_id = format!("evt_{}_{}", claim.event, dest.name);
                let answer = dest
                    .send(
                        &self.client,
                        Request {
                            webhook_id: &webhook_id,
                            source: &meta.source,
                            event: &meta.event,
                            content_type: meta.content_type.as_deref(),
                            body: body.clone(),
                            attempt: claim.record.total_attempts + 1,
                        },
                    )
                    .await;
                drop(permit);
                self.state.wake.notify_one();
                self.metrics
                    .delivery_attempt_duration
                    .with_label_values(&[&dest.name])
                    .observe(answer.duration.as_secs_f64());
                self.report_to_circuit(!matches!(answer.outcome, Outcome::Retry { .. }));
                let report = AttemptReport {
                    attempt: Attempt {
                        at_us: started_us,
                        duration_us: u64::try_from(answer.duration.as_micros()).unwrap_or(u64::MAX),
                        status: answer.status,
                        error: answer.error.clone(),
                    },
                    outcome: answer.outcome,
                    excerpt: answer.excerpt.clone(),
                    jitter: fastrand::f64(),
                };
                (report, Some(meta))
            }
            _ => {
                drop(permit);
                let error = "the event is no longer stored".to_owned();
                let report = AttemptReport {
                    attempt: Attempt {
                        at_us: started_us,
                        duration_us: 0,
                        status: None,
                        error: Some(error.clone()),
                    },
                    outcome: Outcome::Permanent,
                    excerpt: Some(error),
                    jitter: 0.0,
                };
                (report, None)
            }
        };
        let (status, error, outcome) =
            (report.attempt.status, report.attempt.error.clone(), report.outcome);
        let recorded = self.recorder.record(claim.clone(), report).await?;
        let verdict = match recorded {
            Recorded::Done(v) => v,
            Recorded::Stale | Recorded::ClaimLost => {
                tracing::debug!(?recorded, "attempt not recorded: the delivery moved meanwhile");
                return Ok(());
            }
        };
        let m = &self.metrics;
        m.deliveries.with_label_values(&[&dest.name, verdict.label()]).inc();
        if let (Verdict::Success, Some(meta)) = (verdict, &meta) {
            let lag = SystemTime::now().duration_since(meta.received_at()).unwrap_or_default();
            m.delivery_lag.with_label_values(&[&dest.name]).observe(lag.as_secs_f64());
        }
        tracing::debug!(
            attempt = claim.record.total_attempts + 1,
            ?status,
            ?error,
            verdict = verdict.label(),
            "delivery attempt"
        );
        if matches!(verdict, Verdict::Dead | Verdict::Failed) {
            let (source, event) =
                meta.as_ref().map_or(("", ""), |m| (m.source.as_str(), m.event.as_str()));
            tracing::warn!(id = %claim.event, source, event, destination = %dest.name, ?status, ?error,
                "delivery is dead: see the dead letters");
        }
        if outcome == Outcome::Gone {
            tracing::warn!(destination = %dest.name, "destination answered 410 Gone: pausing it");
            self.store.set_paused(&dest.name, true).await?;
            self.state.paused.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Tells the circuit breaker how the destination answered.
    fn report_to_circuit(&self, healthy: bool) {
        let dest = &self.state.dest;
        if self.state.circuit.report(healthy) {
            let open = self.state.circuit.is_open();
            self.metrics.circuit_open.with_label_values(&[&dest.name]).set(i64::from(open));
            if open {
                tracing::warn!(destination = %dest.name, "circuit open: probing once per interval");
            } else {
                tracing::info!(destination = %dest.name, "circuit closed");
            }
        }
    }
}

/// How long to sleep before the next due entry (at most [`MAX_IDLE`]).
fn next_sleep(next_due: Option<u64>, now: u64) -> Duration {
    next_due.map_or(MAX_IDLE, |due| Duration::from_micros(due.saturating_sub(now)).min(MAX_IDLE))
}
