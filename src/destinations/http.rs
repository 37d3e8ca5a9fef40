//! One delivery attempt over HTTP, and what its answer means.

use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use reqwest::header::RETRY_AFTER;

use super::transport::{display_url, error_chain, Answer, Message, Transport};
use crate::config::RetryPolicy;

/// How much of an answer's body is kept for diagnosis.
const EXCERPT_BYTES: usize = 512;

/// What an answer (or its absence) means for the delivery: the lifecycle's own type.
pub(crate) use crate::store::lifecycle::AnswerClass;

/// A POST to the destination's URL, answered 2xx.
pub(crate) struct Http {
    pub(super) client: reqwest::Client,
    pub(super) url: reqwest::Url,
    pub(super) timeout: Duration,
}

#[async_trait]
impl Transport for Http {
    async fn send(&self, message: Message<'_>, policy: &RetryPolicy) -> Answer {
        let started = Instant::now();
        let builder = self
            .client
            .post(self.url.clone())
            .timeout(self.timeout)
            .headers(message.headers)
            .body(message.body);
        match builder.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let retry_after = resp
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(parse_retry_after);
                let excerpt = excerpt(resp).await;
                let class = classify(status, retry_after, policy);
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
                Answer::retry(format!("{kind}: {}", error_chain(&detail)), started.elapsed())
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
