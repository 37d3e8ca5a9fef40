//! The progress watchdog of one destination on this relay. The worker marks progress
//! when an attempt starts, and when a look finds nothing it may do for reasons outside
//! itself (nothing claimable, paused, no share of the fleet's limits, below the
//! free-space floor). Every other wait the pacer imposes (the circuit's probe
//! interval, permits held by requests in flight, the rate limit) ends in a start within
//! [`super::pacer::stall_bound`]. So a worker with no mark for longer than that is
//! stalled: due work is not being attempted, or the worker cannot even look (a store
//! call that never returns, a store that keeps failing).
//!
//! The pacer is built so that the first cannot happen; the watchdog is there for what a
//! design cannot promise, so a stall is never silent again: it is logged with the
//! state, shown by `hookrelay_destination_stalled` and `/readyz`, alerted on
//! (`HookrelayDestinationStalled`), and healed by restarting the worker, at most
//! [`MAX_HEALS`] times an hour.
//!
//! The verdict is pure ([`Watch::observe`]); `worker.rs` feeds it.

use std::time::{Duration, Instant};

/// Worker restarts per destination and hour at most: beyond that a restart is not
/// what helps, and the stall stays reported until an operator looks.
pub(crate) const MAX_HEALS: usize = 3;

/// What a look changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// No progress for `idle`: restart the worker if `heal`.
    Stalled { idle: Duration, heal: bool },
    /// Progress again.
    Recovered,
}

/// The watchdog's memory between looks.
#[derive(Debug)]
pub(crate) struct Watch {
    /// When watching began (progress before it does not count against the worker).
    since: Instant,
    /// When this stall was last healed (or first seen).
    stalled_at: Option<Instant>,
    /// Restarts made, for the hourly budget.
    heals: Vec<Instant>,
}

impl Watch {
    pub(crate) fn new(now: Instant) -> Self {
        Self { since: now, stalled_at: None, heals: Vec::new() }
    }

    /// Takes one look at `now`, given the worker's last mark of progress; `bound` is
    /// how long a worker may go without one.
    pub(crate) fn observe(
        &mut self,
        now: Instant,
        progress: Option<Instant>,
        bound: Duration,
    ) -> Option<Change> {
        let last = progress.map_or(self.since, |p| p.max(self.since));
        let idle = now.saturating_duration_since(last);
        if idle < bound {
            return self.stalled_at.take().map(|_| Change::Recovered);
        }
        // Stalled: heal now if it is new or the last heal had a whole bound to work,
        // within the hour's budget.
        let heal_due = self.stalled_at.is_none_or(|t| now.saturating_duration_since(t) >= bound);
        if !heal_due {
            return None;
        }
        let first = self.stalled_at.is_none();
        self.stalled_at = Some(now);
        self.heals.retain(|t| now.saturating_duration_since(*t) < Duration::from_secs(3600));
        let heal = self.heals.len() < MAX_HEALS;
        if heal {
            self.heals.push(now);
        }
        (first || heal).then_some(Change::Stalled { idle, heal })
    }

    /// Whether the destination is stalled now.
    pub(crate) fn is_stalled(&self) -> bool {
        self.stalled_at.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn no_progress_for_the_bound_is_a_stall_healed_within_budget() {
        let t0 = Instant::now();
        let mut w = Watch::new(t0);
        let bound = S * 10;
        assert_eq!(w.observe(t0 + S * 9, None, bound), None, "watching only began");
        assert_eq!(
            w.observe(t0 + S * 10, None, bound),
            Some(Change::Stalled { idle: S * 10, heal: true })
        );
        assert!(w.is_stalled());
        assert_eq!(w.observe(t0 + S * 15, None, bound), None, "a heal gets a bound to work");
        for i in 0..2 {
            let at = t0 + S * (20 + 10 * i);
            assert!(matches!(w.observe(at, None, bound), Some(Change::Stalled { heal: true, .. })));
        }
        assert_eq!(w.observe(t0 + S * 40, None, bound), None, "the hour's budget is spent");
        assert!(w.is_stalled());
        let start = t0 + S * 41;
        assert_eq!(w.observe(start, Some(start), bound), Some(Change::Recovered));
        assert!(!w.is_stalled());
        // An hour after the first heal, the budget is back.
        let later = t0 + S * 3_700;
        assert!(matches!(
            w.observe(later, Some(start), bound),
            Some(Change::Stalled { heal: true, .. })
        ));
    }

    #[test]
    fn steady_progress_is_no_stall() {
        let t0 = Instant::now();
        let bound = S * 10;
        let mut w = Watch::new(t0);
        for i in 0..100 {
            // Progress every 5 s (an attempt, or a look that found nothing to do).
            let last = t0 + S * (i - i % 5);
            assert_eq!(w.observe(t0 + S * i, Some(last), bound), None);
        }
    }
}
