//! Delivery: one worker per destination takes the due entries of its schedule, sends
//! them (at most `max_concurrency` at once), and records each outcome together with
//! the next schedule entry. Destinations never wait for each other.

mod backoff;
mod circuit;
mod verdict;
mod worker;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, Semaphore};

use crate::config::Config;
use crate::destinations::Destination;
use crate::metrics::Metrics;
use crate::shutdown::Stop;
use crate::store::{Committer, Scheduled, SharedStore, StoreError};

/// A destination and its worker's live state, shared with dispatch and the admin API.
pub(crate) struct DestinationState {
    pub(crate) dest: Destination,
    pub(crate) circuit: circuit::Circuit,
    wake: Notify,
    paused: AtomicBool,
    /// Schedule entries being attempted right now (still in the store until done).
    in_flight: Mutex<HashSet<Scheduled>>,
    permits: Arc<Semaphore>,
}

impl DestinationState {
    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    fn is_in_flight(&self, entry: &Scheduled) -> bool {
        self.in_flight.lock().is_ok_and(|s| s.contains(entry))
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.lock().map_or(0, |s| s.len())
    }
}

/// Every configured destination, by name.
pub(crate) struct Destinations {
    by_name: BTreeMap<String, Arc<DestinationState>>,
    store: SharedStore,
}

impl Destinations {
    /// Builds the destinations of `config`; pauses persisted in the store are kept.
    pub(crate) fn new(config: &Config, store: SharedStore) -> anyhow::Result<Self> {
        let paused = store.paused()?;
        let mut by_name = BTreeMap::new();
        for dc in &config.destinations {
            let dest = Destination::new(dc, &config.delivery)?;
            let state = DestinationState {
                circuit: circuit::Circuit::new(
                    config.delivery.circuit_failure_threshold,
                    config.delivery.circuit_probe_interval,
                ),
                permits: Arc::new(Semaphore::new(dest.max_concurrency)),
                paused: AtomicBool::new(paused.contains(&dc.name)),
                wake: Notify::new(),
                in_flight: Mutex::new(HashSet::new()),
                dest,
            };
            by_name.insert(dc.name.clone(), Arc::new(state));
        }
        Ok(Self { by_name, store })
    }

    /// Starts one worker per destination.
    pub(crate) fn start(
        &self,
        committer: Committer,
        metrics: Arc<Metrics>,
        client: reqwest::Client,
        stop: Stop,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        self.by_name
            .values()
            .map(|state| {
                let worker = worker::Worker {
                    committer: committer.clone(),
                    next_slot: Mutex::new(std::time::Instant::now()),
                    state: state.clone(),
                    store: self.store.clone(),
                    metrics: metrics.clone(),
                    client: client.clone(),
                };
                tokio::spawn(worker.run(stop.clone()))
            })
            .collect()
    }

    /// Tells a destination's worker to look at its schedule now.
    pub(crate) fn wake(&self, name: &str) {
        if let Some(state) = self.by_name.get(name) {
            state.wake.notify_one();
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Arc<DestinationState>> {
        self.by_name.get(name)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<DestinationState>> {
        self.by_name.values()
    }

    /// Pauses or resumes a destination (persisted); `false` if there is no such one.
    pub(crate) fn set_paused(&self, name: &str, paused: bool) -> Result<bool, StoreError> {
        let Some(state) = self.by_name.get(name) else { return Ok(false) };
        self.store.set_paused(name, paused)?;
        state.paused.store(paused, Ordering::SeqCst);
        state.wake.notify_one();
        tracing::info!(
            destination = name,
            paused,
            "destination {}",
            if paused { "paused" } else { "resumed" }
        );
        Ok(true)
    }
}
