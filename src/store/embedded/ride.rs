//! An attempt's record riding the committer's next group (`store::commit`): written in
//! the transaction that stores (and, when quiet, dispatches) the group, and durable
//! with its fsync. At a gentle rate a callback then costs one write transaction and
//! one hand-off fewer: the record no longer has a transaction of its own on the
//! blocking pool, which then waited for the next ack's fsync anyway
//! (`flush.rs`, BENCHMARKS.md "An attempt's record rides the next group").
//!
//! Only the records of unordered deliveries ride: one that releases the next delivery
//! of a resource's queue is written and flushed at once (`deliveries.rs`), since that
//! delivery waits for it.

use tokio::sync::oneshot;

use super::EmbeddedState;
use crate::config::RetryPolicy;
use crate::store::lifecycle::{self, AttemptReport, Staged, View};
use crate::store::{Claim, Recorded, StoreError};

/// Attempts to record with the next group, and where their outcome goes.
pub(crate) struct Rider {
    pub(super) attempts: Vec<(Claim, AttemptReport)>,
    pub(super) policy: RetryPolicy,
    pub(super) bodies_before_us: Option<u64>,
    pub(super) reply: oneshot::Sender<Result<Recorded, StoreError>>,
}

impl Rider {
    /// Whether these attempts may ride: none is of an ordered delivery (see the module
    /// docs).
    pub(super) fn may_ride(attempts: &[(Claim, AttemptReport)]) -> bool {
        attempts.iter().all(|(claim, _)| claim.record.resource.is_none())
    }
}

/// The riders of one write: those not written yet, and those written with what their
/// rules returned, answered once the write is durable ([`Riders::finish`]).
pub(super) struct Riders {
    waiting: Vec<Rider>,
    written: Vec<(Rider, Recorded)>,
}

impl Riders {
    pub(super) fn new(riders: Vec<Rider>) -> Self {
        Self { waiting: riders, written: Vec::new() }
    }

    /// Whether no rider waits to be written.
    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Stages each waiting rider's attempts on `st` under the rules of an attempt's
    /// record, as `record_attempts` would. A rider whose rules fail (or panic) has its
    /// changes taken back, so that its failure is its own and never the group's.
    /// Returns each waiting rider's outcome, in order. The caller holds the lifecycle
    /// lock.
    pub(super) fn stage<V: View + ?Sized>(
        &self,
        state: &EmbeddedState,
        st: &mut Staged<'_, V>,
    ) -> Vec<Result<Recorded, StoreError>> {
        let holds = |c: &Claim| state.claims.holds(&c.destination, c.event, c.token);
        self.waiting
            .iter()
            .map(|rider| {
                let before = st.changes.clone();
                let rules = std::panic::AssertUnwindSafe(|| {
                    lifecycle::record_attempts(
                        st,
                        &rider.attempts,
                        &rider.policy,
                        rider.bodies_before_us,
                        holds,
                    )
                });
                let outcome = std::panic::catch_unwind(rules).unwrap_or_else(|_| {
                    Err(StoreError::Task("the rules of an attempt's record panicked".into()))
                });
                if outcome.is_err() {
                    st.changes = before;
                }
                outcome
            })
            .collect()
    }

    /// The waiting riders are written, in a transaction of what [`Riders::stage`]
    /// returned as `staged`: their claims released (the caller holds the lifecycle
    /// lock, as `record_attempts` does), a rider whose rules failed answered now, the
    /// others kept to answer once the write is durable.
    pub(super) fn written(
        &mut self,
        state: &EmbeddedState,
        staged: Vec<Result<Recorded, StoreError>>,
    ) {
        for (rider, outcome) in self.waiting.drain(..).zip(staged) {
            match outcome {
                Ok(recorded) => {
                    for (claim, _) in &rider.attempts {
                        state.release(claim);
                    }
                    self.written.push((rider, recorded));
                }
                Err(e) => {
                    let _ = rider.reply.send(Err(e));
                }
            }
        }
    }

    /// Answers every rider once the write ended: with its outcome when the write is
    /// durable, else with the write's error (a rider not written included: its
    /// attempts are recorded again by the recorder while their claims hold).
    pub(super) fn finish<T>(self, write: &Result<T, StoreError>) {
        match write {
            Ok(_) => {
                for (rider, recorded) in self.written {
                    let _ = rider.reply.send(Ok(recorded));
                }
                for rider in self.waiting {
                    let _ = rider.reply.send(Err(StoreError::Task(
                        "an attempt's record was left out of its write".into(),
                    )));
                }
            }
            Err(e) => {
                let riders = self.written.into_iter().map(|(r, _)| r).chain(self.waiting);
                for rider in riders {
                    let _ = rider.reply.send(Err(e.duplicate()));
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "ride_tests.rs"]
mod tests;
