//! The pacer in a simulated world: a store of due deliveries with claims and leases, a
//! consumer that fails in every way until time T and answers well after it, and before
//! T composed faults (pauses, a fleet share of 0, store calls failing, a dead relay's
//! claims holding deliveries until their leases end). The shell below mirrors
//! `worker.rs` step for step. Checked: after T, no delivery stays due for longer than
//! [`stall_bound`] while no attempt starts, and every delivery ends.

use std::collections::{BTreeMap, BinaryHeap};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

const MS: u64 = 1_000;

#[derive(Debug, Clone, PartialEq, Eq)]
struct SimClaim {
    id: usize,
    token: u64,
    expires_us: u64,
}

impl Leased for SimClaim {
    fn expires_us(&self) -> u64 {
        self.expires_us
    }
}

#[derive(Debug, Clone)]
struct Delivery {
    due_us: u64,
    /// (token, expires): who holds it. Token 0 is the dead relay.
    claim: Option<(u64, u64)>,
    done: bool,
    attempts: u32,
}

/// A fault window before T.
#[derive(Debug, Clone)]
enum Fault {
    Paused,
    NoShare,
    StoreDown,
    /// A relay claims this many due deliveries and dies holding them.
    DeadRelay(usize),
}

#[derive(Debug, Clone)]
struct World {
    deliveries: Vec<(u64, bool)>,
    timeout_ms: u64,
    lease_margin_ms: u64,
    share: usize,
    probe_interval_ms: u64,
    threshold: u32,
    rate_ms: Option<u64>,
    backoff_ms: u64,
    max_backoff_ms: u64,
    healthy_from_ms: u64,
    /// Per attempt before T: fail (true) or succeed, and how long (ms).
    answers: Vec<(u8, u64)>,
    faults: Vec<(u64, u64, Fault)>,
}

fn world() -> impl Strategy<Value = World> {
    (
        prop::collection::vec((0u64..3_000, any::<bool>()), 1..40),
        (20u64..300, 1u64..600, 1usize..4),
        (50u64..2_000, 1u32..5, prop::option::of(1u64..60)),
        (1u64..200, 0u64..3_000, 0u64..8_000),
        prop::collection::vec((0u8..10, 1u64..400), 0..200),
        prop::collection::vec(
            (
                0u64..8_000,
                1u64..3_000,
                prop_oneof![
                    Just(Fault::Paused),
                    Just(Fault::NoShare),
                    Just(Fault::StoreDown),
                    (1usize..6).prop_map(Fault::DeadRelay)
                ],
            ),
            0..6,
        ),
    )
        .prop_map(|(deliveries, (t, m, s), (p, th, r), (b, mb, h), answers, faults)| World {
            deliveries,
            timeout_ms: t,
            lease_margin_ms: m,
            share: s,
            probe_interval_ms: p,
            threshold: th,
            rate_ms: r,
            backoff_ms: b,
            max_backoff_ms: mb,
            healthy_from_ms: h,
            answers,
            faults,
        })
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// The worker looks (after a sleep, or woken).
    Look,
    /// An attempt's answer arrives.
    Answer { id: usize, token: u64, probe: bool, fail: bool, sent: bool },
    /// A fault window opens (the dead relay claims).
    Fault(usize),
}

struct Sim {
    w: World,
    t0: Instant,
    now_us: u64,
    queue: BinaryHeap<std::cmp::Reverse<(u64, u64, Ev)>>,
    seq: u64,
    store: Vec<Delivery>,
    next_token: u64,
    pacer: Pacer<SimClaim>,
    in_flight: usize,
    answers: std::vec::IntoIter<(u8, u64)>,
    last_start_us: u64,
    /// The worker's last progress mark (a start, an idle look, a rest).
    last_mark_us: u64,
    ended_us: BTreeMap<usize, u64>,
}

impl Sim {
    fn new(w: World) -> Self {
        let circuit = Circuit::new(w.threshold, Duration::from_millis(w.probe_interval_ms));
        let store = w
            .deliveries
            .iter()
            .map(|&(due, _)| Delivery { due_us: due * MS, claim: None, done: false, attempts: 0 })
            .collect();
        let answers = w.answers.clone().into_iter();
        let mut sim = Sim {
            t0: Instant::now(),
            now_us: 0,
            queue: BinaryHeap::new(),
            seq: 0,
            store,
            next_token: 1,
            pacer: Pacer::new(circuit, Duration::from_millis(w.timeout_ms)),
            in_flight: 0,
            answers,
            last_start_us: 0,
            last_mark_us: 0,
            ended_us: BTreeMap::new(),
            w,
        };
        sim.at(0, Ev::Look);
        for (i, f) in sim.w.faults.clone().iter().enumerate() {
            if f.0 < sim.w.healthy_from_ms {
                sim.at(f.0 * MS, Ev::Fault(i));
            }
        }
        sim
    }

    fn at(&mut self, t_us: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(std::cmp::Reverse((t_us, self.seq, ev)));
    }

    fn healthy_from_us(&self) -> u64 {
        self.w.healthy_from_ms * MS
    }

    /// Whether a fault of this kind holds now (faults end at T).
    fn fault(&self, kind: fn(&Fault) -> bool) -> bool {
        self.now_us < self.healthy_from_us()
            && self.w.faults.iter().any(|(start, len, f)| {
                kind(f) && (*start * MS..(start + len) * MS).contains(&self.now_us)
            })
    }

    fn lease_us(&self) -> u64 {
        (self.w.timeout_ms + self.w.lease_margin_ms) * MS
    }

    fn claim_due(&mut self, n: usize) -> Vec<SimClaim> {
        let now = self.now_us;
        let mut due: Vec<usize> = (0..self.store.len())
            .filter(|&i| {
                let d = &self.store[i];
                !d.done && d.due_us <= now && d.claim.is_none_or(|(_, exp)| exp <= now)
            })
            .collect();
        due.sort_by_key(|&i| (self.store[i].due_us, i));
        let lease = self.lease_us();
        due.into_iter()
            .take(n)
            .map(|id| {
                let token = self.next_token;
                self.next_token += 1;
                self.store[id].claim = Some((token, now + lease));
                SimClaim { id, token, expires_us: now + lease }
            })
            .collect()
    }

    fn release(&mut self, c: &SimClaim) {
        let d = &mut self.store[c.id];
        if d.claim.is_some_and(|(t, _)| t == c.token) {
            d.claim = None;
        }
    }

    fn next_due(&self) -> Option<u64> {
        self.store.iter().filter(|d| !d.done && d.due_us > self.now_us).map(|d| d.due_us).min()
    }

    fn now(&self) -> Now {
        Now { at: self.t0 + Duration::from_micros(self.now_us), wall_us: self.now_us }
    }

    /// One look of the worker: the loop of `Worker::run_once`.
    fn look(&mut self) {
        let room = |sim: &Sim| {
            let share = if sim.fault(|f| matches!(f, Fault::NoShare)) { 0 } else { sim.w.share };
            Room {
                paused: sim.fault(|f| matches!(f, Fault::Paused)),
                share,
                free: share.saturating_sub(sim.in_flight),
                interval: sim.w.rate_ms.map(Duration::from_millis),
            }
        };
        self.pacer.begin();
        for _ in 0..10_000 {
            let now = self.now();
            match self.pacer.next(now, room(self)) {
                Step::Release(claims) => {
                    if !self.fault(|f| matches!(f, Fault::StoreDown)) {
                        for c in &claims {
                            self.release(c);
                        }
                    }
                }
                Step::Claim(n) => {
                    if self.fault(|f| matches!(f, Fault::StoreDown)) {
                        self.at(self.now_us + crate::clock::micros(MAX_IDLE), Ev::Look);
                        return;
                    }
                    let claims = self.claim_due(n);
                    self.pacer.claimed(claims);
                }
                Step::Start { claim, probe } => {
                    self.in_flight += 1;
                    self.last_start_us = self.now_us;
                    self.last_mark_us = self.now_us;
                    let d = &mut self.store[claim.id];
                    d.attempts += 1;
                    let before_t = self.now_us < self.w.healthy_from_ms * MS;
                    let (kind, ms) =
                        if before_t { self.answers.next().unwrap_or((0, 5)) } else { (9, 5) };
                    let took = ms.min(self.w.timeout_ms) * MS;
                    let (fail, sent) = match kind {
                        0..=5 if before_t => (true, true),
                        6 if before_t => (false, false),
                        _ => (false, true),
                    };
                    self.at(
                        self.now_us + took,
                        Ev::Answer { id: claim.id, token: claim.token, probe, fail, sent },
                    );
                }
                Step::Idle => {
                    self.last_mark_us = self.now_us;
                    let wait = self.next_due().map_or(crate::clock::micros(MAX_IDLE), |due| {
                        (due - self.now_us).min(crate::clock::micros(MAX_IDLE))
                    });
                    self.at(self.now_us + wait, Ev::Look);
                    return;
                }
                Step::Rest(d) => {
                    self.last_mark_us = self.now_us;
                    self.at(self.now_us + crate::clock::micros(d), Ev::Look);
                    return;
                }
                Step::Sleep(d) => {
                    self.at(self.now_us + crate::clock::micros(d), Ev::Look);
                    return;
                }
            }
        }
        panic!("the pacer never said sleep");
    }

    fn answer(&mut self, id: usize, token: u64, probe: bool, fail: bool, sent: bool) {
        self.in_flight -= 1;
        let answer = match (sent, fail) {
            (false, _) => Health::NotSent,
            (true, true) => Health::Unwell,
            (true, false) => Health::Healthy,
        };
        let finished = self.pacer.finished(self.now(), probe, answer);
        let (now, backoff, max) = (self.now_us, self.w.backoff_ms * MS, self.w.max_backoff_ms * MS);
        let d = &mut self.store[id];
        if d.claim.is_some_and(|(t, _)| t == token) {
            d.claim = None;
            if fail {
                let step = backoff.saturating_mul(1 << d.attempts.min(20)).min(max);
                d.due_us = now + step;
            } else {
                d.done = true;
                self.ended_us.insert(id, now);
            }
        }
        // A finished attempt wakes the worker when the pacer says so, or when its
        // record may have made something due (a retry: these are unordered).
        let verdict = match (sent, fail) {
            (true, true) => Some(AttemptVerdict::Retry),
            (true, false) => Some(AttemptVerdict::Success),
            // Not sent: the shell records no attempt of its own.
            (false, _) => None,
        };
        if finished.look || look_after_record(verdict, false) {
            self.at(self.now_us, Ev::Look);
        }
    }

    fn dead_relay(&mut self, n: usize) {
        let now = self.now_us;
        let lease = self.lease_us();
        let mut taken = 0;
        for d in &mut self.store {
            if taken < n && !d.done && d.due_us <= now && d.claim.is_none() {
                d.claim = Some((0, now + lease));
                taken += 1;
            }
        }
    }

    /// After T, nothing stays due for [`stall_bound`] without an attempt starting, and
    /// the worker never goes that long without a progress mark (the watchdog's measure:
    /// it would raise a false alarm).
    fn check(&self, bound_us: u64) {
        let t = self.now_us;
        if t < self.healthy_from_us() + bound_us {
            return;
        }
        assert!(
            self.last_mark_us + bound_us > t,
            "no progress mark since {} µs at {t} µs (bound {bound_us} µs): the watchdog would call this a stall",
            self.last_mark_us
        );
        let waiting = self.store.iter().enumerate().find(|(_, d)| {
            let claimable_since =
                d.due_us.max(d.claim.map_or(0, |(tok, exp)| if tok == 0 { exp } else { 0 }));
            !d.done && claimable_since + bound_us <= t
        });
        if let Some((id, d)) = waiting {
            assert!(
                self.last_start_us + bound_us > t,
                "stalled at {t} µs: delivery {id} ({d:?}) due, last start {} µs, bound {bound_us} µs, circuit {:?}",
                self.last_start_us,
                self.pacer.phase()
            );
        }
    }

    fn run(mut self) {
        let bound = stall_bound(
            Duration::from_millis(self.w.probe_interval_ms),
            Duration::from_millis(self.w.timeout_ms),
            self.w.rate_ms.map(Duration::from_millis),
        )
        // Deliveries a dead relay holds are not this worker's to start until the lease
        // ends (the watchdog does not count them: the worker's look finds nothing
        // claimable, which is progress).
        ;
        let bound_us = crate::clock::micros(bound);
        let end = self.healthy_from_us() + 120_000 * MS;
        let mut checks = self.healthy_from_us();
        while let Some(std::cmp::Reverse((t, _, ev))) = self.queue.pop() {
            while checks <= t {
                self.now_us = checks;
                self.check(bound_us);
                checks += 50 * MS;
            }
            self.now_us = t;
            if t > end || self.store.iter().all(|d| d.done) {
                break;
            }
            match ev {
                Ev::Look => self.look(),
                Ev::Answer { id, token, probe, fail, sent } => {
                    self.answer(id, token, probe, fail, sent)
                }
                Ev::Fault(i) => {
                    if let Fault::DeadRelay(n) = self.w.faults[i].2 {
                        self.dead_relay(n);
                    }
                }
            }
        }
        let left: Vec<_> = self.store.iter().enumerate().filter(|(_, d)| !d.done).collect();
        assert!(
            left.is_empty(),
            "undelivered 120 s after T: {left:?}, circuit {:?}",
            self.pacer.phase()
        );
    }
}

proptest! {
    // 256 worlds by default; `PROPTEST_CASES=20000` for a long run.
    #[test]
    fn every_due_delivery_is_attempted_within_the_bound_once_the_consumer_is_well(w in world()) {
        Sim::new(w).run();
    }
}

const TIMEOUT: Duration = Duration::from_secs(15);

fn claim(id: usize, expires_us: u64) -> SimClaim {
    SimClaim { id, token: id as u64, expires_us }
}

/// The wedge seen from outside: the circuit opened with claims taken ahead; by the
/// probe time their leases were nearly over. The old worker handed out the probe,
/// found the claim too old, gave it back and never started an attempt, so the circuit
/// stayed half-open for ever.
#[test]
fn a_stale_claim_at_probe_time_does_not_leave_the_circuit_half_open() {
    let t0 = Instant::now();
    let mut p = Pacer::new(Circuit::new(1, Duration::from_secs(30)), TIMEOUT);
    let room = Room { paused: false, share: 8, free: 8, interval: None };
    let now = Now { at: t0, wall_us: 0 };
    assert_eq!(p.next(now, room), Step::Claim(16));
    p.claimed([claim(1, 75_000_000), claim(2, 75_000_000)]);
    let Step::Start { probe: false, .. } = p.next(now, room) else { panic!() };
    assert_eq!(p.finished(now, false, Health::Unwell).change, Some(CircuitChange::Opened));
    // The circuit is open: the claim left ahead is given back at once.
    assert_eq!(p.next(now, room), Step::Release(vec![claim(2, 75_000_000)]));
    assert!(matches!(p.next(now, room), Step::Sleep(_)));
    // 70 s later, a claim with 5 s of lease left would be found ahead: none is.
    p.claimed([claim(3, 75_000_000)]);
    let later = Now { at: t0 + Duration::from_secs(70), wall_us: 70_000_000 };
    assert_eq!(p.next(later, room), Step::Release(vec![claim(3, 75_000_000)]));
    assert_eq!(p.next(later, room), Step::Claim(1), "the probe claims afresh");
    assert_eq!(p.phase(), Phase::Open, "no probe handed out without an attempt");
    p.claimed([claim(4, 145_000_000)]);
    assert_eq!(p.next(later, room), Step::Start { claim: claim(4, 145_000_000), probe: true });
    assert_eq!(p.phase(), Phase::HalfOpen);
    assert!(matches!(p.next(later, room), Step::Sleep(_)), "nothing else while probing");
    assert_eq!(p.finished(later, true, Health::Healthy).change, Some(CircuitChange::Closed));
    assert_eq!(p.next(later, room), Step::Claim(16));
}

/// Every way the old worker could hand out the probe and start nothing: no claim due,
/// no permit, the rate-limit slot ahead, a store call failing, and an event whose body
/// is gone. None leaves the circuit half-open.
#[test]
fn the_probe_is_handed_out_only_with_an_attempt() {
    let t0 = Instant::now();
    let mut p = Pacer::new(Circuit::new(1, Duration::from_millis(10)), TIMEOUT);
    let room = Room { paused: false, share: 2, free: 2, interval: Some(Duration::from_secs(2)) };
    let now = Now { at: t0, wall_us: 0 };
    assert_eq!(p.next(now, room), Step::Claim(4));
    p.claimed([claim(1, 100_000_000)]);
    assert!(matches!(p.next(now, room), Step::Start { probe: false, .. }));
    p.finished(now, false, Health::Unwell);
    // The rate-limit slot is ahead (the first attempt took it at t0).
    let ta = Now { at: t0 + Duration::from_secs(1), wall_us: 1_000_000 };
    assert_eq!(p.next(ta, room), Step::Sleep(Duration::from_secs(1)));
    assert_eq!(p.phase(), Phase::Open);
    // Nothing due: the claim comes back empty (or the store call failed: the shell
    // sleeps without calling `claimed`).
    let t1 = Now { at: t0 + Duration::from_millis(2_020), wall_us: 2_020_000 };
    assert_eq!(p.next(t1, room), Step::Claim(1));
    p.claimed([]);
    assert_eq!(p.next(t1, room), Step::Idle);
    assert_eq!(p.phase(), Phase::Open);
    // No permit free.
    assert!(matches!(p.next(t1, Room { free: 0, ..room }), Step::Sleep(_)));
    assert_eq!(p.phase(), Phase::Open);
    // The permit could not be taken after all.
    let t3 = Now { at: t0 + Duration::from_secs(3), wall_us: 3_000_000 };
    assert_eq!(p.next(t3, room), Step::Claim(1));
    p.claimed([claim(2, 100_000_000)]);
    let Step::Start { claim: c, probe: true } = p.next(t3, room) else { panic!() };
    p.not_started(t3, c, true);
    assert_eq!(p.phase(), Phase::Open);
    // Started, but nothing was sent (the event is gone): the probe comes back.
    let t4 = Now { at: t0 + Duration::from_secs(6), wall_us: 6_000_000 };
    let Step::Start { probe: true, .. } = p.next(t4, room) else { panic!() };
    assert_eq!(p.phase(), Phase::HalfOpen);
    assert_eq!(p.finished(t4, true, Health::NotSent).change, None);
    assert_eq!(p.phase(), Phase::Open);
    assert!(matches!(p.next(t4, room), Step::Sleep(_)), "the rate-limit slot");
    let t5 = Now { at: t0 + Duration::from_secs(9), wall_us: 9_000_000 };
    p.begin();
    assert_eq!(p.next(t5, room), Step::Claim(1), "the next look probes again");
}

#[test]
fn a_pause_or_a_lost_share_gives_every_claim_back() {
    let t0 = Instant::now();
    let mut p = Pacer::new(Circuit::new(5, Duration::from_secs(30)), TIMEOUT);
    let now = Now { at: t0, wall_us: 0 };
    let room = Room { paused: false, share: 1, free: 1, interval: None };
    assert_eq!(p.next(now, room), Step::Claim(2));
    p.claimed([claim(1, 100_000_000), claim(2, 100_000_000)]);
    let paused = Room { paused: true, ..room };
    assert_eq!(
        p.next(now, paused),
        Step::Release(vec![claim(1, 100_000_000), claim(2, 100_000_000)])
    );
    assert_eq!(p.next(now, paused), Step::Rest(PAUSE_REFRESH));
    p.claimed([claim(3, 100_000_000)]);
    assert_eq!(
        p.next(now, Room { share: 0, free: 0, ..room }),
        Step::Release(vec![claim(3, 100_000_000)])
    );
}

#[test]
fn any_rate_gives_an_interval_without_panicking() {
    assert_eq!(rate_interval(4.0), Duration::from_millis(250));
    for rate in [f64::MIN_POSITIVE, 1e-300, 0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(rate_interval(rate) <= MAX_RATE_INTERVAL, "{rate}");
    }
}

/// An attempt's end wakes the worker only when the worker waits for what it frees (a
/// permit) or the circuit moved; after a look that drained the schedule, not (new
/// deliveries wake it themselves).
#[test]
fn a_finished_attempt_wakes_the_worker_only_when_it_waits_for_it() {
    let t0 = Instant::now();
    let now = Now { at: t0, wall_us: 0 };
    let mut p = Pacer::new(Circuit::new(3, Duration::from_secs(30)), TIMEOUT);
    let room = Room { paused: false, share: 1, free: 1, interval: None };
    // A look: one claim, started; the schedule is drained.
    p.begin();
    assert_eq!(p.next(now, room), Step::Claim(2));
    p.claimed([claim(1, 75_000_000)]);
    assert!(matches!(p.next(now, room), Step::Start { .. }));
    let busy = Room { free: 0, ..room };
    assert!(matches!(p.next(now, busy), Step::Sleep(_)), "every permit in use: it waits");
    assert!(p.finished(now, false, Health::Healthy).look, "the permit it waits for is free");
    // The next look finds nothing: an end after it needs no look.
    p.begin();
    assert_eq!(p.next(now, room), Step::Claim(2));
    p.claimed([claim(2, 75_000_000)]);
    assert!(matches!(p.next(now, room), Step::Start { .. }));
    assert_eq!(p.next(now, room), Step::Idle);
    assert_eq!(p.finished(now, false, Health::Healthy), Finished { change: None, look: false });
    // A start the shell could not make (no permit after all) waits for one too.
    p.begin();
    assert_eq!(p.next(now, room), Step::Claim(2));
    p.claimed([claim(3, 75_000_000)]);
    let Step::Start { claim: c, probe } = p.next(now, room) else { panic!("no start") };
    p.not_started(now, c, probe);
    assert!(p.finished(now, false, Health::NotSent).look);
    // The circuit moving is news whatever the worker waits for.
    p.begin();
    assert!(matches!(p.next(now, room), Step::Start { .. }), "the claim given back");
    assert_eq!(p.next(now, room), Step::Claim(2));
    p.claimed([]);
    assert_eq!(p.next(now, room), Step::Idle);
    for _ in 0..2 {
        assert!(!p.finished(now, false, Health::Unwell).look);
    }
    let third = p.finished(now, false, Health::Unwell);
    assert_eq!(third, Finished { change: Some(CircuitChange::Opened), look: true });
}

/// A record wakes the worker when it may have made something due: a retry always
/// (its time is new to the worker's sleep), a final record of an ordered destination
/// (the resource's next delivery), a record not written as the worker's; never an
/// unordered destination's final record.
#[test]
fn a_record_wakes_the_worker_only_when_it_may_make_something_due() {
    use AttemptVerdict::{Dead, Failed, Retry, Success};
    for ordered in [false, true] {
        assert!(look_after_record(Some(Retry), ordered));
        assert!(look_after_record(None, ordered));
        for last in [Success, Failed, Dead] {
            assert_eq!(look_after_record(Some(last), ordered), ordered, "{last:?}");
        }
    }
}
