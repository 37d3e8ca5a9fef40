//! The upstream side: the relay registers and watches the REST hooks that call it.
//!
//! `client` talks to one account's `/api/rest/resthooks` (with `credentials`: static,
//! file or OAuth2), `model` parses what it answers, `plan` decides what to change,
//! `reconcile` applies it on a timer and on demand, `gap` reports the callbacks a
//! Disabled hook lost, `gauges` keeps the metrics (with `missing`, which compares the
//! upstream's counts with what arrived), `status` is what the admin API shows.

mod client;
mod credentials;
mod gap;
mod gauges;
mod missing;
mod model;
mod plan;
mod reconcile;
mod status;

use std::sync::Arc;

use anyhow::Context;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::SharedStore;

pub(crate) use reconcile::Reconciler;
pub(crate) use status::AccountStatus;

pub(crate) use crate::account::AccountId;

/// Why a request to the upstream failed. Never contains a token or a target URL.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    /// `request` is the method and URL (secrets masked); the message ends with what to
    /// check for that status.
    #[error("{request} answered {status}{}{}", if detail.is_empty() { String::new() } else { format!(": {detail}") }, client::status_hint(*status))]
    Status { status: u16, detail: String, request: String },
    /// The method and URL, what failed (timeout, connection, ...) with its causes, and
    /// what to check.
    #[error("{0}")]
    Network(String),
    #[error("credentials: {0}")]
    Auth(#[from] credentials::AuthError),
    #[error("unexpected answer: {0}")]
    Unexpected(String),
    #[error("store: {0}")]
    Store(String),
}

/// Builds the reconciler of every configured account.
pub(crate) fn reconciler(
    config: &Config,
    store: SharedStore,
    metrics: Arc<Metrics>,
) -> anyhow::Result<Reconciler> {
    let upstream = &config.upstream;
    let http = reqwest::Client::builder()
        .timeout(upstream.request_timeout)
        .connect_timeout(upstream.request_timeout.min(std::time::Duration::from_secs(10)))
        .user_agent(concat!("hookrelay/", env!("CARGO_PKG_VERSION")))
        .build()
        .context("building the upstream HTTP client")?;
    let retry = client::RetrySettings::from(upstream);
    let mut accounts = Vec::new();
    for source in &config.sources {
        let Some(source_token) = source.resolved_token.clone() else { continue };
        for account in &source.accounts {
            let Some(auth) = &account.resolved else { continue };
            let public = upstream.public_url.as_deref().unwrap_or_default().trim_end_matches('/');
            let id = AccountId { source: source.name.clone(), account: account.name.clone() };
            let credentials = credentials::Credentials::new(
                id.clone(),
                auth,
                store.clone(),
                http.clone(),
                metrics.clone(),
            );
            let client = client::AccountClient::new(
                id,
                http.clone(),
                credentials,
                account.api_base.clone(),
                account.page_size,
                retry,
                metrics.clone(),
            );
            accounts.push(reconcile::Account {
                client,
                events: account.events(source).to_vec(),
                prune: account.prune,
                prefix: format!("{public}/hooks/{}/", source.name),
                source_token: source_token.clone(),
            });
        }
    }
    Ok(Reconciler::new(
        accounts,
        store,
        metrics,
        upstream.max_concurrency,
        upstream.reconcile_interval,
    ))
}
