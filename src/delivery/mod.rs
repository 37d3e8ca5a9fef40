//! Delivery: one worker per destination claims the due deliveries of its schedule,
//! sends them (at most `max_concurrency` requests at once), and has the store record
//! each outcome. Destinations never wait for each other.

mod activity;
mod attempt;
mod circuit;
mod pacer;
mod recorder;
mod watchdog;
mod worker;
#[cfg(test)]
mod worker_tests;

pub(crate) use circuit::Phase;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};

use crate::config::Config;
use crate::destinations::Destination;
use crate::internal_events::{DestinationPauseSet, InternalEvent};
use crate::lock::Current;
use crate::metrics::Metrics;
use crate::shutdown::Stop;
use crate::store::{Claim, SharedStore};

/// A destination and its worker's live state, shared with dispatch and the admin API.
pub(crate) struct DestinationState {
    pub(crate) dest: Destination,
    /// The worker's decisions (circuit, rate slot, claims taken ahead): one state
    /// machine, moved only under this lock.
    pacer: Mutex<pacer::Pacer<Claim>>,
    circuit_threshold: u32,
    circuit_interval: Duration,
    /// The worker's last progress: an attempt started, or a look that found nothing
    /// it may do (the watchdog's measure).
    progress: Mutex<Option<Instant>>,
    /// The watchdog finds due deliveries and no attempt starting.
    stalled: AtomicBool,
    wake: Notify,
    /// The pause as last read from the store (which every relay shares).
    paused: AtomicBool,
    /// How many pauses and resumes this relay has written: a read of the store that
    /// began before one of them is stale and must not undo it (`refresh_paused`).
    pause_writes: Mutex<u64>,
    /// Attempts of this relay between their claim and their record.
    in_flight: AtomicUsize,
    /// The claim tokens of those attempts (the claims this worker holds, with the
    /// pacer's taken ahead).
    in_flight_tokens: Mutex<std::collections::HashSet<u64>>,
    /// A claim call may have taken claims whose answer never came back (it failed or
    /// was dropped): the next look gives back this relay's claims it does not hold.
    unknown_claims: AtomicBool,
    /// Requests in flight to the destination: a permit is held from the send to the
    /// answer, not while the store records it.
    permits: Arc<Semaphore>,
    /// What it did lately (for the console's overview).
    activity: Mutex<activity::Activity>,
    /// This relay's share of `max_concurrency`, as its worker last computed it.
    share: AtomicUsize,
    /// What dispatch routes to it, as configured (for the console).
    pub(crate) route: Route,
}

/// An attempt on the books ([`DestinationState::attempt_started`]) until it ends, by
/// any way: dropped, it takes the attempt off them (its claim's token out of
/// `in_flight_tokens`, the count down). A panicked attempt, whose record was not
/// written, also marks its claim for the next look to give back (held until its lease
/// ran out before, and counted in flight for good).
struct OnTheBooks {
    state: Arc<DestinationState>,
    token: u64,
}

impl Drop for OnTheBooks {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.state.unknown_claims.store(true, Ordering::SeqCst);
        }
        crate::lock::lock(&self.state.in_flight_tokens).remove(&self.token);
        self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A destination's route and order, as configured: the sources and event names it
/// takes (`*` globs; empty: all) and its `ordering` (`none`, `per-resource`, `latest`).
pub(crate) struct Route {
    pub(crate) sources: Vec<String>,
    pub(crate) events: Vec<String>,
    pub(crate) ordering: &'static str,
}

impl DestinationState {
    /// The state of the destination `dc` of `config`, as at start: circuit closed,
    /// nothing claimed, `paused` as the store says.
    fn new(
        dc: &crate::config::DestinationConfig,
        config: &Config,
        client: &reqwest::Client,
        paused: bool,
    ) -> anyhow::Result<Self> {
        let dest = Destination::new(dc, &config.delivery, client)?;
        let (threshold, interval) =
            (config.delivery.circuit_failure_threshold, config.delivery.circuit_probe_interval);
        Ok(Self {
            pacer: Mutex::new(new_pacer(&dest, threshold, interval)),
            circuit_threshold: threshold,
            circuit_interval: interval,
            progress: Mutex::new(None),
            stalled: AtomicBool::new(false),
            permits: Arc::new(Semaphore::new(dest.max_concurrency)),
            paused: AtomicBool::new(paused),
            pause_writes: Mutex::new(0),
            wake: Notify::new(),
            in_flight: AtomicUsize::new(0),
            in_flight_tokens: Mutex::new(std::collections::HashSet::new()),
            unknown_claims: AtomicBool::new(false),
            activity: Mutex::default(),
            share: AtomicUsize::new(0),
            route: Route {
                sources: dc.sources.clone(),
                events: dc.events.clone(),
                ordering: match dc.ordering {
                    crate::config::Ordering::None => "none",
                    crate::config::Ordering::PerResource => "per-resource",
                    crate::config::Ordering::Latest => "latest",
                },
            },
            dest,
        })
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Takes a pause or resume this relay has just written to the store.
    pub(crate) fn note_paused(&self, paused: bool) {
        let mut writes = crate::lock::lock(&self.pause_writes);
        *writes += 1;
        self.paused.store(paused, Ordering::SeqCst);
    }

    /// A mark to take before reading the pause from the store.
    pub(crate) fn pause_mark(&self) -> u64 {
        *crate::lock::lock(&self.pause_writes)
    }

    /// Takes `paused` as read from the store after `mark`, unless this relay wrote a
    /// pause or resume since (the read may predate it: a destination paused for a
    /// 410 was resumed by a refresh that had read the store just before, and got the
    /// next event).
    pub(crate) fn refresh_paused(&self, paused: bool, mark: u64) {
        let writes = crate::lock::lock(&self.pause_writes);
        if *writes == mark {
            self.paused.store(paused, Ordering::SeqCst);
        }
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Puts an attempt of the claim `token` on the books (counted in flight, its
    /// claim held) until the returned guard goes.
    fn attempt_started(self: &Arc<Self>, token: u64) -> OnTheBooks {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        crate::lock::lock(&self.in_flight_tokens).insert(token);
        OnTheBooks { state: self.clone(), token }
    }

    /// Where the circuit stands.
    pub(crate) fn phase(&self) -> Phase {
        crate::lock::lock(&self.pacer).phase()
    }

    /// Whether the progress watchdog finds this destination stalled on this relay.
    pub(crate) fn is_stalled(&self) -> bool {
        self.stalled.load(Ordering::SeqCst)
    }

    /// This relay's share of `max_concurrency` (the fleet divides it; 0 while a relay
    /// joins).
    pub(crate) fn share(&self) -> usize {
        self.share.load(Ordering::Relaxed)
    }

    /// Deliveries of this relay in the last minute, its last error and when, and
    /// since when the circuit is where it is (`None`: closed since start).
    pub(crate) fn activity(&self) -> Recent {
        let now = std::time::SystemTime::now();
        let mut a = crate::lock::lock(&self.activity);
        Recent {
            per_minute: a.per_minute(now),
            last_error: a.last_error(),
            recovered: a.recovered(),
            circuit_since: a.circuit_since(),
        }
    }

    /// A pacer as at start-up: circuit closed, nothing claimed.
    fn fresh_pacer(&self) -> pacer::Pacer<Claim> {
        new_pacer(&self.dest, self.circuit_threshold, self.circuit_interval)
    }
}

fn new_pacer(dest: &Destination, threshold: u32, interval: Duration) -> pacer::Pacer<Claim> {
    pacer::Pacer::new(circuit::Circuit::new(threshold, interval), dest.timeout)
}

/// A destination's recent activity on this relay, as [`DestinationState::activity`]
/// reads it.
pub(crate) struct Recent {
    pub(crate) per_minute: u64,
    pub(crate) last_error: Option<(String, std::time::SystemTime)>,
    /// When a delivery first succeeded after that error.
    pub(crate) recovered: Option<std::time::SystemTime>,
    pub(crate) circuit_since: Option<std::time::SystemTime>,
}

/// What the workers of one relay share.
pub(crate) struct RelayContext {
    /// This relay's name on its claims.
    pub(crate) owner: String,
    /// This relay's share of each destination's limits.
    pub(crate) fleet: Arc<crate::fleet::FleetShare>,
    /// The free-space floor: below it no attempt starts.
    pub(crate) space: Arc<crate::space::Space>,
    pub(crate) metrics: Arc<Metrics>,
    /// Each attempt's span, and the `traceparent` it sends.
    pub(crate) tracer: Arc<crate::telemetry::Tracer>,
    /// Where transforms run.
    pub(crate) shaper: Arc<crate::shape::Shaper>,
}

/// Every configured destination, by name.
pub(crate) struct Destinations {
    by_name: BTreeMap<String, Arc<DestinationState>>,
    store: SharedStore,
    /// `retention.delivered_bodies`: an attempt settling an older event drops its body.
    delivered_bodies: Option<std::time::Duration>,
    /// The HTTP client every http destination shares (one pool per host).
    client: reqwest::Client,
}

impl Destinations {
    /// Builds the destinations of `config`; pauses persisted in the store are kept.
    pub(crate) async fn new(
        config: &Config,
        store: SharedStore,
        client: reqwest::Client,
    ) -> anyhow::Result<Self> {
        Self::empty(config, store, client).next(config, &[]).await
    }

    /// None yet, on `store`: what [`Self::next`] builds on at start.
    fn empty(config: &Config, store: SharedStore, client: reqwest::Client) -> Self {
        Self {
            by_name: BTreeMap::new(),
            store,
            delivered_bodies: config.retention.delivered_bodies,
            client,
        }
    }

    /// The destinations of `config` after these: those named in `kept` (unchanged)
    /// are these very ones, their workers running on; every other is built anew, its
    /// pause read from the store. Nothing is started.
    pub(crate) async fn next(&self, config: &Config, kept: &[String]) -> anyhow::Result<Self> {
        let paused = self.store.paused().await?;
        let mut by_name = BTreeMap::new();
        for dc in &config.destinations {
            let state = match self.by_name.get(&dc.name) {
                Some(state) if kept.contains(&dc.name) => state.clone(),
                _ => Arc::new(DestinationState::new(
                    dc,
                    config,
                    &self.client,
                    paused.contains(&dc.name),
                )?),
            };
            by_name.insert(dc.name.clone(), state);
        }
        let delivered_bodies = config.retention.delivered_bodies;
        let client = self.client.clone();
        Ok(Self { by_name, store: self.store.clone(), delivered_bodies, client })
    }

    /// The worker of the destination `name`, with what this relay shares with every
    /// worker, to run until `stop`; `None` if there is no such destination.
    pub(crate) fn worker(
        &self,
        name: &str,
        relay: &RelayContext,
        stop: Stop,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let state = self.by_name.get(name)?;
        if state.dest.kind == crate::config::DestinationKind::Pull {
            // Its consumer leases its deliveries (`pull/`): nothing to send, nothing to
            // watch; the part only waits for its stop.
            let mut stop = stop;
            return Some(futures_util::future::Either::Left(async move { stop.wait().await }));
        }
        let worker = worker::Worker {
            recorder: recorder::Recorder::start(
                self.store.clone(),
                state.dest.retry.clone(),
                self.delivered_bodies,
                relay.metrics.clone(),
            ),
            owner: relay.owner.clone(),
            fleet: relay.fleet.clone(),
            space: relay.space.clone(),
            pause_read: std::sync::Mutex::new(None),
            attempts: std::sync::Mutex::default(),
            state: state.clone(),
            store: self.store.clone(),
            metrics: relay.metrics.clone(),
            shaper: relay.shaper.clone(),
            tracer: relay.tracer.clone(),
            shaped: std::sync::Mutex::default(),
        };
        Some(futures_util::future::Either::Right(worker.run(stop)))
    }

    /// The names of the destinations, in order.
    pub(crate) fn names(&self) -> impl Iterator<Item = &String> {
        self.by_name.keys()
    }

    /// Tells a destination's worker to look at its schedule now.
    pub(crate) fn wake(&self, name: &str) {
        if let Some(state) = self.by_name.get(name) {
            state.wake.notify_one();
        }
    }

    /// Wakes the workers named by the other relays' wake-ups (see
    /// [`crate::store::Store::wakeups`]), among the destinations in force, until `stop`.
    pub(crate) async fn follow_wakeups(
        current: Arc<Current<Self>>,
        mut wakeups: tokio::sync::broadcast::Receiver<crate::store::Wake>,
        mut stop: Stop,
    ) {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            let wake = tokio::select! {
                w = wakeups.recv() => w,
                _ = stop.wait() => return,
            };
            match wake {
                Ok(crate::store::Wake::Due(name)) => current.load().wake(&name),
                Ok(crate::store::Wake::All) | Err(RecvError::Lagged(_)) => {
                    for state in current.load().by_name.values() {
                        state.wake.notify_one();
                    }
                }
                // The dispatcher's, not the workers'.
                Ok(crate::store::Wake::Inbox) => {}
                Err(RecvError::Closed) => return,
            }
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Arc<DestinationState>> {
        self.by_name.get(name)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<DestinationState>> {
        self.by_name.values()
    }

    /// Takes in that the admin token named `by` paused or resumed the destination
    /// `name` in the store (so on every relay sharing it; the admin API journals it
    /// in the same transaction): its worker sees it at once, not at the next read of
    /// the store's pauses. `false` if there is no such destination.
    pub(crate) fn paused_by(&self, name: &str, paused: bool, by: &str, metrics: &Metrics) -> bool {
        let Some(state) = self.by_name.get(name) else { return false };
        state.note_paused(paused);
        state.wake.notify_one();
        DestinationPauseSet { destination: name, paused, by }.emit(metrics);
        true
    }
}
