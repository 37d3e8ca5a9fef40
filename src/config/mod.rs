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

mod admin;
mod delivery;
pub(crate) mod duration;
mod kinds;
mod reference;
pub(crate) mod reload;
mod secret;
mod storage;
mod telemetry;
mod upstream;
mod validate;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub(crate) use admin::{AdminConfig, Role, ADMIN_NAME};
pub(crate) use delivery::{
    DeliveryConfig, DestinationConfig, DestinationKind, Ordering, RetentionConfig, RetryPolicy,
};
pub(crate) use reference::reference;
pub(crate) use secret::{mask_url, EnvLookup, Secret, SecretSpec, MASK};
pub(crate) use storage::{Durability, SslMode, StorageBackend, StorageConfig, RELAY_RESERVE_BYTES};
pub(crate) use telemetry::TelemetryConfig;
pub(crate) use upstream::{AccountAuth, AccountConfig, UpstreamConfig};
pub(crate) use validate::valid_name;

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
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
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
    /// validates the result: the config's own checks (syntax, names, ranges). What only
    /// the store or the shaping room can tell is added by the daemon's loader
    /// (`daemon/load.rs`).
    pub(crate) fn load(path: &Path, env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        Self::load_checking(path, env, Config::validate)
    }

    /// Reads `path` with `env` overlaid, and checks it with `check`, whose problems are
    /// reported all at once.
    pub(crate) fn load_checking(
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
