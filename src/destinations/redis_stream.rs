//! A Redis Streams destination: each delivery an `XADD` to a stream, its fields the
//! delivery's id, the relay's headers and the body. Delivered once Redis answers with
//! the entry's id; how durable that is, Redis's own persistence says (docs/destinations.md).

use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::transport::{connect_error, display_url, Answer, Message, Transport};
use crate::config::{RetryPolicy, Secret};
use crate::template::Template;

/// An `XADD` per delivery to `stream` on the server at `url`.
pub(crate) struct RedisStream {
    url: reqwest::Url,
    client: redis::Client,
    stream: Template,
    max_len: Option<u64>,
    timeout: Duration,
    /// Connected at the first delivery, not at start: a relay starts while Redis is
    /// down, and its deliveries wait. The manager reconnects by itself from then on.
    connection: tokio::sync::Mutex<Option<ConnectionManager>>,
}

impl RedisStream {
    /// From the validated `url`, its `password`, the CA to trust (PEM, for
    /// `rediss://`; else the public CAs) and the `stream` template.
    pub(crate) fn new(
        url: reqwest::Url,
        password: Option<&Secret>,
        ca_pem: Option<String>,
        stream: &str,
        max_len: Option<u64>,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        use redis::IntoConnectionInfo;
        let mut info = url
            .as_str()
            .into_connection_info()
            .map_err(|e| anyhow::anyhow!("url: not a Redis URL ({:?})", e.kind()))?;
        if let Some(password) = password {
            let redis = info.redis_settings().clone().set_password(password.expose());
            info = info.set_redis_settings(redis);
        }
        let client = match ca_pem {
            None => redis::Client::open(info),
            Some(pem) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates { client_tls: None, root_cert: Some(pem.into_bytes()) },
            ),
        }
        .map_err(|e| anyhow::anyhow!("url: not a Redis URL ({:?})", e.kind()))?;
        let stream = Template::parse(stream).map_err(|e| anyhow::anyhow!("stream: {e}"))?;
        Ok(Self { url, client, stream, max_len, timeout, connection: Default::default() })
    }

    /// The connection, made now if there is none yet.
    async fn connection(&self) -> Result<ConnectionManager, String> {
        let mut slot = self.connection.lock().await;
        if let Some(c) = &*slot {
            return Ok(c.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(1);
        let made = ConnectionManager::new_with_config(self.client.clone(), config)
            .await
            .map_err(|e| format!("cannot connect to Redis at {}: {}", self.display(), said(&e)))?;
        *slot = Some(made.clone());
        Ok(made)
    }
}

/// What Redis said (its errors name no URL, so no password), and whether it was
/// reached at all.
fn said(e: &redis::RedisError) -> String {
    if e.is_timeout() {
        format!("{e} (timed out)")
    } else if e.to_string().contains("invalid peer certificate") {
        connect_error(e.to_string())
    } else if e.is_io_error() || e.is_connection_refusal() {
        format!("{e} (unreachable)")
    } else {
        e.to_string()
    }
}

#[async_trait]
impl Transport for RedisStream {
    async fn send(&self, message: Message<'_>, _policy: &RetryPolicy) -> Answer {
        let started = Instant::now();
        let mut conn = match self.connection().await {
            Ok(c) => c,
            Err(e) => return Answer::retry(e, started.elapsed()),
        };
        let key = self.stream.render(&message.names);
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&key);
        if let Some(n) = self.max_len {
            cmd.arg("MAXLEN").arg("~").arg(n);
        }
        cmd.arg("*").arg("id").arg(message.id);
        for (name, value) in &message.headers {
            cmd.arg(name.as_str()).arg(value.as_bytes());
        }
        cmd.arg("body").arg(message.body.as_ref());
        match cmd.query_async::<String>(&mut conn).await {
            Ok(entry) => Answer::taken(Some(format!("{key} {entry}")), started.elapsed()),
            Err(e) => {
                if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
                    // Connect afresh next time: the manager's own reconnection gives up
                    // while Redis is down and answers its stored error once more after
                    // Redis is back, which would fail the circuit's probe for nothing.
                    *self.connection.lock().await = None;
                }
                Answer::retry(format!("XADD to {key}: {}", said(&e)), started.elapsed())
            }
        }
    }

    /// No answer in time: connect afresh next time.
    async fn no_answer(&self, _started: Instant) {
        *self.connection.lock().await = None;
    }

    fn display(&self) -> String {
        display_url(&self.url)
    }

    fn host(&self) -> Option<&str> {
        self.url.host_str()
    }
}
