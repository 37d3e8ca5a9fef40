//! The model's state, the operations a sequence is drawn from, and how each stands to
//! a crash.

use proptest::prelude::*;

use super::super::*;
use super::dispatch::resource_index;

pub(super) const DESTS: [&str; 3] = ["a", "b", "c"];
/// The destination with `ordering = "per-resource"`.
pub(super) const ORDERED: &str = "b";
/// The destination with `ordering = "latest"`.
pub(super) const LATEST: &str = "c";

/// What the model knows of a delivery.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Delivery {
    pub(super) state: DeliveryState,
    pub(super) due: Option<u64>,
    pub(super) round: u32,
}

#[derive(Clone, Default, Debug)]
pub(super) struct Model {
    /// Event id → status, for every event the store should still hold.
    pub(super) events: BTreeMap<EventId, EventStatus>,
    pub(super) occurrence: BTreeMap<EventId, u8>,
    /// Occurrence → the first event dispatched with it.
    pub(super) originals: BTreeMap<u8, EventId>,
    pub(super) deliveries: BTreeMap<(EventId, String), Delivery>,
    pub(super) paused: BTreeSet<String>,
    /// The queue of each ordered destination (`b`, `c`) and resource (by
    /// [`resource_index`]): its deliveries in dispatch order, the head first (the one
    /// not held).
    pub(super) queues: BTreeMap<(String, u8), std::collections::VecDeque<EventId>>,
    /// Callbacks ever appended, and of them rejected: what the audit must count,
    /// whatever retention deleted since.
    pub(super) appended: i64,
    pub(super) rejected: i64,
    pub(super) now: u64,
}

impl Model {
    /// Records in the model an attempt at `id`'s delivery to `dest` ending in
    /// `outcome` (made at `now`, lasting 1 ms); returns the verdict the store must give.
    pub(super) fn attempted(
        &mut self,
        id: EventId,
        dest: &str,
        class: AnswerClass,
    ) -> AttemptVerdict {
        let d = self.deliveries.get_mut(&(id, dest.to_owned())).expect("claimed, so known");
        d.round += 1;
        let ended = self.now + 1_000;
        let verdict = match class {
            AnswerClass::Success => {
                *d = Delivery { state: DeliveryState::Delivered, due: None, round: d.round };
                AttemptVerdict::Success
            }
            AnswerClass::Permanent => {
                *d = Delivery { state: DeliveryState::Dead, due: None, round: d.round };
                AttemptVerdict::Failed
            }
            _ if d.round >= 3 => {
                *d = Delivery { state: DeliveryState::Dead, due: None, round: d.round };
                AttemptVerdict::Dead
            }
            _ => {
                *d = Delivery {
                    state: DeliveryState::Retrying,
                    due: Some(ended + S),
                    round: d.round,
                };
                AttemptVerdict::Retry
            }
        };
        if (dest == ORDERED || dest == LATEST) && !matches!(verdict, AttemptVerdict::Retry) {
            self.advance(id, dest, ended);
        }
        verdict
    }

    /// A finished (delivered or dead) delivery to `b` at the head of its resource's
    /// queue hands the turn to the next, due at `at`.
    pub(super) fn advance(&mut self, id: EventId, dest: &str, at: u64) {
        let key = (dest.to_owned(), resource_index(self.occurrence[&id]));
        let Some(queue) = self.queues.get_mut(&key) else { return };
        if queue.front() != Some(&id) {
            return; // a replay whose turn had passed
        }
        queue.pop_front();
        match queue.front() {
            Some(next) => {
                let d = self.deliveries.get_mut(&(*next, dest.to_owned())).expect("queued");
                *d = Delivery { state: DeliveryState::Pending, due: Some(at), round: 0 };
            }
            None => {
                self.queues.remove(&key);
            }
        }
    }
}

#[derive(Clone, Debug)]
pub(super) enum Op {
    /// `n` events; those whose bit is set in `rejected` are stored rejected (final at
    /// once, never pending).
    Append {
        n: usize,
        occurrence: u8,
        routed: u8,
        rejected: u8,
    },
    /// Dispatches the pending events except those whose position (mod 8) has its bit
    /// set in `skip`: a dispatcher may leave events behind, in any order.
    Dispatch {
        skip: u8,
    },
    Attempt {
        dest: usize,
        outcome: u8,
    },
    /// Two dispatchers at once (two stores on one database where the backend has
    /// them, else two calls on one store) over the same pending events, routed to the
    /// unordered destination only (one dispatcher per fleet keeps the order of the
    /// ordered one): each event is dispatched once, each occurrence has one original.
    RaceDispatch {
        skip: u8,
    },
    /// Two relays claim the same destination's due deliveries at once: never the same
    /// one, the earliest always; then each records its attempt.
    RaceClaims {
        dest: usize,
        outcome: u8,
    },
    Replay {
        pick: usize,
        dest: usize,
    },
    Discard {
        pick: usize,
    },
    Pause {
        dest: usize,
        on: bool,
    },
    Prune,
    Reopen,
    /// A power cut: the backend may lose the writes exempt from durability (dispatch,
    /// pruning) made since its last durable write, a suffix of them, never more.
    Crash,
    Tick(u64),
}

pub(super) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..4, 0u8..12, 0u8..8, prop_oneof![3 => Just(0u8), 1 => any::<u8>()])
            .prop_map(|(n, occurrence, routed, rejected)| Op::Append { n, occurrence, routed, rejected }),
        3 => prop_oneof![3 => Just(0u8), 1 => any::<u8>()].prop_map(|skip| Op::Dispatch { skip }),
        6 => (0usize..3, 0u8..3).prop_map(|(dest, outcome)| Op::Attempt { dest, outcome }),
        1 => prop_oneof![3 => Just(0u8), 1 => any::<u8>()].prop_map(|skip| Op::RaceDispatch { skip }),
        2 => (0usize..3, 0u8..3).prop_map(|(dest, outcome)| Op::RaceClaims { dest, outcome }),
        1 => (any::<usize>(), 0usize..3).prop_map(|(pick, dest)| Op::Replay { pick, dest }),
        1 => any::<usize>().prop_map(|pick| Op::Discard { pick }),
        1 => (0usize..3, any::<bool>()).prop_map(|(dest, on)| Op::Pause { dest, on }),
        1 => Just(Op::Prune),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
        2 => (1u64..3_000_000).prop_map(Op::Tick),
    ]
}

/// Which destinations want events with `routed` (bits for "a", "b" and "c").
pub(super) fn route(routed: u8) -> Vec<String> {
    DESTS
        .iter()
        .enumerate()
        .filter(|(i, _)| routed & (1 << i) != 0)
        .map(|(_, d)| (*d).to_owned())
        .collect()
}

/// How an op's writes stand to a crash.
#[derive(Clone, Copy)]
pub(super) enum Durability {
    /// Its writes are durable when it returns, and make every earlier one durable.
    Durable,
    /// Its writes may be lost to a crash until the next durable write.
    Exempt,
    /// It writes nothing a crash could lose (or, a crash, starts over).
    Neutral,
}

impl Durability {
    pub(super) fn of(op: &Op) -> Self {
        match op {
            // Attempts write only when a delivery was due (the op says so then).
            Op::Append { .. } | Op::Replay { .. } | Op::Discard { .. } | Op::Pause { .. } => {
                Self::Durable
            }
            Op::Dispatch { .. } | Op::RaceDispatch { .. } | Op::Prune => Self::Exempt,
            Op::Attempt { .. } | Op::RaceClaims { .. } => Self::Neutral,
            Op::Reopen | Op::Crash | Op::Tick(_) => Self::Neutral,
        }
    }
}

/// The attempt outcome an op's number stands for.
pub(super) fn outcome_of(n: u8) -> AnswerClass {
    match n {
        0 => AnswerClass::Success,
        1 => AnswerClass::Retry { retry_after: None },
        _ => AnswerClass::Permanent,
    }
}
