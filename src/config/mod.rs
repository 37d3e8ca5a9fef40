//! Configuration: a TOML file overlaid by `HOOKRELAY__SECTION__KEY` environment
//! variables, checked as a whole so that every mistake is reported at once, by key.

/// Implements `TryFrom<String>` for a config enum so that a wrong value is reported
/// as `unknown value "x": expected "a" or "b"` (serde's own enum errors are cryptic
/// once they pass through the `config` crate).
macro_rules! config_enum {
    ($ty:ident { $($text:literal => $variant:ident),+ $(,)? }) => {
        impl TryFrom<String> for $ty {
            type Error = String;
            fn try_from(value: String) -> Result<Self, String> {
                match value.as_str() {
                    $($text => Ok(Self::$variant),)+
                    _ => Err(format!(
                        "unknown value {value:?}: expected {}",
                        [$(concat!("\"", $text, "\"")),+].join(" or ")
                    )),
                }
            }
        }

        /// In the configuration reference: one of its words.
        impl schemars::JsonSchema for $ty {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($ty).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string", "enum": [$($text),+] })
            }
        }
    };
}

mod delivery;
pub(crate) mod duration;
mod reference;
mod secret;
mod telemetry;
mod upstream;
mod validate;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub(crate) use delivery::{
    DeliveryConfig, DestinationConfig, Ordering, RetentionConfig, RetryPolicy,
};
pub(crate) use reference::reference;
pub(crate) use secret::{mask_url, EnvLookup, Secret, SecretSpec, MASK};
pub(crate) use telemetry::TelemetryConfig;
pub(crate) use upstream::{AccountAuth, AccountConfig, UpstreamConfig};

/// The file `serve` and `check-config` read unless told otherwise.
pub const DEFAULT_PATH: &str = "config/hookrelay.toml";

/// Environment variables `HOOKRELAY__SECTION__KEY` override `[section] key`; the double
/// underscore keeps snake_case keys such as `max_body_bytes` intact.
const ENV_PREFIX: &str = "HOOKRELAY";
const ENV_SEPARATOR: &str = "__";

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {0} does not exist (give another with --config)")]
    Missing(PathBuf),
    #[error("{path}: {source}")]
    Load {
        path: PathBuf,
        #[source]
        source: config::ConfigError,
    },
    #[error("{path}: invalid configuration:\n  - {}", problems.join("\n  - "))]
    Invalid { path: PathBuf, problems: Vec<String> },
}

/// The whole configuration, as read and validated.
#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct Config {
    pub(crate) ingress: IngressConfig,
    pub(crate) admin: AdminConfig,
    pub(crate) storage: StorageConfig,
    pub(crate) log: LogConfig,
    pub(crate) telemetry: TelemetryConfig,
    pub(crate) shutdown: ShutdownConfig,
    pub(crate) sources: Vec<SourceConfig>,
    pub(crate) delivery: DeliveryConfig,
    pub(crate) destinations: Vec<DestinationConfig>,
    pub(crate) retention: RetentionConfig,
    pub(crate) upstream: UpstreamConfig,
}

/// The public listener the upstream calls.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct IngressConfig {
    /// Address of the public callback listener.
    pub(crate) listen: SocketAddr,
    /// Larger bodies are acknowledged and recorded as rejected, never stored.
    pub(crate) max_body_bytes: u64,
    /// HTTP worker threads; 0 means one per CPU core.
    pub(crate) workers: usize,
    /// Longest time a callback's body may take to arrive once its headers have: a
    /// client trickling its body is cut off (connection closed, nothing stored, the
    /// upstream retries) instead of holding a connection for ever.
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) body_timeout: Duration,
}

impl Default for IngressConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: 10 * 1024 * 1024,
            workers: 0,
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// The private listener: metrics, health and the admin API.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct AdminConfig {
    /// Address of the private listener (`/metrics`, `/healthz`, `/readyz`, `/admin`,
    /// `/console`): keep it private.
    pub(crate) listen: SocketAddr,
    /// Bearer token of the admin API; without one the admin API refuses every request.
    pub(crate) token: Option<Secret>,
    /// A file holding the admin token (instead of `token`).
    pub(crate) token_file: Option<PathBuf>,
    /// An environment variable holding the admin token (instead of `token`).
    pub(crate) token_env: Option<String>,
    #[serde(skip)]
    pub(crate) resolved_token: Option<Secret>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8079)),
            token: None,
            token_file: None,
            token_env: None,
            resolved_token: None,
        }
    }
}

/// When an acknowledged callback is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub(crate) enum Durability {
    /// Acknowledge only after the group's fsync: nothing acknowledged is ever lost.
    Durable,
    /// Acknowledge once written to sled's buffers; sled flushes every `flush_interval`,
    /// so a crash may lose the last moments of callbacks.
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
    /// memory bounded by `cache_capacity_bytes` (or `memory_limit_bytes`) and a restart
    /// in milliseconds whatever it holds. The default for a new data directory.
    Redb,
    /// PostgreSQL (`[storage.postgres]`): any number of relays on one database.
    Postgres,
}

config_enum!(StorageBackend { "sled" => Sled, "redb" => Redb, "postgres" => Postgres });

/// What the relay needs besides the engine's cache under `storage.memory_limit_bytes`:
/// its runtime, HTTP stacks, buffers and counts. Measured on redb (BENCHMARKS.md,
/// "Capacity"): 50 MB idle, about 110 MB beside a 64 MiB cache under 64 connections
/// of ingest with deliveries.
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
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
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
    /// URL's `sslrootcert`); unset with verify-ca or verify-full: the public CAs.
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
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct StorageConfig {
    /// Which store holds the relay's state. Unset, the engine of the store
    /// `data_dir` holds: redb for a new directory, sled where an earlier relay left a
    /// sled store (whose memory grows with what it holds: a notice at start names
    /// `hookrelay migrate --to redb`). A directory holding both is refused until this
    /// names one.
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
    /// The embedded engine's background flush period (what `buffered` relies on).
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) flush_interval: Duration,
    /// The embedded engine's page cache. redb keeps to it (its memory whatever it
    /// holds); sled takes it as a hint and grows with what it holds.
    pub(crate) cache_capacity_bytes: u64,
    /// redb only: the memory the relay keeps to, whatever the store holds (for a
    /// container's memory limit). The engine's cache gets this less what the relay
    /// itself needs (`RELAY_RESERVE_BYTES`, 112 MiB, measured under load), replacing
    /// `cache_capacity_bytes`, and the allocator returns freed memory to the system at
    /// once rather than after a delay. At least 128 MiB. sled cannot keep to a limit
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

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

config_enum!(LogFormat { "text" => Text, "json" => Json });

/// Logging.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct LogConfig {
    /// A tracing filter such as `info` or `hookrelay=debug,actix_server=warn`;
    /// `RUST_LOG` overrides it.
    pub(crate) level: String,
    /// `text` for people, `json` (one object per line) for log shippers.
    pub(crate) format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { level: "info".into(), format: LogFormat::Text }
    }
}

/// Graceful shutdown.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct ShutdownConfig {
    /// How long in-flight callbacks may take to finish after SIGTERM.
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) grace: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self { grace: Duration::from_secs(10) }
    }
}

/// One upstream organisation whose hooks call `/hooks/{name}/{token}[/{eventName}]`.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SourceConfig {
    /// The source's name: the `{source}` of its callback URL and a metric label.
    pub(crate) name: String,
    /// The secret segment of the callback URL, `/hooks/{source}/{token}`: at least 16
    /// URL-safe characters (`openssl rand -hex 24`).
    pub(crate) token: Option<Secret>,
    /// A file holding the token (instead of `token`).
    pub(crate) token_file: Option<PathBuf>,
    /// An environment variable holding the token (instead of `token`).
    pub(crate) token_env: Option<String>,
    #[serde(skip)]
    pub(crate) resolved_token: Option<Secret>,
    /// A second copy of an occurrence arriving within this window is a duplicate
    /// (several users' hooks for the same event and URL); `0` disables.
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(default = "default_dedup_window", with = "duration")]
    pub(crate) dedup_window: Duration,
    /// JSON pointers into the body whose values identify an occurrence; the `meta`
    /// block differs between copies, `data` does not.
    #[serde(default = "default_dedup_pointers")]
    pub(crate) dedup_pointers: Vec<String>,
    /// Events the source's accounts hold hooks for (each account may override).
    #[serde(default)]
    pub(crate) events: Vec<String>,
    /// Upstream users whose hooks this relay registers and watches.
    #[serde(default)]
    pub(crate) accounts: Vec<AccountConfig>,
}

fn default_dedup_window() -> Duration {
    Duration::from_secs(600)
}

fn default_dedup_pointers() -> Vec<String> {
    vec!["/data".to_owned()]
}

impl Default for SourceConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            token: None,
            token_file: None,
            token_env: None,
            resolved_token: None,
            dedup_window: default_dedup_window(),
            dedup_pointers: default_dedup_pointers(),
            events: Vec::new(),
            accounts: Vec::new(),
        }
    }
}

impl Config {
    /// Reads `path`, overlays the `HOOKRELAY__…` variables of `env`, resolves secrets and
    /// validates the result.
    pub(crate) fn load(path: &Path, env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        Self::load_checking(path, env, Config::validate)
    }

    /// [`Config::load`] checking only the storage settings (`hookrelay migrate`).
    pub(crate) fn load_storage(
        path: &Path,
        env: &HashMap<String, String>,
    ) -> Result<Self, ConfigError> {
        Self::load_checking(path, env, Config::validate_storage_only)
    }

    fn load_checking(
        path: &Path,
        env: &HashMap<String, String>,
        check: impl FnOnce(&mut Config, EnvLookup<'_>) -> Result<(), Vec<String>>,
    ) -> Result<Self, ConfigError> {
        if !path.is_file() {
            return Err(ConfigError::Missing(path.to_owned()));
        }
        let load_err = |source| ConfigError::Load { path: path.to_owned(), source };
        let overlay: HashMap<String, String> = env
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{ENV_PREFIX}{ENV_SEPARATOR}")))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut config: Config = config::Config::builder()
            .add_source(config::File::from(path).format(config::FileFormat::Toml))
            .add_source(
                config::Environment::with_prefix(ENV_PREFIX)
                    .prefix_separator(ENV_SEPARATOR)
                    .separator(ENV_SEPARATOR)
                    .source(Some(overlay.into_iter().collect())),
            )
            .build()
            .and_then(config::Config::try_deserialize)
            .map_err(load_err)?;
        let lookup = |name: &str| env.get(name).cloned();
        check(&mut config, &lookup)
            .map_err(|problems| ConfigError::Invalid { path: path.to_owned(), problems })?;
        Ok(config)
    }

    /// The effective configuration as TOML, every secret masked.
    pub(crate) fn to_masked_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }
}

#[cfg(test)]
mod tests;
