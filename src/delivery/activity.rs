//! What a destination did lately, as an operator on call asks it: deliveries in the
//! last minute, the last error and when, and since when the circuit is where it is.
//! Kept by each relay for its own attempts (a fleet's console shows the relay it
//! reached); pure, the caller passes the time in.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use crate::store::lifecycle::AttemptVerdict;

/// The window of "deliveries per minute".
const MINUTE: Duration = Duration::from_secs(60);

/// Most deliveries remembered for the rate (beyond it the rate reads as this many).
const MAX_REMEMBERED: usize = 100_000;

/// A destination's recent activity on this relay.
#[derive(Debug, Default)]
pub(crate) struct Activity {
    /// When each delivery of the last minute succeeded, oldest first.
    delivered: VecDeque<SystemTime>,
    /// The last failed attempt's error (or status), and when.
    last_error: Option<(String, SystemTime)>,
    /// When the first delivery after the last error succeeded: the error is old news.
    recovered: Option<SystemTime>,
    /// When the circuit last moved (open or closed); `None`: closed since start.
    circuit_since: Option<SystemTime>,
}

impl Activity {
    /// An attempt was recorded with `verdict`; `error` is its error or status.
    pub(crate) fn recorded(
        &mut self,
        verdict: AttemptVerdict,
        error: Option<String>,
        now: SystemTime,
    ) {
        match verdict {
            AttemptVerdict::Success => {
                self.delivered.push_back(now);
                if self.delivered.len() > MAX_REMEMBERED {
                    self.delivered.pop_front();
                }
                if self.last_error.is_some() && self.recovered.is_none() {
                    self.recovered = Some(now);
                }
            }
            AttemptVerdict::Retry | AttemptVerdict::Failed | AttemptVerdict::Dead => {
                self.last_error = Some((error.unwrap_or_else(|| "failed".into()), now));
                self.recovered = None;
            }
        }
        self.forget(now);
    }

    /// The circuit opened or closed at `now`.
    pub(crate) fn circuit_moved(&mut self, now: SystemTime) {
        self.circuit_since = Some(now);
    }

    /// Deliveries in the minute before `now`.
    pub(crate) fn per_minute(&mut self, now: SystemTime) -> u64 {
        self.forget(now);
        self.delivered.len() as u64
    }

    pub(crate) fn last_error(&self) -> Option<(String, SystemTime)> {
        self.last_error.clone()
    }

    /// When a delivery first succeeded after the last error, if one has.
    pub(crate) fn recovered(&self) -> Option<SystemTime> {
        self.recovered
    }

    pub(crate) fn circuit_since(&self) -> Option<SystemTime> {
        self.circuit_since
    }

    /// Drops deliveries older than a minute.
    fn forget(&mut self, now: SystemTime) {
        while self
            .delivered
            .front()
            .is_some_and(|t| now.duration_since(*t).unwrap_or_default() > MINUTE)
        {
            self.delivered.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_counts_the_last_minute_only() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut a = Activity::default();
        for i in 0..30 {
            a.recorded(AttemptVerdict::Success, None, t0 + Duration::from_secs(i));
        }
        assert_eq!(a.per_minute(t0 + Duration::from_secs(30)), 30);
        assert_eq!(a.per_minute(t0 + Duration::from_secs(75)), 15, "those of 15 s and later");
        assert_eq!(a.per_minute(t0 + Duration::from_secs(200)), 0);
    }

    #[test]
    fn the_last_error_is_the_latest_failure_and_survives_successes() {
        let t0 = SystemTime::UNIX_EPOCH;
        let mut a = Activity::default();
        assert_eq!(a.last_error(), None);
        a.recorded(AttemptVerdict::Retry, Some("HTTP 503".into()), t0);
        a.recorded(AttemptVerdict::Dead, Some("connection refused".into()), t0 + MINUTE);
        a.recorded(AttemptVerdict::Success, None, t0 + MINUTE * 2);
        assert_eq!(a.last_error(), Some(("connection refused".into(), t0 + MINUTE)));
        assert_eq!(a.recovered(), Some(t0 + MINUTE * 2), "recovered by the first success");
        a.recorded(AttemptVerdict::Success, None, t0 + MINUTE * 3);
        assert_eq!(a.recovered(), Some(t0 + MINUTE * 2), "the first one after it");
        a.recorded(AttemptVerdict::Retry, Some("HTTP 500".into()), t0 + MINUTE * 4);
        assert_eq!(a.recovered(), None, "failing again");
        a.circuit_moved(t0 + MINUTE * 3);
        assert_eq!(a.circuit_since(), Some(t0 + MINUTE * 3));
    }
}
