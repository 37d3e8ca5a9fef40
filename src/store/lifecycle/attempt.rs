//! An attempt's answer moves a delivery on: delivered, retried later, or dead; a
//! finished head of a per-resource queue hands the turn to the next delivery.

use std::time::Duration;

use super::{backoff, Staged, View};
use crate::clock::micros;
use crate::config::RetryPolicy;
use crate::store::{
    resource_from_hex, Attempt, AttemptWrite, Claim, DeliveryRecord, DeliveryState, EventId,
    Recorded, StoreError,
};

/// How a destination answered, classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AnswerClass {
    /// 2xx.
    Success,
    /// Try again later: 408, 429, configured 4xx, 5xx, timeouts, connection errors.
    Retry { retry_after: Option<Duration> },
    /// Any other answer: retrying will not help.
    Permanent,
    /// 410: the consumer is gone; the destination is paused (retried once resumed,
    /// within the same `max_attempts` and `give_up_after` as any failure: a consumer
    /// that keeps answering 410 cannot keep a delivery alive for ever).
    Gone,
}

/// The decision, also the `outcome` label of `hookrelay_deliveries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptVerdict {
    /// 2xx.
    Success,
    /// Scheduled again.
    Retry,
    /// A permanent failure (non-retryable 4xx, 3xx): dead at once.
    Failed,
    /// Retries exhausted (`max_attempts` or `give_up_after`): dead.
    Dead,
}

impl AttemptVerdict {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Retry => "retry",
            Self::Failed => "failed",
            Self::Dead => "dead",
        }
    }
}

/// What one attempt found, as the worker saw it.
#[derive(Debug, Clone)]
pub(crate) struct AttemptReport {
    /// When it started, how long it took, the status, error and start of the answer.
    pub(crate) attempt: Attempt,
    pub(crate) class: AnswerClass,
    /// The backoff's random draw, uniform in `[0, 1)`.
    pub(crate) jitter: f64,
}

impl AttemptReport {
    /// An attempt that sent nothing and never can (the event is gone, the destination
    /// is no longer configured): a permanent failure at `at_us`, with `reason` as its
    /// error and answer.
    pub(crate) fn not_sent(at_us: u64, reason: String) -> Self {
        Self {
            attempt: Attempt {
                at_us,
                duration_us: 0,
                status: None,
                error: Some(reason.clone()),
                answer: Some(reason),
            },
            class: AnswerClass::Permanent,
            jitter: 0.0,
        }
    }

    /// When the attempt ended: the clock of every decision it causes.
    fn ended_us(&self) -> u64 {
        self.attempt.at_us.saturating_add(self.attempt.duration_us)
    }
}

/// Records the attempt made for the delivery of `event` to `dest` that was due at
/// `due_us`, and moves the delivery on under `policy`. Returns `None`, changing
/// nothing, if the delivery is no longer scheduled at `due_us` (a replay or another
/// relay moved it while the attempt was in flight).
pub(crate) fn record_attempt<V: View + ?Sized>(
    st: &mut Staged<'_, V>,
    event: EventId,
    dest: &str,
    due_us: u64,
    report: &AttemptReport,
    policy: &RetryPolicy,
) -> Result<Option<AttemptVerdict>, StoreError> {
    let Some(mut record) = st.delivery(event, dest)? else { return Ok(None) };
    if super::schedule_entry(&record) != Some(due_us) {
        return Ok(None);
    }
    let verdict = apply(&mut record, report, policy);
    if matches!(record.state, DeliveryState::Delivered | DeliveryState::Dead) {
        advance_queue(st, &record, report.ended_us())?;
    }
    st.put_delivery(record)?;
    Ok(Some(verdict))
}

/// Records a group of attempts, each made under its claim: [`record_attempt`] for each
/// whose claim `holds` still, [`AttemptWrite::ClaimLost`] for the others. An event an
/// attempt settled loses its body if it was received before `bodies_before_us`
/// (`retention.delivered_bodies`; [`super::drop_body_if_settled`]).
pub(crate) fn record_attempts<V: View + ?Sized>(
    st: &mut Staged<'_, V>,
    attempts: &[(Claim, AttemptReport)],
    policy: &RetryPolicy,
    bodies_before_us: Option<u64>,
    holds: impl Fn(&Claim) -> bool,
) -> Result<Recorded, StoreError> {
    let mut recorded = Recorded::default();
    for (claim, report) in attempts {
        if !holds(claim) {
            recorded.writes.push(AttemptWrite::ClaimLost);
            continue;
        }
        let verdict =
            record_attempt(st, claim.event, &claim.destination, claim.due_us, report, policy)?;
        if let (Some(_), Some(before)) = (verdict, bodies_before_us) {
            if super::drop_body_if_settled(st, claim.event, before)? {
                recorded.bodies_dropped += 1;
            }
        }
        recorded.writes.push(verdict.map_or(AttemptWrite::Stale, AttemptWrite::Done));
    }
    Ok(recorded)
}

/// The state machine of one attempt on the record itself.
fn apply(
    record: &mut DeliveryRecord,
    report: &AttemptReport,
    policy: &RetryPolicy,
) -> AttemptVerdict {
    let now_us = report.ended_us();
    if report.attempt.answer.is_some() || report.attempt.status.is_some() {
        record.last_response.clone_from(&report.attempt.answer);
    }
    record.push_attempt(report.attempt.clone());
    let retry_after = match report.class {
        AnswerClass::Success => {
            record.state = DeliveryState::Delivered;
            record.delivered_us = Some(now_us);
            record.next_attempt_us = None;
            return AttemptVerdict::Success;
        }
        AnswerClass::Permanent => {
            record.state = DeliveryState::Dead;
            record.next_attempt_us = None;
            return AttemptVerdict::Failed;
        }
        AnswerClass::Retry { retry_after } => retry_after,
        AnswerClass::Gone => None,
    };
    let exhausted = record.round_attempts >= policy.max_attempts
        || now_us.saturating_sub(record.round_started_us) >= micros(policy.give_up_after);
    if exhausted {
        record.state = DeliveryState::Dead;
        record.next_attempt_us = None;
        return AttemptVerdict::Dead;
    }
    let delay = backoff::next_delay(policy, record.round_attempts, retry_after, report.jitter);
    record.state = DeliveryState::Retrying;
    record.next_attempt_us = Some(now_us.saturating_add(micros(delay)));
    AttemptVerdict::Retry
}

/// A finished delivery at the head of its resource's queue hands the turn to the next
/// one (due at `now_us`), or removes the queue if it was the last. A finished delivery
/// that is not the head (a replay whose turn had passed) changes nothing.
fn advance_queue<V: View + ?Sized>(
    st: &mut Staged<'_, V>,
    done: &DeliveryRecord,
    now_us: u64,
) -> Result<(), StoreError> {
    let Some(resource) = done.resource.as_deref().and_then(resource_from_hex) else {
        return Ok(());
    };
    let dest = done.destination.as_str();
    let Some(queue) = st.queue(dest, &resource)? else { return Ok(()) };
    if queue.head != done.event {
        return Ok(());
    }
    let key = (dest.to_owned(), resource);
    // `done` was read through `st`: its link is the current one.
    let Some(next) = done.next_in_order else {
        st.changes.queues.insert(key, None);
        return Ok(());
    };
    let len = queue.len.saturating_sub(1);
    st.changes.queues.insert(key, Some(super::Queue { head: next, tail: queue.tail, len }));
    if let Some(mut rec) = st.delivery(next, dest)? {
        rec.state = DeliveryState::Pending;
        rec.next_attempt_us = Some(now_us);
        rec.round_started_us = now_us;
        st.put_delivery(rec)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(class: AnswerClass, status: Option<u16>, at_us: u64) -> AttemptReport {
        AttemptReport {
            attempt: Attempt {
                at_us,
                duration_us: 5_000,
                status,
                error: None,
                answer: Some("nope".into()),
            },
            class,
            jitter: 0.5,
        }
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            give_up_after: Duration::from_secs(3600),
            ..RetryPolicy::default()
        }
    }

    #[test]
    fn success_delivers() {
        let mut r = DeliveryRecord::new(EventId::new(1), "d", 1_000);
        assert_eq!(
            apply(&mut r, &report(AnswerClass::Success, Some(200), 2_000), &policy()),
            AttemptVerdict::Success
        );
        assert_eq!(r.state, DeliveryState::Delivered);
        assert_eq!(r.next_attempt_us, None);
        assert_eq!(r.delivered_us, Some(7_000));
        assert_eq!(r.attempts.len(), 1);
    }

    #[test]
    fn retries_until_max_attempts_then_dead() {
        let mut r = DeliveryRecord::new(EventId::new(1), "d", 0);
        let fail = |at| report(AnswerClass::Retry { retry_after: None }, Some(503), at);
        assert_eq!(apply(&mut r, &fail(10), &policy()), AttemptVerdict::Retry);
        assert_eq!(r.state, DeliveryState::Retrying);
        // Half of the first ceiling (1 s), after the attempt's end.
        assert_eq!(r.next_attempt_us, Some(10 + 5_000 + 500_000));
        assert_eq!(apply(&mut r, &fail(20), &policy()), AttemptVerdict::Retry);
        assert_eq!(apply(&mut r, &fail(30), &policy()), AttemptVerdict::Dead);
        assert_eq!(r.state, DeliveryState::Dead);
        assert_eq!(r.last_response.as_deref(), Some("nope"));
        // A replay starts a new round.
        r.restart(40);
        assert_eq!(apply(&mut r, &fail(50), &policy()), AttemptVerdict::Retry);
        assert_eq!(r.total_attempts, 4);
    }

    #[test]
    fn gives_up_after_the_time_budget() {
        let mut r = DeliveryRecord::new(EventId::new(1), "d", 0);
        let p = RetryPolicy {
            max_attempts: 50,
            give_up_after: Duration::from_secs(10),
            ..RetryPolicy::default()
        };
        let fail = |at| report(AnswerClass::Retry { retry_after: None }, None, at);
        assert_eq!(apply(&mut r, &fail(9_000_000), &p), AttemptVerdict::Retry);
        assert_eq!(apply(&mut r, &fail(10_000_000), &p), AttemptVerdict::Dead);
    }

    #[test]
    fn permanent_failures_die_at_once_and_gone_retries_within_the_policy() {
        let mut r = DeliveryRecord::new(EventId::new(1), "d", 0);
        assert_eq!(
            apply(&mut r, &report(AnswerClass::Permanent, Some(400), 1), &policy()),
            AttemptVerdict::Failed
        );
        assert_eq!(r.state, DeliveryState::Dead);
        // 410 pauses the destination; each resume that meets 410 again is one more
        // attempt of the round, and the round ends dead like any other.
        let mut r = DeliveryRecord::new(EventId::new(1), "d", 0);
        let gone = |t| report(AnswerClass::Gone, Some(410), t);
        let verdicts: Vec<_> = (1..=3).map(|t| apply(&mut r, &gone(t), &policy())).collect();
        assert_eq!(verdicts, [AttemptVerdict::Retry, AttemptVerdict::Retry, AttemptVerdict::Dead]);
        assert_eq!(r.state, DeliveryState::Dead);
    }

    #[test]
    fn retry_after_sets_the_next_attempt() {
        let mut r = DeliveryRecord::new(EventId::new(1), "d", 0);
        let a =
            report(AnswerClass::Retry { retry_after: Some(Duration::from_secs(30)) }, Some(429), 0);
        apply(&mut r, &a, &policy());
        assert!(r.next_attempt_us.unwrap() >= 30_000_000);
    }
}
