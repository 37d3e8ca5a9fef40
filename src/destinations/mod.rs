//! Destinations: the downstream consumers, and how a request to one is built, signed
//! and judged. Scheduling and retries live in `delivery/`.

mod amqp;
mod http;
mod nats;
mod redis_stream;
mod signature;
pub(crate) mod transport;

use std::time::{Duration, Instant, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};

use crate::config::{DeliveryConfig, DestinationConfig, DestinationKind, RetryPolicy};

pub(crate) use http::{parse_retry_after, AnswerClass};
use signature::Signer;
pub(crate) use transport::{Answer, Message, Transport};

/// What the worker asks to send.
pub(crate) struct Request<'a> {
    pub(crate) webhook_id: &'a str,
    pub(crate) source: &'a str,
    pub(crate) event: &'a str,
    /// The resource the event is about (`actions/5`), if its body names one.
    pub(crate) resource: Option<&'a str>,
    pub(crate) content_type: Option<&'a str>,
    pub(crate) body: bytes::Bytes,
    /// 1 for the first attempt.
    pub(crate) attempt: u32,
    /// The attempt's W3C trace context: the consumer's spans join the event's trace.
    pub(crate) traceparent: &'a str,
}

/// A destination as the delivery workers use it.
pub(crate) struct Destination {
    pub(crate) name: String,
    pub(crate) kind: DestinationKind,
    transport: Box<dyn Transport>,
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
    /// pull: the token its consumer sends.
    pub(crate) pull_token: Option<crate::config::Secret>,
    /// Its order: an ordered destination's record may make the next delivery due.
    pub(crate) ordering: crate::config::Ordering,
}

impl Destination {
    /// The host messages go to (a span's `server.address`): never the whole URL,
    /// which may hold a password or a token.
    pub(crate) fn host(&self) -> Option<&str> {
        self.transport.host()
    }

    /// Builds a destination from its validated config; `client` is the HTTP client
    /// every http destination shares.
    pub(crate) fn new(
        config: &DestinationConfig,
        defaults: &DeliveryConfig,
        client: &reqwest::Client,
    ) -> anyhow::Result<Self> {
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
        let timeout = config.timeout.unwrap_or(defaults.timeout);
        let url = || {
            reqwest::Url::parse(&config.url)
                .map_err(|e| anyhow::anyhow!("destination {}: url: {e}", config.name))
        };
        // A private CA's certificates, read now: at start and at each reload.
        let ca_pem = config
            .ca_file
            .as_ref()
            .map(|path| {
                std::fs::read_to_string(path).map_err(|e| {
                    anyhow::anyhow!("destination {}: ca_file {}: {e}", config.name, path.display())
                })
            })
            .transpose()?;
        let transport: Box<dyn Transport> = match config.kind {
            DestinationKind::Http => {
                Box::new(http::Http { client: client.clone(), url: url()?, timeout })
            }
            DestinationKind::Nats => Box::new(
                nats::Nats::new(
                    url()?,
                    config.resolved_password.as_ref(),
                    config.credentials_file.clone(),
                    config.ca_file.clone(),
                    config.subject.as_deref().unwrap_or_default(),
                    timeout,
                )
                .map_err(|e| anyhow::anyhow!("destination {}: {e}", config.name))?,
            ),
            DestinationKind::RedisStream => Box::new(
                redis_stream::RedisStream::new(
                    url()?,
                    config.resolved_password.as_ref(),
                    ca_pem,
                    config.stream.as_deref().unwrap_or_default(),
                    config.max_len,
                    timeout,
                )
                .map_err(|e| anyhow::anyhow!("destination {}: {e}", config.name))?,
            ),
            DestinationKind::Amqp => Box::new(
                amqp::Amqp::new(
                    url()?,
                    config.resolved_password.as_ref(),
                    ca_pem,
                    config.exchange.as_deref().unwrap_or_default(),
                    config.routing_key.as_deref(),
                )
                .map_err(|e| anyhow::anyhow!("destination {}: {e}", config.name))?,
            ),
            DestinationKind::Pull => Box::new(transport::Held),
        };
        Ok(Self {
            name: config.name.clone(),
            kind: config.kind,
            transport,
            headers,
            signer: config.resolved_secret.as_ref().and_then(Signer::from_secret),
            filter: shape.filter,
            transform: shape.transform,
            timeout,
            max_concurrency: config.max_concurrency.unwrap_or(defaults.max_concurrency),
            retry: config.retry_policy(&defaults.retry),
            rate_limit: config.rate_limit,
            pull_token: config.resolved_token.clone(),
            ordering: config.ordering,
        })
    }

    /// The id of `event`'s delivery here (`webhook-id`, a broker's message id, a pull
    /// lease's `delivery_id`): the same on every attempt, by any relay, so that
    /// consumers and brokers drop a resend by it.
    pub(crate) fn delivery_id(&self, event: crate::store::EventId) -> String {
        format!("evt_{event}_{}", self.name)
    }

    /// Where messages go, for display: no password, no query.
    pub(crate) fn display_url(&self) -> String {
        self.transport.display()
    }

    /// The message of one attempt: the relay's headers (signed now), the configured
    /// ones and the body; what every kind sends, and what a pull consumer leases.
    pub(crate) fn message<'a>(&self, req: Request<'a>) -> Message<'a> {
        let timestamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let mut headers = self.headers.clone();
        let mut put = |name: &'static str, value: &str| {
            if let Ok(v) = HeaderValue::from_str(value) {
                headers.insert(HeaderName::from_static(name), v);
            }
        };
        put("webhook-id", req.webhook_id);
        put("webhook-timestamp", &timestamp.to_string());
        put("hookrelay-event", req.event);
        put("hookrelay-source", req.source);
        put("hookrelay-attempt", &req.attempt.to_string());
        put("traceparent", req.traceparent);
        if let Some(signer) = &self.signer {
            put("webhook-signature", &signer.sign(req.webhook_id, timestamp, &req.body));
        }
        if let Some(ct) = req.content_type.and_then(|c| HeaderValue::from_str(c).ok()) {
            headers.insert(CONTENT_TYPE, ct);
        }
        Message {
            headers,
            body: req.body,
            id: req.webhook_id,
            names: crate::template::Values {
                event: req.event,
                source: req.source,
                resource_type: crate::template::resource_type(req.resource),
            },
        }
    }

    /// Sends one attempt and classifies the answer, within the destination's
    /// `timeout`. Never fails: every failure is an [`Answer`] too.
    pub(crate) async fn send(&self, req: Request<'_>) -> Answer {
        let started = Instant::now();
        let message = self.message(req);
        let sent = self.transport.send(message, &self.retry);
        match tokio::time::timeout(self.timeout, sent).await {
            Ok(answer) => answer,
            Err(_) => {
                self.transport.no_answer(started).await;
                Answer::retry(
                    format!(
                        "timeout: no answer within {}",
                        humantime::format_duration(self.timeout)
                    ),
                    started.elapsed(),
                )
            }
        }
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
