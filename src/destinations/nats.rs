//! A NATS JetStream destination: each delivery published to a subject, delivered once
//! the stream capturing it acknowledges it. `Nats-Msg-Id` is the delivery's id, so a
//! resend after a crash or a lost acknowledgement falls in the stream's duplicate
//! window and is dropped there: the stream holds each delivery once.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::transport::{connect_error, display_url, Answer, Message, Transport};
use crate::config::{RetryPolicy, Secret};
use crate::template::Template;

/// A JetStream publish per delivery to `subject` on the server at `url`.
pub(crate) struct Nats {
    url: reqwest::Url,
    password: Option<Secret>,
    credentials_file: Option<PathBuf>,
    /// A private CA's PEM file, trusted for `tls://` (else the system's CAs).
    ca_file: Option<PathBuf>,
    subject: Template,
    timeout: Duration,
    /// Connected at the first delivery, not at start (a relay starts while NATS is
    /// down); the client reconnects by itself from then on.
    context: tokio::sync::Mutex<Option<async_nats::jetstream::Context>>,
}

impl Nats {
    /// From the validated `url`, its password or credentials file, the CA to trust,
    /// and the `subject` template.
    pub(crate) fn new(
        url: reqwest::Url,
        password: Option<&Secret>,
        credentials_file: Option<PathBuf>,
        ca_file: Option<PathBuf>,
        subject: &str,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let subject = Template::parse(subject).map_err(|e| anyhow::anyhow!("subject: {e}"))?;
        Ok(Self {
            url,
            password: password.cloned(),
            credentials_file,
            ca_file,
            subject,
            timeout,
            context: Default::default(),
        })
    }

    /// The JetStream context, connected now if it is not yet.
    async fn context(&self) -> Result<async_nats::jetstream::Context, String> {
        let mut slot = self.context.lock().await;
        if let Some(c) = &*slot {
            return Ok(c.clone());
        }
        let mut options = async_nats::ConnectOptions::new()
            .name("hookrelay")
            .connection_timeout(self.timeout)
            .require_tls(self.url.scheme() == "tls");
        if let Some(ca) = &self.ca_file {
            options = options.add_root_certificates(ca.clone());
        }
        if let Some(path) = &self.credentials_file {
            options = options.credentials_file(path).await.map_err(|e| {
                format!("cannot read the NATS credentials file {}: {e}", path.display())
            })?;
        }
        if !self.url.username().is_empty() {
            let password =
                self.password.as_ref().map(|p| p.expose().to_owned()).unwrap_or_default();
            options = options.user_and_password(self.url.username().to_owned(), password);
        }
        // The server's address only: user and password were given above.
        let host = self.url.host_str().unwrap_or_default();
        let port = self.url.port().unwrap_or(4222);
        let address = format!("{}://{host}:{port}", self.url.scheme());
        let client = options.connect(address.as_str()).await.map_err(|e| {
            connect_error(format!("cannot connect to NATS at {}: {e}", self.display()))
        })?;
        let mut context = async_nats::jetstream::new(client);
        context.set_timeout(self.timeout);
        *slot = Some(context.clone());
        Ok(context)
    }
}

#[async_trait]
impl Transport for Nats {
    async fn send(&self, message: Message<'_>, _policy: &RetryPolicy) -> Answer {
        use async_nats::jetstream::context::PublishErrorKind;
        let started = Instant::now();
        let context = match self.context().await {
            Ok(c) => c,
            Err(e) => return Answer::retry(e, started.elapsed()),
        };
        let subject = self.subject.render(&message.names);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", message.id);
        for (name, value) in &message.headers {
            if let Ok(value) = value.to_str() {
                headers.insert(name.as_str(), value);
            }
        }
        let acked = match context.publish_with_headers(subject.clone(), headers, message.body).await
        {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match acked {
            Ok(ack) => {
                let again = if ack.duplicate { ", a duplicate the stream dropped" } else { "" };
                let said = format!("stream {} sequence {}{again}", ack.stream, ack.sequence);
                Answer::taken(Some(said), started.elapsed())
            }
            Err(e) => {
                let why = match e.kind() {
                    PublishErrorKind::StreamNotFound => format!(
                        "no JetStream stream captures subject {subject}: create one whose \
                         subjects include it (the relay does not)"
                    ),
                    PublishErrorKind::TimedOut => format!(
                        "publish to {subject} not acknowledged within {} (NATS unreachable?)",
                        humantime::format_duration(self.timeout)
                    ),
                    _ => format!("publish to {subject}: {e}"),
                };
                Answer::retry(why, started.elapsed())
            }
        }
    }

    fn display(&self) -> String {
        display_url(&self.url)
    }

    fn host(&self) -> Option<&str> {
        self.url.host_str()
    }
}
