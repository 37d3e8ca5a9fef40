//! `hookrelay serve`: opens the store, starts the listeners, and stops them in order.

use std::sync::Arc;

use anyhow::Context;

use tokio::sync::Notify;

use crate::admin::{self, AdminState, Readiness};
use crate::config::Config;
use crate::delivery::Destinations;
use crate::dispatch::Dispatcher;
use crate::ingress::{self, IngressState};
use crate::metrics::Metrics;
use crate::shutdown::StopTrigger;
use crate::store::{Committer, SharedStore, SledStore};

/// Runs the relay until SIGTERM or SIGINT, then drains: readiness goes false, the
/// ingress finishes in-flight callbacks, the committer flushes, and the admin
/// listener stops last. Returns once everything is on disk.
pub(crate) async fn serve(config: Config) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new().context("setting up metrics")?);
    let source_names: Vec<&str> = config.sources.iter().map(|s| s.name.as_str()).collect();
    let destination_names: Vec<&str> =
        config.destinations.iter().map(|d| d.name.as_str()).collect();
    metrics.init_series(&source_names, &destination_names, ingress::UNKNOWN_SOURCE);
    let readiness = Arc::new(Readiness::default());
    let storage = &config.storage;

    std::fs::create_dir_all(&storage.data_dir)
        .with_context(|| format!("creating storage.data_dir {}", storage.data_dir.display()))?;
    let path = storage.data_dir.clone();
    let (cache, flush_interval) = (storage.cache_capacity_bytes, storage.flush_interval);
    let store: SharedStore = tokio::task::spawn_blocking(move || {
        SledStore::open(&crate::store::SledOptions {
            path: &path,
            cache_capacity_bytes: cache,
            flush_interval,
        })
    })
    .await
    .context("opening the store")?
    .with_context(|| format!("opening the store in {}", storage.data_dir.display()))
    .map(|s| Arc::new(s) as SharedStore)?;

    let committed = Arc::new(Notify::new());
    let opts = crate::store::CommitterOptions {
        durability: storage.durability,
        max_batch: storage.commit_max_batch,
        committed: Some(committed.clone()),
    };
    let (committer, committer_thread) =
        Committer::start(store.clone(), opts, metrics.clone()).context("starting the committer")?;
    tracing::info!(
        data_dir = %storage.data_dir.display(),
        durability = ?storage.durability,
        inbox = store.inbox_len(),
        "store open"
    );

    let destinations =
        Arc::new(Destinations::new(&config, store.clone()).context("setting up destinations")?);
    let client = crate::destinations::client().context("building the HTTP client")?;
    let (stop_trigger, stop) = StopTrigger::new();
    let delivery_tasks =
        destinations.start(committer.clone(), metrics.clone(), client, stop.clone());
    let dispatcher = Dispatcher::new(
        &config,
        store.clone(),
        committer.clone(),
        metrics.clone(),
        destinations.clone(),
        committed,
    );
    let dispatch_task = tokio::spawn(dispatcher.run(stop.clone()));
    let retention_task = tokio::spawn(crate::retention::run(
        store.clone(),
        config.retention.clone(),
        metrics.clone(),
        stop.clone(),
    ));

    let reconciler = Arc::new(
        crate::upstream::reconciler(&config, store.clone(), committer.clone(), metrics.clone())
            .context("setting up the upstream accounts")?,
    );

    let grace = config.shutdown.grace;
    let admin_state = AdminState {
        destinations: destinations.clone(),
        store: store.clone(),
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        token: config.admin.resolved_token.clone(),
        upstream: reconciler.clone(),
    };
    let (admin_server, admin_addrs) = admin::server(config.admin.listen, grace, admin_state)
        .with_context(|| format!("binding admin.listen {}", config.admin.listen))?;
    let ingress_state = IngressState::new(
        &config.sources,
        committer.clone(),
        metrics.clone(),
        config.ingress.max_body_bytes,
    );
    let (ingress_server, ingress_addrs) =
        ingress::server(config.ingress.listen, config.ingress.workers, grace, ingress_state)
            .with_context(|| format!("binding ingress.listen {}", config.ingress.listen))?;
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
    metrics.ready.set(1);
    tracing::info!(sources = config.sources.len(), "ready");
    crate::notify::notify("READY=1\nSTATUS=accepting callbacks");
    // Hooks point at the ingress: register them only once it listens.
    let reconcile_task =
        tokio::spawn(reconciler.run(config.upstream.reconcile_interval, stop.clone()));

    let reason = tokio::select! {
        sig = crate::shutdown::signal() => sig.context("installing signal handlers")?.to_owned(),
        r = &mut ingress_task => format!("ingress listener ended: {r:?}"),
        r = &mut admin_task => format!("admin listener ended: {r:?}"),
    };
    tracing::info!(%reason, grace = ?grace, "shutting down");
    crate::notify::notify("STOPPING=1\nSTATUS=draining");
    readiness.set(false);
    metrics.ready.set(0);

    let drain = async {
        ingress_handle.stop(true).await;
        stop_trigger.stop();
        let _ = dispatch_task.await;
        let _ = retention_task.await;
        let _ = reconcile_task.await;
        for task in delivery_tasks {
            let _ = task.await;
        }
        committer.close().await;
        admin_handle.stop(true).await;
    };
    if tokio::time::timeout(grace, drain).await.is_err() {
        tracing::warn!("shutdown grace period exceeded; cutting remaining connections");
        ingress_handle.stop(false).await;
        admin_handle.stop(false).await;
        committer.close().await;
    }
    if tokio::task::spawn_blocking(move || committer_thread.join()).await.is_err() {
        tracing::error!("the committer thread panicked");
    }
    let flush_store = store.clone();
    tokio::task::spawn_blocking(move || flush_store.flush())
        .await
        .context("final flush")?
        .context("final flush")?;
    tracing::info!("stopped");
    Ok(())
}
