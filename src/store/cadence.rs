//! When the next ack's write is expected: the one rule by which a write that can wait
//! a little (an attempt's record) decides whether to wait for the next ack's, to
//! share its fsync (`embedded/flush.rs`) or its whole transaction (`commit.rs`), or
//! to go at once because none is coming soon.

use std::time::{Duration, Instant};

/// The most an attempt's record waits to share an ack's write, and so the most it
/// adds before its outcome is known (a record that releases the next delivery of a
/// resource's queue does not wait). At 200 callbacks a second an ack comes every
/// 5 ms, about 3.5 ms after a record.
pub(crate) const RECORD_LINGER: Duration = Duration::from_millis(5);

/// The rhythm of the acks' writes: when the last one came, and the mean interval
/// between them (exponentially weighted, µs). Pure: the caller passes the clock.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Cadence {
    last: Option<Instant>,
    interval_us: f64,
}

impl Cadence {
    /// Notes an ack's write at `now`.
    pub(crate) fn noted(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let gap = now.saturating_duration_since(last).as_micros() as f64;
            self.interval_us =
                if self.interval_us == 0.0 { gap } else { 0.8 * self.interval_us + 0.2 * gap };
        }
        self.last = Some(now);
    }

    /// Whether the next ack's write is expected by `deadline`: they have been coming
    /// at a mean interval that puts the next one before it, and the last is not
    /// overdue by more than an interval (they stopped).
    pub(crate) fn expected_by(&self, now: Instant, deadline: Instant) -> bool {
        let Some(last) = self.last else { return false };
        if self.interval_us <= 0.0 {
            return false;
        }
        let interval = Duration::from_micros(self.interval_us as u64);
        last + interval <= deadline && now.saturating_duration_since(last) <= interval * 2
    }

    /// Until when a write that may wait `linger` from `now` waits for the next ack's:
    /// `None` when none is expected by then (it goes at once).
    pub(crate) fn linger_until(&self, now: Instant, linger: Duration) -> Option<Instant> {
        Some(now + linger).filter(|&deadline| self.expected_by(now, deadline))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn nothing_is_expected_before_two_acks_have_set_a_rhythm() {
        let t0 = Instant::now();
        let mut c = Cadence::default();
        assert_eq!(c.linger_until(t0, ms(5)), None);
        c.noted(t0);
        assert_eq!(c.linger_until(t0 + ms(1), ms(5)), None, "one ack is no rhythm");
        c.noted(t0 + ms(4));
        assert_eq!(c.linger_until(t0 + ms(5), ms(5)), Some(t0 + ms(10)));
    }

    /// Acks every 4 ms: expected within a 5 ms linger; every 20 ms: not; stopped (the
    /// last more than two intervals ago): not, however short the rhythm was.
    #[test]
    fn an_ack_is_expected_only_within_the_linger_and_while_they_keep_coming() {
        let t0 = Instant::now();
        let every = |gap: u64| {
            let mut c = Cadence::default();
            for i in 0..10 {
                c.noted(t0 + ms(gap * i));
            }
            (c, t0 + ms(gap * 9))
        };
        let (fast, last) = every(4);
        assert!(fast.linger_until(last + ms(1), ms(5)).is_some());
        assert!(fast.linger_until(last + ms(9), ms(5)).is_none(), "overdue: they stopped");
        let (slow, last) = every(20);
        assert!(slow.linger_until(last + ms(1), ms(5)).is_none());
    }

    /// The interval follows a change of rate within a few acks, not at once: one odd
    /// gap does not stop the lingering.
    #[test]
    fn the_rhythm_follows_the_rate_smoothly() {
        let t0 = Instant::now();
        let mut c = Cadence::default();
        let mut at = t0;
        for _ in 0..10 {
            c.noted(at);
            at += ms(4);
        }
        at += ms(6);
        c.noted(at);
        assert!(c.linger_until(at + ms(1), ms(5)).is_some(), "one 10 ms gap");
        for _ in 0..10 {
            at += ms(30);
            c.noted(at);
        }
        assert!(c.linger_until(at + ms(1), ms(5)).is_none(), "the rate fell to 33/s");
    }
}
