//! Configuration of the hook lifecycle: `[upstream]` and each source's `accounts`.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::secret::{EnvLookup, SecretSpec};
use super::{duration, Secret, SourceConfig};
use crate::event_names;

/// How the relay talks to the upstream's `/api/rest/resthooks`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct UpstreamConfig {
    /// The relay's public base URL as the upstream reaches it (scheme, host, optional
    /// port and path prefix); hooks get `{public_url}/hooks/{source}/{token}/{eventName}`.
    #[serde(serialize_with = "super::secret::serialize_opt_url")]
    pub(crate) public_url: Option<String>,
    /// How often every account's hooks are checked (also `hookrelay hooks sync`).
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) reconcile_interval: Duration,
    /// Accounts reconciled at once; within one account requests go one at a time.
    pub(crate) max_concurrency: usize,
    /// One request to the upstream, connect to last byte.
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) request_timeout: Duration,
    /// Retries of a request answered 429 or 5xx or lost to the network.
    pub(crate) max_retries: u32,
    /// First retry delay; doubled per retry, capped by `max_backoff` (which also caps
    /// `Retry-After`).
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) initial_backoff: Duration,
    /// Longest delay between two retries of an upstream request (also caps `Retry-After`).
    #[schemars(with = "crate::config::duration::Text")]
    #[serde(with = "duration")]
    pub(crate) max_backoff: Duration,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            public_url: None,
            reconcile_interval: Duration::from_secs(60),
            max_concurrency: 4,
            request_timeout: Duration::from_secs(30),
            max_retries: 4,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(60),
        }
    }
}

/// One upstream user whose hooks call this relay for a source.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AccountConfig {
    /// Names the account in metrics, logs and the admin API.
    pub(crate) name: String,
    /// The API base, e.g. `https://api.example.com/api` (the REST base is
    /// `{api_base}/rest`). With `oauth`, the token answer's `api_endpoint` is used
    /// when this is not set.
    #[serde(serialize_with = "super::secret::serialize_opt_url")]
    pub(crate) api_base: Option<String>,
    /// Events to hold hooks for; defaults to the source's `events`.
    pub(crate) events: Option<Vec<String>>,
    /// Delete hooks that point at this relay for events no longer configured.
    #[serde(default)]
    pub(crate) prune: bool,
    /// Records per page when listing hooks (the upstream allows at most 200).
    #[serde(default = "default_page_size")]
    pub(crate) page_size: u64,
    /// A static bearer token (or `token_env`).
    pub(crate) token: Option<Secret>,
    /// A file holding the bearer token, re-read whenever it changes.
    pub(crate) token_file: Option<PathBuf>,
    /// An environment variable holding the bearer token (instead of `token`).
    pub(crate) token_env: Option<String>,
    /// The OAuth2 refresh flow instead of a bearer token.
    pub(crate) oauth: Option<OAuthConfig>,
    #[serde(skip)]
    pub(crate) resolved: Option<AccountAuth>,
}

fn default_page_size() -> u64 {
    200
}

/// OAuth2 refresh-token grant (`upstream-notes.md`, "Tokens").
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OAuthConfig {
    /// The token endpoint, e.g. `https://auth.example.com/oauth/token`.
    pub(crate) token_url: String,
    /// The OAuth2 client id.
    pub(crate) client_id: String,
    /// The OAuth2 client secret (or `client_secret_file`, `client_secret_env`).
    pub(crate) client_secret: Option<Secret>,
    /// A file holding the client secret.
    pub(crate) client_secret_file: Option<PathBuf>,
    /// An environment variable holding the client secret.
    pub(crate) client_secret_env: Option<String>,
    /// The refresh token to start from. Each refresh returns a new one, which the relay
    /// keeps in its store and uses from then on (the old one may stop working).
    pub(crate) refresh_token: Option<Secret>,
    /// A file holding the first refresh token.
    pub(crate) refresh_token_file: Option<PathBuf>,
    /// An environment variable holding the first refresh token (rotated ones are stored).
    pub(crate) refresh_token_env: Option<String>,
}

/// An account's credentials, resolved at load time.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AccountAuth {
    Static(Secret),
    /// Re-read at run time; the value read at load time proved the file readable.
    File(PathBuf),
    OAuth {
        token_url: String,
        client_id: String,
        client_secret: Secret,
        refresh_token: Secret,
    },
}

impl AccountConfig {
    /// The events this account holds hooks for.
    pub(crate) fn events<'a>(&'a self, source: &'a SourceConfig) -> &'a [String] {
        self.events.as_deref().unwrap_or(&source.events)
    }
}

/// Checks `[upstream]` and every source's `events` and `accounts`, resolving secrets.
pub(crate) fn validate(
    upstream: &UpstreamConfig,
    sources: &mut [SourceConfig],
    env: EnvLookup<'_>,
    problems: &mut Vec<String>,
) {
    let any_account = sources.iter().any(|s| !s.accounts.is_empty());
    match &upstream.public_url {
        Some(url) if !is_http_url(url) => problems.push(format!(
            "upstream.public_url: {:?} is not an absolute http(s) URL",
            super::mask_url(url)
        )),
        Some(url) if url.contains('?') || url.contains('#') => {
            problems.push("upstream.public_url: must not have a query or fragment".into())
        }
        None if any_account => problems.push(
            "upstream.public_url: missing (the URL the upstream calls this relay at, e.g. \
             \"https://relay.example.com\"); needed to register hooks"
                .into(),
        ),
        _ => {}
    }
    if upstream.reconcile_interval < Duration::from_secs(1) {
        problems.push("upstream.reconcile_interval: must be at least 1s".into());
    }
    if !(1..=64).contains(&upstream.max_concurrency) {
        problems.push("upstream.max_concurrency: must be between 1 and 64".into());
    }
    if upstream.request_timeout.is_zero() {
        problems.push("upstream.request_timeout: must be greater than 0".into());
    }
    if upstream.initial_backoff.is_zero() || upstream.max_backoff < upstream.initial_backoff {
        problems.push(
            "upstream: initial_backoff must be greater than 0 and at most max_backoff".into(),
        );
    }

    for (i, source) in sources.iter_mut().enumerate() {
        check_events(&format!("sources[{i}].events"), &source.events, problems);
        let mut names = std::collections::HashSet::new();
        let source_events = source.events.clone();
        for (j, account) in source.accounts.iter_mut().enumerate() {
            let key = format!("sources[{i}].accounts[{j}]");
            if !super::validate::valid_name(&account.name) {
                problems.push(format!(
                    "{key}.name: {:?} must be 1 to 64 characters of A-Z a-z 0-9 _ -",
                    account.name
                ));
            } else if !names.insert(account.name.clone()) {
                problems.push(format!("{key}.name: {:?} is used twice", account.name));
            }
            match &account.events {
                Some(events) => check_events(&format!("{key}.events"), events, problems),
                None if source_events.is_empty() => problems.push(format!(
                    "{key}: no events to subscribe to (set `events` on the source or the account)"
                )),
                None => {}
            }
            if let Some(base) = &account.api_base {
                if !is_http_url(base) {
                    problems.push(format!(
                        "{key}.api_base: {:?} is not an absolute http(s) URL",
                        super::mask_url(base)
                    ));
                }
            } else if account.oauth.is_none() {
                problems.push(format!(
                    "{key}.api_base: missing (e.g. \"https://api.example.com/api\")"
                ));
            }
            if !(1..=200).contains(&account.page_size) {
                problems.push(format!("{key}.page_size: must be between 1 and 200"));
            }
            account.resolved = resolve_auth(&key, account, env, problems);
        }
    }
}

fn resolve_auth(
    key: &str,
    account: &AccountConfig,
    env: EnvLookup<'_>,
    problems: &mut Vec<String>,
) -> Option<AccountAuth> {
    let token_given =
        account.token.is_some() || account.token_file.is_some() || account.token_env.is_some();
    match (&account.oauth, token_given) {
        (Some(_), true) => {
            problems.push(format!("{key}: give either a token or `oauth`, not both"));
            None
        }
        (None, false) => {
            problems.push(format!(
                "{key}: no credentials (give `token`, `token_file`, `token_env` or [oauth])"
            ));
            None
        }
        (None, true) => {
            let spec = SecretSpec {
                inline: account.token.as_ref(),
                file: account.token_file.as_deref(),
                env: account.token_env.as_deref(),
            };
            match spec.resolve(&format!("{key}.token"), env) {
                Ok(Some(token)) => Some(match &account.token_file {
                    Some(path) => AccountAuth::File(path.clone()),
                    None => AccountAuth::Static(token),
                }),
                Ok(None) => None,
                Err(e) => {
                    problems.push(e);
                    None
                }
            }
        }
        (Some(oauth), false) => {
            let key = format!("{key}.oauth");
            if !is_http_url(&oauth.token_url) {
                problems.push(format!(
                    "{key}.token_url: {:?} is not an absolute http(s) URL",
                    oauth.token_url
                ));
            }
            let mut secret = |name: &str, spec: SecretSpec<'_>| match spec
                .resolve(&format!("{key}.{name}"), env)
            {
                Ok(Some(s)) => Some(s),
                Ok(None) => {
                    problems
                        .push(format!("{key}.{name}: missing (or `{name}_file`, `{name}_env`)"));
                    None
                }
                Err(e) => {
                    problems.push(e);
                    None
                }
            };
            let client_secret = secret(
                "client_secret",
                SecretSpec {
                    inline: oauth.client_secret.as_ref(),
                    file: oauth.client_secret_file.as_deref(),
                    env: oauth.client_secret_env.as_deref(),
                },
            );
            let refresh_token = secret(
                "refresh_token",
                SecretSpec {
                    inline: oauth.refresh_token.as_ref(),
                    file: oauth.refresh_token_file.as_deref(),
                    env: oauth.refresh_token_env.as_deref(),
                },
            );
            Some(AccountAuth::OAuth {
                token_url: oauth.token_url.clone(),
                client_id: oauth.client_id.clone(),
                client_secret: client_secret?,
                refresh_token: refresh_token?,
            })
        }
    }
}

fn check_events(key: &str, events: &[String], problems: &mut Vec<String>) {
    for (j, name) in events.iter().enumerate() {
        if !event_names::KNOWN.contains(&name.as_str()) {
            let hint = match event_names::closest(name) {
                Some(close) => format!("did you mean {close:?}? "),
                None => String::new(),
            };
            problems.push(format!(
                "{key}[{j}]: {name:?} is not one of the upstream's 21 event names; {hint}they are: {}",
                event_names::KNOWN.join(", ")
            ));
        }
    }
    let mut seen = std::collections::HashSet::new();
    for name in events {
        if !seen.insert(name) {
            problems.push(format!("{key}: {name:?} is listed twice"));
        }
    }
}

fn is_http_url(text: &str) -> bool {
    reqwest::Url::parse(text)
        .map(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
        .unwrap_or(false)
}
