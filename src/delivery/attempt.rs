//! One attempt of a claimed delivery, from the worker: the body made (or its
//! transform's failure), the request sent, the answer reported to the pacer and
//! recorded, and what the record means (a 410 pauses the destination).

use std::sync::atomic::Ordering;

use tracing::Instrument;

use super::pacer::{self, CircuitChange, Health};
use super::worker::Worker;
use crate::destinations::{AnswerClass, Request};
use crate::internal_events::taxonomy::{self, ErrorType, Stage};
use crate::internal_events::{
    AttemptFinished, AttemptRecorded, CircuitChanged, DestinationGone, InternalEvent,
    TransformFailed,
};
use crate::lock::lock;
use crate::store::lifecycle::AttemptReport;
use crate::store::{Attempt, AttemptWrite, Claim};
use crate::telemetry::trace;

impl Worker {
    /// Makes one attempt for a claimed delivery and records its outcome, in a span
    /// that names the event (id, source, name) and the destination. A debug span,
    /// free at info level; warnings name their event and destination themselves.
    pub(super) async fn attempt(
        &self,
        claim: Claim,
        permit: tokio::sync::OwnedSemaphorePermit,
        probe: bool,
    ) {
        let span = tracing::debug_span!("delivery", id = %claim.event, destination = %self.state.dest.name,
            source = tracing::field::Empty, event = tracing::field::Empty);
        if let Err(e) = self.try_attempt(&claim, permit, probe).instrument(span.clone()).await {
            // Nothing was recorded: once the attempt is off the books, the next look
            // gives its claim back, and the delivery is tried again.
            lock(&self.state.in_flight_tokens).remove(&claim.token);
            self.state.unknown_claims.store(true, Ordering::SeqCst);
            let what = format!(
                "the attempt of {} to {} was not recorded; it is made again",
                claim.event, self.state.dest.name
            );
            span.in_scope(|| {
                taxonomy::failed(&self.metrics, Stage::Delivery, ErrorType::Storage, &what, &e)
            });
        }
    }

    async fn try_attempt(
        &self,
        claim: &Claim,
        permit: tokio::sync::OwnedSemaphorePermit,
        probe: bool,
    ) -> anyhow::Result<()> {
        let dest = &self.state.dest;
        let started_us = crate::clock::now_us();
        // The attempt's span: its id goes to the consumer in the `traceparent`.
        let span_id = crate::telemetry::ids::random_span();
        let made = lock(&self.shaped).remove(&claim.token);
        let shaped = match (&claim.meta, &claim.body, made) {
            (Some(_), Some(_), Some(made)) => Some(made),
            (Some(meta), Some(body), None) => {
                let transform = dest.transform.as_ref();
                Some(self.shaper.body_sent(&dest.name, transform, claim.event, meta, body).await)
            }
            _ => None,
        };
        let (report, meta, sent) = match (&claim.meta, shaped) {
            (Some(_), Some(Err(reason))) => {
                drop(permit);
                self.finished(probe, Health::NotSent);
                TransformFailed { event: claim.event, destination: &dest.name, reason: &reason }
                    .emit(&self.metrics);
                (AttemptReport::not_sent(started_us, reason), claim.meta.as_ref(), false)
            }
            (Some(meta), Some(Ok((body, content_type)))) => {
                let span = tracing::Span::current();
                span.record("source", meta.source.as_str());
                span.record("event", meta.event.as_str());
                let webhook_id = dest.delivery_id(claim.event);
                let traceparent = self.tracer.traceparent(claim.event, span_id).header();
                let answer = dest
                    .send(Request {
                        webhook_id: &webhook_id,
                        source: &meta.source,
                        event: &meta.event,
                        resource: meta.resource.as_deref(),
                        content_type: content_type.as_deref(),
                        body,
                        attempt: claim.record.total_attempts + 1,
                        traceparent: &traceparent,
                    })
                    .await;
                drop(permit);
                let healthy = !matches!(answer.class, AnswerClass::Retry { .. });
                self.finished(probe, if healthy { Health::Healthy } else { Health::Unwell });
                AttemptFinished { destination: &dest.name, took: answer.duration }
                    .emit(&self.metrics);
                let report = AttemptReport {
                    attempt: Attempt {
                        at_us: started_us,
                        duration_us: crate::clock::micros(answer.duration),
                        status: answer.status,
                        error: answer.error.clone(),
                        answer: answer.excerpt.clone(),
                    },
                    class: answer.class,
                    jitter: fastrand::f64(),
                };
                (report, Some(meta), true)
            }
            _ => {
                drop(permit);
                self.finished(probe, Health::NotSent);
                // A replay of an event whose body retention dropped is refused by the
                // API; one that raced the drop finds nothing to send.
                let why = if claim.meta.is_some() {
                    "the event's body was dropped by retention.delivered_bodies"
                } else {
                    "the event is no longer stored"
                };
                (AttemptReport::not_sent(started_us, why.into()), None, false)
            }
        };
        let (status, error, class) =
            (report.attempt.status, report.attempt.error.clone(), report.class);
        if class == AnswerClass::Gone {
            // Paused here at once, before the record makes the retry due: a look in
            // between started it, and it reached the consumer after the pause (seen
            // on a loaded CI-faithful run). The store hears of it below.
            self.state.note_paused(true);
        }
        let recorded = self.recorder.record(claim.clone(), report).await;
        let verdict = match &recorded {
            Ok(AttemptWrite::Done(v)) => Some(*v),
            Ok(AttemptWrite::Stale | AttemptWrite::ClaimLost) | Err(_) => None,
        };
        // The record may have made due what the worker's sleep does not know (a retry,
        // the next delivery of an ordered resource): look now, not at the next poll (a
        // look woken by the answer raced this record, and an ordered destination on
        // PostgreSQL drained one delivery per resource a second).
        if pacer::look_after_record(verdict, dest.ordering != crate::config::Ordering::None) {
            self.state.wake.notify_one();
        }
        let recorded = recorded?;
        if let Some(meta) = meta {
            let attempt = trace::AttemptSpan {
                event: claim.event,
                meta,
                span: span_id,
                destination: &dest.name,
                host: dest.host(),
                number: claim.record.total_attempts + 1,
                start_us: started_us,
                end_us: crate::clock::now_us(),
                sent,
                status,
                error: error.as_deref(),
                verdict,
            };
            self.tracer.record(|salt| trace::attempt(salt, &attempt));
        }
        let Some(verdict) = verdict else {
            tracing::debug!(?recorded, "attempt not recorded: the delivery moved meanwhile");
            return Ok(());
        };
        AttemptRecorded {
            event: claim.event,
            meta,
            destination: &dest.name,
            attempt: claim.record.total_attempts + 1,
            status,
            error: error.as_deref(),
            verdict,
        }
        .emit(&self.metrics);
        let said = error.or_else(|| status.map(|s| format!("HTTP {s}")));
        lock(&self.state.activity).recorded(verdict, said, std::time::SystemTime::now());
        if class == AnswerClass::Gone {
            DestinationGone { destination: &dest.name }.emit(&self.metrics);
            self.store.set_paused(&dest.name, true).await?;
            // Again once written: a refresh that read the store between the pause in
            // memory above and this write is now stale too.
            self.state.note_paused(true);
        }
        Ok(())
    }

    /// Tells the pacer how an attempt ended (the circuit hears of it) and wakes the
    /// worker: a permit is free, and the circuit may have moved.
    pub(super) fn finished(&self, probe: bool, health: Health) {
        let dest = &self.state.dest;
        let finished = lock(&self.state.pacer).finished(Self::now(), probe, health);
        if finished.look {
            self.state.wake.notify_one();
        }
        if let Some(change) = finished.change {
            lock(&self.state.activity).circuit_moved(std::time::SystemTime::now());
            let open = change == CircuitChange::Opened;
            CircuitChanged { destination: &dest.name, open }.emit(&self.metrics);
        }
    }
}
