//! Destinations: the downstream consumers, and how a request to one is built, signed
//! and judged. Scheduling and retries live in `delivery/`.

mod http;
mod signature;

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::config::{DeliveryConfig, DestinationConfig, RetryPolicy};

pub(crate) use http::{parse_retry_after, AnswerClass, Request};
use signature::Signer;

/// A destination as the delivery workers use it.
pub(crate) struct Destination {
    pub(crate) name: String,
    url: reqwest::Url,
    headers: HeaderMap,
    signer: Option<Signer>,
    pub(crate) timeout: Duration,
    pub(crate) max_concurrency: usize,
    pub(crate) retry: RetryPolicy,
    pub(crate) rate_limit: Option<f64>,
    /// The `filter` choosing the events sent (applied by dispatch; a replay asks it
    /// again), if any.
    pub(crate) filter: Option<std::sync::Arc<crate::shape::program::Program>>,
    /// The `transform` giving the body sent, if any.
    pub(crate) transform: Option<std::sync::Arc<crate::shape::program::Program>>,
}

impl Destination {
    /// The host requests go to (a span's `server.address`): never the whole URL, which
    /// may hold a password or a token.
    pub(crate) fn host(&self) -> Option<&str> {
        self.url.host_str()
    }

    /// Builds a destination from its validated config.
    pub(crate) fn new(
        config: &DestinationConfig,
        defaults: &DeliveryConfig,
    ) -> anyhow::Result<Self> {
        let url = reqwest::Url::parse(&config.url)
            .map_err(|e| anyhow::anyhow!("destination {}: url: {e}", config.name))?;
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            headers.insert(HeaderName::from_bytes(name.as_bytes())?, HeaderValue::from_str(value)?);
        }
        // Checked whole by `shape::check` when the config was loaded.
        let shape =
            crate::shape::Shape::compile(config.filter.as_deref(), config.transform.as_deref())
                .map_err(|errors| {
                    let (which, e) = &errors[0];
                    anyhow::anyhow!("destination {}: {which}: {e}", config.name)
                })?;
        Ok(Self {
            name: config.name.clone(),
            url,
            headers,
            signer: config.resolved_secret.as_ref().and_then(Signer::from_secret),
            filter: shape.filter,
            transform: shape.transform,
            timeout: config.timeout.unwrap_or(defaults.timeout),
            max_concurrency: config.max_concurrency.unwrap_or(defaults.max_concurrency),
            retry: config.retry_policy(&defaults.retry),
            rate_limit: config.rate_limit,
        })
    }
}

impl Destination {
    /// The URL without credentials or query (which may hold secrets), for display.
    pub(crate) fn display_url(&self) -> String {
        let mut u = self.url.clone();
        let _ = u.set_username("");
        let _ = u.set_password(None);
        u.set_query(None);
        u.to_string()
    }
}

/// The HTTP client every destination shares: connection pools per host, no
/// redirects (a redirected POST would become a GET), rustls.
pub(crate) fn client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("hookrelay/", env!("CARGO_PKG_VERSION")))
        .pool_idle_timeout(Duration::from_secs(60))
        .build()
}
