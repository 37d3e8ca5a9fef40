//! `[telemetry]`: where the traces of callbacks are exported.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration;

/// Traces: a span for each callback, its dispatch and each delivery attempt, exported
/// over OTLP/HTTP (protobuf). Off until `otlp_endpoint` is set; every delivery carries a
/// W3C `traceparent` either way.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct TelemetryConfig {
    /// An OTLP/HTTP receiver (an OpenTelemetry Collector, Jaeger, Tempo, a hosted
    /// backend), such as `http://127.0.0.1:4318`: spans are posted to
    /// `{otlp_endpoint}/v1/traces`, or to the URL as given when it ends in `/v1/traces`.
    /// Unset: no spans are exported.
    #[serde(serialize_with = "super::secret::serialize_opt_url")]
    pub(crate) otlp_endpoint: Option<String>,
    /// Headers sent with each export, such as a hosted backend's API key (values are
    /// secrets: shown masked).
    #[serde(serialize_with = "super::secret::serialize_headers")]
    pub(crate) otlp_headers: BTreeMap<String, String>,
    /// Longest an export may take; a failed one is tried twice more, then its spans are
    /// dropped (counted in `hookrelay_trace_spans_total{outcome="failed"}`).
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) otlp_timeout: Duration,
    /// The spans' `service.name`.
    pub(crate) service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            otlp_headers: BTreeMap::new(),
            otlp_timeout: Duration::from_secs(10),
            service_name: "hookrelay".into(),
        }
    }
}

impl TelemetryConfig {
    /// The URL spans are posted to, if any: OTLP's rule for a base endpoint (the
    /// signal's path appended) unless the path already names the signal.
    pub(crate) fn traces_url(&self) -> Option<String> {
        let endpoint = self.otlp_endpoint.as_deref()?.trim();
        if endpoint.is_empty() {
            return None;
        }
        if endpoint.trim_end_matches('/').ends_with("/v1/traces") {
            return Some(endpoint.to_owned());
        }
        Some(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
    }

    /// What is wrong with the section, each problem by key.
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(url) = self.traces_url() {
            match reqwest::Url::parse(&url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
                _ => problems.push(format!(
                    "telemetry.otlp_endpoint: {:?} is not an absolute http(s) URL (an OTLP/HTTP \
                     receiver, such as http://127.0.0.1:4318)",
                    super::mask_url(self.otlp_endpoint.as_deref().unwrap_or_default())
                )),
            }
        }
        for (name, value) in &self.otlp_headers {
            if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err()
                || reqwest::header::HeaderValue::from_str(value).is_err()
            {
                problems.push(format!("telemetry.otlp_headers.{name}: not a valid HTTP header"));
            }
        }
        if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&self.otlp_timeout) {
            problems.push("telemetry.otlp_timeout: must be between 100ms and 60s".into());
        }
        if self.service_name.trim().is_empty() {
            problems.push("telemetry.service_name: must not be empty".into());
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_a_base_or_the_traces_url() {
        let with =
            |e: &str| TelemetryConfig { otlp_endpoint: Some(e.into()), ..Default::default() };
        assert_eq!(TelemetryConfig::default().traces_url(), None);
        assert_eq!(with("").traces_url(), None);
        assert_eq!(with("http://c:4318").traces_url().unwrap(), "http://c:4318/v1/traces");
        assert_eq!(with("http://c:4318/").traces_url().unwrap(), "http://c:4318/v1/traces");
        assert_eq!(with("https://h/otlp").traces_url().unwrap(), "https://h/otlp/v1/traces");
        assert_eq!(with("http://c/v1/traces").traces_url().unwrap(), "http://c/v1/traces");
        assert!(with("http://c:4318").problems().is_empty());
        let bad = with("ftp://user:hunter2@c").problems();
        assert!(bad[0].starts_with("telemetry.otlp_endpoint:"), "{bad:?}");
        assert!(!bad[0].contains("hunter2"), "{bad:?}");
        let mut headers = with("http://c");
        headers.otlp_headers.insert("x-api-key".into(), "bad\nvalue".into());
        headers.otlp_timeout = Duration::ZERO;
        let problems = headers.problems();
        assert!(problems.iter().any(|p| p.starts_with("telemetry.otlp_headers.x-api-key")));
        assert!(problems.iter().any(|p| p.starts_with("telemetry.otlp_timeout")));
        assert!(!problems.concat().contains("bad"), "{problems:?}");
    }
}
