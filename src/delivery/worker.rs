//! The worker of one destination: the imperative shell around its [`Pacer`]. It asks
//! the pacer what to do, does it (claim, release, start a request, sleep), reports
//! each answer back, and runs the destination's progress [`watchdog`]. One attempt,
//! from the body to its record, is `attempt.rs`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pacer::{self, Now, Room, Step, MAX_IDLE, PAUSE_REFRESH};
use super::recorder::Recorder;
use super::watchdog::{Change, Watch};
use super::DestinationState;
use crate::internal_events::taxonomy::{self, ErrorType, Stage};
use crate::internal_events::{DestinationRecovered, DestinationStalled, InternalEvent};
use crate::lock::lock;
use crate::metrics::Metrics;
use crate::shape;
use crate::shutdown::Stop;
use crate::store::{Claim, SharedStore};

/// What one attempt's record writes, about (the delivery's record, its attempt, the
/// schedule and the ledger's row): taken out of the free-space budget per claim.
const ATTEMPT_BYTES: u64 = 1024;
/// How long a worker refused room by the free-space budget waits before it looks again.
const FLOOR_WAIT: Duration = Duration::from_millis(100);

impl pacer::Leased for Claim {
    fn expires_us(&self) -> u64 {
        self.expires_us
    }
}

pub(super) struct Worker {
    /// This relay's name on its claims.
    pub(super) owner: String,
    /// This relay's share of the destination's limits (all of them, alone).
    pub(super) fleet: Arc<crate::fleet::FleetShare>,
    /// Below the free-space floor no attempt starts (its record is a write).
    pub(super) space: Arc<crate::space::Space>,
    /// Records finished attempts in groups.
    pub(super) recorder: Recorder,
    /// The attempts started and not yet joined: the worker owns them, and its run
    /// ends only after each has ended (each holds the worker, and with it the store).
    pub(super) attempts: std::sync::Mutex<tokio::task::JoinSet<()>>,
    pub(super) state: Arc<DestinationState>,
    /// When the pause state was last read from the store.
    pub(super) pause_read: std::sync::Mutex<Option<Instant>>,
    pub(super) store: SharedStore,
    pub(super) metrics: Arc<Metrics>,
    pub(super) tracer: Arc<crate::telemetry::Tracer>,
    /// Where the destination's transform runs.
    pub(super) shaper: Arc<shape::Shaper>,
    /// Bodies the destination's transform made for claims taken ahead, by claim token:
    /// a claimed batch is transformed in one loan of a shaping process.
    pub(super) shaped: std::sync::Mutex<HashMap<u64, Result<shape::Sent, String>>>,
}

/// Bodies kept for claims taken ahead at most (beyond, each is made when sent).
const SHAPED_KEPT: usize = 4096;

impl Worker {
    /// Runs the destination until `stop`: looks at the schedule whenever the pacer
    /// says, woken early by new deliveries, finished attempts and resumes; beside it,
    /// the watchdog, which restarts the looking (a fresh pacer) when it stalls.
    pub(super) async fn run(self, stop: Stop) {
        let this = Arc::new(self);
        // The watch outlives the restarts it makes: it knows the stall is still on.
        let mut watch = Watch::new(Instant::now());
        loop {
            tokio::select! {
                () = this.clone().look_until(stop.clone()) => break,
                () = this.watch(&mut watch) => this.restart().await,
            }
        }
        // Give back what was claimed but not started, and let attempts in flight
        // finish and be recorded (the daemon bounds this by its grace period; one cut
        // short stays scheduled and is made again).
        let waiting = lock(&this.state.pacer).drain();
        this.release(waiting).await;
        let mut attempts = std::mem::take(&mut *lock(&this.attempts));
        while let Some(ended) = attempts.join_next().await {
            if let Err(e) = ended {
                if e.is_panic() {
                    let what = format!("an attempt of {} panicked", this.state.dest.name);
                    taxonomy::failed(
                        &this.metrics,
                        Stage::Delivery,
                        ErrorType::TaskDied,
                        &what,
                        &e,
                    );
                }
            }
        }
        // Every attempt has ended and let go of the worker: the recorder ends last.
        if let Ok(worker) = Arc::try_unwrap(this) {
            worker.recorder.close().await;
        }
    }

    async fn look_until(self: Arc<Self>, mut stop: Stop) {
        while !stop.is_stopped() {
            let idle = match self.look().await {
                Ok(idle) => idle,
                Err(e) => {
                    let what = format!(
                        "reading the schedule of {} failed; looking again shortly",
                        self.state.dest.name
                    );
                    taxonomy::failed(&self.metrics, Stage::Delivery, ErrorType::Storage, &what, &e);
                    MAX_IDLE
                }
            };
            tokio::select! {
                _ = self.state.wake.notified() => {}
                _ = tokio::time::sleep(idle) => {}
                _ = stop.wait() => {}
            }
        }
    }

    /// How long a claim is held: the request's timeout plus room to record it.
    fn lease(&self) -> Duration {
        self.state.dest.timeout + crate::store::CLAIM_MARGIN
    }

    pub(super) fn now() -> Now {
        Now { at: Instant::now(), wall_us: crate::clock::now_us() }
    }

    /// What the pacer needs to know now.
    fn room(&self) -> Room {
        let state = &self.state;
        let (max, available) = (state.dest.max_concurrency, state.permits.available_permits());
        let share = self.fleet.concurrency(max);
        state.share.store(share, Ordering::Relaxed);
        let requests = max.saturating_sub(available);
        Room {
            // Below the free-space floor, as paused: claims go back, nothing starts,
            // and the watchdog counts no stall (attempts in flight are recorded).
            paused: state.is_paused() || self.space.below_floor(),
            share,
            free: share.saturating_sub(requests).min(available),
            interval: state.dest.rate_limit.map(|r| pacer::rate_interval(self.fleet.rate(r))),
        }
    }

    /// Reads the shared pause state when the cached one is older than [`PAUSE_REFRESH`].
    async fn refresh_pause(&self) -> anyhow::Result<()> {
        let stale = lock(&self.pause_read).is_none_or(|t| t.elapsed() >= PAUSE_REFRESH);
        if stale {
            let mark = self.state.pause_mark();
            let paused = self.store.paused().await?.contains(&self.state.dest.name);
            self.state.refresh_paused(paused, mark);
            *lock(&self.pause_read) = Some(Instant::now());
        }
        Ok(())
    }

    /// Gives claims back to the store; one that cannot be (the store unreachable) is
    /// given back by the first look that can ([`Worker::release_unknown`]): this relay
    /// lives, so nobody takes it over, and it would wait out its lease.
    async fn release(&self, claims: Vec<Claim>) {
        for claim in claims {
            lock(&self.shaped).remove(&claim.token);
            if let Err(e) = self.store.release(&claim).await {
                self.state.unknown_claims.store(true, Ordering::SeqCst);
                let what = format!(
                    "cannot give a claim of {} back now; the next look gives it back",
                    self.state.dest.name
                );
                taxonomy::degraded(&self.metrics, Stage::Delivery, ErrorType::Storage, &what, &e);
            }
        }
    }

    /// Makes the bodies of `claims` with the destination's transform, if it has one,
    /// in one loan of a shaping process.
    async fn shape_ahead(&self, claims: &[Claim]) {
        let Some(transform) = &self.state.dest.transform else { return };
        let events: Vec<shape::ToTransform> = claims
            .iter()
            .filter_map(|c| {
                let (meta, body) = (c.meta.clone()?, c.body.clone()?);
                Some(shape::ToTransform { token: c.token, id: c.event, meta, body })
            })
            .collect();
        if events.is_empty() {
            return;
        }
        let made = self.shaper.bodies_sent(&self.state.dest.name, transform, events).await;
        let mut shaped = lock(&self.shaped);
        if shaped.len() + made.len() > SHAPED_KEPT {
            shaped.clear();
        }
        shaped.extend(made);
    }

    /// Gives back this relay's claims on the destination that it does not hold, once
    /// a claim call may have left some (see `DestinationState::unknown_claims`).
    async fn release_unknown(&self) -> anyhow::Result<()> {
        if !self.state.unknown_claims.load(Ordering::SeqCst) {
            return Ok(());
        }
        let keep: Vec<u64> = {
            let pacer = lock(&self.state.pacer);
            let in_flight = lock(&self.state.in_flight_tokens);
            pacer.ahead().map(|c| c.token).chain(in_flight.iter().copied()).collect()
        };
        let name = &self.state.dest.name;
        let n = self.store.release_unknown(name, &self.owner, &keep).await?;
        self.state.unknown_claims.store(false, Ordering::SeqCst);
        if n > 0 {
            tracing::info!(destination = %name, claims = n,
                "gave back claims whose claiming call had failed (they were taken, the answer lost)");
        }
        Ok(())
    }

    /// One look: does what the pacer says until it says sleep; returns how long.
    async fn look(self: &Arc<Self>) -> anyhow::Result<Duration> {
        self.refresh_pause().await?;
        self.release_unknown().await?;
        let name = &self.state.dest.name;
        lock(&self.state.pacer).begin();
        // When the next delivery after the look's claim is due, read with the claim: the
        // pacer says Idle only once a claim of this look left nothing to start.
        let mut next_due: Option<Option<u64>> = None;
        loop {
            let now = Self::now();
            let step = lock(&self.state.pacer).next(now, self.room());
            match step {
                Step::Release(claims) => self.release(claims).await,
                Step::Claim(want) => {
                    // Each claim ends in an attempt's record: its bytes come out of the
                    // free-space budget first (`space/`); refused, as below the floor.
                    let bytes = ATTEMPT_BYTES.saturating_mul(want as u64);
                    if !self.space.admit(bytes).await {
                        lock(&self.state.pacer).claimed(Vec::new());
                        return Ok(FLOOR_WAIT);
                    }
                    // Until the answer is in hand, the call may have claimed for nobody.
                    self.state.unknown_claims.store(true, Ordering::SeqCst);
                    let (claims, next) = self
                        .store
                        .claim_due_and_next(name, &self.owner, now.wall_us, self.lease(), want)
                        .await?;
                    next_due = Some(next);
                    self.shape_ahead(&claims).await;
                    lock(&self.state.pacer).claimed(claims);
                    self.state.unknown_claims.store(false, Ordering::SeqCst);
                }
                Step::Start { claim, probe } => {
                    let Ok(permit) = self.state.permits.clone().try_acquire_owned() else {
                        lock(&self.state.pacer).not_started(now, claim, probe);
                        return Ok(MAX_IDLE);
                    };
                    let books = self.state.attempt_started(claim.token);
                    self.progress(now.at);
                    let this = self.clone();
                    let mut attempts = lock(&self.attempts);
                    // Those ended are let go of here: the set holds only what runs.
                    while attempts.try_join_next().is_some() {}
                    attempts.spawn(async move {
                        let _books = books;
                        this.attempt(claim, permit, probe).await;
                    });
                }
                Step::Idle => {
                    self.progress(now.at);
                    let next = match next_due {
                        Some(next) => next,
                        None => self.store.next_due_after(name, now.wall_us).await?,
                    };
                    return Ok(next_sleep(next, now.wall_us));
                }
                Step::Rest(d) => {
                    self.progress(now.at);
                    return Ok(d);
                }
                Step::Sleep(d) => return Ok(d),
            }
        }
    }

    /// Marks progress for the watchdog: an attempt started, or a look found nothing
    /// this worker may do.
    fn progress(&self, at: Instant) {
        *lock(&self.state.progress) = Some(at);
    }

    /// Watches progress; returns when the worker should be restarted.
    async fn watch(&self, watch: &mut Watch) {
        let state = &self.state;
        loop {
            let room = self.room();
            let bound =
                pacer::stall_bound(state.circuit_interval, state.dest.timeout, room.interval);
            tokio::time::sleep(
                (bound / 10).clamp(Duration::from_millis(500), Duration::from_secs(5)),
            )
            .await;
            let change = watch.observe(Instant::now(), *lock(&state.progress), bound);
            state.stalled.store(watch.is_stalled(), Ordering::SeqCst);
            match change {
                Some(Change::Stalled { idle, heal }) => {
                    let phase = lock(&state.pacer).phase();
                    DestinationStalled {
                        destination: &state.dest.name,
                        idle,
                        circuit: &phase,
                        in_flight: state.in_flight(),
                        share: room.share,
                        free: room.free,
                        restart: heal,
                    }
                    .emit(&self.metrics);
                    if heal {
                        return;
                    }
                }
                Some(Change::Recovered) => {
                    DestinationRecovered { destination: &state.dest.name }.emit(&self.metrics);
                }
                None => {}
            }
        }
    }

    /// A fresh start after a stall: claims taken ahead go back, the pacer starts over
    /// (circuit closed, as after a process restart). Attempts in flight finish.
    async fn restart(&self) {
        let fresh = self.state.fresh_pacer();
        let mut old = std::mem::replace(&mut *lock(&self.state.pacer), fresh);
        lock(&self.shaped).clear();
        self.release(old.drain()).await;
        *lock(&self.pause_read) = None;
    }
}

/// How long to sleep before the next due entry (at most [`MAX_IDLE`]).
fn next_sleep(next_due: Option<u64>, now: u64) -> Duration {
    next_due.map_or(MAX_IDLE, |due| Duration::from_micros(due.saturating_sub(now)).min(MAX_IDLE))
}
