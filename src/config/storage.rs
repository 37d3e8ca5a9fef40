//! `[storage]`: which store holds the relay's state, how durably, in how much memory,
//! and the checks of those settings (what `hookrelay migrate` needs on its own).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{duration, Config, EnvLookup, Secret, SecretSpec};

/// When an acknowledged callback is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub(crate) enum Durability {
    /// Acknowledge only after the group's fsync: nothing acknowledged is ever lost.
    Durable,
    /// Acknowledge once written to the engine's buffers, flushed every `flush_interval`:
    /// a crash may lose the last moments of callbacks.
    Buffered,
}

config_enum!(Durability { "durable" => Durable, "buffered" => Buffered });

/// Which store backend holds the relay's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub(crate) enum StorageBackend {
    /// sled, embedded, in `data_dir`: one relay per data directory. The default of
    /// earlier releases, kept where a data directory holds a sled store; its memory
    /// grows with what it holds (BENCHMARKS.md, "Capacity").
    Sled,
    /// redb, embedded, in `data_dir` (`hookrelay.redb`): one relay per data directory,
    /// memory bounded by `cache_capacity_bytes` (or `memory_limit_bytes`), freed memory
    /// returned to the system at once, and a restart in milliseconds whatever it holds.
    /// The default for a new data directory.
    Redb,
    /// PostgreSQL (`[storage.postgres]`): any number of relays on one database.
    Postgres,
}

config_enum!(StorageBackend { "sled" => Sled, "redb" => Redb, "postgres" => Postgres });

/// What the relay needs besides the engine's cache under `storage.memory_limit_bytes`:
/// its runtime, HTTP stacks, buffers and counts, and the binary's text (16 MB, counted
/// in RSS). Measured on redb with huge pages refused (BENCHMARKS.md, "Capacity"):
/// 50-65 MB beside the cache under 64 connections of ingest with deliveries, flat
/// from 1 M to 10 M events; the dedup index's filters (16 MiB at most, some 12 MB for a
/// 10-minute window at 9,400 callbacks/s) kept a 3 M store under a 150 MiB limit at
/// 96 MB. The rest is room for what the bench does not send: bodies
/// up to `ingress.max_body_bytes` (10 MiB) on many connections at once, a console
/// reading large pages.
pub(crate) const RELAY_RESERVE_BYTES: u64 = 112 * 1024 * 1024;

impl StorageConfig {
    /// The backend the relay runs on: `backend`, which loading sets from what `data_dir`
    /// holds when the file left it unset; redb, the default for a new directory, for a
    /// configuration no load resolved.
    pub(crate) fn backend(&self) -> StorageBackend {
        self.backend.unwrap_or(StorageBackend::Redb)
    }

    /// The engine's cache: `cache_capacity_bytes`, or on redb what `memory_limit_bytes`
    /// leaves once the relay's own share is set aside.
    pub(crate) fn engine_cache_bytes(&self) -> u64 {
        match self.memory_limit_bytes {
            Some(limit) if self.backend() == StorageBackend::Redb => {
                limit.saturating_sub(RELAY_RESERVE_BYTES)
            }
            _ => self.cache_capacity_bytes,
        }
    }
}

impl StorageBackend {
    /// Its word in the configuration (and in the admin API's overview).
    pub(crate) fn name(self) -> &'static str {
        match self {
            StorageBackend::Sled => "sled",
            StorageBackend::Redb => "redb",
            StorageBackend::Postgres => "postgres",
        }
    }

    /// Whether the store lives in `data_dir`, owned by this one process.
    pub(crate) fn is_embedded(self) -> bool {
        matches!(self, StorageBackend::Sled | StorageBackend::Redb)
    }
}

/// `[storage.postgres]`: the shared database of a fleet of relays.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct PostgresConfig {
    /// `postgres://user:password@host:port/database`: a secret (or `url_file`,
    /// `url_env`), never logged or printed.
    pub(crate) url: Option<Secret>,
    /// A file holding the database URL (instead of `url`).
    pub(crate) url_file: Option<PathBuf>,
    /// An environment variable holding the database URL (instead of `url`).
    pub(crate) url_env: Option<String>,
    #[serde(skip)]
    pub(crate) resolved_url: Option<Secret>,
    /// Connections this relay keeps to the database.
    pub(crate) pool_size: usize,
    /// The schema holding hookrelay's tables (created and migrated at start).
    pub(crate) schema: String,
    /// The server cancels any statement running longer than this.
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) statement_timeout: Duration,
    /// TLS to the database, as libpq's `sslmode` (wins over the URL's `sslmode`);
    /// unset: the URL's, else `prefer`.
    pub(crate) sslmode: Option<SslMode>,
    /// PEM file of the CA(s) the server's certificate must be signed by (wins over the
    /// URL's `sslrootcert`), or "system" for the public CAs. verify-ca and verify-full
    /// need one (the relay refuses to start without it, as libpq does).
    pub(crate) ca_file: Option<PathBuf>,
}

/// libpq's `sslmode` (`store/postgres/tls.rs` says what each one checks).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS if the server offers it; its certificate is not checked.
    #[default]
    Prefer,
    /// Always TLS; the certificate is not checked (unless a CA file is given).
    Require,
    /// Always TLS, the certificate signed by a trusted CA.
    VerifyCa,
    /// As verify-ca, and issued for the host connected to.
    VerifyFull,
}

impl SslMode {
    /// As the config spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

impl Default for PostgresConfig {
    fn default() -> Self {
        Self {
            url: None,
            url_file: None,
            url_env: None,
            resolved_url: None,
            pool_size: 16,
            schema: "hookrelay".into(),
            statement_timeout: Duration::from_secs(5),
            sslmode: None,
            ca_file: None,
        }
    }
}

/// The store.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct StorageConfig {
    /// Which store holds the relay's state. Unset, the engine of the store
    /// `data_dir` holds: redb for a new directory, sled where an earlier relay left a
    /// sled store (whose memory grows with what it holds: a notice at start names
    /// `hookrelay migrate --to redb`), the one named by the `CURRENT` file a
    /// migration writes where both are there. Set to the engine a migration moved away
    /// from, the relay refuses the stale copy. A directory holding both without
    /// `CURRENT` (migrated by an earlier build) is refused until this names one.
    pub(crate) backend: Option<StorageBackend>,
    /// The backend was unset and `data_dir` holds a sled store: said at start.
    #[serde(skip)]
    pub(crate) sled_found: bool,
    /// Directory of the embedded database (sled or redb); created if missing.
    pub(crate) data_dir: PathBuf,
    /// When a callback is acknowledged: `durable` after its group's fsync (nothing
    /// acknowledged is ever lost), `buffered` once in the engine's buffers.
    pub(crate) durability: Durability,
    /// Most callbacks one group commit (one write batch, one fsync) takes.
    pub(crate) commit_max_batch: usize,
    /// The embedded engine's background flush period (what `buffered` relies on). On
    /// redb, its checkpoint period: a durable commit of the database file, after which
    /// its redo log is emptied (it bounds the log and what a restart after a crash
    /// applies again); a checkpoint comes sooner once 1 MiB of writes were logged. In
    /// `durable` mode on redb, where the log makes each write durable and writers wait
    /// while a checkpoint runs, the shortest period: checkpoints come up to 5 s apart
    /// while each holds the writers under 10 ms or under twice what one at this period
    /// took, and at this period again when one takes longer.
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) flush_interval: Duration,
    /// The embedded engine's page cache. redb keeps to it (its memory whatever it
    /// holds); sled takes it as a hint and grows with what it holds.
    pub(crate) cache_capacity_bytes: u64,
    /// redb only: the memory the relay keeps to, whatever the store holds (for a
    /// container's memory limit). The engine's cache gets this less what the relay
    /// itself needs (`RELAY_RESERVE_BYTES`, 112 MiB, measured under load), replacing
    /// `cache_capacity_bytes`. At least 128 MiB. sled cannot keep to a limit
    /// (its memory grows with its history): refused with `backend = "sled"`, not kept
    /// (and said at start) on a sled store the unset backend found.
    pub(crate) memory_limit_bytes: Option<u64>,
    /// zstd compression of sled's log: far fewer bytes on disk, for less ingest
    /// throughput (the figures: BENCHMARKS.md, footprint). A new data directory only:
    /// sled keeps the setting a directory was created with.
    pub(crate) compression: bool,
    /// Callbacks are refused (connection closed) while the data directory's filesystem
    /// has less free space than the larger of these two.
    pub(crate) min_free_bytes: u64,
    /// The free-space floor as a share of the filesystem (the larger of the two wins).
    pub(crate) min_free_percent: f64,
    /// sled, redb: store writes waiting this long with none returning fail the store
    /// (a write queued behind others that return is slow, not hung): callbacks waiting
    /// on them are closed, the relay turns unready and exits non-zero so that its
    /// service manager restarts it. PostgreSQL: the write fails (its caller retries)
    /// and the relay goes on: restarting does not make a slow database faster.
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) write_timeout: Duration,
    /// The database, when `backend = "postgres"`.
    pub(crate) postgres: PostgresConfig,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            backend: None,
            sled_found: false,
            data_dir: PathBuf::from("./data"),
            durability: Durability::Durable,
            commit_max_batch: 512,
            flush_interval: Duration::from_millis(500),
            cache_capacity_bytes: 64 * 1024 * 1024,
            memory_limit_bytes: None,
            compression: false,
            min_free_bytes: 256 * 1024 * 1024,
            min_free_percent: 2.0,
            write_timeout: Duration::from_secs(10),
            postgres: PostgresConfig::default(),
        }
    }
}

impl Config {
    /// Resolves and checks the storage settings alone: what `hookrelay migrate` needs
    /// (not the tokens and secrets of the sources, destinations and admin API).
    pub(crate) fn validate_storage_only(&mut self, env: EnvLookup<'_>) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        self.validate_storage(env, &mut problems);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// The `[storage]` checks, into `problems`.
    pub(super) fn validate_storage(&mut self, env: EnvLookup<'_>, problems: &mut Vec<String>) {
        let pg = &self.storage.postgres;
        let spec = SecretSpec {
            inline: pg.url.as_ref(),
            file: pg.url_file.as_deref(),
            env: pg.url_env.as_deref(),
        };
        match spec.resolve("storage.postgres.url", env) {
            Ok(url) => self.storage.postgres.resolved_url = url,
            Err(e) => problems.push(e),
        }
        let pg = &self.storage.postgres;
        // Present; its parameters are the store's to check (`store::settle`).
        if self.storage.backend() == StorageBackend::Postgres && pg.resolved_url.is_none() {
            problems.push(
                "storage.postgres.url: missing (backend = \"postgres\" needs `url`, \
                 `url_file` or `url_env`: postgres://user:password@host:port/database)"
                    .into(),
            );
        }
        if !(1..=1000).contains(&pg.pool_size) {
            problems.push("storage.postgres.pool_size: must be between 1 and 1000".into());
        }
        if !valid_schema(&pg.schema) {
            problems.push(format!(
                "storage.postgres.schema: {:?} must be 1 to 63 characters of a-z 0-9 _, \
                 starting with a letter",
                pg.schema
            ));
        }
        // "system": the public CAs, named (libpq's sslrootcert=system), no file.
        if let Some(ca) = pg.ca_file.as_ref().filter(|ca| ca.as_os_str() != "system") {
            if let Err(e) = std::fs::File::open(ca) {
                problems
                    .push(format!("storage.postgres.ca_file: cannot read {}: {e}", ca.display()));
            }
        }
        if pg.statement_timeout < Duration::from_millis(100) {
            problems.push("storage.postgres.statement_timeout: must be at least 100ms".into());
        }
        if self.storage.data_dir.as_os_str().is_empty() {
            problems.push("storage.data_dir: must not be empty".into());
        }
        if !(1..=10_000).contains(&self.storage.commit_max_batch) {
            problems.push("storage.commit_max_batch: must be between 1 and 10000".into());
        }
        if !(0.0..=50.0).contains(&self.storage.min_free_percent) {
            problems.push("storage.min_free_percent: must be between 0 and 50".into());
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(600))
            .contains(&self.storage.write_timeout)
        {
            problems.push("storage.write_timeout: must be between 1s and 10m".into());
        }
        if self.storage.flush_interval.is_zero() {
            problems.push("storage.flush_interval: must be greater than 0".into());
        }
    }
}

/// A PostgreSQL schema name that needs no quoting anywhere.
fn valid_schema(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}
