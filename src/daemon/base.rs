//! What the relay has before its store is open, and keeps to the end: its registry
//! (with the operational events' queue), its readiness, the free-space watch of its
//! data directory, and where the store reports.

use std::sync::Arc;

use anyhow::Context;
use tokio::sync::{watch, Notify};

use super::open::Commits;
use crate::config::Config;
use crate::ingress;
use crate::metrics::Metrics;
use crate::readiness::Readiness;
use crate::space::Space;

/// What the relay has before its store is open: its registry, its readiness, the
/// free-space watch of its data directory, and the store's reports.
pub(super) struct Base {
    pub(super) metrics: Arc<Metrics>,
    pub(super) readiness: Arc<Readiness>,
    pub(super) space: Arc<Space>,
    /// Woken by each group commit: dispatch follows ingest without polling.
    pub(super) committed: Arc<Notify>,
    /// Set once the store failed (fail-stop).
    pub(super) store_failed: watch::Receiver<Option<String>>,
    pub(super) commits: Arc<Commits>,
    /// Where the store lives, for messages (never the database URL).
    pub(super) location: String,
}

impl Base {
    /// The registry with the config's series at 0, and the free space measured before
    /// the store opens (and before the relay says it is ready).
    pub(super) fn new(config: &Config) -> anyhow::Result<Self> {
        let metrics = Arc::new(Metrics::new().context("setting up metrics")?);
        let sources: Vec<&str> = config.sources.iter().map(|s| s.name.as_str()).collect();
        let destinations: Vec<&str> = config.destinations.iter().map(|d| d.name.as_str()).collect();
        metrics.init_series(&sources, &destinations, ingress::UNKNOWN_SOURCE);
        crate::internal_events::taxonomy::init(&metrics);
        let readiness = Arc::new(Readiness::default());
        let storage = &config.storage;
        let location = if storage.backend().is_embedded() {
            format!("storage.data_dir {}", storage.data_dir.display())
        } else {
            format!("PostgreSQL schema {:?}", storage.postgres.schema)
        };
        let space = if storage.backend().is_embedded() {
            std::fs::create_dir_all(&storage.data_dir)
                .with_context(|| format!("creating {location}"))?;
            let (bytes, percent) = (storage.min_free_bytes, storage.min_free_percent);
            let space = Space::new(&storage.data_dir, bytes, percent, metrics.clone());
            space.check().with_context(|| format!("measuring free space of {location}"))?;
            space
        } else {
            Space::remote(metrics.clone())
        };
        let committed = Arc::new(Notify::new());
        let (failed, store_failed) = watch::channel(None);
        let commits = Arc::new(Commits {
            metrics: metrics.clone(),
            wake: committed.clone(),
            readiness: readiness.clone(),
            failed,
        });
        Ok(Self {
            metrics,
            readiness,
            space: Arc::new(space),
            committed,
            store_failed,
            commits,
            location,
        })
    }
}
