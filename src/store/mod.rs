//! Durable storage of events and their deliveries: one contract, several backends.
//!
//! The contract ([`contract`]) is one trait per part of the product ([`EventLog`],
//! [`Dispatch`], [`DeliveryQueue`], [`Coordination`], [`SharedState`], [`Upkeep`]);
//! [`Store`] is their sum. The rules that move events and deliveries on live in
//! [`lifecycle`], pure; a backend reads what a rule asks for, and applies the
//! [`lifecycle::Changes`] it returns in one atomic write. Backends: `sled/` (the
//! embedded default), `postgres/` (several relays on one database), `memory` (tests);
//! [`open`] is the one factory. Each backend groups concurrent appends into one write
//! ([`Committer`] for a backend with blocking writes). `conformance/` checks every
//! trait on every backend.

mod claims;
mod commit;
#[cfg(test)]
pub(crate) mod conformance;
mod contract;
mod counts;
mod deliveries;
mod error;
mod health;
pub(crate) mod lifecycle;
#[cfg(test)]
pub(crate) mod memory;
mod model;
mod observer;
pub(crate) mod postgres;
mod sled;

use std::sync::Arc;

pub(crate) use self::sled::{SledOptions, SledStore};
pub(crate) use claims::ClaimTable;
pub(crate) use commit::Committer;
pub(crate) use contract::{
    owner_silence, Audit, Coordination, DeliveryQueue, Dispatch, EventFilter, EventLog, Exclusive,
    Fleet, LedgerReading, Planner, SharedState, Store, Upkeep, Wake, CLAIM_MARGIN, DISPATCH_LEAD,
};
pub(crate) use counts::QueueCounts;
pub(crate) use deliveries::{
    hex, resource_from_hex, resource_hex, Attempt, AttemptWrite, Claim, DeadLetterFilter, DedupKey,
    DeliveryRecord, DeliveryState, DispatchPlan, DispatchVerdict, FilteredOut, PendingEvent,
    QueueStats,
};
pub(crate) use error::StoreError;
pub(crate) use health::Health;
pub(crate) use model::{
    EventFlag, EventId, EventMeta, EventNameOrigin, EventRecord, EventStatus, NewEvent,
};
#[cfg(test)]
pub(crate) use observer::NoObserver;
pub(crate) use observer::StoreObserver;

use crate::config::{Durability, StorageBackend, StorageConfig};

/// How the rest of the relay holds the store.
pub(crate) type SharedStore = Arc<dyn Store>;

/// The database URL of `[storage.postgres]` (validated with the config).
/// What is wrong with `url` as a PostgreSQL URL (libpq's TLS parameters included), if
/// anything; never quoting it (it holds a password).
pub(crate) fn postgres_url_problem(url: &str) -> Option<String> {
    postgres::url_problem(url)
}

fn postgres_url(config: &StorageConfig) -> Result<&crate::config::Secret, StoreError> {
    config.postgres.resolved_url.as_ref().ok_or_else(|| {
        StoreError::Config(
            "storage.postgres.url is not set (nor url_file, nor url_env): set one of them".into(),
        )
    })
}

/// `hookrelay migrate`: brings the configured store's schema to this build's version
/// (or, with `dry_run`, says what that would do); returns what to print.
pub(crate) async fn migrate(config: &StorageConfig, dry_run: bool) -> Result<String, StoreError> {
    match config.backend {
        StorageBackend::Sled => Ok(format!(
            "storage.backend is sled: nothing to migrate (the data directory carries its \
             own layout version, {}, checked at start)",
            config.data_dir.display()
        )),
        StorageBackend::Postgres => {
            let pg = &config.postgres;
            let url = postgres_url(config)?;
            let tls = postgres::TlsSettings { mode: pg.sslmode, ca_file: pg.ca_file.clone() };
            postgres::migrate_only(url.expose(), &pg.schema, tls, dry_run).await
        }
    }
}

/// Opens the backend `config` names: the one factory of the relay. `observer` hears
/// of every group commit.
pub(crate) async fn open(
    config: &StorageConfig,
    observer: Arc<dyn StoreObserver>,
) -> Result<SharedStore, StoreError> {
    match config.backend {
        StorageBackend::Sled => {
            let opts = SledOptions {
                path: config.data_dir.clone(),
                cache_capacity_bytes: config.cache_capacity_bytes,
                compression: config.compression,
                flush_interval: config.flush_interval,
                durable: config.durability == Durability::Durable,
                commit_max_batch: config.commit_max_batch,
                write_timeout: config.write_timeout,
                observer,
            };
            let store = tokio::task::spawn_blocking(move || SledStore::open(&opts))
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
                tls: postgres::TlsSettings { mode: pg.sslmode, ca_file: pg.ca_file.clone() },
                commit_max_batch: config.commit_max_batch,
                write_timeout: config.write_timeout,
                observer,
            })
            .await?;
            Ok(Arc::new(store))
        }
    }
}
