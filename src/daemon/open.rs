//! Opening the store for `hookrelay serve`: a database that is not there yet is waited
//! for (the admin listener answering meanwhile), and the store's reports (group
//! commits, a failure) are wired to the metrics, the dispatcher and readiness.

use std::sync::Arc;

use anyhow::Context;
use tokio::sync::Notify;

use crate::admin;
use crate::config::Config;
use crate::internal_events::taxonomy::{degraded, ErrorType, Stage};
use crate::internal_events::InternalEvent;
use crate::metrics::Metrics;
use crate::readiness::Readiness;
use crate::shutdown::Stop;
use crate::store::{SharedStore, StoreObserver, Trouble};

/// The store's trace salt (`telemetry/ids.rs`). The store was just opened; a database
/// that fails right after is waited for a little, as at open.
pub(super) async fn trace_salt(
    store: &SharedStore,
    metrics: &Metrics,
) -> anyhow::Result<crate::telemetry::ids::Salt> {
    let mut backoff = OPEN_BACKOFF;
    loop {
        match crate::telemetry::export::salt(store).await {
            Ok(salt) => return Ok(salt),
            Err(e) if e.is_transient() && backoff < OPEN_BACKOFF_MAX => {
                let what = format!("cannot read the trace salt yet; trying again in {backoff:?}");
                degraded(metrics, Stage::Store, ErrorType::Unreachable, &what, &e);
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// First wait between two tries to open a database that is not there, doubled after
/// each try up to [`OPEN_BACKOFF_MAX`].
const OPEN_BACKOFF: std::time::Duration = std::time::Duration::from_secs(1);
const OPEN_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(15);

/// Opens the store. A database that cannot be reached (down, starting, failing over,
/// refusing this user for now) is waited for, with backoff, the admin listener up
/// meanwhile (`admin/waiting.rs`: alive, not ready and why); what no waiting mends (a
/// schema newer than this build, a URL that does not parse) fails at once. A sled
/// store below the free-space floor is not opened until space is back: sled writes at
/// open (a snapshot), and a write that fails there can leave the store unopenable
/// (issue 40), so it is waited for as a database is. `None`: the stop was requested
/// first.
pub(super) async fn open_store(
    config: &Config,
    observer: Arc<Commits>,
    metrics: &Arc<Metrics>,
    location: &str,
    space: &crate::space::Space,
    admin_socket: Option<&std::net::TcpListener>,
    requested: &mut Stop,
) -> anyhow::Result<Option<SharedStore>> {
    let storage = &config.storage;
    let may_wait = !storage.backend().is_embedded();
    // Started at the first failure that waiting may mend.
    let mut waiting: Option<Waiting> = None;
    let mut backoff = OPEN_BACKOFF;
    let sled = storage.backend() == crate::config::StorageBackend::Sled;
    let opened = loop {
        if sled && space.is_local() {
            space.check().with_context(|| format!("measuring free space of {location}"))?;
        }
        let why = if sled && space.below_floor() {
            let why =
                format!("waiting for free space before opening the store: {}", space.describe());
            let what = format!(
                "waiting for free space before opening the store ({location}); SIGTERM exits 0 \
                 meanwhile"
            );
            degraded(metrics, Stage::Store, ErrorType::Full, &what, &space.describe());
            backoff = OPEN_BACKOFF;
            why
        } else {
            let error =
                match crate::store::open(storage, observer.clone(), crate::fleet::LIVE_FOR).await {
                    Ok(store) => break Some(store),
                    Err(e) if may_wait && e.is_transient() => e,
                    Err(e) => {
                        if let Some(w) = waiting {
                            w.stop().await;
                        }
                        return Err(e).with_context(|| format!("opening the store ({location})"));
                    }
                };
            let what = format!(
                "cannot open the store ({location}); waiting for the database (not ready \
                 meanwhile), next try in {backoff:?}"
            );
            degraded(metrics, Stage::Store, ErrorType::Unreachable, &what, &error);
            format!("waiting for the database: {error}")
        };
        match &waiting {
            Some(w) => *crate::lock::lock(&w.state.why) = why,
            None => waiting = Some(Waiting::start(config, admin_socket, metrics, why)?),
        }
        tokio::select! {
            _ = requested.wait() => {
                let why = requested.reason().unwrap_or("stop requested");
                tracing::info!(reason = why, "shutting down while waiting to open the store");
                break None;
            }
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(OPEN_BACKOFF_MAX);
    };
    if let Some(w) = waiting {
        // The real admin listener binds the same address next.
        w.stop().await;
        if opened.is_some() {
            tracing::info!("the store is open: starting the relay");
        }
    }
    Ok(opened)
}

/// The admin listener of a relay waiting for its database (`admin/waiting.rs`).
struct Waiting {
    state: Arc<admin::waiting::Waiting>,
    handle: actix_web::dev::ServerHandle,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Waiting {
    fn start(
        config: &Config,
        handed: Option<&std::net::TcpListener>,
        metrics: &Arc<Metrics>,
        why: String,
    ) -> anyhow::Result<Self> {
        metrics.store.store_reachable.set(0);
        let state = Arc::new(admin::waiting::Waiting {
            why: std::sync::Mutex::new(why),
            metrics: metrics.clone(),
        });
        // A handed-over socket is lent (a duplicate): the real listener serves on it next.
        let handed = handed.map(std::net::TcpListener::try_clone).transpose()?;
        let server = admin::waiting::server(config.admin.listen, handed, state.clone())
            .map_err(|e| crate::bind::error(e, "admin.listen", config.admin.listen))?;
        let handle = server.handle();
        let task = tokio::spawn(server);
        tracing::info!(listener = "admin", addr = %config.admin.listen,
            "admin listener up while waiting for the database (/healthz, /readyz, /metrics)");
        crate::notify::notify("STATUS=waiting for the database");
        Ok(Self { state, handle, task })
    }

    async fn stop(self) {
        self.handle.stop(true).await;
        let _ = self.task.await;
    }
}

/// Where the store reports: group commits are counted in the metrics, and each stored
/// group that left events in the inbox wakes the dispatcher, so dispatch follows
/// ingest without a polling delay; a
/// failed store turns the relay unready at once and stops it.
pub(super) struct Commits {
    pub(super) metrics: Arc<Metrics>,
    pub(super) wake: Arc<Notify>,
    pub(super) readiness: Arc<Readiness>,
    pub(super) failed: tokio::sync::watch::Sender<Option<String>>,
}

impl StoreObserver for Commits {
    fn failed(&self, reason: &str) {
        self.readiness.fail(format!("the store failed: {reason}"));
        self.metrics.failed(reason);
        self.failed.send_replace(Some(reason.to_owned()));
    }
    fn group(&self, size: usize, took: std::time::Duration, ok: bool) {
        self.metrics.group(size, took, ok);
    }
    fn waiting(&self) {
        self.wake.notify_one();
    }
    fn stored(&self, meta: &crate::store::EventMeta) {
        self.metrics.stored(meta);
    }
    fn checkpoint(&self, took: std::time::Duration, ok: bool) {
        self.metrics.checkpoint(took, ok);
    }
    fn trouble(&self, kind: Trouble, what: &str, error: &dyn std::fmt::Display) {
        self.metrics.trouble(kind, what, error);
    }
}

/// Says what opened: the backend, where, how durable, the inbox as counted so far
/// (the embedded store counts behind the open), the TLS to a database, and the notice
/// of an earlier release's sled store.
pub(super) async fn announce(config: &Config, store: &SharedStore, base: &super::base::Base) {
    let storage = &config.storage;
    let inbox = store.inbox().await.unwrap_or_default();
    tracing::info!(
        backend = storage.backend().name(),
        store = %base.location,
        durability = ?storage.durability,
        inbox = inbox.events,
        counting = inbox.counting,
        "store open"
    );
    if let Some((sslmode, verified)) = crate::store::postgres_tls(storage) {
        crate::internal_events::PostgresTls { sslmode, verified }.emit(&base.metrics);
    }
    if storage.sled_found {
        tracing::warn!(
            store = %base.location,
            "running on sled because storage.backend is unset and the data directory holds \
             a sled store (the default of earlier releases): its memory grows with what it \
             holds (storage.memory_limit_bytes, if set, is not kept) and its restart time \
             with it. redb, the default for new data directories, keeps to the limit and \
             restarts in milliseconds: stop the relay, run `hookrelay migrate --to redb`, \
             set storage.backend = \"redb\" (docs/deploy.md, \"Moving to redb\"); or set \
             storage.backend = \"sled\" to stay on it and silence this notice"
        );
    }
}
