//! One delivery attempt over HTTP, and what its answer means.

use std::time::{Duration, Instant, SystemTime};

use reqwest::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};

use super::Destination;
use crate::config::RetryPolicy;

/// How much of an answer's body is kept for diagnosis.
const EXCERPT_BYTES: usize = 512;

/// What is sent.
pub(crate) struct Request<'a> {
    pub(crate) webhook_id: &'a str,
    pub(crate) source: &'a str,
    pub(crate) event: &'a str,
    pub(crate) content_type: Option<&'a str>,
    pub(crate) body: bytes::Bytes,
    /// 1 for the first attempt.
    pub(crate) attempt: u32,
    /// The attempt's W3C trace context: the consumer's spans join the event's trace.
    pub(crate) traceparent: &'a str,
}

/// What an answer (or its absence) means for the delivery: the lifecycle's own type.
pub(crate) use crate::store::lifecycle::AnswerClass;

/// The result of one attempt.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) class: AnswerClass,
    pub(crate) status: Option<u16>,
    pub(crate) error: Option<String>,
    pub(crate) excerpt: Option<String>,
    pub(crate) duration: Duration,
}

impl Destination {
    /// Sends one attempt and classifies the answer. Never fails: every failure is an
    /// [`Answer`] too.
    pub(crate) async fn send(&self, client: &reqwest::Client, req: Request<'_>) -> Answer {
        let started = Instant::now();
        let timestamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let mut builder = client
            .post(self.url.clone())
            .timeout(self.timeout)
            .headers(self.headers.clone())
            .header("webhook-id", req.webhook_id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("hookrelay-event", req.event)
            .header("hookrelay-source", req.source)
            .header("hookrelay-attempt", req.attempt.to_string())
            .header("traceparent", req.traceparent);
        if let Some(ct) = req.content_type.and_then(|c| HeaderValue::from_str(c).ok()) {
            builder = builder.header(CONTENT_TYPE, ct);
        }
        if let Some(signer) = &self.signer {
            builder = builder
                .header("webhook-signature", signer.sign(req.webhook_id, timestamp, &req.body));
        }
        match builder.body(req.body).send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let retry_after = resp
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(parse_retry_after);
                let excerpt = excerpt(resp).await;
                let class = classify(status, retry_after, &self.retry);
                let error = (class != AnswerClass::Success).then(|| format!("HTTP {status}"));
                Answer { class, status: Some(status), error, excerpt, duration: started.elapsed() }
            }
            Err(e) => {
                // The URL may hold credentials: never part of the message.
                let kind = if e.is_timeout() {
                    "timeout"
                } else if e.is_connect() {
                    "connection failed"
                } else {
                    "request failed"
                };
                let detail = e.without_url();
                Answer {
                    class: AnswerClass::Retry { retry_after: None },
                    status: None,
                    error: Some(format!("{kind}: {}", error_chain(&detail))),
                    excerpt: None,
                    duration: started.elapsed(),
                }
            }
        }
    }
}

/// The class of an answer, from its HTTP status.
pub(crate) fn classify(
    status: u16,
    retry_after: Option<Duration>,
    policy: &RetryPolicy,
) -> AnswerClass {
    match status {
        200..=299 => AnswerClass::Success,
        410 => AnswerClass::Gone,
        408 | 429 | 500..=599 => AnswerClass::Retry { retry_after },
        s if policy.retryable_statuses.contains(&s) => AnswerClass::Retry { retry_after },
        _ => AnswerClass::Permanent,
    }
}

/// `Retry-After`: delay-seconds or an HTTP date.
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO))
}

async fn excerpt(mut resp: reqwest::Response) -> Option<String> {
    let mut buf = Vec::new();
    while buf.len() < EXCERPT_BYTES {
        match resp.chunk().await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk),
            _ => break,
        }
    }
    buf.truncate(EXCERPT_BYTES);
    (!buf.is_empty()).then(|| String::from_utf8_lossy(&buf).into_owned())
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified_as_the_issue_says() {
        let policy = RetryPolicy::default();
        assert_eq!(classify(200, None, &policy), AnswerClass::Success);
        assert_eq!(classify(204, None, &policy), AnswerClass::Success);
        for s in [408, 429, 500, 502, 503, 599] {
            assert!(matches!(classify(s, None, &policy), AnswerClass::Retry { .. }), "{s}");
        }
        for s in [301, 400, 401, 403, 404, 409, 422] {
            assert_eq!(classify(s, None, &policy), AnswerClass::Permanent, "{s}");
        }
        assert_eq!(classify(410, None, &policy), AnswerClass::Gone);
        let custom = RetryPolicy { retryable_statuses: vec![409], ..RetryPolicy::default() };
        assert!(matches!(classify(409, None, &custom), AnswerClass::Retry { .. }));
        assert_eq!(classify(429, None, &custom), AnswerClass::Retry { retry_after: None });
    }

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        assert_eq!(parse_retry_after("120"), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after(" 0 "), Some(Duration::ZERO));
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(90));
        let d = parse_retry_after(&later).unwrap();
        assert!(d > Duration::from_secs(80) && d <= Duration::from_secs(90), "{d:?}");
        let past = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(90));
        assert_eq!(parse_retry_after(&past), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon"), None);
    }
}
