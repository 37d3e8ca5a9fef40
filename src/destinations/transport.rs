//! The one thing a destination's kind decides: how a message is sent and what the
//! other side's answer means. Everything else (the lifecycle, retries, the circuit,
//! order, filters, transforms, dead letters) is the same code for every kind.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use reqwest::header::HeaderMap;

use crate::config::RetryPolicy;
use crate::store::lifecycle::AnswerClass;

/// What every kind sends: the headers (the relay's own, `webhook-id`,
/// `webhook-timestamp`, `webhook-signature`, `hookrelay-*`, `traceparent` and
/// `content-type`, then the configured ones) and the body, with the names a broker's
/// subject, key or stream is made of.
pub(crate) struct Message<'a> {
    pub(crate) headers: HeaderMap,
    pub(crate) body: bytes::Bytes,
    /// The delivery's id (`webhook-id`): the same on every attempt, by any relay, so
    /// that a broker's duplicate window (`Nats-Msg-Id`) and consumers drop a resend.
    pub(crate) id: &'a str,
    pub(crate) names: crate::template::Values<'a>,
}

/// The result of one attempt, whatever the kind.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) class: AnswerClass,
    /// The HTTP status (http only).
    pub(crate) status: Option<u16>,
    /// Why it failed, in words that name no secret.
    pub(crate) error: Option<String>,
    /// The start of what the other side answered, for diagnosis.
    pub(crate) excerpt: Option<String>,
    pub(crate) duration: Duration,
}

impl Answer {
    /// An attempt to retry: the other side did not take the message (unreachable,
    /// refused, timed out, not confirmed), for `error`.
    pub(crate) fn retry(error: String, duration: Duration) -> Self {
        Self {
            class: AnswerClass::Retry { retry_after: None },
            status: None,
            error: Some(error),
            excerpt: None,
            duration,
        }
    }

    /// The other side has the message.
    pub(crate) fn taken(excerpt: Option<String>, duration: Duration) -> Self {
        Self { class: AnswerClass::Success, status: None, error: None, excerpt, duration }
    }
}

/// How a kind sends. `send` never fails: every failure is an [`Answer`] too, one to
/// retry unless retrying cannot help.
#[async_trait]
pub(crate) trait Transport: Send + Sync {
    /// Sends `message` once; `policy` for the kinds whose answers it classifies.
    async fn send(&self, message: Message<'_>, policy: &RetryPolicy) -> Answer;
    /// An attempt got no answer within the destination's timeout: a connection kept
    /// for the next attempts may be dead without knowing it yet (a broker restarted
    /// behind it), so a kind that keeps one opens another next time. `started`: when
    /// that attempt began, for a kind that tells its connections apart by age.
    async fn no_answer(&self, _started: Instant) {}
    /// Where messages go, for the console and the API: no password, no query.
    fn display(&self) -> String;
    /// The host messages go to (a span's `server.address`).
    fn host(&self) -> Option<&str>;
}

/// A pull destination's: nothing is sent, its consumer leases (`pull/`). Its worker
/// never runs, so this answers only if something asks it by mistake.
pub(crate) struct Held;

#[async_trait]
impl Transport for Held {
    async fn send(&self, _message: Message<'_>, _policy: &RetryPolicy) -> Answer {
        Answer::retry(
            "a pull destination is not sent to: its consumer leases".into(),
            Duration::ZERO,
        )
    }

    fn display(&self) -> String {
        "(pulled by its consumer)".into()
    }

    fn host(&self) -> Option<&str> {
        None
    }
}

/// The chain of `e`'s causes in one line.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A broker's connection error, with what to do when it is the certificate check
/// (rustls says `invalid peer certificate: UnknownIssuer` and the like).
pub(crate) fn connect_error(said: String) -> String {
    if said.contains("invalid peer certificate") {
        format!(
            "{said}: the server's TLS certificate is not trusted; give the CA that signed \
             it by ca_file (and check that it names the URL's host)"
        )
    } else {
        said
    }
}

/// `url` without its user's password and its query (which may hold secrets).
pub(crate) fn display_url(url: &reqwest::Url) -> String {
    let mut u = url.clone();
    let _ = u.set_password(None);
    if url.scheme().starts_with("http") {
        let _ = u.set_username("");
    }
    u.set_query(None);
    u.to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_certificate_refused_says_to_give_the_ca() {
        let said = super::connect_error("io error: invalid peer certificate: UnknownIssuer".into());
        assert!(said.contains("give the CA that signed it by ca_file"), "{said}");
        assert_eq!(super::connect_error("connection refused".into()), "connection refused");
    }
}
