//! Durable storage of events and their deliveries: one contract, several backends.
//!
//! The contract ([`contract`]) is one trait per part of the product ([`EventLog`],
//! [`Dispatch`], [`DeliveryQueue`], [`Coordination`], [`SharedState`], [`Upkeep`],
//! [`Audit`]); [`Store`] is their sum. The rules that move events and deliveries on
//! live in [`lifecycle`], pure; a backend reads what a rule asks for, and applies the
//! [`lifecycle::Changes`] it returns in one atomic write. Backends: `embedded/` (one
//! process, on redb for a new data directory or sled where one was left), `postgres/`
//! (several relays on one database), `memory` (tests); [`open`] is the one factory,
//! [`settle`] completes `[storage]` with what only the store can tell. Each backend groups concurrent appends into one write
//! ([`Committer`] for a backend with blocking writes). `conformance/` checks every
//! trait on every backend.

pub(crate) mod backup;
mod cadence;
mod claims;
mod commit;
#[cfg(test)]
pub(crate) mod conformance;
mod contract;
mod counts;
mod deliveries;
mod embedded;
mod error;
#[cfg(test)]
pub(crate) mod fixtures;
mod health;
pub(crate) mod lifecycle;
#[cfg(test)]
pub(crate) mod memory;
mod model;
mod observer;
pub(crate) mod own_thread;
pub(crate) mod postgres;
mod settle;
mod tasks;
mod ticker;

use std::path::Path;
use std::sync::Arc;

pub(crate) use self::embedded::{run_calls_here, EmbeddedOptions, EmbeddedStore};
pub(crate) use claims::ClaimTable;
pub(crate) use commit::{Committer, Written};
pub(crate) use contract::{
    owner_silence, Audit, CommitDispatch, Coordination, DeliveryQueue, Dispatch, DispatchWrite,
    EventFilter, EventLog, Exclusive, Fleet, Journal, JournalEntry, JournalFilter, LedgerReading,
    Planner, QueueChange, SharedState, Store, Upkeep, Wake, CLAIM_MARGIN, DISPATCH_LEAD,
};
pub(crate) use counts::QueueCounts;
pub(crate) use deliveries::{
    hex, resource_from_hex, resource_hex, Attempt, AttemptWrite, Claim, DeadLetterFilter, DedupKey,
    DeliveryRecord, DeliveryState, DispatchPlan, DispatchVerdict, FilteredOut, InboxStats,
    PendingEvent, QueueStats, Recorded,
};
pub(crate) use error::StoreError;
pub(crate) use health::{Health, Writers};
pub(crate) use model::{
    EventFlag, EventId, EventMeta, EventNameOrigin, EventRecord, EventStatus, NewEvent,
};
#[cfg(test)]
pub(crate) use observer::NoObserver;
pub(crate) use observer::{StoreObserver, Trouble};
pub(crate) use settle::settle;
pub(crate) use tasks::Tasks;
pub(crate) use ticker::Ticker;

use crate::config::{Durability, StorageBackend, StorageConfig};

/// How the rest of the relay holds the store.
pub(crate) type SharedStore = Arc<dyn Store>;

/// The TLS `[storage.postgres]` sets beside the URL's.
fn tls_settings(config: &StorageConfig) -> postgres::TlsSettings {
    postgres::TlsSettings {
        mode: config.postgres.sslmode,
        ca_file: config.postgres.ca_file.clone(),
    }
}

/// The TLS the relay uses to its database (`None` on an embedded store, or a URL that
/// does not parse): its sslmode's name, and whether the server's certificate is
/// verified against a chosen CA.
pub(crate) fn postgres_tls(config: &StorageConfig) -> Option<(&'static str, bool)> {
    let url = config.postgres.resolved_url.as_ref()?;
    if config.backend() != StorageBackend::Postgres {
        return None;
    }
    let chosen = postgres::TlsChoice::of(url.expose(), &tls_settings(config)).ok()?;
    Some((chosen.mode.name(), chosen.verified()))
}

fn postgres_url(config: &StorageConfig) -> Result<&crate::config::Secret, StoreError> {
    config.postgres.resolved_url.as_ref().ok_or_else(|| {
        StoreError::Config(
            "storage.postgres.url is not set (nor url_file, nor url_env): set one of them".into(),
        )
    })
}

/// `hookrelay migrate`: brings the configured store's schema to this build's version
/// (or, with `dry_run`, says what that would do); with `to`, copies the embedded store
/// to the other embedded engine (`embedded/copy.rs`). Returns what to print.
pub(crate) async fn migrate(
    config: &StorageConfig,
    dry_run: bool,
    to: Option<StorageBackend>,
) -> Result<String, StoreError> {
    if let Some(to) = to {
        return copy_embedded(config, to, dry_run).await;
    }
    match config.backend() {
        StorageBackend::Sled | StorageBackend::Redb => Ok(format!(
            "storage.backend is {}: nothing to migrate (the data directory {} carries its \
             own layout version, checked at start; --to moves it to the other embedded \
             engine)",
            engine_of(config.backend()).name(),
            config.data_dir.display()
        )),
        StorageBackend::Postgres => {
            let pg = &config.postgres;
            let url = postgres_url(config)?;
            postgres::migrate_only(url.expose(), &pg.schema, tls_settings(config), dry_run).await
        }
    }
}

/// `hookrelay migrate --to {sled|redb}`.
async fn copy_embedded(
    config: &StorageConfig,
    to: StorageBackend,
    dry_run: bool,
) -> Result<String, StoreError> {
    if !config.backend().is_embedded() || !to.is_embedded() {
        return Err(StoreError::Config(
            "--to moves an embedded store (storage.backend sled or redb) to the other embedded \
             engine: `--to redb` or `--to sled`; between PostgreSQL and an embedded store \
             there is no copy (start the new relay empty and drain the old one)"
                .into(),
        ));
    }
    let (from, to) = (engine_of(config.backend()), engine_of(to));
    let dir = config.data_dir.clone();
    if dry_run {
        return Ok(format!(
            "would copy the {} store in {} to a new {} store beside it, check it entry by \
             entry, switch to it, and leave the {} files for you to remove (nothing changed)",
            from.name(),
            dir.display(),
            to.name(),
            from.name()
        ));
    }
    let (cache, compression) = (config.engine_cache_bytes(), config.compression);
    let report = tokio::task::spawn_blocking(move || {
        embedded::copy::copy(from, to, &dir, cache, compression)
    })
    .await
    .map_err(|e| StoreError::Task(e.to_string()))??;
    let leftovers = names(&report.leftovers);
    Ok(format!(
        "copied {} entries ({} bytes) from {} to {} in {}, checked entry by entry, and \
         switched to it ({}/{} says {}).\n\
         Next: set storage.backend = \"{}\" (or leave it unset) and start the relay; set to \
         {}, it refuses the stale copy. Once it runs, remove what is left of the {} store: {}",
        report.entries,
        report.bytes,
        report.from.name(),
        report.to.name(),
        config.data_dir.display(),
        config.data_dir.display(),
        embedded::engine::current::CURRENT,
        report.to.name(),
        report.to.name(),
        report.from.name(),
        report.from.name(),
        if leftovers.is_empty() { "nothing".to_owned() } else { leftovers }
    ))
}

/// Paths, for a message.
pub(super) fn names(paths: &[std::path::PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" ")
}

/// The engine of an embedded backend (sled for PostgreSQL, which has none: never asked).
/// `hookrelay restore --from FILE`: the backup checked whole, then restored into
/// `storage.data_dir` (which must hold no store) on `storage.backend`'s engine (redb for
/// a new data directory). The relay must be stopped.
pub(crate) async fn restore(config: &StorageConfig, from: &Path) -> Result<String, StoreError> {
    if !config.backend().is_embedded() {
        return Err(StoreError::Config(
            "a backup restores an embedded store (storage.backend redb or sled): on PostgreSQL \
             use pg_restore (docs/deploy.md)"
                .into(),
        ));
    }
    let (engine, dir, from) =
        (engine_of(config.backend()), config.data_dir.clone(), from.to_owned());
    let (cache, compression) = (config.engine_cache_bytes(), config.compression);
    let done = tokio::task::spawn_blocking(move || {
        embedded::backup::restore(&from, &dir, engine, cache, compression)
    })
    .await
    .map_err(|e| StoreError::Task(e.to_string()))??;
    let s = &done.summary;
    Ok(format!(
        "restored {} entries ({} bytes, sha256 {}) of a {} store taken at {} into a {} store \
         in {}: start the relay on it",
        s.entries,
        s.bytes,
        s.sha256,
        s.header.engine,
        crate::timefmt::format_admin_us(s.header.created_at_us),
        done.engine.name(),
        done.dir.display()
    ))
}

fn engine_of(backend: StorageBackend) -> embedded::engine::Engine {
    match backend {
        StorageBackend::Redb => embedded::engine::Engine::Redb,
        StorageBackend::Sled | StorageBackend::Postgres => embedded::engine::Engine::Sled,
    }
}

/// Opens the backend `config` names: the one factory of the relay. `observer` hears
/// of every group commit; `live_for` is how long the fleet counts a silent relay
/// (what a shared store needs to take over a dead relay's claims).
pub(crate) async fn open(
    config: &StorageConfig,
    observer: Arc<dyn StoreObserver>,
    live_for: std::time::Duration,
) -> Result<SharedStore, StoreError> {
    match config.backend() {
        StorageBackend::Sled | StorageBackend::Redb => {
            let opts = EmbeddedOptions {
                engine: engine_of(config.backend()),
                path: config.data_dir.clone(),
                cache_capacity_bytes: config.engine_cache_bytes(),
                compression: config.compression,
                flush_interval: config.flush_interval,
                durable: config.durability == Durability::Durable,
                commit_max_batch: config.commit_max_batch,
                write_timeout: config.write_timeout,
                observer,
                count_pace: embedded::CountPace::SERVICE,
            };
            let store = tokio::task::spawn_blocking(move || EmbeddedStore::open(&opts))
                .await
                .map_err(|e| StoreError::Task(e.to_string()))??;
            Ok(Arc::new(store))
        }
        StorageBackend::Postgres => {
            let pg = &config.postgres;
            let url = postgres_url(config)?;
            let store = postgres::PostgresStore::open(postgres::PostgresOptions {
                url: url.expose().to_owned(),
                pool_size: pg.pool_size,
                schema: pg.schema.clone(),
                statement_timeout: pg.statement_timeout,
                tls: tls_settings(config),
                commit_max_batch: config.commit_max_batch,
                write_timeout: config.write_timeout,
                live_for,
                observer,
            })
            .await?;
            Ok(Arc::new(store))
        }
    }
}
