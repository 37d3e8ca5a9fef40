//! Requests to one account's `/api/rest/resthooks`: bearer token, JSON:API media type,
//! one token refresh on 401, backoff on 429 / 5xx / network errors honouring
//! `Retry-After`, and a count of every request by outcome.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::credentials::Credentials;
use super::model::{self, Hook};
use super::{AccountId, UpstreamError};
use crate::config::UpstreamConfig;
use crate::internal_events::{InternalEvent, UpstreamRequest};
use crate::metrics::Metrics;

const JSON_API: &str = "application/vnd.api+json";

/// Retry settings of upstream requests.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetrySettings {
    pub(crate) max_retries: u32,
    pub(crate) initial_backoff: Duration,
    pub(crate) max_backoff: Duration,
}

impl From<&UpstreamConfig> for RetrySettings {
    fn from(c: &UpstreamConfig) -> Self {
        Self {
            max_retries: c.max_retries,
            initial_backoff: c.initial_backoff,
            max_backoff: c.max_backoff,
        }
    }
}

/// A client for one account.
pub(crate) struct AccountClient {
    pub(crate) id: AccountId,
    http: reqwest::Client,
    pub(crate) credentials: Credentials,
    api_base: Option<String>,
    page_size: u64,
    retry: RetrySettings,
    metrics: Arc<Metrics>,
}

impl AccountClient {
    pub(crate) fn new(
        id: AccountId,
        http: reqwest::Client,
        credentials: Credentials,
        api_base: Option<String>,
        page_size: u64,
        retry: RetrySettings,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self { id, http, credentials, api_base, page_size, retry, metrics }
    }

    /// Every hook of the account, following `nextPage` to the last page.
    pub(crate) async fn list(&self) -> Result<Vec<Hook>, UpstreamError> {
        let mut hooks = Vec::new();
        let mut page = 1u64;
        loop {
            let query = format!("?page={page}&pageSize={}", self.page_size);
            let body = self.send(Method::GET, &query, None).await?;
            let found = model::parse_hooks(&body)?;
            let empty = found.is_empty();
            hooks.extend(found);
            match model::next_page(&body) {
                // A page that does not advance, or an empty one, ends the walk: a
                // misbehaving upstream must not keep the reconciler looping.
                Some(next) if next > page && !empty && page < 10_000 => page = next,
                _ => return Ok(hooks),
            }
        }
    }

    /// Registers a hook; returns it as the upstream answered.
    pub(crate) async fn create(
        &self,
        event: &str,
        target_url: &str,
    ) -> Result<Hook, UpstreamError> {
        let body = json!({"resthooks": {"eventName": event, "targetUrl": target_url}});
        let answer = self.send(Method::POST, "", Some(body)).await?;
        model::parse_hooks(&answer)?
            .into_iter()
            .next()
            .ok_or_else(|| UpstreamError::Unexpected("create answered no hook".into()))
    }

    /// Deletes hooks by id; one already gone counts as deleted.
    pub(crate) async fn delete(&self, ids: &[String]) -> Result<(), UpstreamError> {
        match self.send(Method::DELETE, &format!("/{}", ids.join(",")), None).await {
            Ok(_) | Err(UpstreamError::Status { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn url(&self, path_and_query: &str) -> Result<String, UpstreamError> {
        let base = match &self.api_base {
            Some(base) => base.clone(),
            None => self.credentials.api_endpoint().await.ok_or_else(|| {
                UpstreamError::Unexpected(
                    "no api_base and the token answer named no api_endpoint".into(),
                )
            })?,
        };
        Ok(format!("{}/rest/resthooks{path_and_query}", base.trim_end_matches('/')))
    }

    fn count(&self, method: &Method, outcome: &str) {
        UpstreamRequest { account: &self.id, method: method.as_str(), outcome }.emit(&self.metrics);
    }

    /// Sends one logical request, retrying as the module doc says; the body of a 2xx.
    async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Value>,
    ) -> Result<bytes::Bytes, UpstreamError> {
        let mut attempt = 0u32;
        let mut refreshed = false;
        loop {
            let token = self.credentials.token().await.map_err(UpstreamError::Auth)?;
            let url = self.url(path_and_query).await?;
            let mut req = self
                .http
                .request(method.clone(), &url)
                .header("accept", JSON_API)
                .bearer_auth(token.expose());
            if let Some(body) = &body {
                req = req.header("content-type", JSON_API).body(body.to_string());
            }
            let request = format!("{method} {}", crate::config::mask_url(&url));
            let wait = match req.send().await {
                Err(e) => {
                    self.count(&method, "network_error");
                    let e = network_error(&request, e);
                    self.backoff(attempt, None).ok_or(e)?
                }
                Ok(response) => {
                    let status = response.status();
                    let retry_after = response
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(crate::destinations::parse_retry_after);
                    let answer = response.bytes().await.unwrap_or_default();
                    if status.is_success() {
                        self.count(&method, "ok");
                        return Ok(answer);
                    }
                    let error = UpstreamError::Status {
                        status: status.as_u16(),
                        detail: error_detail(&answer),
                        request: request.clone(),
                    };
                    if status == StatusCode::UNAUTHORIZED {
                        self.count(&method, "unauthorized");
                        if refreshed {
                            return Err(error);
                        }
                        refreshed = true;
                        self.credentials
                            .after_unauthorized(&token)
                            .await
                            .map_err(UpstreamError::Auth)?;
                        continue;
                    }
                    if status == StatusCode::TOO_MANY_REQUESTS {
                        self.count(&method, "throttled");
                        self.backoff(attempt, retry_after).ok_or(error)?
                    } else if status.is_server_error() {
                        self.count(&method, "server_error");
                        self.backoff(attempt, retry_after).ok_or(error)?
                    } else {
                        self.count(&method, "client_error");
                        return Err(error);
                    }
                }
            };
            tracing::debug!(source = %self.id.source, account = %self.id.account, %method, ?wait, "retrying upstream request");
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    fn backoff(&self, attempt: u32, retry_after: Option<Duration>) -> Option<Duration> {
        retry_delay(&self.retry, attempt, retry_after, fastrand::f64())
    }
}

/// How long to wait before retry `attempt + 1`, or `None` when retries are spent:
/// exponential (a random point, `jitter` in 0..1, in the upper half of the ceiling), or
/// `Retry-After` when longer; never more than `max_backoff`.
fn retry_delay(
    retry: &RetrySettings,
    attempt: u32,
    retry_after: Option<Duration>,
    jitter: f64,
) -> Option<Duration> {
    if attempt >= retry.max_retries {
        return None;
    }
    let ceiling =
        retry.initial_backoff.saturating_mul(2u32.saturating_pow(attempt)).min(retry.max_backoff);
    let jittered = ceiling / 2 + ceiling.mul_f64(jitter.clamp(0.0, 1.0) / 2.0);
    Some(retry_after.map_or(jittered, |ra| ra.max(jittered)).min(retry.max_backoff))
}

/// The `detail` (or `title`) of the first entry of an `errors` body, cut short.
/// What to check after an answer with `status`, as the end of a sentence.
pub(crate) fn status_hint(status: u16) -> &'static str {
    match status {
        401 => "; check the account's token or OAuth2 credentials",
        403 => "; the user lacks the permission to manage REST hooks",
        404 => "; check the account's api_base (the API's root, e.g. https://host/api)",
        429 => "; the upstream throttles this account (retried with backoff)",
        500..=599 => "; the upstream failed (retried with backoff); try again later",
        _ => "",
    }
}

/// A request that got no answer, said so that it can be acted on: the request (its URL
/// masked), what failed, every cause down to the system's (DNS, refused, TLS, reset),
/// and what to check.
fn network_error(request: &str, e: reqwest::Error) -> UpstreamError {
    let (what, hint) = if e.is_timeout() {
        (
            "timed out",
            "check that the upstream is reachable from here, or raise upstream.request_timeout",
        )
    } else if e.is_connect() {
        ("cannot connect", "check the account's api_base (host and port), DNS, and any firewall or proxy on the way")
    } else {
        ("request failed", "check the account's api_base and the network to it")
    };
    // The causes, outermost first, each once (reqwest and hyper repeat one another).
    let mut causes: Vec<String> = Vec::new();
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(&e);
    while let Some(err) = source {
        let text = err.to_string();
        if !causes.iter().any(|c| c.contains(&text) || text.contains(c.as_str())) {
            causes.push(text);
        }
        source = err.source();
    }
    let causes = if causes.is_empty() { e.without_url().to_string() } else { causes.join(": ") };
    UpstreamError::Network(format!("{request}: {what}: {causes}; {hint}"))
}

fn error_detail(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let e = &v["errors"][0];
    let text = e["detail"].as_str().or_else(|| e["title"].as_str()).unwrap_or("");
    text.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_grow_honour_retry_after_and_stop() {
        let r = RetrySettings {
            max_retries: 3,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(10),
        };
        let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
        assert_eq!(secs(retry_delay(&r, 0, None, 1.0)), Some(0.5));
        assert_eq!(secs(retry_delay(&r, 0, None, 0.0)), Some(0.25));
        assert_eq!(secs(retry_delay(&r, 2, None, 1.0)), Some(2.0));
        assert_eq!(secs(retry_delay(&r, 0, Some(Duration::from_secs(3)), 1.0)), Some(3.0));
        assert_eq!(secs(retry_delay(&r, 1, Some(Duration::from_secs(3600)), 0.5)), Some(10.0));
        assert_eq!(retry_delay(&r, 3, Some(Duration::from_secs(1)), 0.5), None);
    }

    /// A refused connection names the request, the system's cause and what to check.
    #[tokio::test]
    async fn a_network_error_says_where_why_and_what_to_check() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}/api/rest/resthooks?api_key=SECRET");
        let e = reqwest::Client::new().get(&url).send().await.unwrap_err();
        let request = format!("GET {}", crate::config::mask_url(&url));
        let text = network_error(&request, e).to_string();
        assert!(
            text.starts_with(&format!("GET http://127.0.0.1:{port}/api/rest/resthooks")),
            "{text}"
        );
        assert!(!text.contains("SECRET"), "{text}");
        assert!(
            text.contains("cannot connect") && text.to_lowercase().contains("refused"),
            "{text}"
        );
        assert!(text.contains("check the account's api_base"), "{text}");
        let status =
            UpstreamError::Status { status: 403, detail: "no".into(), request: "GET u".into() };
        assert_eq!(
            status.to_string(),
            "GET u answered 403: no; the user lacks the permission to manage REST hooks"
        );
    }

    #[test]
    fn error_detail_reads_the_errors_body() {
        assert_eq!(
            error_detail(br#"{"errors":[{"status":"400","detail":"bad eventName"}]}"#),
            "bad eventName"
        );
        assert_eq!(error_detail(br#"{"errors":[{"title":"Forbidden"}]}"#), "Forbidden");
        assert_eq!(error_detail(b"<html>"), "");
    }
}
