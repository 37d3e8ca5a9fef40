//! A RabbitMQ (AMQP 0-9-1) destination: each delivery published to an exchange with
//! a routing key, persistent and `mandatory`, on a channel in confirm mode. Delivered
//! once the broker confirms it: a nack, a message returned as unroutable, a publish
//! not confirmed within the timeout (a disk or memory alarm blocks publishers) is a
//! failed attempt, retried, with the reason.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use async_trait::async_trait;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

use super::transport::{connect_error, display_url, Answer, Message, Transport};
use crate::config::{RetryPolicy, Secret};
use crate::template::Template;

/// A confirmed publish per delivery to `exchange` on the broker at `url`.
pub(crate) struct Amqp {
    url: reqwest::Url,
    password: Option<Secret>,
    /// A private CA's certificates (PEM), trusted for `amqps://` (besides the public
    /// CAs, as lapin does).
    ca_pem: Option<String>,
    exchange: String,
    routing_key: Template,
    /// Opened at the first delivery, not at start (a relay starts while RabbitMQ is
    /// down); opened again after a failure closed it.
    link: tokio::sync::Mutex<Option<Link>>,
}

/// One connection and its confirm-mode channel, shared by the attempts in flight.
struct Link {
    conn: Connection,
    channel: Channel,
    /// Why the relay closed this link, set once when it did. Attempts still in flight
    /// on it then fail with lapin's bare "invalid connection state: Closed"; they say
    /// this instead, the reason an operator can act on (a broker's alarm that let a
    /// publish time out, say), not the relay's own close.
    closed: Arc<OnceLock<String>>,
    /// When the attempt that opened it started. An attempt uses the link there is
    /// when it starts, or opens one, so one that times out closes only a link whose
    /// opener started no later than itself: not one opened since by a later attempt.
    opener_started: Instant,
}

impl Amqp {
    /// From the validated `url`, its password, the CA to trust, the `exchange` and the
    /// `routing_key` template (default `{event}`).
    pub(crate) fn new(
        url: reqwest::Url,
        password: Option<&Secret>,
        ca_pem: Option<String>,
        exchange: &str,
        routing_key: Option<&str>,
    ) -> anyhow::Result<Self> {
        let routing_key = Template::parse(routing_key.unwrap_or("{event}"))
            .map_err(|e| anyhow::anyhow!("routing_key: {e}"))?;
        Ok(Self {
            url,
            password: password.cloned(),
            ca_pem,
            exchange: exchange.to_owned(),
            routing_key,
            link: Default::default(),
        })
    }

    /// The channel in confirm mode, opened now (for an attempt `started` then) if there
    /// is none that is open, and its link's close reason (a token for [`Amqp::forget`]).
    async fn channel(&self, started: Instant) -> Result<(Channel, Arc<OnceLock<String>>), String> {
        let mut slot = self.link.lock().await;
        if let Some(link) = &*slot {
            if link.conn.status().connected() && link.channel.status().connected() {
                return Ok((link.channel.clone(), link.closed.clone()));
            }
        }
        *slot = None;
        let mut uri: lapin::uri::AMQPUri = self
            .url
            .as_str()
            .parse()
            .map_err(|e| format!("{} is not an AMQP URL: {e}", self.display()))?;
        if let Some(password) = &self.password {
            uri.authority.userinfo.password = password.expose().to_owned();
        }
        let props = ConnectionProperties::default().with_connection_name("hookrelay".into());
        let tls = lapin::tcp::OwnedTLSConfig { identity: None, cert_chain: self.ca_pem.clone() };
        let runtime = lapin::runtime::default_runtime()
            .map_err(|e| format!("cannot connect to RabbitMQ at {}: {e}", self.display()))?;
        let conn =
            Connection::connect_uri_with_config(uri, props, tls, runtime).await.map_err(|e| {
                connect_error(format!("cannot connect to RabbitMQ at {}: {e}", self.display()))
            })?;
        let opened = async {
            let channel = conn
                .create_channel()
                .await
                .map_err(|e| format!("cannot open a channel on {}: {e}", self.display()))?;
            channel.confirm_select(ConfirmSelectOptions::default()).await.map_err(|e| {
                format!("cannot turn publisher confirms on at {}: {e}", self.display())
            })?;
            Ok::<_, String>(channel)
        };
        let channel = match opened.await {
            Ok(channel) => channel,
            Err(e) => {
                close_aside(conn);
                return Err(e);
            }
        };
        let closed = Arc::new(OnceLock::new());
        *slot = Some(Link {
            conn,
            channel: channel.clone(),
            closed: closed.clone(),
            opener_started: started,
        });
        Ok((channel, closed))
    }

    /// Forgets the link, if `is_it` says it is the one an attempt failed on, after a
    /// failure, saying `why`: the next attempt opens another (a publish to a missing
    /// exchange closes the channel; an outage, the connection). A link opened since by
    /// another attempt is left alone: closing it would fail that attempt's publishes
    /// for nothing.
    async fn forget(&self, is_it: impl FnOnce(&Link) -> bool, why: String) {
        let taken = {
            let mut slot = self.link.lock().await;
            match &*slot {
                Some(link) if is_it(link) => slot.take(),
                _ => None,
            }
        };
        if let Some(Link { conn, closed, .. }) = taken {
            let _ = closed.set(why);
            close_aside(conn);
        }
    }
}

/// Closes `conn` on a task of its own, for at most 5 s: a dead connection never
/// answers the close.
fn close_aside(conn: Connection) {
    tokio::spawn(async move {
        let close = conn.close(200, "reopening".into());
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), close).await;
    });
}

/// `message`'s headers as AMQP headers (long strings).
fn headers(message: &Message<'_>) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in &message.headers {
        table.insert(
            ShortString::from(name.as_str().to_owned()),
            AMQPValue::LongString(LongString::from(value.as_bytes().to_vec())),
        );
    }
    table
}

#[async_trait]
impl Transport for Amqp {
    async fn send(&self, message: Message<'_>, _policy: &RetryPolicy) -> Answer {
        let started = Instant::now();
        // A link that could not be opened was never kept: nothing to forget.
        let (channel, closed) = match self.channel(started).await {
            Ok(c) => c,
            Err(e) => return Answer::retry(e, started.elapsed()),
        };
        let key = self.routing_key.render(&message.names);
        let timestamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(ShortString::from(message.id.to_owned()))
            .with_timestamp(timestamp)
            .with_app_id("hookrelay".into())
            .with_headers(headers(&message));
        if let Some(ct) = message.headers.get(reqwest::header::CONTENT_TYPE) {
            if let Ok(ct) = ct.to_str() {
                props = props.with_content_type(ShortString::from(ct.to_owned()));
            }
        }
        let options = BasicPublishOptions { mandatory: true, ..Default::default() };
        let exchange = ShortString::from(self.exchange.clone());
        let published = channel
            .basic_publish(exchange, ShortString::from(key.clone()), options, &message.body, props)
            .await;
        let confirmed = match published {
            Ok(confirm) => confirm.await,
            Err(e) => Err(e),
        };
        let on = |what: &str| {
            let exchange = if self.exchange.is_empty() { "(default)" } else { &self.exchange };
            format!("{what} (exchange {exchange}, routing key {key})")
        };
        match confirmed {
            Ok(Confirmation::Ack(None)) => Answer::taken(Some(on("confirmed")), started.elapsed()),
            Ok(Confirmation::Ack(Some(returned))) => Answer::retry(
                on(&format!(
                    "returned unroutable: {} {}: bind a queue that takes this routing key",
                    returned.reply_code,
                    returned.reply_text.as_str()
                )),
                started.elapsed(),
            ),
            Ok(Confirmation::Nack(_)) => {
                Answer::retry(on("refused by the broker (nack)"), started.elapsed())
            }
            Ok(Confirmation::NotRequested) => {
                let said = on("not confirmed (confirm mode was off)");
                self.forget(|l| Arc::ptr_eq(&l.closed, &closed), said.clone()).await;
                Answer::retry(said, started.elapsed())
            }
            Err(e) => {
                let said = match closed.get() {
                    Some(why) => {
                        on(&format!("not confirmed: the relay closed the connection: {why}"))
                    }
                    None => on(&format!("publish failed: {e}")),
                };
                self.forget(|l| Arc::ptr_eq(&l.closed, &closed), said.clone()).await;
                Answer::retry(said, started.elapsed())
            }
        }
    }

    /// A publish or its confirm that never came: the connection is closed and
    /// opened again next time (one dead behind a restarted broker would otherwise
    /// hold every attempt until its heartbeat noticed, a minute or more). The
    /// attempts still in flight on it say so ([`Link::closed`]).
    async fn no_answer(&self, started: Instant) {
        let why = "timeout: a publish got no confirm within the destination's timeout \
                   (a disk or memory alarm blocks publishers; or the broker is unreachable)";
        self.forget(|l| l.opener_started <= started, why.to_owned()).await;
    }

    fn display(&self) -> String {
        display_url(&self.url)
    }

    fn host(&self) -> Option<&str> {
        self.url.host_str()
    }
}
