//! Who a bearer token belongs to: static tokens from the simulator's config, and
//! access tokens it issued through the OAuth2 refresh flow of `upstream-notes.md`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The OAuth2 client the token endpoint accepts.
#[derive(Debug, Clone)]
pub(crate) struct OAuthClient {
    pub(crate) client_id: String,
    pub(crate) client_secret: String,
    pub(crate) access_token_ttl: Duration,
}

/// A granted token pair, as the token endpoint answers it.
#[derive(Debug)]
pub(crate) struct Grant {
    pub(crate) access_token: String,
    pub(crate) refresh_token: String,
    pub(crate) expires_in: Duration,
}

/// Why the token endpoint refused (an OAuth2 `error` code).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum GrantError {
    InvalidClient,
    InvalidGrant,
    UnsupportedGrantType,
}

impl GrantError {
    pub(crate) fn code(&self) -> &'static str {
        match self {
            GrantError::InvalidClient => "invalid_client",
            GrantError::InvalidGrant => "invalid_grant",
            GrantError::UnsupportedGrantType => "unsupported_grant_type",
        }
    }
}

/// Every user's credentials.
#[derive(Debug, Default)]
pub(crate) struct Users {
    static_tokens: HashMap<String, String>,
    issued: HashMap<String, (String, Instant)>,
    refresh_tokens: HashMap<String, String>,
    oauth: Option<OAuthClient>,
}

impl Users {
    pub(crate) fn new(oauth: Option<OAuthClient>) -> Self {
        Self { oauth, ..Self::default() }
    }

    /// Sets `user`'s static token; the previous one stops working.
    pub(crate) fn set_token(&mut self, user: &str, token: &str) {
        self.static_tokens.retain(|_, u| u != user);
        self.static_tokens.insert(token.to_owned(), user.to_owned());
    }

    /// Gives `user` a refresh token to start the OAuth2 flow with.
    pub(crate) fn add_refresh_token(&mut self, user: &str, token: &str) {
        self.refresh_tokens.insert(token.to_owned(), user.to_owned());
    }

    /// The user a bearer token belongs to, if it is valid now.
    pub(crate) fn user_for(&self, token: &str, now: Instant) -> Option<String> {
        if let Some(user) = self.static_tokens.get(token) {
            return Some(user.clone());
        }
        self.issued.get(token).filter(|(_, until)| now < *until).map(|(u, _)| u.clone())
    }

    /// Makes every issued access token expire now (static tokens stay valid).
    pub(crate) fn expire_access_tokens(&mut self) {
        self.issued.clear();
    }

    /// `grant_type=refresh_token`: a new access token and a new refresh token; the
    /// refresh token used stops working (rotation, as the real service may do).
    pub(crate) fn refresh(
        &mut self,
        grant_type: &str,
        client_id: &str,
        client_secret: &str,
        refresh_token: &str,
        now: Instant,
    ) -> Result<Grant, GrantError> {
        let client = self.oauth.as_ref().ok_or(GrantError::InvalidClient)?;
        if client.client_id != client_id || client.client_secret != client_secret {
            return Err(GrantError::InvalidClient);
        }
        if grant_type != "refresh_token" {
            return Err(GrantError::UnsupportedGrantType);
        }
        let ttl = client.access_token_ttl;
        let user = self.refresh_tokens.remove(refresh_token).ok_or(GrantError::InvalidGrant)?;
        let grant = Grant {
            access_token: random_token("at"),
            refresh_token: random_token("rt"),
            expires_in: ttl,
        };
        self.issued.insert(grant.access_token.clone(), (user.clone(), now + ttl));
        self.refresh_tokens.insert(grant.refresh_token.clone(), user);
        Ok(grant)
    }
}

fn random_token(prefix: &str) -> String {
    format!("{prefix}-{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users() -> Users {
        let mut u = Users::new(Some(OAuthClient {
            client_id: "relay".into(),
            client_secret: "s3cret".into(),
            access_token_ttl: Duration::from_secs(60),
        }));
        u.set_token("alice", "alice-token");
        u.add_refresh_token("bob", "bob-rt-1");
        u
    }

    #[test]
    fn static_tokens_map_to_users_and_can_be_replaced() {
        let mut u = users();
        let now = Instant::now();
        assert_eq!(u.user_for("alice-token", now).as_deref(), Some("alice"));
        assert_eq!(u.user_for("nobody", now), None);
        u.set_token("alice", "alice-token-2");
        assert_eq!(u.user_for("alice-token", now), None);
        assert_eq!(u.user_for("alice-token-2", now).as_deref(), Some("alice"));
    }

    #[test]
    fn refresh_rotates_and_access_tokens_expire() {
        let mut u = users();
        let now = Instant::now();
        let g = u.refresh("refresh_token", "relay", "s3cret", "bob-rt-1", now).unwrap();
        assert_eq!(u.user_for(&g.access_token, now).as_deref(), Some("bob"));
        assert_eq!(u.user_for(&g.access_token, now + Duration::from_secs(61)), None);
        assert_eq!(
            u.refresh("refresh_token", "relay", "s3cret", "bob-rt-1", now).unwrap_err(),
            GrantError::InvalidGrant,
            "a used refresh token stops working"
        );
        let g2 = u.refresh("refresh_token", "relay", "s3cret", &g.refresh_token, now).unwrap();
        u.expire_access_tokens();
        assert_eq!(u.user_for(&g2.access_token, now), None);
        assert_eq!(u.user_for("alice-token", now).as_deref(), Some("alice"));
    }

    #[test]
    fn refresh_checks_client_and_grant_type() {
        let mut u = users();
        let now = Instant::now();
        let err = u.refresh("refresh_token", "relay", "wrong", "bob-rt-1", now).unwrap_err();
        assert_eq!(err, GrantError::InvalidClient);
        let err = u.refresh("password", "relay", "s3cret", "bob-rt-1", now).unwrap_err();
        assert_eq!(err, GrantError::UnsupportedGrantType);
        assert!(u.refresh("refresh_token", "relay", "s3cret", "bob-rt-1", now).is_ok());
    }
}
