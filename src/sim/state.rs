//! The simulator's configuration and its shared, in-memory state.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;

use super::hooks::{Hooks, Quirks};
use super::users::{OAuthClient, Users};

/// `hookrelay sim --config FILE`: everything the flags can say, and users with
/// refresh tokens and the OAuth2 client, which only the file can.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct SimConfig {
    pub(crate) listen: SocketAddr,
    pub(crate) users: Vec<UserConfig>,
    pub(crate) oauth: Option<OAuthConfig>,
    pub(crate) quirks: Quirks,
    /// Every n-th API request is answered 429 (0: never).
    pub(crate) throttle_every: u32,
    /// The `Retry-After` of those answers, in seconds.
    pub(crate) throttle_retry_after: u64,
    /// How long a hook call may take before it counts as a (transient) timeout.
    #[serde(with = "crate::config::duration")]
    pub(crate) callback_timeout: Duration,
    /// Retries of a call after a transient network error.
    pub(crate) callback_retries: u32,
    /// Backoff before the first retry; doubled for each next one.
    #[serde(with = "crate::config::duration")]
    pub(crate) callback_retry_backoff: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8000)),
            users: Vec::new(),
            oauth: None,
            quirks: Quirks::default(),
            throttle_every: 0,
            throttle_retry_after: 1,
            callback_timeout: Duration::from_secs(10),
            callback_retries: 3,
            callback_retry_backoff: Duration::from_millis(200),
        }
    }
}

/// A user of the simulated upstream.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UserConfig {
    pub(crate) name: String,
    /// A static bearer token.
    pub(crate) token: Option<String>,
    /// A refresh token for the OAuth2 flow (needs `[oauth]`).
    pub(crate) refresh_token: Option<String>,
}

/// The OAuth2 client `POST /oauth/token` accepts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OAuthConfig {
    pub(crate) client_id: String,
    pub(crate) client_secret: String,
    #[serde(default = "default_ttl", with = "crate::config::duration")]
    pub(crate) access_token_ttl: Duration,
}

fn default_ttl() -> Duration {
    Duration::from_secs(3600)
}

impl SimConfig {
    pub(crate) fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading simulator config {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("simulator config {}", path.display()))
    }

    /// Refuses a config that could not work: users without a way in, a refresh token
    /// with no OAuth client.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        for user in &self.users {
            if user.token.is_none() && user.refresh_token.is_none() {
                anyhow::bail!("user {:?} has neither token nor refresh_token", user.name);
            }
            if user.refresh_token.is_some() && self.oauth.is_none() {
                anyhow::bail!("user {:?} has a refresh_token but there is no [oauth]", user.name);
            }
        }
        Ok(())
    }
}

/// Answers 429 to some API requests.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    every: u32,
    retry_after: u64,
    seen: u64,
    forced: u32,
}

impl Throttle {
    /// The next `requests` API requests get 429 with `Retry-After: retry_after`.
    pub(crate) fn force(&mut self, requests: u32, retry_after: u64) {
        self.forced = requests;
        self.retry_after = retry_after;
    }

    /// `Some(retry_after)` when this request is to be refused.
    pub(crate) fn check(&mut self) -> Option<u64> {
        if self.forced > 0 {
            self.forced -= 1;
            return Some(self.retry_after);
        }
        self.seen += 1;
        (self.every > 0 && self.seen.is_multiple_of(u64::from(self.every)))
            .then_some(self.retry_after)
    }
}

/// What every handler of the simulator shares.
pub(crate) struct SimState {
    pub(crate) hooks: Mutex<Hooks>,
    pub(crate) users: Mutex<Users>,
    pub(crate) quirks: Mutex<Quirks>,
    pub(crate) throttle: Mutex<Throttle>,
    /// Calls hooks' targets; no redirects (a 3xx is not the 200 a target owes).
    pub(crate) http: reqwest::Client,
    pub(crate) config: SimConfig,
    /// Resource ids of generated events.
    pub(crate) next_resource: AtomicU64,
    pub(crate) stats: super::fire::Stats,
    /// The last deliveries `POST /sim/sink` received.
    pub(crate) sink: Mutex<std::collections::VecDeque<serde_json::Value>>,
    /// Until when, and with which status, the sink fails (`POST /sim/sink-outage`).
    pub(crate) sink_down: Mutex<Option<(std::time::Instant, u16)>>,
}

impl SimState {
    pub(crate) fn new(config: SimConfig) -> anyhow::Result<Self> {
        config.check()?;
        let oauth = config.oauth.as_ref().map(|o| OAuthClient {
            client_id: o.client_id.clone(),
            client_secret: o.client_secret.clone(),
            access_token_ttl: o.access_token_ttl,
        });
        let mut users = Users::new(oauth);
        for user in &config.users {
            if let Some(token) = &user.token {
                users.set_token(&user.name, token);
            }
            if let Some(token) = &user.refresh_token {
                users.add_refresh_token(&user.name, token);
            }
        }
        let http = reqwest::Client::builder()
            .timeout(config.callback_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("hookrelay-sim/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("building the simulator's HTTP client")?;
        Ok(Self {
            hooks: Mutex::new(Hooks::default()),
            users: Mutex::new(users),
            quirks: Mutex::new(config.quirks),
            throttle: Mutex::new(Throttle {
                every: config.throttle_every,
                retry_after: config.throttle_retry_after,
                ..Throttle::default()
            }),
            http,
            next_resource: AtomicU64::new(1),
            stats: super::fire::Stats::default(),
            sink: Mutex::new(std::collections::VecDeque::new()),
            sink_down: Mutex::new(None),
            config,
        })
    }
}

pub(crate) use crate::lock::lock;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_refuses_every_nth_and_forced_requests() {
        let mut t = Throttle { every: 3, retry_after: 2, ..Throttle::default() };
        let seen: Vec<_> = (0..6).map(|_| t.check()).collect();
        assert_eq!(seen, vec![None, None, Some(2), None, None, Some(2)]);
        t.force(2, 5);
        assert_eq!((t.check(), t.check()), (Some(5), Some(5)));
    }

    #[test]
    fn config_file_parses_and_is_checked() {
        let c: SimConfig = toml::from_str(
            r#"
            listen = "127.0.0.1:0"
            callback_timeout = "2s"
            quirks = { single_object = true }
            [[users]]
            name = "alice"
            token = "a"
            [[users]]
            name = "bob"
            refresh_token = "rt"
            [oauth]
            client_id = "relay"
            client_secret = "s"
            "#,
        )
        .unwrap();
        assert!(c.quirks.single_object && !c.quirks.triggered_last_timestamp);
        assert_eq!(c.callback_timeout, Duration::from_secs(2));
        c.check().unwrap();
        let mut no_oauth = c.clone();
        no_oauth.oauth = None;
        assert!(no_oauth.check().unwrap_err().to_string().contains("no [oauth]"));
        assert!(toml::from_str::<SimConfig>("colour = 1").is_err());
    }
}
