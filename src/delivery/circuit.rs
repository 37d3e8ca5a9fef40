//! Circuit breaker: a destination that keeps failing is tested by one probe request
//! at a time instead of one request per waiting delivery. Probes start one second
//! after the circuit opens and their spacing doubles after each failed one, up to
//! `circuit_probe_interval`: a consumer back after a short outage is found within
//! seconds, a long outage costs one request per interval.
//!
//! Only failures that say "the consumer is unwell" count: 5xx, 408, 429, timeouts
//! and connection errors. A 4xx rejection of one event says nothing about the rest.
//!
//! A plain value with the clock passed in: the [`super::pacer::Pacer`] owns it and is
//! the only one to move it, so the probe can be handed out only when an attempt really
//! starts (see the pacer for why that matters).

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
    },
    /// No requests until `until`; then one probe. `wait` is the spacing that led here.
    Open {
        until: Instant,
        wait: Duration,
    },
    /// The probe is in flight; nothing else starts.
    Probing {
        wait: Duration,
    },
}

/// Whether a destination's circuit lets deliveries through: `closed`, `open`, or
/// `half_open` while its probe is in flight.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "Circuit")]
pub(crate) enum Phase {
    Closed,
    Open,
    HalfOpen,
}

/// The first probe's delay after the circuit opens (or the interval, if shorter).
const FIRST_PROBE: Duration = Duration::from_secs(1);

/// What the circuit allows at a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Closed: as many attempts as permits allow.
    Open,
    /// One attempt, the probe, may start (it is handed out by [`Circuit::start_probe`]).
    Probe,
    /// Open: nothing before this long.
    Wait(Duration),
    /// The probe is in flight: nothing until it answers.
    Probing,
}

/// One destination's circuit.
#[derive(Debug, Clone)]
pub(crate) struct Circuit {
    state: State,
    threshold: u32,
    interval: Duration,
}

impl Circuit {
    pub(crate) fn new(threshold: u32, interval: Duration) -> Self {
        Self { state: State::Closed { failures: 0 }, threshold, interval }
    }

    /// What may start at `now`; asking changes nothing.
    pub(crate) fn gate(&self, now: Instant) -> Gate {
        match self.state {
            State::Closed { .. } => Gate::Open,
            State::Probing { .. } => Gate::Probing,
            State::Open { until, .. } if now >= until => Gate::Probe,
            State::Open { until, .. } => Gate::Wait(until - now),
        }
    }

    /// The probe's attempt starts: nothing else starts until it answers.
    pub(crate) fn start_probe(&mut self) {
        if let State::Open { wait, .. } = self.state {
            self.state = State::Probing { wait };
        }
    }

    /// The probe's attempt ended without the consumer saying anything (no request was
    /// sent): the next look may probe at once.
    pub(crate) fn cancel_probe(&mut self, now: Instant) {
        if let State::Probing { wait } = self.state {
            self.state = State::Open { until: now, wait };
        }
    }

    /// Reports an attempt's result at `now` (`healthy`: the consumer answered
    /// sensibly). Returns true when this report changed whether the circuit is open.
    pub(crate) fn report(&mut self, now: Instant, healthy: bool) -> bool {
        let was_open = self.is_open();
        self.state = match (self.state, healthy) {
            (_, true) => State::Closed { failures: 0 },
            (State::Closed { failures }, false) if failures + 1 < self.threshold => {
                State::Closed { failures: failures + 1 }
            }
            (open @ State::Open { .. }, false) => open,
            (State::Probing { wait }, false) => {
                let wait = wait.saturating_mul(2).min(self.interval);
                State::Open { until: now + wait, wait }
            }
            (State::Closed { .. }, false) => {
                let wait = FIRST_PROBE.min(self.interval);
                State::Open { until: now + wait, wait }
            }
        };
        was_open != self.is_open()
    }

    /// Where the circuit stands, as the admin API shows it.
    pub(crate) fn phase(&self) -> Phase {
        match self.state {
            State::Closed { .. } => Phase::Closed,
            State::Open { .. } => Phase::Open,
            State::Probing { .. } => Phase::HalfOpen,
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        self.phase() != Phase::Closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn opens_after_the_threshold_and_probes_once_per_interval() {
        let t0 = Instant::now();
        let mut c = Circuit::new(3, MS * 50);
        assert_eq!(c.gate(t0), Gate::Open);
        assert!(!c.report(t0, false));
        assert!(!c.report(t0, false));
        c.report(t0, true); // a success resets the count
        assert!(!c.report(t0, false));
        assert!(!c.report(t0, false));
        assert!(c.report(t0, false), "third consecutive failure opens");
        assert_eq!(c.phase(), Phase::Open);
        assert!(matches!(c.gate(t0), Gate::Wait(d) if d <= MS * 50));
        let t1 = t0 + MS * 60;
        assert_eq!(c.gate(t1), Gate::Probe);
        assert_eq!(c.gate(t1), Gate::Probe, "asking hands nothing out");
        c.start_probe();
        assert_eq!(c.gate(t1), Gate::Probing, "one probe at a time");
        assert_eq!(c.phase(), Phase::HalfOpen);
        assert!(!c.report(t1, false), "a failed probe keeps it open");
        assert!(matches!(c.gate(t1), Gate::Wait(_)));
        let t2 = t1 + MS * 120;
        assert_eq!(c.gate(t2), Gate::Probe);
        c.start_probe();
        assert!(c.report(t2, true), "a good probe closes it");
        assert_eq!(c.gate(t2), Gate::Open);
    }

    /// Probe spacing, after the circuit opened and each failed probe.
    fn spacing(c: &Circuit) -> Duration {
        match c.state {
            State::Open { wait, .. } | State::Probing { wait } => wait,
            State::Closed { .. } => Duration::ZERO,
        }
    }

    #[test]
    fn probes_start_after_a_second_and_back_off_to_the_interval() {
        let mut now = Instant::now();
        let mut c = Circuit::new(1, Duration::from_secs(30));
        c.report(now, false);
        let mut seen = vec![spacing(&c)];
        for _ in 0..7 {
            now += spacing(&c);
            assert_eq!(c.gate(now), Gate::Probe);
            c.start_probe();
            c.report(now, false);
            seen.push(spacing(&c));
        }
        let secs: Vec<u64> = seen.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30, 30]);
        c.report(now, true);
        assert_eq!(c.phase(), Phase::Closed);
        c.report(now, false);
        assert_eq!(spacing(&c), Duration::from_secs(1), "a new outage starts short again");
    }

    #[test]
    fn an_unused_probe_is_handed_back() {
        let t0 = Instant::now();
        let mut c = Circuit::new(1, MS * 10);
        c.report(t0, false);
        let t1 = t0 + MS * 15;
        c.start_probe();
        c.cancel_probe(t1);
        assert_eq!(c.gate(t1), Gate::Probe, "the next look may probe at once");
        assert_eq!(c.phase(), Phase::Open);
    }
}
