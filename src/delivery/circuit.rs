//! Circuit breaker: a destination that keeps failing is tested by one probe request
//! at a time instead of one request per waiting delivery. Probes start one second
//! after the circuit opens and their spacing doubles after each failed one, up to
//! `circuit_probe_interval`: a consumer back after a short outage is found within
//! seconds, a long outage costs one request per interval.
//!
//! Only failures that say "the consumer is unwell" count: 5xx, 408, 429, timeouts
//! and connection errors. A 4xx rejection of one event says nothing about the rest.

use std::sync::Mutex;
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

/// What the worker may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Closed: as many attempts as permits allow.
    Open,
    /// One attempt, the probe.
    Probe,
    /// Nothing before this long.
    Wait(Duration),
}

/// One destination's circuit.
pub(crate) struct Circuit {
    state: Mutex<State>,
    threshold: u32,
    interval: Duration,
}

impl Circuit {
    pub(crate) fn new(threshold: u32, interval: Duration) -> Self {
        Self { state: Mutex::new(State::Closed { failures: 0 }), threshold, interval }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // A poisoned lock only means a panic elsewhere mid-update: the state is a
        // plain value and still usable.
        let mut guard = crate::lock::lock(&self.state);
        f(&mut guard)
    }

    /// Asks to start attempts; moving from open to probing hands out the probe.
    pub(crate) fn gate(&self) -> Gate {
        self.with(|s| match *s {
            State::Closed { .. } => Gate::Open,
            State::Probing { wait } => Gate::Wait(wait),
            State::Open { until, wait } => {
                let now = Instant::now();
                if now >= until {
                    *s = State::Probing { wait };
                    Gate::Probe
                } else {
                    Gate::Wait(until - now)
                }
            }
        })
    }

    /// Gives back a probe that was not used (nothing was due after all).
    pub(crate) fn cancel_probe(&self) {
        self.with(|s| {
            if let State::Probing { wait } = *s {
                *s = State::Open { until: Instant::now(), wait };
            }
        });
    }

    /// Reports an attempt's result (`healthy`: the consumer answered sensibly).
    /// Returns true when this report changed whether the circuit is open.
    pub(crate) fn report(&self, healthy: bool) -> bool {
        self.with(|s| {
            let was_open = !matches!(s, State::Closed { .. });
            let now = Instant::now();
            *s = match (*s, healthy) {
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
            was_open != !matches!(s, State::Closed { .. })
        })
    }

    /// Where the circuit stands, as the admin API shows it.
    pub(crate) fn phase(&self) -> Phase {
        self.with(|s| match s {
            State::Closed { .. } => Phase::Closed,
            State::Open { .. } => Phase::Open,
            State::Probing { .. } => Phase::HalfOpen,
        })
    }

    /// The phase as its API word (the tests read better with it).
    #[cfg(test)]
    fn describe(&self) -> &'static str {
        match self.phase() {
            Phase::Closed => "closed",
            Phase::Open => "open",
            Phase::HalfOpen => "half_open",
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        self.phase() != Phase::Closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_the_threshold_and_probes_once_per_interval() {
        let c = Circuit::new(3, Duration::from_millis(50));
        assert_eq!(c.gate(), Gate::Open);
        assert!(!c.report(false));
        assert!(!c.report(false));
        c.report(true); // a success resets the count
        assert!(!c.report(false));
        assert!(!c.report(false));
        assert!(c.report(false), "third consecutive failure opens");
        assert_eq!(c.describe(), "open");
        assert!(matches!(c.gate(), Gate::Wait(d) if d <= Duration::from_millis(50)));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(c.gate(), Gate::Probe);
        assert!(matches!(c.gate(), Gate::Wait(_)), "one probe at a time");
        assert_eq!(c.describe(), "half_open");
        assert!(!c.report(false), "a failed probe keeps it open");
        assert!(matches!(c.gate(), Gate::Wait(_)));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(c.gate(), Gate::Probe);
        assert!(c.report(true), "a good probe closes it");
        assert_eq!(c.gate(), Gate::Open);
    }

    /// Probe spacing, after the circuit opened and each failed probe.
    fn spacing(c: &Circuit) -> Duration {
        match *crate::lock::lock(&c.state) {
            State::Open { wait, .. } | State::Probing { wait } => wait,
            State::Closed { .. } => Duration::ZERO,
        }
    }

    #[test]
    fn probes_start_after_a_second_and_back_off_to_the_interval() {
        let c = Circuit::new(1, Duration::from_secs(30));
        c.report(false);
        let mut seen = vec![spacing(&c)];
        for _ in 0..7 {
            // Fail the probe (forced due, as if its time had come).
            let current = *crate::lock::lock(&c.state);
            if let State::Open { wait, .. } = current {
                *crate::lock::lock(&c.state) = State::Probing { wait };
            }
            c.report(false);
            seen.push(spacing(&c));
        }
        let secs: Vec<u64> = seen.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30, 30]);
        c.report(true);
        assert_eq!(c.describe(), "closed");
        c.report(false);
        assert_eq!(spacing(&c), Duration::from_secs(1), "a new outage starts short again");
    }

    #[test]
    fn an_unused_probe_is_handed_back() {
        let c = Circuit::new(1, Duration::from_millis(10));
        c.report(false);
        std::thread::sleep(Duration::from_millis(15));
        assert_eq!(c.gate(), Gate::Probe);
        c.cancel_probe();
        assert_eq!(c.gate(), Gate::Probe, "the next look may probe at once");
        assert_eq!(c.describe(), "half_open");
    }
}
