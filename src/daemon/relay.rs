//! The running relay as one owner of its parts: [`Relay::start`] builds and starts
//! each component in order, [`Relay::wait`] waits for a reason to stop, and
//! [`Relay::stop`] stops every one of them and waits for it, within
//! `shutdown.grace`, closing the store last. Nothing it starts outlives it: no task,
//! no listener, no shaping process, no queue.

use std::sync::Arc;

use actix_web::web;
use anyhow::Context;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::base::Base;
use super::flow::Flow;
use super::listeners::{self, Listener};
use super::open::trace_salt;
use crate::access::journal::Recorder;
use crate::access::Access;
use crate::admin::AdminState;
use crate::config::Config;
use crate::delivery::Destinations;
use crate::dispatch::{DispatchRules, Dispatcher};
use crate::ingress::{self, IngressState};
use crate::internal_events::taxonomy::{self, ErrorType, Stage};
use crate::internal_events::{ConfigInForce, InternalEvent, RelayReady};
use crate::lock::Current;
use crate::metrics::Metrics;
use crate::readiness::Readiness;
use crate::shape::Shaper;
use crate::shutdown::{Stop, StopTrigger};
use crate::store::SharedStore;
use crate::supervise::Supervisor;
use crate::telemetry::export::Export;

mod stop;

/// Why the relay stops, and whether the store failed (then it exits non-zero).
pub(super) struct Ended {
    reason: String,
    failure: Option<String>,
}

/// The running relay: every part it started, in the order they stop.
pub(super) struct Relay {
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    store: SharedStore,
    store_failed: watch::Receiver<Option<String>>,
    /// Stops the background tasks a reload leaves alone (their [`Stop`]).
    trigger: StopTrigger,
    /// Those tasks: dispatch, the services, the fleet's heartbeat and wake-ups.
    tasks: Vec<JoinHandle<()>>,
    /// What a reload replaces, and the parts it restarts (the reconciler, retention,
    /// the delivery workers).
    flow: Flow,
    /// Reloads asked through the admin API.
    reloads: mpsc::Receiver<crate::admin::reload::Request>,
    /// SIGHUP (`systemctl reload`), when the relay runs as a server.
    hangup: Option<tokio::signal::unix::Signal>,
    /// Appends the operational events; ends once the queue is closed.
    operational: JoinHandle<()>,
    shaper: Arc<Shaper>,
    export: Option<Export>,
    ingress: Listener,
    admin: Listener,
    /// The backups being streamed by the admin listener: ended before it stops.
    backups: Arc<crate::admin::Backups>,
}

impl Relay {
    /// Builds each component on `store` and starts it: operational events, shaping,
    /// destinations and their workers, dispatch, the services, the listeners, and the
    /// reconciler once the ingress listens (the hooks point at it). `source` is where
    /// a reload reads the configuration again.
    pub(super) async fn start(
        config: &Config,
        launch: super::Launch,
        base: &Base,
        store: SharedStore,
    ) -> anyhow::Result<Self> {
        let super::Launch { source, sockets } = launch;
        let (metrics, readiness, space) = (&base.metrics, &base.readiness, &base.space);
        let operational = start_operational(config, &store, metrics);
        let shaper = Arc::new(Shaper::new(metrics.clone()));
        let client = crate::destinations::client().context("building the HTTP client")?;
        let destinations = Arc::new(
            Destinations::new(config, store.clone(), client)
                .await
                .context("setting up destinations")?,
        );
        // This relay's name on its delivery claims.
        let owner = format!("relay-{}-{:08x}", std::process::id(), fastrand::u32(..));
        let salt =
            trace_salt(&store, &base.metrics).await.context("reading the store's trace salt")?;
        let (tracer, export) =
            crate::telemetry::export::start(&config.telemetry, salt, &owner, metrics.clone())
                .context("setting up the trace export ([telemetry])")?;
        let reconciler = Arc::new(
            crate::upstream::reconciler(config, store.clone(), metrics.clone())
                .context("setting up the upstream accounts")?,
        );
        let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("installing the SIGHUP handler (reload)")?;
        let (trigger, stop) = StopTrigger::new();
        let sup = Supervisor {
            readiness: readiness.clone(),
            metrics: metrics.clone(),
            stop: stop.clone(),
        };
        let mut tasks = Vec::new();
        metrics.relay.fleet_relays.set(1);
        let (fleet, fleet_task) =
            crate::fleet::follow(store.clone(), owner.clone(), metrics.clone(), stop.clone()).await;
        tasks.extend(fleet_task.map(|t| sup.watch("fleet", "fleet heartbeat".into(), t)));
        let relay = Arc::new(crate::delivery::RelayContext {
            owner,
            fleet,
            space: space.clone(),
            metrics: metrics.clone(),
            tracer: tracer.clone(),
            shaper: shaper.clone(),
        });
        let current = Arc::new(Current::new(destinations.clone()));
        // Deliveries another relay made due start here without waiting for a poll.
        if let Some(wakeups) = store.wakeups() {
            let follow = Destinations::follow_wakeups(current.clone(), wakeups, stop.clone());
            tasks.push(sup.watch("wakeups", "fleet wake-ups".into(), tokio::spawn(follow)));
        }
        let rules = Arc::new(DispatchRules::new(config, destinations));
        let dispatcher = Dispatcher::new(
            store.clone(),
            rules.clone(),
            metrics.clone(),
            base.committed.clone(),
            space.clone(),
            tracer.clone(),
            shaper.clone(),
        );
        let dispatch = dispatcher
            .start(stop.clone(), config.storage.backend())
            .context("starting the dispatcher's thread (is the relay out of threads?)")?;
        tasks.insert(0, sup.watch("dispatcher", "dispatcher".into(), dispatch));
        tasks.extend(services(config, &store, base, &sup, &stop));
        let upstream = Arc::new(Current::new(reconciler));
        let (reloads, requests) = crate::admin::reload::Reloads::channel();
        let history = Arc::new(crate::admin::history::History::default());
        let sampling = crate::admin::history::sample(
            history.clone(),
            current.clone(),
            store.clone(),
            stop.clone(),
        );
        tasks.push(sup.watch("history", "destination history".into(), tokio::spawn(sampling)));
        let backups = Arc::new(crate::admin::Backups::default());
        let admin = AdminState {
            backups: backups.clone(),
            destinations: current.clone(),
            store: store.clone(),
            metrics: metrics.clone(),
            readiness: readiness.clone(),
            space: space.clone(),
            backend: config.storage.backend(),
            upstream: upstream.clone(),
            shaper: shaper.clone(),
            reloads,
            history,
        };
        let journal = Arc::new(Recorder::new(store.clone(), metrics.clone()));
        let access = web::Data::new(Access::new(&config.admin, journal.clone(), metrics.clone()));
        let gate = ingress::Gate::of(config);
        let ingress_state = web::Data::new(IngressState::new(
            gate,
            store.clone(),
            metrics.clone(),
            space.clone(),
            tracer,
        ));
        let pull = web::Data::new(crate::pull::PullState {
            destinations: current.clone(),
            store: store.clone(),
            shaper: shaper.clone(),
            metrics: metrics.clone(),
            tracer: relay.tracer.clone(),
            owner: relay.owner.clone(),
            wrong_tokens: access.wrong_tokens(),
        });
        let mut flow = Flow {
            config: Arc::new(config.clone()),
            source,
            store: store.clone(),
            metrics: metrics.clone(),
            destinations: current,
            rules,
            upstream,
            ingress: ingress_state.clone(),
            access: access.clone(),
            journal,
            relay,
            sup,
            space: space.clone(),
            workers: Default::default(),
            reconciler: None,
            retention: None,
            retiring: Vec::new(),
        };
        flow.start_workers();
        flow.start_retention();
        let (admin, ingress) =
            listeners::start(config, sockets, admin, access, ingress_state, pull)?;
        readiness.set(true);
        RelayReady { sources: config.sources.len() }.emit(metrics);
        ConfigInForce { fingerprint: crate::config::reload::fingerprint(config) }.emit(metrics);
        crate::notify::notify("READY=1\nSTATUS=accepting callbacks");
        // Hooks point at the ingress: register them only once it listens.
        flow.start_reconciler();
        Ok(Self {
            metrics: metrics.clone(),
            readiness: readiness.clone(),
            store,
            store_failed: base.store_failed.clone(),
            trigger,
            tasks,
            flow,
            reloads: requests,
            hangup: Some(hangup),
            operational,
            shaper,
            export,
            ingress,
            admin,
            backups,
        })
    }

    /// Waits for a reason to stop: the stop `requested` (a signal), a listener that
    /// ended, or the store failing; meanwhile does the reloads asked (SIGHUP, or the
    /// admin API), one at a time.
    pub(super) async fn wait(&mut self, requested: &mut Stop) -> Ended {
        loop {
            let mut failure = None;
            let hangup = async {
                match self.hangup.as_mut() {
                    Some(signal) => signal.recv().await,
                    None => std::future::pending().await,
                }
            };
            let woke = tokio::select! {
                _ = requested.wait() => Err(requested.reason().unwrap_or("stop requested").to_owned()),
                r = &mut self.ingress.task => Err(format!("ingress listener ended: {r:?}")),
                r = &mut self.admin.task => Err(format!("admin listener ended: {r:?}")),
                f = self.store_failed.wait_for(Option::is_some) => {
                    let why = f.ok().and_then(|f| f.clone()).unwrap_or_default();
                    failure = Some(why.clone());
                    Err(format!("the store failed: {why}"))
                }
                Some(request) = self.reloads.recv() => Ok(request),
                Some(()) = hangup => {
                    // Asked by the service manager: its answer is the log and the journal.
                    let (answer, _) = tokio::sync::oneshot::channel();
                    Ok(crate::admin::reload::Request { by: "SIGHUP".into(), from: None, answer })
                }
            };
            match woke {
                Ok(request) => self.reload(request).await,
                Err(reason) => return Ended { reason, failure },
            }
        }
    }

    /// Does one reload, telling the service manager while it runs.
    async fn reload(&mut self, request: crate::admin::reload::Request) {
        let now = crate::notify::monotonic_us();
        crate::notify::notify(&format!(
            "RELOADING=1\nMONOTONIC_USEC={now}\nSTATUS=reloading the configuration"
        ));
        self.flow.serve(request).await;
        crate::notify::notify("READY=1\nSTATUS=accepting callbacks");
    }
}

/// The source operational events are listed under (the first configured one), and
/// the names of those some destination of `config` takes (the others are not raised).
pub(super) fn raised(config: &Config) -> (&str, Vec<&'static str>) {
    let source = config.sources.first().map_or("hookrelay", |s| s.name.as_str());
    let wanted = crate::operational::NAMES
        .iter()
        .copied()
        .filter(|name| crate::dispatch::wanted(config, name))
        .collect();
    (source, wanted)
}

/// Connects the metrics' operational-event queue to a task appending to `store`.
fn start_operational(
    config: &Config,
    store: &SharedStore,
    metrics: &Arc<Metrics>,
) -> JoinHandle<()> {
    let (source, wanted) = raised(config);
    // Weak: the raiser lives in the metrics, and is closed at the stop.
    let counted = Arc::downgrade(metrics);
    let lost: crate::operational::Lost = Arc::new(move |name, why| {
        if let Some(m) = counted.upgrade() {
            let what = format!("operational event {name} lost");
            taxonomy::degraded(&m, Stage::Relay, ErrorType::Dropped, &what, why);
        }
    });
    crate::operational::start(&metrics.operational, store.clone(), source, wanted, lost)
}

/// The services beside the flow: free space, the database probe, the audit check
/// (retention is part of the flow: a reload changes what it keeps).
fn services(
    config: &Config,
    store: &SharedStore,
    base: &Base,
    sup: &Supervisor,
    stop: &Stop,
) -> Vec<JoinHandle<()>> {
    let (metrics, space) = (&base.metrics, &base.space);
    let mut tasks = Vec::new();
    if space.is_local() {
        let task = tokio::spawn(crate::space::watch(space.clone(), metrics.clone(), stop.clone()));
        tasks.push(sup.watch("space", "free-space watch".into(), task));
    }
    metrics.store.store_reachable.set(1);
    if !config.storage.backend().is_embedded() {
        let (store, readiness) = (store.clone(), base.readiness.clone());
        let task = tokio::spawn(crate::reachability::watch(
            store,
            readiness,
            metrics.clone(),
            stop.clone(),
        ));
        tasks.push(sup.watch("reachability", "database probe".into(), task));
    }
    let task = tokio::spawn(crate::audit::watch(store.clone(), metrics.clone(), stop.clone()));
    tasks.push(sup.watch("audit", "audit check".into(), task));
    tasks
}
