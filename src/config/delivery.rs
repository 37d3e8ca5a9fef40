//! Configuration of dispatch and delivery: `[delivery]` defaults, `[[destinations]]`,
//! `[retention]`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{duration, Secret};

/// Retry policy; `[delivery]` holds the defaults, a destination may override each key.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RetryPolicy {
    /// First retry delay ceiling; full jitter draws the actual delay below it.
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) initial_backoff: Duration,
    /// Each retry's delay ceiling is the previous one times this.
    pub(crate) backoff_multiplier: f32,
    /// Largest delay between two attempts (also caps `Retry-After`).
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) max_backoff: Duration,
    /// A delivery still failing this long after it was first due goes dead.
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) give_up_after: Duration,
    /// A delivery that failed this many attempts goes dead.
    pub(crate) max_attempts: u32,
    /// 4xx statuses that are retried; every other 4xx is a permanent failure
    /// (5xx, timeouts and connection errors are always retried).
    pub(crate) retryable_statuses: Vec<u16>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial_backoff: Duration::from_secs(1),
            backoff_multiplier: 2.0,
            max_backoff: Duration::from_secs(600),
            give_up_after: Duration::from_secs(72 * 3600),
            max_attempts: 50,
            retryable_statuses: vec![408, 429],
        }
    }
}

/// `[delivery]`: defaults for every destination (`[delivery.retry]` for retries).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct DeliveryConfig {
    pub(crate) retry: RetryPolicy,
    /// Time for one request, connect to last byte of the answer.
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) timeout: Duration,
    /// Requests in flight to one destination at most.
    pub(crate) max_concurrency: usize,
    /// Consecutive failed attempts (5xx, 408, 429, timeouts, connection errors) that
    /// open a destination's circuit.
    pub(crate) circuit_failure_threshold: u32,
    /// While the circuit is open, one probe request per this interval.
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) circuit_probe_interval: Duration,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            timeout: Duration::from_secs(15),
            max_concurrency: 8,
            circuit_failure_threshold: 5,
            circuit_probe_interval: Duration::from_secs(30),
        }
    }
}

/// How a destination's deliveries are ordered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub(crate) enum Ordering {
    /// Each delivery on its own schedule.
    #[default]
    None,
    /// Events about the same resource (source, `data.type`, `data.id`) in receive order.
    PerResource,
    /// Like `per-resource`, and a newer update of a resource supersedes the older ones
    /// still waiting: each callback carries the whole resource, so only the newest
    /// needs sending.
    Latest,
}

config_enum!(Ordering { "none" => None, "per-resource" => PerResource, "latest" => Latest });

/// How a destination's deliveries reach it: pushed over HTTP or to a broker, or held
/// for a consumer that fetches them. Every kind has the same lifecycle (retries,
/// circuit, order, filters, dead letters); only the sending differs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub(crate) enum DestinationKind {
    /// A POST to `url` (http or https), answered 2xx.
    #[default]
    Http,
    /// A publish to a NATS JetStream `subject`, acknowledged by the stream.
    Nats,
    /// A publish to a RabbitMQ (AMQP 0-9-1) `exchange`, confirmed by the broker.
    Amqp,
    /// An `XADD` to a Redis `stream`.
    RedisStream,
    /// Held for a consumer that leases and acknowledges them (`/pull/{name}/...`).
    Pull,
}

config_enum!(DestinationKind {
    "http" => Http,
    "nats" => Nats,
    "amqp" => Amqp,
    "redis-stream" => RedisStream,
    "pull" => Pull,
});

impl DestinationKind {
    /// As the configuration writes it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            DestinationKind::Http => "http",
            DestinationKind::Nats => "nats",
            DestinationKind::Amqp => "amqp",
            DestinationKind::RedisStream => "redis-stream",
            DestinationKind::Pull => "pull",
        }
    }
}

/// One downstream consumer.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DestinationConfig {
    /// The destination's name: in metrics, logs, the admin API and `ordering` queues.
    pub(crate) name: String,
    /// `http` (the default), `nats`, `amqp`, `redis-stream` or `pull`
    /// (docs/destinations.md).
    #[serde(default)]
    pub(crate) kind: DestinationKind,
    /// Where deliveries go: `https://...` for http, `nats://host:4222` (`tls://` for
    /// TLS), `amqp://user@host:5672/vhost` (`amqps://`), `redis://host:6379`
    /// (`rediss://`); none for pull. Shown with its password and query values masked.
    #[serde(default, serialize_with = "super::secret::serialize_url")]
    pub(crate) url: String,
    /// nats: the subject published to, a template over `{event}`, `{source}` and
    /// `{resource_type}` (`hookrelay.{source}.{event}`). The stream capturing it is
    /// the operator's.
    pub(crate) subject: Option<String>,
    /// amqp: the exchange published to (`""`: the default exchange). The relay does
    /// not declare it.
    pub(crate) exchange: Option<String>,
    /// amqp: the routing key, a template as `subject`; default `{event}`.
    pub(crate) routing_key: Option<String>,
    /// redis-stream: the stream key, a template as `subject`.
    pub(crate) stream: Option<String>,
    /// redis-stream: trims the stream to about this many entries (`MAXLEN ~`) at each
    /// add; unset: never trimmed by the relay.
    pub(crate) max_len: Option<u64>,
    /// amqp, redis-stream, nats: the password of the URL's user (never in the URL).
    pub(crate) password: Option<Secret>,
    /// A file holding the password (instead of `password`).
    pub(crate) password_file: Option<std::path::PathBuf>,
    /// An environment variable holding the password (instead of `password`).
    pub(crate) password_env: Option<String>,
    #[serde(skip)]
    pub(crate) resolved_password: Option<Secret>,
    /// nats: a credentials file (`.creds`: a user JWT and its NKey seed).
    pub(crate) credentials_file: Option<std::path::PathBuf>,
    /// nats, amqp, redis-stream over TLS (`tls://`, `amqps://`, `rediss://`): a PEM
    /// file of the CA certificates that sign the server's certificate (a firm's own
    /// CA); without it, the public CAs. Read at start and at each reload.
    pub(crate) ca_file: Option<std::path::PathBuf>,
    /// pull: the token its consumer sends (`Authorization: Bearer`), at least 16
    /// characters.
    pub(crate) token: Option<Secret>,
    /// A file holding the pull token (instead of `token`).
    pub(crate) token_file: Option<std::path::PathBuf>,
    /// An environment variable holding the pull token (instead of `token`).
    pub(crate) token_env: Option<String>,
    #[serde(skip)]
    pub(crate) resolved_token: Option<Secret>,
    /// Extra request headers (their values are shown masked: API keys go here).
    #[serde(default, serialize_with = "super::secret::serialize_headers")]
    pub(crate) headers: BTreeMap<String, String>,
    /// Standard Webhooks signing secret (`whsec_` + base64).
    pub(crate) secret: Option<Secret>,
    /// A file holding the signing secret (instead of `secret`).
    pub(crate) secret_file: Option<std::path::PathBuf>,
    /// An environment variable holding the signing secret (instead of `secret`).
    pub(crate) secret_env: Option<String>,
    #[serde(skip)]
    pub(crate) resolved_secret: Option<Secret>,
    /// Sources this destination wants (`*` globs); default all.
    #[serde(default = "all")]
    pub(crate) sources: Vec<String>,
    /// Event names this destination wants (`*` globs, e.g. `Action*`); default all.
    #[serde(default = "all")]
    pub(crate) events: Vec<String>,
    /// Time for one request; unset: `[delivery] timeout`.
    #[schemars(with = "Option<crate::config::duration::Text>")]
    #[serde(default, with = "duration::option")]
    pub(crate) timeout: Option<Duration>,
    /// Requests in flight at most; unset: `[delivery] max_concurrency`.
    pub(crate) max_concurrency: Option<usize>,
    /// Requests per second at most (on top of the concurrency cap).
    pub(crate) rate_limit: Option<f64>,
    /// `none`; `per-resource`: one resource's deliveries in the order they came; `latest`:
    /// as per-resource, and a newer update supersedes the older ones still waiting.
    #[serde(default)]
    pub(crate) ordering: Ordering,
    /// Overrides of `[delivery]`'s retry policy.
    #[serde(default)]
    pub(crate) retry: Option<RetryOverride>,
    /// A jq program: the event goes to this destination only when it gives `true`.
    pub(crate) filter: Option<String>,
    /// A jq program giving the JSON body sent instead of the callback's.
    pub(crate) transform: Option<String>,
}

/// Per-destination retry overrides (`[destinations.retry]`); unset keys inherit.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetryOverride {
    /// Unset: `[delivery.retry]`'s.
    #[schemars(with = "Option<crate::config::duration::Text>")]
    #[serde(default, with = "duration::option")]
    pub(crate) initial_backoff: Option<Duration>,
    /// Unset: `[delivery.retry]`'s.
    pub(crate) backoff_multiplier: Option<f32>,
    /// Unset: `[delivery.retry]`'s.
    #[schemars(with = "Option<crate::config::duration::Text>")]
    #[serde(default, with = "duration::option")]
    pub(crate) max_backoff: Option<Duration>,
    /// Unset: `[delivery.retry]`'s.
    #[schemars(with = "Option<crate::config::duration::Text>")]
    #[serde(default, with = "duration::option")]
    pub(crate) give_up_after: Option<Duration>,
    /// Unset: `[delivery.retry]`'s.
    pub(crate) max_attempts: Option<u32>,
    /// Unset: `[delivery.retry]`'s.
    pub(crate) retryable_statuses: Option<Vec<u16>>,
}

fn all() -> Vec<String> {
    vec!["*".to_owned()]
}

impl DestinationConfig {
    /// The retry policy in force: the defaults with this destination's overrides.
    pub(crate) fn retry_policy(&self, defaults: &RetryPolicy) -> RetryPolicy {
        let o = self.retry.clone().unwrap_or_default();
        RetryPolicy {
            initial_backoff: o.initial_backoff.unwrap_or(defaults.initial_backoff),
            backoff_multiplier: o.backoff_multiplier.unwrap_or(defaults.backoff_multiplier),
            max_backoff: o.max_backoff.unwrap_or(defaults.max_backoff),
            give_up_after: o.give_up_after.unwrap_or(defaults.give_up_after),
            max_attempts: o.max_attempts.unwrap_or(defaults.max_attempts),
            retryable_statuses: o
                .retryable_statuses
                .unwrap_or_else(|| defaults.retryable_statuses.clone()),
        }
    }
}

/// `[retention]`: how long finished work is kept.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RetentionConfig {
    /// Events whose deliveries all succeeded (or that were duplicates, unrouted or
    /// rejected) are deleted this long after they were received. Dead letters stay
    /// until replayed or deleted.
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) delivered: Duration,
    /// Retention by part: the bodies of those events go this long after they were
    /// received, their records (meta, deliveries and every attempt) staying for
    /// `delivered`: the audit, the event pages and the search by resource keep working,
    /// a replay of such an event is refused. Bodies are most of a store's bytes. An
    /// event not yet settled at that age (a consumer down longer than this) loses its
    /// body when the attempt that settles it is recorded; a dead letter keeps its
    /// body for a replay. Unset: bodies go with their records.
    #[schemars(with = "Option<crate::config::duration::Text>")]
    #[serde(default, with = "duration::option")]
    pub(crate) delivered_bodies: Option<Duration>,
    /// How often the pruner runs.
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) interval: Duration,
    /// Deliveries to a destination removed from the config wait this long (from when
    /// a relay first finds it gone, in case it comes back) and then go dead with the
    /// reason, to be replayed if it returns or deleted; until then they keep their
    /// events from being pruned.
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) removed_destinations: Duration,
    /// The audit ledger's hours (`GET /admin/audit`) are deleted whole this long after
    /// they ended, by the relay that prunes, and the journal's entries (`GET
    /// /admin/journal`) this long after they were made. At least a day (the imbalance
    /// check reads the last one); the API reads at most a year at a time.
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) audit: Duration,
}

/// `retention.audit` unless set: 400 days, a year's window and a month to spare.
fn default_audit() -> Duration {
    Duration::from_secs(400 * 24 * 3600)
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            delivered: Duration::from_secs(7 * 24 * 3600),
            delivered_bodies: None,
            interval: Duration::from_secs(300),
            removed_destinations: Duration::from_secs(24 * 3600),
            audit: default_audit(),
        }
    }
}
