//! Property tests of the lifecycle rules, with no backend: a small world of maps that
//! applies [`Changes`] the way every backend must (indexes derived from each record's
//! state before and after), driven by random sequences of dispatches, attempts,
//! replays, discards and prunes. After every step the invariants must hold.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;
use crate::config::RetryPolicy;
use crate::store::{
    Attempt, AttemptWrite, Claim, DedupKey, DeliveryRecord, DeliveryState, DispatchPlan, EventFlag,
    EventMeta, EventNameOrigin, EventStatus,
};

const DESTS: [&str; 3] = ["a", "b", "c"];
/// Destinations "b" and "c" deliver per resource, in order.
const ORDERED: [&str; 2] = ["b", "c"];

#[derive(Default)]
struct World {
    events: BTreeMap<EventId, EventMeta>,
    inbox: BTreeSet<EventId>,
    dedup: BTreeMap<[u8; 16], DedupEntry>,
    deliveries: BTreeMap<(EventId, String), DeliveryRecord>,
    /// Schedule entries with multiplicity, to catch a second entry.
    schedule: BTreeMap<(String, EventId), Vec<u64>>,
    dead: BTreeSet<(EventId, String)>,
    queues: BTreeMap<(String, [u8; 16]), Queue>,
    /// Events whose body retention by part dropped.
    bodiless: BTreeSet<EventId>,
    next_id: u64,
    now: u64,
}

impl View for World {
    fn dedup(&self, hash: &[u8; 16]) -> Result<Option<DedupEntry>, StoreError> {
        Ok(self.dedup.get(hash).copied())
    }
    fn delivery(&self, event: EventId, dest: &str) -> Result<Option<DeliveryRecord>, StoreError> {
        Ok(self.deliveries.get(&(event, dest.to_owned())).cloned())
    }
    fn queue(&self, dest: &str, resource: &[u8; 16]) -> Result<Option<Queue>, StoreError> {
        Ok(self.queues.get(&(dest.to_owned(), *resource)).copied())
    }
    fn event(&self, id: EventId) -> Result<Option<EventMeta>, StoreError> {
        Ok(self.events.get(&id).filter(|_| !self.inbox.contains(&id)).cloned())
    }
    fn claimed(&self, _: EventId, _: &str, _: u64) -> Result<bool, StoreError> {
        Ok(false)
    }
    fn deliveries_of(&self, event: EventId) -> Result<Vec<DeliveryRecord>, StoreError> {
        Ok(self.deliveries_of_event(event))
    }
}

impl World {
    fn apply(&mut self, c: Changes) {
        for (id, meta) in c.dispatched {
            assert!(self.inbox.remove(&id), "dispatched an event not in the inbox");
            self.events.insert(id, meta);
        }
        self.dedup.extend(c.dedup);
        for ((event, dest), change) in c.deliveries {
            assert_eq!(
                change.before,
                self.deliveries.get(&(event, dest.clone())).cloned(),
                "stale before"
            );
            let key = (dest.clone(), event);
            let edits = change.index_edits();
            if let Some(due) = edits.unschedule {
                let entries = self.schedule.entry(key.clone()).or_default();
                let at = entries.iter().position(|d| *d == due).expect("before's entry exists");
                entries.remove(at);
            }
            if let Some(due) = edits.schedule {
                self.schedule.entry(key).or_default().push(due);
            }
            match edits.dead {
                Some(true) => assert!(self.dead.insert((event, dest.clone())), "dead twice"),
                Some(false) => assert!(self.dead.remove(&(event, dest.clone())), "not dead"),
                None => {}
            }
            match change.after {
                Some(after) => self.deliveries.insert((event, dest), after),
                None => self.deliveries.remove(&(event, dest)),
            };
        }
        for (key, q) in c.queues {
            match q {
                Some(q) => self.queues.insert(key, q),
                None => self.queues.remove(&key),
            };
        }
        for (id, _) in c.pruned {
            self.events.remove(&id);
            self.bodiless.remove(&id);
        }
        for id in c.bodies_dropped {
            // A body goes only with every delivery of its event final.
            let settled = self.deliveries_of_event(id).iter().all(|d| d.state.is_settled());
            assert!(settled && !self.inbox.contains(&id), "a body dropped while owed: {id:?}");
            // Again after a replay delivered it once more: the backends' drop is a
            // no-op on a record without a body.
            self.bodiless.insert(id);
        }
    }

    fn deliveries_of_event(&self, event: EventId) -> Vec<DeliveryRecord> {
        let next = EventId::new(event.raw() + 1);
        self.deliveries
            .range((event, String::new())..(next, String::new()))
            .map(|(_, d)| d.clone())
            .collect()
    }

    fn receive(&mut self) -> EventId {
        self.next_id += 1;
        let id = EventId::new(self.next_id);
        self.events.insert(id, meta(self.now));
        self.inbox.insert(id);
        id
    }

    /// Every invariant of the state machines.
    fn check(&self) {
        for ((event, dest), r) in &self.deliveries {
            let entries = self.schedule.get(&(dest.clone(), *event)).map_or(0, Vec::len);
            // A scheduled delivery has exactly one schedule entry, anything else none.
            assert_eq!(entries, usize::from(r.state.is_scheduled()), "{r:?}");
            if let Some(due) = schedule_entry(r) {
                assert_eq!(self.schedule[&(dest.clone(), *event)], [due]);
            }
            // Dead exactly when in the dead letters.
            assert_eq!(self.dead.contains(&(*event, dest.clone())), r.state == DeliveryState::Dead);
            assert_eq!(r.next_attempt_us.is_some(), r.state.is_scheduled(), "{r:?}");
            assert!(self.events.contains_key(event), "a delivery outlived its event");
        }
        for ((dest, _), q) in &self.queues {
            // Only the head of a resource's queue may be scheduled; the rest are held,
            // linked from the head, `len` long.
            let mut at = Some(q.head);
            let mut seen = 0;
            while let Some(id) = at {
                let r = &self.deliveries[&(id, dest.clone())];
                if seen == 0 {
                    assert_ne!(r.state, DeliveryState::Held, "the head is never held");
                } else {
                    assert_eq!(r.state, DeliveryState::Held, "only the head is scheduled");
                }
                seen += 1;
                if id == q.tail {
                    break;
                }
                at = r.next_in_order;
            }
            assert_eq!(seen, q.len, "queue length");
        }
        let held =
            self.deliveries.values().filter(|r| r.state == DeliveryState::Held).count() as u64;
        let queued: u64 = self.queues.values().map(|q| q.len - 1).sum();
        assert_eq!(held, queued, "every held delivery waits in a queue");
    }
}

fn meta(now: u64) -> EventMeta {
    EventMeta {
        source: "demo".into(),
        event: "ActionUpdated".into(),
        event_from: EventNameOrigin::Path,
        received_at_us: now,
        size: 2,
        content_type: None,
        headers: Vec::new(),
        remote_addr: None,
        status: EventStatus::Received,
        flags: Vec::<EventFlag>::new(),
        reason: None,
        duplicate_of: None,
        destinations: Vec::new(),
        resource: None,
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// A callback received and dispatched: occurrence key, resource, destinations.
    Dispatch {
        occurrence: u8,
        resource: u8,
        dests: u8,
    },
    /// The earliest due delivery of a destination gets this answer.
    Attempt {
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
    Prune,
    Tick(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4, 0u8..3, 0u8..8).prop_map(|(occurrence, resource, dests)| Op::Dispatch { occurrence, resource, dests }),
        6 => (0usize..3, 0u8..4).prop_map(|(dest, outcome)| Op::Attempt { dest, outcome }),
        1 => (any::<usize>(), 0usize..3).prop_map(|(pick, dest)| Op::Replay { pick, dest }),
        1 => any::<usize>().prop_map(|pick| Op::Discard { pick }),
        1 => Just(Op::Prune),
        2 => (1u64..5_000_000).prop_map(Op::Tick),
    ]
}

fn policy() -> RetryPolicy {
    RetryPolicy { max_attempts: 3, ..RetryPolicy::default() }
}

/// `retention.delivered_bodies` in the property test: ticks go up to 5 s.
const BODIES_KEEP_US: u64 = 2_000_000;

fn run(ops: Vec<Op>) {
    let mut w = World { now: 1_000_000, ..World::default() };
    for op in ops {
        match op {
            Op::Dispatch { occurrence, resource, dests } => {
                let id = w.receive();
                let destinations: Vec<String> = DESTS
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| dests & (1 << i) != 0)
                    .map(|(_, d)| (*d).to_owned())
                    .collect();
                let plan = DispatchPlan {
                    latest: Vec::new(),
                    filtered: Vec::new(),
                    id,
                    dedup: Some(DedupKey { hash: [occurrence; 16], window_us: 10_000_000 }),
                    ordered: destinations
                        .iter()
                        .filter(|d| ORDERED.contains(&d.as_str()))
                        .cloned()
                        .collect(),
                    destinations,
                    resource: Some([resource; 16]),
                };
                let mut st = Staged::new(&w);
                let outcome = dispatch(&mut st, meta(w.now), &plan, w.now).unwrap();
                let c = st.into_changes();
                w.apply(c);
                if let crate::store::DispatchVerdict::Duplicate { original } = outcome {
                    assert_ne!(original, id);
                    assert!(w
                        .deliveries
                        .range((id, String::new())..)
                        .next()
                        .is_none_or(|((e, _), _)| *e != id));
                }
            }
            Op::Attempt { dest, outcome } => {
                let dest = DESTS[dest];
                let due: Option<(EventId, u64)> = w
                    .schedule
                    .iter()
                    .filter(|((d, _), e)| d == dest && !e.is_empty())
                    .map(|((_, ev), e)| (*ev, e[0]))
                    .min_by_key(|(_, due)| *due);
                let Some((event, due_us)) = due else { continue };
                let outcome = match outcome {
                    0 => AnswerClass::Success,
                    1 => AnswerClass::Retry { retry_after: None },
                    2 => AnswerClass::Permanent,
                    _ => AnswerClass::Gone,
                };
                let report = AttemptReport {
                    attempt: Attempt {
                        at_us: w.now,
                        duration_us: 10,
                        status: Some(200),
                        error: None,
                        answer: None,
                    },
                    class: outcome,
                    jitter: 0.3,
                };
                let claim = Claim {
                    event,
                    destination: dest.to_owned(),
                    due_us,
                    owner: "relay".into(),
                    token: 1,
                    expires_us: w.now + 60_000_000,
                    record: w.deliveries[&(event, dest.to_owned())].clone(),
                    meta: None,
                    body: None,
                };
                let before = w.now.saturating_sub(BODIES_KEEP_US);
                let mut st = Staged::new(&w);
                let written = record_attempts(
                    &mut st,
                    &[(claim, report.clone())],
                    &policy(),
                    Some(before),
                    |_| true,
                )
                .unwrap();
                assert!(
                    matches!(written.writes[..], [AttemptWrite::Done(_)]),
                    "a due delivery is recorded"
                );
                let c = st.into_changes();
                w.apply(c);
                // An event this attempt settled, received before the cutoff, has no body.
                let meta = &w.events[&event];
                if prunable(meta, &w.deliveries_of_event(event), before) {
                    assert!(w.bodiless.contains(&event), "settled past its body's retention");
                }
                // The same attempt recorded twice is stale the second time.
                let mut st = Staged::new(&w);
                let again =
                    record_attempt(&mut st, event, dest, due_us, &report, &policy()).unwrap();
                if w.deliveries[&(event, dest.to_owned())].next_attempt_us != Some(due_us) {
                    assert_eq!(again, None);
                }
            }
            Op::Replay { pick, dest } => {
                let dead: Vec<_> = w.deliveries.keys().cloned().collect();
                if dead.is_empty() {
                    continue;
                }
                let (event, _) = dead[pick % dead.len()].clone();
                let dest = DESTS[dest];
                let was = w.deliveries.get(&(event, dest.to_owned())).map(|r| r.state);
                let mut st = Staged::new(&w);
                let replayed = replay(&mut st, event, dest, w.now).unwrap();
                let c = st.into_changes();
                w.apply(c);
                let r = &w.deliveries.get(&(event, dest.to_owned()));
                if was == Some(DeliveryState::Dead) {
                    // A replayed dead letter is pending, due now.
                    assert!(replayed);
                    let r = r.unwrap();
                    assert_eq!((r.state, r.next_attempt_us), (DeliveryState::Pending, Some(w.now)));
                }
                if was == Some(DeliveryState::Held) {
                    assert!(!replayed);
                }
            }
            Op::Discard { pick } => {
                let dead: Vec<_> = w.dead.iter().cloned().collect();
                if dead.is_empty() {
                    continue;
                }
                let (event, dest) = dead[pick % dead.len()].clone();
                let mut st = Staged::new(&w);
                assert!(discard(&mut st, event, &dest).unwrap());
                let c = st.into_changes();
                w.apply(c);
                assert_eq!(w.deliveries[&(event, dest)].state, DeliveryState::Discarded);
            }
            Op::Prune => {
                let ids: Vec<EventId> = w.events.keys().copied().collect();
                for id in ids {
                    let Some(meta) = w.event(id).unwrap() else { continue };
                    let deliveries: Vec<DeliveryRecord> = w
                        .deliveries
                        .iter()
                        .filter(|((e, _), _)| *e == id)
                        .map(|(_, r)| r.clone())
                        .collect();
                    let mut st = Staged::new(&w);
                    let pruned = prune(&mut st, id, &meta, &deliveries, w.now + 1).unwrap();
                    let c = st.into_changes();
                    w.apply(c);
                    // Prune never removes an event with a scheduled, held or dead delivery.
                    let keeps = deliveries.iter().any(|d| {
                        matches!(
                            d.state,
                            DeliveryState::Pending
                                | DeliveryState::Retrying
                                | DeliveryState::Held
                                | DeliveryState::Dead
                        )
                    });
                    assert_eq!(pruned, !keeps, "{deliveries:?}");
                    assert_eq!(w.events.contains_key(&id), keeps);
                }
            }
            Op::Tick(us) => w.now += us,
        }
        w.check();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_under_random_operations(ops in proptest::collection::vec(op(), 1..80)) {
        run(ops);
    }
}

#[test]
fn two_copies_in_one_batch_are_one_delivery() {
    let mut w = World { now: 5, ..World::default() };
    let (a, b) = (w.receive(), w.receive());
    let plan = |id| DispatchPlan {
        latest: Vec::new(),
        filtered: Vec::new(),
        id,
        dedup: Some(DedupKey { hash: [1; 16], window_us: 100 }),
        destinations: vec!["a".into()],
        ordered: Vec::new(),
        resource: None,
    };
    let mut st = Staged::new(&w);
    let first = dispatch(&mut st, meta(5), &plan(a), 5).unwrap();
    let second = dispatch(&mut st, meta(5), &plan(b), 5).unwrap();
    assert_eq!(first, crate::store::DispatchVerdict::dispatched(1));
    assert_eq!(second, crate::store::DispatchVerdict::Duplicate { original: a });
    let c = st.into_changes();
    w.apply(c);
    assert_eq!(w.deliveries.len(), 1);
    assert_eq!(w.events[&b].duplicate_of, Some(a));
    w.check();
}

#[test]
fn a_finished_head_hands_the_turn_on_at_the_given_clock() {
    let mut w = World { now: 10, ..World::default() };
    let ids: Vec<EventId> = (0..3).map(|_| w.receive()).collect();
    for id in &ids {
        let plan = DispatchPlan {
            latest: Vec::new(),
            filtered: Vec::new(),
            id: *id,
            dedup: None,
            destinations: vec!["b".into()],
            ordered: vec!["b".into()],
            resource: Some([9; 16]),
        };
        let mut st = Staged::new(&w);
        dispatch(&mut st, meta(10), &plan, 10).unwrap();
        let c = st.into_changes();
        // Only the head is due; the others are held behind it.
        let due: &[&str] = if *id == ids[0] { &["b"] } else { &[] };
        assert_eq!(c.made_due(), due);
        w.apply(c);
    }
    w.check();
    let states = |w: &World| {
        ids.iter().map(|id| w.deliveries[&(*id, "b".to_owned())].state).collect::<Vec<_>>()
    };
    assert_eq!(states(&w), [DeliveryState::Pending, DeliveryState::Held, DeliveryState::Held]);
    let report = AttemptReport {
        attempt: Attempt {
            at_us: 1_000,
            duration_us: 500,
            status: Some(200),
            error: None,
            answer: None,
        },
        class: AnswerClass::Success,
        jitter: 0.0,
    };
    // A failed attempt of the next one: retried later, nothing made due now (a record
    // that may wait for an ack's flush, `embedded/flush.rs`).
    let failed = AttemptReport {
        attempt: Attempt { status: Some(503), ..report.attempt.clone() },
        class: AnswerClass::Retry { retry_after: None },
        ..report.clone()
    };
    let mut st = Staged::new(&w);
    record_attempt(&mut st, ids[0], "b", 10, &report, &policy()).unwrap();
    let c = st.into_changes();
    // The head's success releases the next: due now, so the record is flushed at once.
    assert_eq!(c.made_due(), ["b"]);
    w.apply(c);
    w.check();
    assert_eq!(states(&w), [DeliveryState::Delivered, DeliveryState::Pending, DeliveryState::Held]);
    // The next one is due when the attempt ended: the clock passed in, none read.
    assert_eq!(w.deliveries[&(ids[1], "b".to_owned())].next_attempt_us, Some(1_500));
    let mut st = Staged::new(&w);
    record_attempt(&mut st, ids[1], "b", 1_500, &failed, &policy()).unwrap();
    let c = st.into_changes();
    assert_eq!(c.made_due(), Vec::<&str>::new(), "a retry makes nothing due now");
    w.apply(c);
    w.check();
    assert_eq!(states(&w)[1], DeliveryState::Retrying);
}
