//! The write budget of free-space admission (`space/mod.rs`): pure, so that the rule
//! that keeps a fast fill above the floor can be property-tested without a disk.

/// The write budget between two measurements of free space: pure, fed the free space
/// measured and the bytes writers ask for.
#[derive(Clone, Debug)]
pub(crate) struct Budget {
    /// Disk bytes still to be granted before the next measurement.
    left: u64,
    /// Disk bytes written per byte admitted, as measured (at least [`MIN_AMPLIFICATION`]).
    amplification: f64,
    /// Bytes admitted since the last measurement, and the free space then.
    admitted: u64,
    last_free: Option<u64>,
}

/// The least write amplification assumed: records, indexes and the engine's own pages
/// come with every body.
pub(crate) const MIN_AMPLIFICATION: f64 = 4.0;
/// The most (a measurement this far off is the engine growing in a step, not a rate).
const MAX_AMPLIFICATION: f64 = 64.0;
/// A write this large must still fit above the floor for the relay to count as above
/// it: closer than that, the budget halves towards the floor without end, and the
/// relay is as good as at it (not ready, writers held).
const MARGIN_WRITE: u64 = 64 << 10;
/// Bytes admitted before a measurement updates the amplification (fewer say little).
const AMPLIFICATION_SAMPLE: u64 = 256 << 10;

impl Default for Budget {
    fn default() -> Self {
        Self { left: 0, amplification: MIN_AMPLIFICATION, admitted: 0, last_free: None }
    }
}

impl Budget {
    /// A measurement: `free` bytes free, `floor` the floor. Learns the amplification
    /// from how much free space the bytes admitted since the last one took, and grants
    /// half the room above the floor.
    pub(crate) fn measured(&mut self, free: u64, floor: u64) {
        if let Some(before) = self.last_free {
            if self.admitted >= AMPLIFICATION_SAMPLE && before > free {
                let seen = (before - free) as f64 / self.admitted as f64;
                // Quick to rise, slow to fall: under-estimating is what costs the floor.
                let next = if seen > self.amplification {
                    seen
                } else {
                    (self.amplification + seen) / 2.0
                };
                self.amplification = next.clamp(MIN_AMPLIFICATION, MAX_AMPLIFICATION);
            }
        }
        if self.admitted >= AMPLIFICATION_SAMPLE
            || self.last_free.is_none()
            || free > self.last_free.unwrap_or(0)
        {
            self.admitted = 0;
            self.last_free = Some(free);
        }
        self.left = free.saturating_sub(floor) / 2;
    }

    /// Takes `bytes` (before amplification) out of the budget: whether they fit. When
    /// they do not, nothing is taken: measure, then ask again.
    pub(crate) fn take(&mut self, bytes: u64) -> bool {
        let cost = (bytes as f64 * self.amplification).ceil() as u64;
        if cost > self.left {
            return false;
        }
        self.left -= cost;
        self.admitted = self.admitted.saturating_add(bytes);
        true
    }

    /// The room above the floor under which the relay counts as below it: twice the
    /// disk bytes of a [`MARGIN_WRITE`] (the budget grants half the room).
    pub(crate) fn margin(&self) -> u64 {
        (2.0 * MARGIN_WRITE as f64 * self.amplification).ceil() as u64
    }

    /// The amplification as measured.
    #[cfg(test)]
    pub(crate) fn amplification(&self) -> f64 {
        self.amplification
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    /// A disk and writers against the budget: `amp` disk bytes per byte admitted.
    /// Returns the lowest free space seen and how many writes were admitted.
    fn fill(free: u64, floor: u64, amp: f64, sizes: &[u64]) -> (u64, usize, Budget) {
        let (mut free, mut lowest, mut admitted) = (free, free, 0);
        let mut budget = Budget::default();
        budget.measured(free, floor);
        for &bytes in sizes.iter().cycle().take(20_000) {
            let granted = budget.take(bytes) || {
                budget.measured(free, floor);
                free >= floor && budget.take(bytes)
            };
            if granted {
                free = free.saturating_sub((bytes as f64 * amp) as u64);
                admitted += 1;
                lowest = lowest.min(free);
            }
        }
        (lowest, admitted, budget)
    }

    proptest! {
        /// Whatever the sizes, an engine writing up to twice the amplification assumed
        /// never takes the disk below the floor, and the writes fill it close to it.
        #[test]
        fn a_fast_fill_never_crosses_the_floor(
            sizes in proptest::collection::vec(1u64..(64 << 10), 1..50),
            amp in 1.0f64..(2.0 * MIN_AMPLIFICATION),
        ) {
            let (lowest, admitted, _) = fill(56 * MIB, 8 * MIB, amp, &sizes);
            prop_assert!(lowest >= 8 * MIB, "lowest {lowest}");
            prop_assert!(admitted > 0);
        }
    }

    #[test]
    fn the_amplification_is_learnt_and_then_the_floor_holds() {
        // An engine writing 20 bytes per byte: the first window may overshoot what
        // was assumed, the measurement learns it, the rest keeps to the floor.
        let mut budget = Budget::default();
        budget.measured(1_000 * MIB, 8 * MIB);
        let mut free = 1_000 * MIB;
        for _ in 0..100 {
            assert!(budget.take(16 << 10));
            free -= 20 * (16 << 10);
        }
        budget.measured(free, 8 * MIB);
        assert!(budget.amplification() >= 19.0, "{}", budget.amplification());
        let (lowest, _, _) = fill(60 * MIB, 8 * MIB, 20.0 * 1.9, &[16 << 10]);
        assert!(lowest < 8 * MIB, "unlearnt, 38x jumps the floor: {lowest}");
        let mut learnt = budget.clone();
        learnt.measured(60 * MIB, 8 * MIB);
        assert!(learnt.take(16 << 10));
    }

    #[test]
    fn freed_space_is_granted_again() {
        let mut budget = Budget::default();
        budget.measured(9 * MIB, 8 * MIB);
        assert!(!budget.take(MIB));
        budget.measured(40 * MIB, 8 * MIB);
        assert!(budget.take(MIB));
    }
}
