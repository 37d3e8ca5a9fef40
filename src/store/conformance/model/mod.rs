//! The model-based test: random sequences of append, dispatch, claim + record,
//! replay, discard, pause, prune and reopen, checked after every step against a small
//! reference model (as vector checks its disk buffer). Destination `b` is ordered per
//! resource: its deliveries of one resource wait their turn (`held`), in dispatch order.
//! Destination `c` has `ordering = "latest"`: a newer update of a resource supersedes
//! the one waiting (no claim outlives the step that took it here, so the head is never
//! in flight when one is dispatched). Each has a filter that keeps some occurrences out
//! (`filtered`, never scheduled). After every step the audit ledger balances, and
//! counts what the model says happened (retention deletes nothing from it).

use proptest::prelude::*;

use super::*;

mod dispatch;
mod ops;
mod verify;

use self::dispatch::{dispatched, plans, race_dispatch, resource_index, resource_of, RESOURCES};
use self::ops::*;
use self::verify::{shows, verify};
pub(super) use self::verify::{SEEN_COUNTING, SEEN_INBOX_COUNTING};

pub(super) fn check(make: impl Fn() -> Box<dyn Harness>) {
    let config =
        ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..60))| {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(run(make(), ops));
    });
}

async fn run(mut h: Box<dyn Harness>, ops: Vec<Op>) {
    let mut store = h.open().await;
    let mut other = h.second().await.unwrap_or_else(|| store.clone());
    let mut m = Model { now: 1_000 * S, ..Model::default() };
    // What a crash may leave: the model as of the last durable write, then as after
    // each write exempt from durability made since.
    let mut durable = m.clone();
    let mut since: Vec<Model> = Vec::new();
    let mut routes: BTreeMap<EventId, u8> = BTreeMap::new();
    for op in ops {
        let mut kind = Durability::of(&op);
        match op {
            Op::Append { n, occurrence, routed, rejected } => {
                let is_rejected = |i: usize| rejected & (1 << i) != 0;
                let events: Vec<NewEvent> = (0..n)
                    .map(|i| {
                        if is_rejected(i) {
                            super::rejected(m.now)
                        } else {
                            super::about(
                                received("demo", "ActionUpdated", m.now, "{\"data\":1}"),
                                &resource_of(occurrence),
                            )
                        }
                    })
                    .collect();
                for (i, id) in append_all(&store, events).await.into_iter().enumerate() {
                    assert!(
                        m.events.keys().next_back().is_none_or(|last| *last < id),
                        "ids increase"
                    );
                    let status =
                        if is_rejected(i) { EventStatus::Rejected } else { EventStatus::Received };
                    m.events.insert(id, status);
                    m.appended += 1;
                    m.rejected += i64::from(is_rejected(i));
                    m.occurrence.insert(id, occurrence);
                    routes.insert(id, routed);
                }
            }
            Op::Dispatch { skip } => {
                let pending = store.pending(1000).await.unwrap();
                let expected: Vec<EventId> = m
                    .events
                    .iter()
                    .filter(|(_, s)| **s == EventStatus::Received)
                    .map(|(id, _)| *id)
                    .collect();
                assert_eq!(
                    pending.iter().map(|p| p.id).collect::<Vec<_>>(),
                    expected,
                    "the inbox in id order"
                );
                let plans = plans(&pending, &m, &routes, skip, true);
                let outcomes = store.dispatch(plans.clone(), m.now).await.unwrap();
                for (plan, outcome) in plans.iter().zip(outcomes) {
                    let occurrence = m.occurrence[&plan.id];
                    let expected = match m.originals.get(&occurrence) {
                        Some(original) => DispatchVerdict::Duplicate { original: *original },
                        None => {
                            m.originals.insert(occurrence, plan.id);
                            if plan.destinations.is_empty() {
                                DispatchVerdict::Unrouted
                            } else {
                                let deliveries = plan.destinations.len();
                                // Filled in below, as the model supersedes.
                                DispatchVerdict::Dispatched { deliveries, superseded: Vec::new() }
                            }
                        }
                    };
                    let status = match expected {
                        DispatchVerdict::Duplicate { .. } => {
                            assert_eq!(outcome, expected);
                            EventStatus::Duplicate
                        }
                        DispatchVerdict::Unrouted => {
                            assert_eq!(outcome, expected);
                            EventStatus::Unrouted
                        }
                        DispatchVerdict::Dispatched { deliveries, mut superseded } => {
                            for d in &plan.destinations {
                                let mut delivery = dispatched(plan, d, m.now);
                                let key = (d.clone(), resource_index(occurrence));
                                if d == ORDERED && delivery.state == DeliveryState::Pending {
                                    let queue = m.queues.entry(key).or_default();
                                    if !queue.is_empty() {
                                        delivery.state = DeliveryState::Held;
                                        delivery.due = None;
                                    }
                                    queue.push_back(plan.id);
                                } else if d == LATEST && delivery.state == DeliveryState::Pending {
                                    // Whatever waits is superseded (nothing is claimed).
                                    let queue = m.queues.entry(key).or_default();
                                    for older in queue.drain(..) {
                                        let old = m
                                            .deliveries
                                            .get_mut(&(older, d.clone()))
                                            .expect("queued");
                                        old.state = DeliveryState::Superseded;
                                        old.due = None;
                                        superseded.push(d.clone());
                                    }
                                    queue.push_back(plan.id);
                                }
                                m.deliveries.insert((plan.id, d.clone()), delivery);
                            }
                            let expected = DispatchVerdict::Dispatched { deliveries, superseded };
                            assert_eq!(outcome, expected);
                            EventStatus::Dispatched
                        }
                        DispatchVerdict::Gone => {
                            unreachable!("the model dispatches what is pending")
                        }
                    };
                    m.events.insert(plan.id, status);
                }
            }
            Op::Attempt { dest, outcome } => {
                let dest = DESTS[dest];
                let (claims, next) =
                    store.claim_due_and_next(dest, "model", m.now, LEASE, 1).await.unwrap();
                // With it, when the destination's next delivery after now is due.
                let later = m
                    .deliveries
                    .iter()
                    .filter(|((_, d), _)| d == dest)
                    .filter_map(|(_, x)| x.due.filter(|due| *due > m.now))
                    .min();
                assert_eq!(next, later, "claim_due_and_next: the next due");
                // The earliest due of the destination's scheduled deliveries.
                let expected = m
                    .deliveries
                    .iter()
                    .filter(|((_, d), x)| d == dest && x.due.is_some_and(|due| due <= m.now))
                    .min_by_key(|((id, _), x)| (x.due, *id))
                    .map(|((id, _), x)| (*id, x.due.unwrap_or(0)));
                assert_eq!(
                    claims.iter().map(|c| (c.event, c.due_us)).next(),
                    expected,
                    "claim_due"
                );
                let Some(claim) = claims.into_iter().next() else { continue };
                kind = Durability::Durable; // an attempt recorded
                let outcome = outcome_of(outcome);
                let r = record(&store, &claim, report(outcome, m.now)).await;
                assert_eq!(r, AttemptWrite::Done(m.attempted(claim.event, dest, outcome)));
            }
            Op::RaceDispatch { skip } => {
                race_dispatch(&store, &other, &mut m, &routes, skip).await;
            }
            Op::RaceClaims { dest, outcome } => {
                let dest = DESTS[dest];
                let (x, y) = tokio::join!(
                    store.claim_due(dest, "x", m.now, LEASE, 1),
                    other.claim_due(dest, "y", m.now, LEASE, 1)
                );
                let (x, y) = (x.unwrap(), y.unwrap());
                let mut due: Vec<(Option<u64>, EventId)> = m
                    .deliveries
                    .iter()
                    .filter(|((_, d), x)| d == dest && x.due.is_some_and(|due| due <= m.now))
                    .map(|((id, _), x)| (x.due, *id))
                    .collect();
                due.sort();
                let claimed: Vec<EventId> = x.iter().chain(&y).map(|c| c.event).collect();
                assert!(claimed.len() <= 2 && claimed.len() <= due.len(), "{claimed:?} of {due:?}");
                assert!(
                    claimed.len() < 2 || claimed[0] != claimed[1],
                    "one delivery claimed by two relays at once: {claimed:?}"
                );
                for id in &claimed {
                    assert!(due.iter().any(|(_, d)| d == id), "{id} claimed but not due");
                }
                if let Some((_, earliest)) = due.first() {
                    assert!(
                        claimed.contains(earliest),
                        "the earliest due {earliest} left: {claimed:?}"
                    );
                }
                if !claimed.is_empty() {
                    kind = Durability::Durable; // attempts recorded
                }
                let outcome = outcome_of(outcome);
                for (s, claim) in x.iter().map(|c| (&store, c)).chain(y.iter().map(|c| (&other, c)))
                {
                    let r = record(s, claim, report(outcome, m.now)).await;
                    assert_eq!(r, AttemptWrite::Done(m.attempted(claim.event, dest, outcome)));
                }
            }
            Op::Replay { pick, dest } => {
                let ids: Vec<EventId> = m.events.keys().copied().collect();
                if ids.is_empty() {
                    continue;
                }
                let id = ids[pick % ids.len()];
                let dest = DESTS[dest];
                let n = store.replay(id, vec![dest.to_owned()], m.now).await.unwrap();
                let held = m
                    .deliveries
                    .get(&(id, dest.to_owned()))
                    .is_some_and(|d| d.state == DeliveryState::Held);
                let replayable = !held
                    && !matches!(m.events[&id], EventStatus::Received | EventStatus::Rejected);
                assert_eq!(n, usize::from(replayable), "replay of {:?}", m.events[&id]);
                if replayable {
                    m.deliveries.insert(
                        (id, dest.to_owned()),
                        Delivery { state: DeliveryState::Pending, due: Some(m.now), round: 0 },
                    );
                }
            }
            Op::Discard { pick } => {
                let keys: Vec<(EventId, String)> = m.deliveries.keys().cloned().collect();
                if keys.is_empty() {
                    continue;
                }
                let (id, dest) = keys[pick % keys.len()].clone();
                let done = store.discard(id, &dest).await.unwrap();
                let d = m.deliveries.get_mut(&(id, dest)).unwrap();
                assert_eq!(done, d.state == DeliveryState::Dead);
                if done {
                    d.state = DeliveryState::Discarded;
                }
            }
            Op::Pause { dest, on } => {
                store.set_paused(DESTS[dest], on).await.unwrap();
                if on {
                    m.paused.insert(DESTS[dest].to_owned());
                } else {
                    m.paused.remove(DESTS[dest]);
                }
            }
            Op::Prune => {
                let before = m.now + 1;
                let n = store.prune(before, 10_000).await.unwrap();
                let gone: Vec<EventId> = m
                    .events
                    .iter()
                    .filter(|(id, status)| {
                        id.raw() < before
                            && **status != EventStatus::Received
                            && m.deliveries.iter().filter(|((e, _), _)| e == *id).all(|(_, d)| {
                                matches!(
                                    d.state,
                                    DeliveryState::Delivered
                                        | DeliveryState::Discarded
                                        | DeliveryState::Filtered
                                        | DeliveryState::Superseded
                                )
                            })
                    })
                    .map(|(id, _)| *id)
                    .collect();
                assert_eq!(n, gone.len(), "pruned");
                for id in gone {
                    m.events.remove(&id);
                    m.deliveries.retain(|(e, _), _| *e != id);
                }
            }
            Op::Reopen => {
                drop((store, other));
                store = h.reopen().await;
                other = h.second().await.unwrap_or_else(|| store.clone());
            }
            Op::Crash => {
                drop((store, other));
                store = h.crash().await;
                other = h.second().await.unwrap_or_else(|| store.clone());
                // The newest candidate the store shows; those after it are gone, those
                // before it stay possible (what survived a crash need not be durable).
                let mut left = None;
                for i in (0..=since.len()).rev() {
                    let candidate = if i == 0 { &durable } else { &since[i - 1] };
                    let candidate = Model { now: m.now, ..candidate.clone() };
                    if shows(&store, &candidate).await {
                        left = Some((i, candidate));
                        break;
                    }
                }
                let (i, left) = left.expect("a crash left something other than a durable state");
                since.truncate(i);
                m = left;
            }
            Op::Tick(us) => m.now += us,
        }
        verify(&store, &m).await;
        match kind {
            Durability::Durable => {
                durable = m.clone();
                since.clear();
            }
            Durability::Exempt => since.push(m.clone()),
            Durability::Neutral => {}
        }
    }
    // A count behind the last reopen ends, and ends exact.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.inbox().await.unwrap().counting {
        assert!(
            std::time::Instant::now() < deadline,
            "the inbox count behind the open never ended"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for dest in DESTS {
        while store.queue_stats(dest).await.unwrap().counting {
            assert!(
                std::time::Instant::now() < deadline,
                "the queue count behind the open never ended"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    verify(&store, &m).await;
}
