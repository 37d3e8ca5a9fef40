//! The running relay as one owner of its parts: [`Relay::start`] builds and starts
//! each component in order, [`Relay::wait`] waits for a reason to stop, and
//! [`Relay::stop`] stops every one of them and waits for it, within
//! `shutdown.grace`, closing the store last. Nothing it starts outlives it: no task,
//! no listener, no shaping process, no queue.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::base::Base;
use super::listeners;
use super::open::trace_salt;
use crate::admin::AdminState;
use crate::config::Config;
use crate::delivery::Destinations;
use crate::dispatch::Dispatcher;
use crate::ingress::{self, IngressState};
use crate::internal_events::taxonomy::{self, ErrorType, Stage};
use crate::internal_events::{InternalEvent, RelayReady, ShuttingDown};
use crate::metrics::Metrics;
use crate::readiness::Readiness;
use crate::shape::Shaper;
use crate::shutdown::{Stop, StopTrigger};
use crate::store::SharedStore;
use crate::supervise::Supervisor;
use crate::telemetry::export::Export;

/// A listener and the task serving it.
struct Listener {
    handle: actix_web::dev::ServerHandle,
    task: JoinHandle<std::io::Result<()>>,
}

impl Listener {
    fn spawn(server: actix_web::dev::Server) -> Self {
        Self { handle: server.handle(), task: tokio::spawn(server) }
    }

    /// Stops it: in-flight requests finish (`graceful`) or are cut.
    async fn stop(&self, graceful: bool) {
        self.handle.stop(graceful).await;
    }
}

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
    /// Stops the background tasks (their [`Stop`]).
    trigger: StopTrigger,
    /// The background tasks, in the order they stop: the reconciler first (it talks to
    /// the upstream), then dispatch and the services, the delivery workers last (they
    /// finish their attempts).
    tasks: Vec<JoinHandle<()>>,
    /// Appends the operational events; ends once the queue is closed.
    operational: JoinHandle<()>,
    shaper: Arc<Shaper>,
    export: Option<Export>,
    ingress: Listener,
    admin: Listener,
}

impl Relay {
    /// Builds each component on `store` and starts it: operational events, shaping,
    /// destinations and their workers, dispatch, the services, the listeners, and the
    /// reconciler once the ingress listens (the hooks point at it).
    pub(super) async fn start(
        config: &Config,
        base: &Base,
        store: SharedStore,
    ) -> anyhow::Result<Self> {
        let (metrics, readiness, space) = (&base.metrics, &base.readiness, &base.space);
        let operational = start_operational(config, &store, metrics);
        let shaper = Arc::new(Shaper::new(metrics.clone()));
        let destinations = Arc::new(
            Destinations::new(config, store.clone()).await.context("setting up destinations")?,
        );
        // This relay's name on its delivery claims.
        let owner = format!("relay-{}-{:08x}", std::process::id(), fastrand::u32(..));
        let salt =
            trace_salt(&store, &base.metrics).await.context("reading the store's trace salt")?;
        let (tracer, export) =
            crate::telemetry::export::start(&config.telemetry, salt, &owner, metrics.clone())
                .context("setting up the trace export ([telemetry])")?;
        let client = crate::destinations::client().context("building the HTTP client")?;
        let (trigger, stop) = StopTrigger::new();
        let sup = Supervisor {
            readiness: readiness.clone(),
            metrics: metrics.clone(),
            stop: stop.clone(),
        };
        let mut deliveries = Vec::new();
        metrics.relay.fleet_relays.set(1);
        let (fleet, fleet_task) =
            crate::fleet::follow(store.clone(), owner.clone(), metrics.clone(), stop.clone()).await;
        deliveries.extend(fleet_task.map(|t| sup.watch("fleet", "fleet heartbeat".into(), t)));
        let relay = crate::delivery::RelayContext {
            owner,
            fleet,
            space: space.clone(),
            metrics: metrics.clone(),
            client,
            tracer: tracer.clone(),
            shaper: shaper.clone(),
        };
        for (name, task) in destinations.start(&relay, stop.clone()) {
            deliveries.push(sup.watch("delivery", name, task));
        }
        // Deliveries another relay made due start here without waiting for a poll.
        if let Some(wakeups) = store.wakeups() {
            let task = tokio::spawn(destinations.clone().follow_wakeups(wakeups, stop.clone()));
            deliveries.push(sup.watch("wakeups", "fleet wake-ups".into(), task));
        }
        let dispatcher = Dispatcher::new(
            config,
            store.clone(),
            metrics.clone(),
            destinations.clone(),
            base.committed.clone(),
            space.clone(),
            tracer.clone(),
            shaper.clone(),
        );
        let mut tasks = vec![sup.watch(
            "dispatcher",
            "dispatcher".into(),
            tokio::spawn(dispatcher.run(stop.clone())),
        )];
        tasks.extend(services(config, &store, base, &sup, &stop));
        let reconciler = Arc::new(
            crate::upstream::reconciler(config, store.clone(), metrics.clone())
                .context("setting up the upstream accounts")?,
        );
        let admin = AdminState {
            destinations,
            store: store.clone(),
            metrics: metrics.clone(),
            readiness: readiness.clone(),
            space: space.clone(),
            backend: config.storage.backend(),
            upstream: reconciler.clone(),
            shaper: shaper.clone(),
        };
        let (admin, ingress) = start_listeners(config, base, &store, admin, tracer)?;
        readiness.set(true);
        RelayReady { sources: config.sources.len() }.emit(metrics);
        crate::notify::notify("READY=1\nSTATUS=accepting callbacks");
        // Hooks point at the ingress: register them only once it listens. It stops
        // first, the delivery workers last.
        let every = config.upstream.reconcile_interval;
        let mut order = vec![sup.watch(
            "reconciler",
            "reconciler".into(),
            tokio::spawn(reconciler.run(every, stop)),
        )];
        order.extend(tasks);
        order.extend(deliveries);
        Ok(Self {
            metrics: metrics.clone(),
            readiness: readiness.clone(),
            store,
            store_failed: base.store_failed.clone(),
            trigger,
            tasks: order,
            operational,
            shaper,
            export,
            ingress,
            admin,
        })
    }

    /// Waits for a reason to stop: the stop `requested` (a signal), a listener that
    /// ended, or the store failing.
    pub(super) async fn wait(&mut self, requested: &mut Stop) -> Ended {
        let mut failure = None;
        let reason = tokio::select! {
            _ = requested.wait() => requested.reason().unwrap_or("stop requested").to_owned(),
            r = &mut self.ingress.task => format!("ingress listener ended: {r:?}"),
            r = &mut self.admin.task => format!("admin listener ended: {r:?}"),
            f = self.store_failed.wait_for(Option::is_some) => {
                let why = f.ok().and_then(|f| f.clone()).unwrap_or_default();
                failure = Some(why.clone());
                format!("the store failed: {why}")
            }
        };
        Ended { reason, failure }
    }

    /// Stops every part in order and waits for each, within `grace`: the ingress
    /// finishes its callbacks, the background tasks end, the operational events and the
    /// last traces go out, the admin listener stops, the shaping processes end, and the
    /// store commits what is queued and makes it durable ([`CLOSE_SHARE`] of the grace
    /// is kept for that).
    pub(super) async fn stop(
        self,
        ended: Ended,
        grace: Duration,
        durable: bool,
    ) -> anyhow::Result<()> {
        let Self { metrics, readiness, store, trigger, tasks, operational, shaper, .. } = self;
        let (export, ingress, admin) = (self.export, self.ingress, self.admin);
        ShuttingDown { reason: &ended.reason, grace }.emit(&metrics);
        crate::notify::notify("STOPPING=1\nSTATUS=draining");
        readiness.set(false);
        let started = tokio::time::Instant::now();
        let for_close = grace.mul_f64(CLOSE_SHARE);
        let drain = async {
            ingress.stop(true).await;
            trigger.stop();
            for task in tasks {
                let _ = task.await;
            }
            // Nothing raises operational events any more: the queue drains and ends.
            metrics.operational.close();
            let _ = operational.await;
            // Nothing records spans any more: the last ones go out.
            if let Some(export) = export {
                export.finish(EXPORT_FINISH, &metrics).await;
            }
            admin.stop(true).await;
            shaper.close().await;
        };
        if tokio::time::timeout(grace - for_close, drain).await.is_err() {
            let what = "shutdown grace period exceeded; cutting remaining connections";
            crate::internal_events::taxonomy::degraded(
                &metrics,
                crate::internal_events::taxonomy::Stage::Relay,
                crate::internal_events::taxonomy::ErrorType::Stalled,
                what,
                &format_args!("the drain took longer than {:?}", grace - for_close),
            );
            ingress.stop(false).await;
            admin.stop(false).await;
            shaper.close().await;
        }
        if let Some(why) = ended.failure {
            // Fail-stop: the service manager restarts the relay on a freshly opened
            // store, which holds every acknowledged callback (each was durable before
            // its 200).
            anyhow::bail!(
                "the store failed ({why}); exiting so that systemd or Kubernetes restarts the \
                 relay. Every acknowledged callback is on disk; free space on \
                 storage.data_dir if it is full"
            );
        }
        // Commits what is queued, then makes everything durable, in what is left of the
        // grace: a disk that fills now can stall the flush.
        let left = grace.saturating_sub(started.elapsed()).max(for_close);
        let closed = tokio::time::timeout(left, store.close()).await;
        let context = if durable {
            "final flush (every acknowledged callback was already durable before its answer: \
             what the flush missed is dispatch progress, redone after the restart)"
        } else {
            "final flush (storage.durability = \"buffered\": callbacks acknowledged since the \
             last background flush may be lost)"
        };
        match closed {
            Ok(result) => result.context(context)?,
            Err(_) => anyhow::bail!("{context}: not done within shutdown.grace ({grace:?})"),
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// The share of `shutdown.grace` kept for closing the store (its final flush).
const CLOSE_SHARE: f64 = 0.25;

/// Longest the last traces may take to be exported at shutdown (within the grace).
const EXPORT_FINISH: Duration = Duration::from_secs(5);

/// Connects the metrics' operational-event queue to a task appending to `store`.
fn start_operational(
    config: &Config,
    store: &SharedStore,
    metrics: &Arc<Metrics>,
) -> JoinHandle<()> {
    let source = config.sources.first().map_or("hookrelay", |s| s.name.as_str());
    let wanted = crate::operational::NAMES
        .iter()
        .copied()
        .filter(|name| crate::dispatch::wanted(config, name))
        .collect();
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

/// The services beside the flow: free space, the database probe, retention, the
/// audit check.
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
    let keep = config.destinations.iter().map(|d| d.name.clone()).collect();
    let task = tokio::spawn(crate::retention::run(
        store.clone(),
        config.retention.clone(),
        keep,
        metrics.clone(),
        space.clone(),
        stop.clone(),
    ));
    tasks.push(sup.watch("retention", "retention".into(), task));
    let task = tokio::spawn(crate::audit::watch(store.clone(), metrics.clone(), stop.clone()));
    tasks.push(sup.watch("audit", "audit check".into(), task));
    tasks
}

/// Binds the private listener (admin API and console) and the ingress, and starts
/// both: (admin, ingress).
fn start_listeners(
    config: &Config,
    base: &Base,
    store: &SharedStore,
    admin: AdminState,
    tracer: Arc<crate::telemetry::export::Tracer>,
) -> anyhow::Result<(Listener, Listener)> {
    let grace = config.shutdown.grace;
    let journal =
        Arc::new(crate::access::journal::Recorder::new(Some(store.clone()), base.metrics.clone()));
    let access = crate::access::Access::new(&config.admin, journal, base.metrics.clone());
    // Every admin token, kept out of what is stored should a caller send one.
    let tokens: Vec<Vec<u8>> =
        config.admin.resolved_tokens().map(|t| t.expose().as_bytes().to_vec()).collect();
    let any_token = !tokens.is_empty();
    let (admin_server, admin_addrs) = listeners::private(config.admin.listen, grace, admin, access)
        .map_err(|e| crate::bind::error(e, "admin.listen", config.admin.listen))?;
    let ingress_state = IngressState::new(
        &config.sources,
        store.clone(),
        base.metrics.clone(),
        config.ingress.max_body_bytes,
        config.ingress.body_timeout,
        base.space.clone(),
        tracer,
    )
    .masking(tokens);
    let (ingress_server, ingress_addrs) =
        ingress::server(config.ingress.listen, config.ingress.workers, grace, ingress_state)
            .map_err(|e| crate::bind::error(e, "ingress.listen", config.ingress.listen))?;
    for addr in &ingress_addrs {
        tracing::info!(listener = "ingress", %addr, "listening");
    }
    for addr in &admin_addrs {
        tracing::info!(listener = "admin", %addr, "listening");
    }
    if !any_token {
        tracing::warn!(
            "no admin token is set (admin.token or admin.tokens): the admin API refuses every \
             request"
        );
    }
    Ok((Listener::spawn(admin_server), Listener::spawn(ingress_server)))
}
