//! The delivery worker's decisions, as pure code: when to claim, when to start an
//! attempt, when to give claims back and how long to sleep. The worker
//! (`worker.rs`) is the imperative shell around it: it asks [`Pacer::next`] what to do,
//! does it (a store call, a spawned request, a sleep) and reports back. Nothing here
//! does I/O or reads a clock; `tests.rs` checks by simulation that, from any state, a
//! consumer that answers well from time T has every due delivery attempted within a
//! bound after T ([`stall_bound`]), whatever faults came before.
//!
//! What it decides from, each time it is asked:
//! - the pause (every claim taken ahead is given back);
//! - the circuit ([`Circuit`]): while it is open, claims taken ahead are given back
//!   (they would only age), and the probe is handed out in the same step that starts
//!   its attempt, never before. A probe handed out with no attempt behind it left the
//!   circuit half-open for ever: the wedge this module exists to make impossible;
//! - this relay's share of `max_concurrency` and the permits free now;
//! - the rate limit's next slot;
//! - the claims taken ahead and their leases: one that could expire during its request
//!   is given back unstarted, so an attempt starts with its whole bound left on its
//!   claim (only a relay stalled mid-attempt outlives it: see `store::CLAIM_MARGIN`).
//!
//! Every answer is either work that moves something (claim, start, release) or a
//! sleep no longer than [`MAX_IDLE`], so the worker looks again at least that often.
//! A start, an idle look ([`Step::Idle`]) and a rest ([`Step::Rest`]) are progress for
//! the watchdog; a wait ([`Step::Sleep`]) is not, since it ends in a start within
//! [`stall_bound`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::circuit::{Circuit, Gate, Phase};
use crate::store::lifecycle::AttemptVerdict;

/// Longest sleep between two looks at the schedule (new deliveries, finished attempts
/// and resumes also wake the worker).
pub(crate) const MAX_IDLE: Duration = Duration::from_secs(1);
/// How old the pause state may be: a pause made through any relay stops this one
/// within this long.
pub(crate) const PAUSE_REFRESH: Duration = Duration::from_millis(500);

/// A claim as the pacer sees it: when its lease ends (store clock, µs).
pub(crate) trait Leased {
    fn expires_us(&self) -> u64;
}

/// The clock, passed in: monotonic for the circuit and the rate limit, the store's
/// wall clock (µs) for leases.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Now {
    pub(crate) at: Instant,
    pub(crate) wall_us: u64,
}

/// What the shell knows when it asks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Room {
    /// The destination is paused (as last read from the store).
    pub(crate) paused: bool,
    /// This relay's share of `max_concurrency` (0 while it joins a fleet).
    pub(crate) share: usize,
    /// Requests this relay may start now: its share less its requests in flight.
    pub(crate) free: usize,
    /// Time between two starts under `rate_limit` (this relay's part of it, which
    /// changes with the fleet's size).
    pub(crate) interval: Option<Duration>,
}

/// The longest time between two starts under a rate limit: a rate below one request
/// an hour is refused by validation, and a smaller one is read as this.
const MAX_RATE_INTERVAL: Duration = Duration::from_secs(3600);

/// Time between two starts for `rate` requests a second (never a panic, whatever the
/// float).
pub(crate) fn rate_interval(rate: f64) -> Duration {
    Duration::try_from_secs_f64(1.0 / rate).map_or(MAX_RATE_INTERVAL, |d| d.min(MAX_RATE_INTERVAL))
}

/// What the worker does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step<C> {
    /// Give these claims back to the store unstarted.
    Release(Vec<C>),
    /// Claim up to this many due deliveries and hand them to [`Pacer::claimed`].
    Claim(usize),
    /// Start an attempt for this claim; `probe`: it is the circuit's probe. The shell
    /// must report its end through [`Pacer::finished`], sent or not.
    Start { claim: C, probe: bool },
    /// Nothing is claimed and nothing more could be: sleep until the next delivery is
    /// due, at most [`MAX_IDLE`]. Progress, for the watchdog.
    Idle,
    /// Nothing this worker may do for this long (paused, or no share of the fleet's
    /// limits): progress, for the watchdog.
    Rest(Duration),
    /// Wait this long (or until a wake-up) for the circuit, a permit or the rate
    /// limit: bounded waits that end in a start, not progress by themselves.
    Sleep(Duration),
}

/// What an attempt says of the consumer's health, for the circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Health {
    /// The consumer answered sensibly (2xx, or a 4xx about this one event).
    Healthy,
    /// 5xx, 408, 429, a timeout or a connection error.
    Unwell,
    /// No request was sent (the event is gone): says nothing about the consumer.
    NotSent,
}

/// A change of the circuit worth a log line and a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CircuitChange {
    Opened,
    Closed,
}

/// One destination's worker state on this relay.
#[derive(Debug)]
pub(crate) struct Pacer<C> {
    circuit: Circuit,
    /// A claim must have this much lease left to start (the request timeout).
    must_last: Duration,
    /// Earliest start of the next request under the rate limit.
    next_slot: Option<Instant>,
    /// Claims taken ahead of the permits, so that a claim costs a fraction of a store
    /// call.
    ahead: VecDeque<C>,
    /// A claim was made since the last sleep: what it left is what there is.
    claimed: bool,
    /// The look ended in a wait that an attempt's end may cut short (a permit, the
    /// circuit, the rate limit) or in a start the shell could not make: a finished
    /// attempt wakes the worker only then (see [`Finished::look`]).
    waiting: bool,
}

/// What an attempt's end means for the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Finished {
    /// The circuit moved.
    pub(crate) change: Option<CircuitChange>,
    /// The worker should look again now: it waits for what the end freed (a permit,
    /// the circuit), or the circuit moved. After a look that found the schedule
    /// drained, a freed permit changes nothing: new deliveries wake the worker
    /// themselves, and the record's own news is [`look_after_record`]'s.
    pub(crate) look: bool,
}

/// Whether an attempt's record may have made due what the worker's sleep does not
/// know of: a retry's new time, or, for an ordered destination, the resource's next
/// delivery, which a final record releases. A record not written as the worker's
/// (`None`: stale, claim lost, the write failed) looks too. An unordered destination's
/// success makes nothing due: at a gentle rate that look was half the worker's store
/// calls (issue 44).
pub(crate) fn look_after_record(verdict: Option<AttemptVerdict>, ordered: bool) -> bool {
    match verdict {
        Some(AttemptVerdict::Retry) | None => true,
        Some(AttemptVerdict::Success | AttemptVerdict::Failed | AttemptVerdict::Dead) => ordered,
    }
}

impl<C: Leased> Pacer<C> {
    pub(crate) fn new(circuit: Circuit, must_last: Duration) -> Self {
        Self {
            circuit,
            must_last,
            next_slot: None,
            ahead: VecDeque::new(),
            claimed: false,
            waiting: false,
        }
    }

    /// A look begins (after a sleep, a wake-up or a failed store call): the store may
    /// have new due deliveries, so the next [`Pacer::next`] may claim again.
    pub(crate) fn begin(&mut self) {
        self.claimed = false;
        self.waiting = false;
    }

    /// What to do at `now` with `room`. Call again after doing it, until it says
    /// [`Step::Idle`] or [`Step::Sleep`].
    pub(crate) fn next(&mut self, now: Now, room: Room) -> Step<C> {
        if room.paused || room.share == 0 {
            return self.give_back_all().unwrap_or_else(|| {
                self.claimed = false;
                Step::Rest(PAUSE_REFRESH)
            });
        }
        // A claim that could expire during its request is given back: another relay
        // may take it over once it expires, and the same delivery would be sent twice
        // at once.
        let must_last = crate::clock::micros(self.must_last);
        if self.ahead.iter().any(|c| c.expires_us().saturating_sub(now.wall_us) <= must_last) {
            let (keep, stale): (VecDeque<C>, VecDeque<C>) = std::mem::take(&mut self.ahead)
                .into_iter()
                .partition(|c| c.expires_us().saturating_sub(now.wall_us) > must_last);
            self.ahead = keep;
            return Step::Release(stale.into());
        }
        let (allowance, probe) = match self.circuit.gate(now.at) {
            Gate::Open => (room.free, false),
            Gate::Probe => (room.free.min(1), true),
            // While the circuit is open, claims taken ahead only age: give them back,
            // so that they are due for whoever can send them.
            Gate::Wait(d) => return self.give_back_all().unwrap_or_else(|| self.sleep(d)),
            Gate::Probing => return self.give_back_all().unwrap_or_else(|| self.sleep(MAX_IDLE)),
        };
        if allowance == 0 {
            // Every permit is in use: a finished attempt wakes the worker.
            return self.sleep(MAX_IDLE);
        }
        if let (Some(_), Some(slot)) = (room.interval, self.next_slot) {
            if slot > now.at {
                return self.sleep(slot - now.at);
            }
        }
        if self.ahead.len() < allowance && !self.claimed {
            self.claimed = true;
            // A probe needs one claim; otherwise twice this relay's share, so that the
            // next free permits find a claim waiting.
            let want = if probe { 1 } else { 2 * room.share };
            return Step::Claim(want.saturating_sub(self.ahead.len()).max(1));
        }
        let Some(claim) = self.ahead.pop_front() else {
            self.claimed = false;
            return Step::Idle;
        };
        if let Some(interval) = room.interval {
            self.next_slot = now.at.checked_add(interval);
        }
        if probe {
            self.circuit.start_probe();
        }
        Step::Start { claim, probe }
    }

    /// The claims a [`Step::Claim`] made (possibly none).
    pub(crate) fn claimed(&mut self, claims: impl IntoIterator<Item = C>) {
        self.ahead.extend(claims);
    }

    /// A [`Step::Start`] that could not start after all (no permit): the claim goes
    /// back to the front, and a probe is handed back.
    pub(crate) fn not_started(&mut self, now: Now, claim: C, probe: bool) {
        self.ahead.push_front(claim);
        self.waiting = true;
        if probe {
            self.circuit.cancel_probe(now.at);
        }
    }

    /// An attempt started by [`Step::Start`] ended, telling `health`.
    pub(crate) fn finished(&mut self, now: Now, probe: bool, health: Health) -> Finished {
        let change = match health {
            Health::Healthy | Health::Unwell => {
                self.circuit.report(now.at, health == Health::Healthy).then(|| {
                    if self.circuit.is_open() {
                        CircuitChange::Opened
                    } else {
                        CircuitChange::Closed
                    }
                })
            }
            Health::NotSent => {
                if probe {
                    self.circuit.cancel_probe(now.at);
                }
                None
            }
        };
        Finished { change, look: self.waiting || change.is_some() }
    }

    /// The claims taken ahead, still held.
    pub(crate) fn ahead(&self) -> impl Iterator<Item = &C> {
        self.ahead.iter()
    }

    /// Every claim taken ahead, to give back (the worker stops or restarts).
    pub(crate) fn drain(&mut self) -> Vec<C> {
        self.ahead.drain(..).collect()
    }

    pub(crate) fn phase(&self) -> Phase {
        self.circuit.phase()
    }

    fn give_back_all(&mut self) -> Option<Step<C>> {
        (!self.ahead.is_empty()).then(|| Step::Release(self.drain()))
    }

    fn sleep(&mut self, d: Duration) -> Step<C> {
        self.claimed = false;
        self.waiting = true;
        Step::Sleep(d.min(MAX_IDLE))
    }
}

/// How long a worker may go without progress (an attempt started, or a look that
/// found nothing it may do) before that is a stall: the longest the pacer itself makes
/// due work wait (a probe interval, a request holding every permit for its timeout, a
/// rate-limit slot, two sleeps) and a margin for a slow store.
pub(crate) fn stall_bound(
    probe_interval: Duration,
    must_last: Duration,
    interval: Option<Duration>,
) -> Duration {
    probe_interval + must_last + interval.unwrap_or_default() + MAX_IDLE * 2 + STORE_MARGIN
}

/// Room in [`stall_bound`] for store calls that are slow but answer.
const STORE_MARGIN: Duration = Duration::from_secs(10);

#[cfg(test)]
#[path = "pacer_tests.rs"]
mod tests;
