//! What an attempt's answer does to a delivery: delivered, retried later, or dead.

use std::time::Duration;

use super::backoff;
use crate::config::RetryPolicy;
use crate::destinations::{Answer, Outcome};
use crate::store::{Attempt, DeliveryRecord, DeliveryState};

/// The decision, also the `outcome` label of `hookrelay_deliveries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// 2xx.
    Success,
    /// Scheduled again.
    Retry,
    /// A permanent failure (non-retryable 4xx, 3xx): dead at once.
    Failed,
    /// Retries exhausted (`max_attempts` or `give_up_after`): dead.
    Dead,
}

impl Verdict {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Retry => "retry",
            Self::Failed => "failed",
            Self::Dead => "dead",
        }
    }
}

/// Records the attempt in `record` and moves it on.
pub(crate) fn apply(
    record: &mut DeliveryRecord,
    answer: &Answer,
    policy: &RetryPolicy,
    attempted_us: u64,
) -> Verdict {
    let now_us = attempted_us + micros(answer.duration);
    record.push_attempt(Attempt {
        at_us: attempted_us,
        duration_us: micros(answer.duration),
        status: answer.status,
        error: answer.error.clone(),
    });
    if answer.excerpt.is_some() || answer.status.is_some() {
        record.last_response.clone_from(&answer.excerpt);
    }
    let retry_after = match &answer.outcome {
        Outcome::Success => {
            record.state = DeliveryState::Delivered;
            record.delivered_us = Some(now_us);
            record.next_attempt_us = None;
            return Verdict::Success;
        }
        Outcome::Permanent => {
            record.state = DeliveryState::Dead;
            record.next_attempt_us = None;
            return Verdict::Failed;
        }
        Outcome::Retry { retry_after } => *retry_after,
        Outcome::Gone => None,
    };
    let exhausted = record.round_attempts >= policy.max_attempts
        || now_us.saturating_sub(record.round_started_us) >= micros(policy.give_up_after);
    if exhausted && answer.outcome != Outcome::Gone {
        record.state = DeliveryState::Dead;
        record.next_attempt_us = None;
        return Verdict::Dead;
    }
    let delay = backoff::next_delay(policy, record.round_attempts, retry_after);
    record.state = DeliveryState::Retrying;
    record.next_attempt_us = Some(now_us + micros(delay));
    Verdict::Retry
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_the_pre_created_outcomes() {
        for v in [Verdict::Success, Verdict::Retry, Verdict::Failed, Verdict::Dead] {
            assert!(crate::metrics::DELIVERY_OUTCOMES.contains(&v.label()), "{v:?}");
        }
    }
    use crate::store::EventId;

    fn answer(outcome: Outcome, status: Option<u16>) -> Answer {
        Answer {
            outcome,
            status,
            error: None,
            excerpt: Some("nope".into()),
            duration: Duration::from_millis(5),
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
            apply(&mut r, &answer(Outcome::Success, Some(200)), &policy(), 2_000),
            Verdict::Success
        );
        assert_eq!(r.state, DeliveryState::Delivered);
        assert_eq!(r.next_attempt_us, None);
        assert_eq!(r.delivered_us, Some(7_000));
        assert_eq!(r.attempts.len(), 1);
    }

    #[test]
    fn retries_until_max_attempts_then_dead() {
        let mut r = DeliveryRecord::new(EventId::new(1), "d", 0);
        let fail = answer(Outcome::Retry { retry_after: None }, Some(503));
        assert_eq!(apply(&mut r, &fail, &policy(), 10), Verdict::Retry);
        assert_eq!(r.state, DeliveryState::Retrying);
        let next = r.next_attempt_us.unwrap();
        assert!(next > 10 && next <= 10 + 5_000 + 1_000_000, "{next}");
        assert_eq!(apply(&mut r, &fail, &policy(), 20), Verdict::Retry);
        assert_eq!(apply(&mut r, &fail, &policy(), 30), Verdict::Dead);
        assert_eq!(r.state, DeliveryState::Dead);
        assert_eq!(r.last_response.as_deref(), Some("nope"));
        // A replay starts a new round.
        r.restart(40);
        assert_eq!(apply(&mut r, &fail, &policy(), 50), Verdict::Retry);
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
        let fail = answer(Outcome::Retry { retry_after: None }, None);
        assert_eq!(apply(&mut r, &fail, &p, 9_000_000), Verdict::Retry);
        assert_eq!(apply(&mut r, &fail, &p, 10_000_000), Verdict::Dead);
    }

    #[test]
    fn permanent_failures_die_at_once_and_gone_keeps_retrying() {
        let mut r = DeliveryRecord::new(EventId::new(1), "d", 0);
        assert_eq!(
            apply(&mut r, &answer(Outcome::Permanent, Some(400)), &policy(), 1),
            Verdict::Failed
        );
        assert_eq!(r.state, DeliveryState::Dead);
        let mut r = DeliveryRecord::new(EventId::new(1), "d", 0);
        for t in 1..10 {
            assert_eq!(
                apply(&mut r, &answer(Outcome::Gone, Some(410)), &policy(), t),
                Verdict::Retry
            );
        }
    }

    #[test]
    fn retry_after_sets_the_next_attempt() {
        let mut r = DeliveryRecord::new(EventId::new(1), "d", 0);
        let a = answer(Outcome::Retry { retry_after: Some(Duration::from_secs(30)) }, Some(429));
        apply(&mut r, &a, &policy(), 0);
        assert!(r.next_attempt_us.unwrap() >= 30_000_000);
    }
}
