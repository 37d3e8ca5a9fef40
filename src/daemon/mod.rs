//! `hookrelay serve`: opens the store, starts the listeners, and stops them in order.

mod listeners;
pub(crate) mod load;
mod open;

use open::{open_store, trace_salt, Commits};

use std::sync::Arc;

use crate::internal_events::{InternalEvent, RelayReady, ShuttingDown};

use anyhow::Context;

use tokio::sync::Notify;

use crate::admin::AdminState;
use crate::config::Config;
use crate::delivery::Destinations;
use crate::dispatch::Dispatcher;
use crate::ingress::{self, IngressState};
use crate::metrics::Metrics;
use crate::readiness::Readiness;
use crate::shutdown::StopTrigger;
use crate::supervise::Supervisor;

/// Runs the relay until SIGTERM or SIGINT, then drains: readiness goes false, the
/// ingress finishes in-flight callbacks, the store commits and flushes, and the admin
/// listener stops last. Returns once everything is on disk.
pub(crate) async fn serve(config: Config) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new().context("setting up metrics")?);
    let source_names: Vec<&str> = config.sources.iter().map(|s| s.name.as_str()).collect();
    let destination_names: Vec<&str> =
        config.destinations.iter().map(|d| d.name.as_str()).collect();
    metrics.init_series(&source_names, &destination_names, ingress::UNKNOWN_SOURCE);
    let readiness = Arc::new(Readiness::default());
    let storage = &config.storage;

    let embedded = storage.backend().is_embedded();
    // Where the store lives, for messages (never the database URL).
    let location = if embedded {
        format!("storage.data_dir {}", storage.data_dir.display())
    } else {
        format!("PostgreSQL schema {:?}", storage.postgres.schema)
    };
    let space = if embedded {
        std::fs::create_dir_all(&storage.data_dir)
            .with_context(|| format!("creating {location}"))?;
        // Measured before the store opens, and before the relay says it is ready.
        let space = crate::space::Space::new(
            &storage.data_dir,
            storage.min_free_bytes,
            storage.min_free_percent,
        );
        space.check().with_context(|| format!("measuring free space of {location}"))?;
        Arc::new(space)
    } else {
        Arc::new(crate::space::Space::remote())
    };
    let committed = Arc::new(Notify::new());
    let (failed_tx, mut store_failed) = tokio::sync::watch::channel(None);
    let commits = Arc::new(Commits {
        metrics: metrics.clone(),
        wake: committed.clone(),
        readiness: readiness.clone(),
        failed: failed_tx,
    });
    let Some(store) = open_store(&config, commits, &metrics, &location, &space).await? else {
        tracing::info!("stopped while waiting to open the store");
        return Ok(());
    };
    // The embedded store counts what it holds behind the open: then `inbox` is what it
    // has counted so far, and `counting` says so.
    let inbox = store.inbox().await.unwrap_or_default();
    tracing::info!(
        backend = storage.backend().name(),
        store = %location,
        durability = ?storage.durability,
        inbox = inbox.events,
        counting = inbox.counting,
        "store open"
    );
    if let Some((sslmode, verified)) = crate::store::postgres_tls(storage) {
        crate::internal_events::PostgresTls { sslmode, verified }.emit(&metrics);
    }
    if storage.sled_found {
        tracing::warn!(
            store = %location,
            "running on sled because storage.backend is unset and the data directory holds \
             a sled store (the default of earlier releases): its memory grows with what it \
             holds (storage.memory_limit_bytes, if set, is not kept) and its restart time \
             with it. redb, the default for new data directories, keeps to the limit and \
             restarts in milliseconds: stop the relay, run `hookrelay migrate --to redb`, \
             set storage.backend = \"redb\" (docs/deploy.md, \"Moving to redb\"); or set \
             storage.backend = \"sled\" to stay on it and silence this notice"
        );
    }

    // The relay's own operational events (`hookrelay.*`), stored like callbacks.
    let source = config.sources.first().map_or("hookrelay", |s| s.name.as_str());
    let wanted = crate::operational::NAMES
        .iter()
        .copied()
        .filter(|name| crate::dispatch::wanted(&config, name))
        .collect();
    let _operational = crate::operational::start(store.clone(), source, wanted);
    // Every jq program runs in the shaping processes it owns, ended at the stop.
    let shaper = Arc::new(crate::shape::Shaper::new(metrics.clone()));
    let destinations = Arc::new(
        Destinations::new(&config, store.clone()).await.context("setting up destinations")?,
    );
    // This relay's name on its delivery claims.
    let owner = format!("relay-{}-{:08x}", std::process::id(), fastrand::u32(..));
    let salt = trace_salt(&store).await.context("reading the store's trace salt")?;
    let (tracer, export) =
        crate::telemetry::export::start(&config.telemetry, salt, &owner, metrics.clone())
            .context("setting up the trace export ([telemetry])")?;
    let client = crate::destinations::client().context("building the HTTP client")?;
    let (stop_trigger, stop) = StopTrigger::new();
    let supervisor =
        Supervisor { readiness: readiness.clone(), metrics: metrics.clone(), stop: stop.clone() };
    // On a shared store, each destination's limits are divided among the relays.
    metrics.relay.fleet_relays.set(1);
    let (fleet, fleet_task) =
        crate::fleet::follow(store.clone(), owner.clone(), metrics.clone(), stop.clone()).await;
    let fleet_task =
        fleet_task.map(|task| supervisor.watch("fleet", "fleet heartbeat".into(), task));
    let delivery_tasks: Vec<_> = destinations
        .start(
            &crate::delivery::RelayContext {
                owner: owner.clone(),
                fleet,
                space: space.clone(),
                metrics: metrics.clone(),
                client,
                tracer: tracer.clone(),
                shaper: shaper.clone(),
            },
            stop.clone(),
        )
        .into_iter()
        .map(|(name, handle)| supervisor.watch("delivery", name, handle))
        .collect();
    // Deliveries another relay made due start here without waiting for a poll.
    let wakeup_task = store.wakeups().map(|wakeups| {
        supervisor.watch(
            "wakeups",
            "fleet wake-ups".into(),
            tokio::spawn(destinations.clone().follow_wakeups(wakeups, stop.clone())),
        )
    });
    let dispatcher = Dispatcher::new(
        &config,
        store.clone(),
        metrics.clone(),
        destinations.clone(),
        committed,
        space.clone(),
        tracer.clone(),
        shaper.clone(),
    );
    let dispatch_task = supervisor.watch(
        "dispatcher",
        "dispatcher".into(),
        tokio::spawn(dispatcher.run(stop.clone())),
    );
    let space_task = space.is_local().then(|| {
        supervisor.watch(
            "space",
            "free-space watch".into(),
            tokio::spawn(crate::space::watch(space.clone(), metrics.clone(), stop.clone())),
        )
    });
    metrics.store.store_reachable.set(1);
    let reachability_task = (!embedded).then(|| {
        supervisor.watch(
            "reachability",
            "database probe".into(),
            tokio::spawn(crate::reachability::watch(
                store.clone(),
                readiness.clone(),
                metrics.clone(),
                stop.clone(),
            )),
        )
    });
    let retention_task = supervisor.watch(
        "retention",
        "retention".into(),
        tokio::spawn(crate::retention::run(
            store.clone(),
            config.retention.clone(),
            config.destinations.iter().map(|d| d.name.clone()).collect(),
            metrics.clone(),
            space.clone(),
            stop.clone(),
        )),
    );

    let audit_task = supervisor.watch(
        "audit",
        "audit check".into(),
        tokio::spawn(crate::audit::watch(store.clone(), metrics.clone(), stop.clone())),
    );

    let reconciler = Arc::new(
        crate::upstream::reconciler(&config, store.clone(), metrics.clone())
            .context("setting up the upstream accounts")?,
    );

    let grace = config.shutdown.grace;
    let admin_state = AdminState {
        destinations: destinations.clone(),
        store: store.clone(),
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        space: space.clone(),
        backend: storage.backend(),
        upstream: reconciler.clone(),
        shaper: shaper.clone(),
    };
    let access = crate::access::Access::new(
        config.admin.resolved_token.clone(),
        config.admin.wrong_tokens_per_minute,
        metrics.clone(),
    );
    let (admin_server, admin_addrs) =
        listeners::private(config.admin.listen, grace, admin_state, access)
            .map_err(|e| crate::bind::error(e, "admin.listen", config.admin.listen))?;
    let ingress_state = IngressState::new(
        &config.sources,
        store.clone(),
        metrics.clone(),
        config.ingress.max_body_bytes,
        config.ingress.body_timeout,
        space.clone(),
        tracer,
    )
    .masking(config.admin.resolved_token.iter().map(|t| t.expose().as_bytes().to_vec()));
    let (ingress_server, ingress_addrs) =
        ingress::server(config.ingress.listen, config.ingress.workers, grace, ingress_state)
            .map_err(|e| crate::bind::error(e, "ingress.listen", config.ingress.listen))?;
    for addr in &ingress_addrs {
        tracing::info!(listener = "ingress", %addr, "listening");
    }
    for addr in &admin_addrs {
        tracing::info!(listener = "admin", %addr, "listening");
    }
    if config.admin.resolved_token.is_none() {
        tracing::warn!("admin.token is not set: the admin API refuses every request");
    }

    let (ingress_handle, admin_handle) = (ingress_server.handle(), admin_server.handle());
    let mut ingress_task = tokio::spawn(ingress_server);
    let mut admin_task = tokio::spawn(admin_server);
    readiness.set(true);
    RelayReady { sources: config.sources.len() }.emit(&metrics);
    crate::notify::notify("READY=1\nSTATUS=accepting callbacks");
    // Hooks point at the ingress: register them only once it listens.
    let reconcile_task = supervisor.watch(
        "reconciler",
        "reconciler".into(),
        tokio::spawn(reconciler.run(config.upstream.reconcile_interval, stop.clone())),
    );

    let mut failure = None;
    let reason = tokio::select! {
        sig = crate::shutdown::signal() => sig.context("installing signal handlers")?.to_owned(),
        r = &mut ingress_task => format!("ingress listener ended: {r:?}"),
        r = &mut admin_task => format!("admin listener ended: {r:?}"),
        f = store_failed.wait_for(Option::is_some) => {
            let why = f.ok().and_then(|f| f.clone()).unwrap_or_default();
            failure = Some(why.clone());
            format!("the store failed: {why}")
        }
    };
    ShuttingDown { reason: &reason, grace }.emit(&metrics);
    crate::notify::notify("STOPPING=1\nSTATUS=draining");
    readiness.set(false);

    let drain = async {
        ingress_handle.stop(true).await;
        stop_trigger.stop();
        let _ = dispatch_task.await;
        let _ = retention_task.await;
        let _ = audit_task.await;
        for task in [space_task, reachability_task, wakeup_task, fleet_task].into_iter().flatten() {
            let _ = task.await;
        }
        let _ = reconcile_task.await;
        for task in delivery_tasks {
            let _ = task.await;
        }
        // Nothing records spans any more: the last ones go out.
        if let Some(export) = export {
            export.finish(EXPORT_FINISH).await;
        }
        admin_handle.stop(true).await;
        shaper.close().await;
    };
    if tokio::time::timeout(grace, drain).await.is_err() {
        tracing::warn!("shutdown grace period exceeded; cutting remaining connections");
        ingress_handle.stop(false).await;
        admin_handle.stop(false).await;
    }
    if let Some(why) = failure {
        // Fail-stop: the service manager restarts the relay on a freshly opened store,
        // which holds every acknowledged callback (each was durable before its 200).
        anyhow::bail!(
            "the store failed ({why}); exiting so that systemd or Kubernetes restarts the \
             relay. Every acknowledged callback is on disk; free space on storage.data_dir \
             if it is full"
        );
    }
    // Commits what is queued, then makes everything durable: bounded, since a disk that
    // fills now can stall the flush (the store's watchdog then fails it).
    let durable = storage.durability == crate::config::Durability::Durable;
    store.close().await.with_context(|| {
        if durable {
            "final flush (every acknowledged callback was already durable before its answer: \
             what the flush missed is dispatch progress, redone after the restart)"
        } else {
            "final flush (storage.durability = \"buffered\": callbacks acknowledged since \
             the last background flush may be lost)"
        }
    })?;
    tracing::info!("stopped");
    Ok(())
}

/// Longest the last traces may take to be exported at shutdown (within the grace).
const EXPORT_FINISH: std::time::Duration = std::time::Duration::from_secs(5);
