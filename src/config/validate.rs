//! Whole-config checks. Every problem names its key (`sources[1].name: ...`), and all
//! of them are reported at once.

use std::collections::HashSet;
use std::time::Duration;

use base64::Engine;

use super::{Config, DestinationConfig, EnvLookup, RetryPolicy, SecretSpec};
use crate::event_names;

/// Source names appear in URLs and metric labels: keep them short and plain.
const MAX_SOURCE_NAME: usize = 64;
/// Tokens are the only thing that authenticates a callback: refuse guessable ones.
pub(crate) const MIN_TOKEN_LEN: usize = 16;
const MAX_BODY_LIMIT: u64 = 1024 * 1024 * 1024;

impl Config {
    /// Resolves every secret and checks every value, collecting all problems.
    pub(crate) fn validate(&mut self, env: EnvLookup<'_>) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();

        if self.ingress.max_body_bytes == 0 || self.ingress.max_body_bytes > MAX_BODY_LIMIT {
            problems.push(format!(
                "ingress.max_body_bytes: must be between 1 and {MAX_BODY_LIMIT} (1 GiB)"
            ));
        }
        // Port 0 ("pick a free port") is fine for both.
        if self.ingress.listen == self.admin.listen && self.ingress.listen.port() != 0 {
            problems.push(format!(
                "admin.listen: must differ from ingress.listen ({})",
                self.ingress.listen
            ));
        }

        let destinations: Vec<String> = self.destinations.iter().map(|d| d.name.clone()).collect();
        self.admin.validate(&destinations, env, &mut problems);

        if !(1..=1_000_000).contains(&self.admin.wrong_tokens_per_minute) {
            problems.push("admin.wrong_tokens_per_minute: must be between 1 and 1000000".into());
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(3600))
            .contains(&self.ingress.body_timeout)
        {
            problems.push("ingress.body_timeout: must be between 1s and 1h".into());
        }
        self.validate_storage(env, &mut problems);
        problems.extend(self.telemetry.problems());
        if self.shutdown.grace.is_zero() {
            problems.push("shutdown.grace: must be greater than 0".into());
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            problems.push(format!("log.level: {e} (try \"info\" or \"hookrelay=debug\")"));
        }

        let mut names = HashSet::new();
        for (i, source) in self.sources.iter_mut().enumerate() {
            let key = format!("sources[{i}]");
            if !valid_name(&source.name) {
                problems.push(format!(
                    "{key}.name: {:?} must be 1 to {MAX_SOURCE_NAME} characters of \
                     A-Z a-z 0-9 _ -",
                    source.name
                ));
            } else if !names.insert(source.name.clone()) {
                problems.push(format!("{key}.name: {:?} is used twice", source.name));
            }
            let spec = SecretSpec {
                inline: source.token.as_ref(),
                file: source.token_file.as_deref(),
                env: source.token_env.as_deref(),
            };
            match spec.resolve(&format!("{key}.token"), env) {
                Ok(None) => problems.push(format!(
                    "{key}.token: missing (give `token`, `token_file` or `token_env`)"
                )),
                Ok(Some(token)) => {
                    if let Err(e) = check_url_token(token.expose()) {
                        problems.push(format!("{key}.token: {e}"));
                    }
                    source.resolved_token = Some(token);
                }
                Err(e) => problems.push(e),
            }
        }

        self.check_exposed_examples(&mut problems);

        for (i, source) in self.sources.iter().enumerate() {
            for (j, pointer) in source.dedup_pointers.iter().enumerate() {
                if !pointer.is_empty() && !pointer.starts_with('/') {
                    problems.push(format!(
                        "sources[{i}].dedup_pointers[{j}]: {pointer:?} is not a JSON pointer \
                         (\"\" or starting with \"/\", e.g. \"/data\")"
                    ));
                }
            }
        }

        check_retry("delivery.retry", &self.delivery.retry, &mut problems);
        if self.delivery.timeout.is_zero() {
            problems.push("delivery.timeout: must be greater than 0".into());
        }
        if self.delivery.circuit_failure_threshold == 0 {
            problems.push("delivery.circuit_failure_threshold: must be at least 1".into());
        }
        if self.delivery.circuit_probe_interval.is_zero() {
            problems.push("delivery.circuit_probe_interval: must be greater than 0".into());
        }
        if !(1..=1024).contains(&self.delivery.max_concurrency) {
            problems.push("delivery.max_concurrency: must be between 1 and 1024".into());
        }
        let source_names: HashSet<String> = self.sources.iter().map(|s| s.name.clone()).collect();
        let mut dest_names = HashSet::new();
        let defaults = self.delivery.retry.clone();
        for (i, dest) in self.destinations.iter_mut().enumerate() {
            let key = format!("destinations[{i}]");
            if !valid_name(&dest.name) {
                problems.push(format!(
                    "{key}.name: {:?} must be 1 to {MAX_SOURCE_NAME} characters of A-Z a-z 0-9 _ -",
                    dest.name
                ));
            } else if !dest_names.insert(dest.name.clone()) {
                problems.push(format!("{key}.name: {:?} is used twice", dest.name));
            }
            check_destination(&key, dest, &source_names, &mut problems);
            // Inherited values were checked under `delivery.retry` already.
            if dest.retry.is_some() {
                check_retry(&format!("{key}.retry"), &dest.retry_policy(&defaults), &mut problems);
            }
            let spec = SecretSpec {
                inline: dest.secret.as_ref(),
                file: dest.secret_file.as_deref(),
                env: dest.secret_env.as_deref(),
            };
            match spec.resolve(&format!("{key}.secret"), env) {
                Ok(secret) => {
                    if let Some(secret) = &secret {
                        if let Err(e) = check_signing_secret(secret.expose()) {
                            problems.push(format!("{key}.secret: {e}"));
                        }
                    }
                    dest.resolved_secret = secret;
                }
                Err(e) => problems.push(e),
            }
            let password = SecretSpec {
                inline: dest.password.as_ref(),
                file: dest.password_file.as_deref(),
                env: dest.password_env.as_deref(),
            };
            match password.resolve(&format!("{key}.password"), env) {
                Ok(p) => dest.resolved_password = p,
                Err(e) => problems.push(e),
            }
            let token = SecretSpec {
                inline: dest.token.as_ref(),
                file: dest.token_file.as_deref(),
                env: dest.token_env.as_deref(),
            };
            match token.resolve(&format!("{key}.token"), env) {
                Ok(Some(t)) if t.expose().len() < MIN_TOKEN_LEN => problems.push(format!(
                    "{key}.token: at least {MIN_TOKEN_LEN} characters (it is all that guards \
                     the deliveries it leases)"
                )),
                Ok(t) => dest.resolved_token = t,
                Err(e) => problems.push(e),
            }
        }
        super::upstream::validate(&self.upstream, &mut self.sources, env, &mut problems);
        if self.retention.delivered.is_zero() || self.retention.interval.is_zero() {
            problems.push("retention: `delivered` and `interval` must be greater than 0".into());
        }
        if self.retention.audit < std::time::Duration::from_secs(24 * 3600) {
            problems.push(format!(
                "retention.audit: {} is less than a day; the audit's imbalance check reads \
                 the last day, so keep its hours at least that long (default 400d)",
                humantime::format_duration(self.retention.audit)
            ));
        }
        match self.retention.delivered_bodies {
            Some(d) if d.is_zero() || d > self.retention.delivered => problems.push(format!(
                "retention.delivered_bodies: must be greater than 0 and at most \
                 retention.delivered ({}): a body cannot outlive its record",
                humantime::format_duration(self.retention.delivered)
            )),
            _ => {}
        }

        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

pub(crate) fn valid_name(name: &str) -> bool {
    (1..=MAX_SOURCE_NAME).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The tokens this repository publishes (`config/`, `deploy/`, `docs/`): anyone can
/// read them. A test reads those folders and fails on a token missing here.
pub(crate) const EXAMPLE_TOKENS: &[&str] = &[
    "demo-token-change-me",
    "change-me-admin-token",
    "change-me-admin-token-0123456789",
    "change-me-source-token-0123456789",
];

/// Whether `token` is one this repository publishes, or is marked as one to change
/// (`change-me` anywhere in it: an example copied and edited by half).
pub(crate) fn is_example(token: &str) -> bool {
    EXAMPLE_TOKENS.contains(&token) || token.to_ascii_lowercase().contains("change-me")
}

impl Config {
    /// Safe by default: a listener other machines can reach never takes a token
    /// published in this repository. On loopback the examples are fine (the quick
    /// start), anywhere else the relay refuses to start and says what to do.
    fn check_exposed_examples(&self, problems: &mut Vec<String>) {
        let example = |token: Option<&super::Secret>| token.is_some_and(|t| is_example(t.expose()));
        let fix = "set one of your own (`openssl rand -hex 24`) in the file, or with \
                   token_file / token_env; or listen on 127.0.0.1 to try the relay on this \
                   machine only";
        let ingress = self.ingress.listen;
        if !ingress.ip().is_loopback() {
            for (i, source) in self.sources.iter().enumerate() {
                if example(source.resolved_token.as_ref()) {
                    problems.push(format!(
                        "sources[{i}].token: is the example token of this repository's config, \
                         and ingress.listen ({ingress}) takes calls from other machines: anyone \
                         who read it could post callbacks; {fix}"
                    ));
                }
            }
        }
        let admin = self.admin.listen;
        if !admin.ip().is_loopback() && example(self.admin.resolved_token.as_ref()) {
            problems.push(format!(
                "admin.token: is the example token of this repository's config, and \
                 admin.listen ({admin}) takes calls from other machines: anyone who read it \
                 could replay, discard and pause; {fix} (HOOKRELAY__ADMIN__TOKEN=... also works)"
            ));
        }
        for (i, entry) in self.admin.tokens.iter().enumerate() {
            if !admin.ip().is_loopback() && example(entry.resolved.as_ref()) {
                problems.push(format!(
                    "admin.tokens[{i}].token: is an example token of this repository's config, \
                     and admin.listen ({admin}) takes calls from other machines; {fix}"
                ));
            }
        }
    }
}

/// A source token is a URL path segment the upstream stores verbatim in `targetUrl`.
/// The message describes the problem, never the token.
fn check_url_token(token: &str) -> Result<(), String> {
    if token.len() < MIN_TOKEN_LEN {
        return Err(format!(
            "too short: at least {MIN_TOKEN_LEN} characters (try `openssl rand -hex 24`)"
        ));
    }
    let url_safe = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~');
    if !token.bytes().all(url_safe) {
        return Err("may contain only A-Z a-z 0-9 - _ . ~ (it is part of a URL)".into());
    }
    Ok(())
}

fn check_destination(
    key: &str,
    dest: &DestinationConfig,
    sources: &HashSet<String>,
    problems: &mut Vec<String>,
) {
    super::kinds::check(key, dest, problems);
    for (name, value) in &dest.headers {
        let lower = name.to_ascii_lowercase();
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err()
            || reqwest::header::HeaderValue::from_str(value).is_err()
        {
            problems.push(format!("{key}.headers.{name}: not a valid HTTP header"));
        } else if lower.starts_with("webhook-")
            || lower.starts_with("hookrelay-")
            || matches!(lower.as_str(), "content-type" | "content-length" | "host" | "traceparent")
        {
            problems.push(format!("{key}.headers.{name}: set by the relay, cannot be overridden"));
        }
    }
    if dest.sources.is_empty() {
        problems.push(format!("{key}.sources: empty (omit it to take every source)"));
    }
    for (j, pattern) in dest.sources.iter().enumerate() {
        if !pattern.contains('*') && !sources.contains(pattern) {
            problems.push(format!("{key}.sources[{j}]: no source is named {pattern:?}"));
        }
    }
    if dest.events.is_empty() {
        problems.push(format!("{key}.events: empty (omit it to take every event)"));
    }
    for (j, pattern) in dest.events.iter().enumerate() {
        let known = event_names::KNOWN.contains(&pattern.as_str())
            || pattern == "unknown"
            || pattern.starts_with("hookrelay.");
        if !pattern.contains('*') && !known {
            let hint = match event_names::closest(pattern) {
                Some(close) => format!("did you mean {close:?}? "),
                None => String::new(),
            };
            problems.push(format!(
                "{key}.events[{j}]: {pattern:?} is not an upstream event name; {hint}use one of: {}, or a glob such as \"Action*\" for a family",
                event_names::KNOWN.join(", ")
            ));
        }
    }
    if dest.timeout.is_some_and(|t| t.is_zero()) {
        problems.push(format!("{key}.timeout: must be greater than 0"));
    }
    if dest.max_concurrency.is_some_and(|c| !(1..=1024).contains(&c)) {
        problems.push(format!("{key}.max_concurrency: must be between 1 and 1024"));
    }
    // Below one request an hour a rate limit is a pause: say so instead of computing
    // an interval no clock can hold (a tiny rate once panicked the worker).
    if dest.rate_limit.is_some_and(|r| !(r >= 1.0 / 3600.0 && r.is_finite())) {
        problems.push(format!(
            "{key}.rate_limit: must be a positive number of requests per second, at least \
             one an hour (0.000278); to stop deliveries, pause the destination"
        ));
    }
}

fn check_retry(key: &str, retry: &RetryPolicy, problems: &mut Vec<String>) {
    if retry.initial_backoff.is_zero() {
        problems.push(format!("{key}.initial_backoff: must be greater than 0"));
    }
    if !(retry.backoff_multiplier >= 1.0 && retry.backoff_multiplier <= 100.0) {
        problems.push(format!("{key}.backoff_multiplier: must be between 1 and 100"));
    }
    if retry.max_backoff < retry.initial_backoff {
        problems.push(format!("{key}.max_backoff: must not be below initial_backoff"));
    }
    if retry.max_attempts == 0 {
        problems.push(format!("{key}.max_attempts: must be at least 1"));
    }
    if retry.give_up_after.is_zero() {
        problems.push(format!("{key}.give_up_after: must be greater than 0"));
    }
    for status in &retry.retryable_statuses {
        if !(400..=499).contains(status) {
            problems.push(format!(
                "{key}.retryable_statuses: {status} is not a 4xx status (5xx are always retried)"
            ));
        }
    }
}

/// A Standard Webhooks secret: `whsec_` then base64 of the key bytes. Messages never
/// contain the secret.
fn check_signing_secret(secret: &str) -> Result<(), String> {
    let encoded = secret
        .strip_prefix("whsec_")
        .ok_or("must start with `whsec_` (Standard Webhooks format: whsec_ + base64)")?;
    match base64::engine::general_purpose::STANDARD.decode(encoded) {
        Ok(key) if key.len() >= 16 => Ok(()),
        Ok(_) => Err("key too short: at least 16 bytes after base64 decoding".into()),
        Err(_) => Err("the part after `whsec_` is not valid base64".into()),
    }
}
