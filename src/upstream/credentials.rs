//! An account's bearer token: static, read from a file (re-read when it changes), or
//! obtained through the OAuth2 refresh flow with the rotated refresh token persisted.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::AccountId;
use crate::config::{AccountAuth, Secret};
use crate::internal_events::taxonomy::{self, ErrorType, Stage};
use crate::internal_events::{InternalEvent, TokenRefreshed};
use crate::metrics::Metrics;
use crate::store::SharedStore;

/// Why no usable token could be had. Never contains a token.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum AuthError {
    #[error("the upstream refused the configured token (401); a static token cannot be refreshed")]
    StaticRefused,
    #[error("the upstream refused the token in {0} (401), and the file has not changed since")]
    FileRefused(PathBuf),
    #[error("cannot read token_file {path}: {reason}")]
    FileUnreadable { path: PathBuf, reason: String },
    #[error("token refresh failed: {0}")]
    Refresh(String),
}

/// What the store keeps per OAuth2 account: the refresh token to use next.
#[derive(Serialize, Deserialize)]
struct Persisted {
    refresh_token: String,
    api_endpoint: Option<String>,
}

/// The access token held in memory, and where the token answer said the API is.
#[derive(Default)]
struct OAuthState {
    access: Option<Secret>,
    api_endpoint: Option<String>,
}

enum Kind {
    Static(Secret),
    File {
        path: PathBuf,
        cached: Mutex<Option<(Option<SystemTime>, Secret)>>,
    },
    OAuth {
        token_url: String,
        client_id: String,
        client_secret: Secret,
        initial_refresh: Secret,
        state: tokio::sync::Mutex<OAuthState>,
    },
}

/// One account's credentials.
pub(crate) struct Credentials {
    id: AccountId,
    kind: Kind,
    store: SharedStore,
    http: reqwest::Client,
    metrics: Arc<Metrics>,
}

/// The token endpoint's answer (`upstream-notes.md`, "Tokens").
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    refresh_token: Option<String>,
    api_endpoint: Option<String>,
}

impl Credentials {
    pub(crate) fn new(
        id: AccountId,
        auth: &AccountAuth,
        store: SharedStore,
        http: reqwest::Client,
        metrics: Arc<Metrics>,
    ) -> Self {
        let kind = match auth {
            AccountAuth::Static(token) => Kind::Static(token.clone()),
            AccountAuth::File(path) => Kind::File { path: path.clone(), cached: Mutex::new(None) },
            AccountAuth::OAuth { token_url, client_id, client_secret, refresh_token } => {
                Kind::OAuth {
                    token_url: token_url.clone(),
                    client_id: client_id.clone(),
                    client_secret: client_secret.clone(),
                    initial_refresh: refresh_token.clone(),
                    state: tokio::sync::Mutex::new(OAuthState::default()),
                }
            }
        };
        Self { id, kind, store, http, metrics }
    }

    fn store_key(&self) -> String {
        format!("oauth/{}/{}", self.id.source, self.id.account)
    }

    /// The token to send now (an OAuth2 account without one refreshes first).
    pub(crate) async fn token(&self) -> Result<Secret, AuthError> {
        match &self.kind {
            Kind::Static(token) => Ok(token.clone()),
            Kind::File { path, cached } => read_file(path, cached, false),
            Kind::OAuth { state, .. } => {
                let mut state = state.lock().await;
                if let Some(token) = &state.access {
                    return Ok(token.clone());
                }
                self.refresh(&mut state).await
            }
        }
    }

    /// Where the token answer said the API is (OAuth2 only).
    pub(crate) async fn api_endpoint(&self) -> Option<String> {
        match &self.kind {
            Kind::OAuth { state, .. } => state.lock().await.api_endpoint.clone(),
            _ => None,
        }
    }

    /// After a 401 for `rejected`: gets a different token (refresh, or re-read the
    /// file) so the request can be tried once more, or says why not.
    pub(crate) async fn after_unauthorized(&self, rejected: &Secret) -> Result<(), AuthError> {
        match &self.kind {
            Kind::Static(_) => Err(AuthError::StaticRefused),
            Kind::File { path, cached } => {
                let fresh = match read_file(path, cached, true) {
                    Ok(token) if token != *rejected => Ok(()),
                    Ok(_) => Err(AuthError::FileRefused(path.clone())),
                    Err(e) => Err(e),
                };
                self.refreshed(fresh.as_ref().err());
                fresh
            }
            Kind::OAuth { state, .. } => {
                let mut state = state.lock().await;
                if state.access.as_ref().is_some_and(|current| current != rejected) {
                    return Ok(()); // another request refreshed meanwhile
                }
                state.access = None;
                self.refresh(&mut state).await.map(|_| ())
            }
        }
    }

    /// One refresh's outcome: counted, and logged if it failed.
    fn refreshed(&self, failed: Option<&AuthError>) {
        let failed = failed.map(|e| e as &dyn std::fmt::Display);
        TokenRefreshed { account: &self.id, failed }.emit(&self.metrics);
    }

    /// The refresh-token grant: tries the refresh token persisted by the last refresh,
    /// then (if refused and different) the configured one, so an operator can recover
    /// by putting a fresh token in the config. The rotated refresh token is stored
    /// durably before the new access token is used.
    async fn refresh(&self, state: &mut OAuthState) -> Result<Secret, AuthError> {
        let Kind::OAuth { initial_refresh, .. } = &self.kind else {
            return Err(AuthError::Refresh("not an OAuth2 account".into()));
        };
        let persisted = self.load_persisted().await;
        let mut candidates = Vec::new();
        if let Some(p) = &persisted {
            candidates.push(p.refresh_token.clone());
        }
        if !candidates.iter().any(|c| c == initial_refresh.expose()) {
            candidates.push(initial_refresh.expose().to_owned());
        }
        let mut last_error = AuthError::Refresh("no refresh token".into());
        for refresh_token in candidates {
            match self.grant(&refresh_token).await {
                Ok(answer) => {
                    let next = Persisted {
                        refresh_token: answer.refresh_token.unwrap_or(refresh_token),
                        api_endpoint: answer.api_endpoint.clone(),
                    };
                    if let Err(e) = self.save_persisted(&next).await {
                        let e =
                            AuthError::Refresh(format!("cannot store the new refresh token: {e}"));
                        self.refreshed(Some(&e));
                        return Err(e);
                    }
                    self.refreshed(None);
                    let access = Secret::from(answer.access_token);
                    state.access = Some(access.clone());
                    state.api_endpoint = answer.api_endpoint;
                    return Ok(access);
                }
                Err(e) => last_error = e,
            }
        }
        self.refreshed(Some(&last_error));
        Err(last_error)
    }

    async fn grant(&self, refresh_token: &str) -> Result<TokenAnswer, AuthError> {
        let Kind::OAuth { token_url, client_id, client_secret, .. } = &self.kind else {
            return Err(AuthError::Refresh("not an OAuth2 account".into()));
        };
        let form = [
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh_token),
            ("client_id", client_id.as_str()),
            ("client_secret", client_secret.expose()),
        ];
        let response = self.http.post(token_url).form(&form).send().await.map_err(|e| {
            AuthError::Refresh(format!("token endpoint unreachable: {}", e.without_url()))
        })?;
        let status = response.status();
        let body = response.bytes().await.unwrap_or_default();
        if !status.is_success() {
            // OAuth2 errors are `{"error": "invalid_grant"}`: a code, no secret.
            let code = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_owned))
                .unwrap_or_default();
            return Err(AuthError::Refresh(format!("token endpoint answered {status} {code}")));
        }
        serde_json::from_slice(&body)
            .map_err(|e| AuthError::Refresh(format!("token answer unreadable: {e}")))
    }

    async fn load_persisted(&self) -> Option<Persisted> {
        match self.store.upstream_get(&self.store_key()).await {
            Ok(Some(bytes)) => serde_json::from_slice(&bytes).ok(),
            Ok(None) => None,
            Err(e) => {
                taxonomy::failed(
                    &self.metrics,
                    Stage::Upstream,
                    ErrorType::Storage,
                    "cannot read the stored refresh token; signing in with the configured one",
                    &e,
                );
                None
            }
        }
    }

    async fn save_persisted(&self, p: &Persisted) -> Result<(), String> {
        let bytes = serde_json::to_vec(p).map_err(|e| e.to_string())?;
        self.store.upstream_put(&self.store_key(), Some(bytes)).await.map_err(|e| e.to_string())
    }
}

/// The token in `path`, re-read when its modification time changed (or when `force`).
fn read_file(
    path: &PathBuf,
    cached: &Mutex<Option<(Option<SystemTime>, Secret)>>,
    force: bool,
) -> Result<Secret, AuthError> {
    let unreadable = |e: std::io::Error| AuthError::FileUnreadable {
        path: path.clone(),
        reason: e.kind().to_string(),
    };
    let mtime = std::fs::metadata(path).map_err(unreadable)?.modified().ok();
    let mut cached = crate::lock::lock(cached);
    if let Some((seen, token)) = cached.as_ref() {
        if !force && *seen == mtime && mtime.is_some() {
            return Ok(token.clone());
        }
    }
    let text = std::fs::read_to_string(path).map_err(unreadable)?;
    let token = Secret::from(text.trim().to_owned());
    *cached = Some((mtime, token.clone()));
    Ok(token)
}
