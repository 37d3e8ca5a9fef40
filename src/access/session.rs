//! Console sign-in: a session is a signed cookie, so no relay keeps any state for it
//! and every relay of a fleet that shares the admin tokens accepts it.
//!
//! The cookie is `v2.<token name>.<issued µs>.<nonce>.<mac>`, the MAC an HMAC-SHA256
//! under a key derived from that token: changing a token signs its holder out. It
//! holds nothing secret (the token never leaves the sign-in request), and its CSRF
//! token is an HMAC of it under the same key, which a page of another origin can
//! neither read nor compute.

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::config::Secret;
use crate::store::hex;

/// The cookie's name.
pub(crate) const COOKIE: &str = "hookrelay_console";

/// The header every change made from the console carries.
pub(crate) const CSRF_HEADER: &str = "x-csrf-token";

/// How long a sign-in lasts at most, even in a browser left open: a working day.
/// The cookie itself has no expiry, so closing the browser ends it sooner.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(12 * 3600);

/// Issues and checks sessions under one key.
pub(crate) struct Sessions {
    key: Vec<u8>,
}

/// A valid session: its cookie value and the CSRF token that goes with it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Session {
    pub(crate) cookie: String,
    pub(crate) csrf: String,
}

impl Sessions {
    /// Sessions signed under a key derived from `token` (never the token itself, so
    /// a MAC says nothing about it).
    pub(crate) fn new(token: &Secret) -> Self {
        let key = mac(token.expose().as_bytes(), b"hookrelay console sessions v1");
        Self { key }
    }

    /// A new session of the holder `name` (a token's name: no dots), issued at
    /// `now_us`.
    pub(crate) fn issue(&self, name: &str, now_us: u64) -> Session {
        let payload = format!("v2.{name}.{now_us}.{:016x}", fastrand::u64(..));
        self.session(payload)
    }

    /// The name of the holder a cookie claims to be of (checked by [`Self::verify`]
    /// with that holder's key).
    pub(crate) fn claimed(cookie: &str) -> Option<&str> {
        let mut parts = cookie.split('.');
        (parts.next() == Some("v2")).then(|| parts.next()).flatten()
    }

    /// The session `cookie` stands for, if this key signed it for `name` and it is
    /// not older than [`MAX_AGE`] at `now_us` (nor issued in the future, beyond a
    /// minute of clock skew between relays).
    pub(crate) fn verify(&self, name: &str, cookie: &str, now_us: u64) -> Option<Session> {
        let (payload, given) = cookie.rsplit_once('.')?;
        let mut parts = payload.split('.');
        let (Some("v2"), Some(holder), Some(issued), Some(nonce), None) =
            (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        if holder != name {
            return None;
        }
        let issued: u64 = issued.parse().ok()?;
        if nonce.len() != 16 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut check = Hmac::<Sha256>::new_from_slice(&self.key).ok()?;
        check.update(payload.as_bytes());
        check.verify_slice(&from_hex(given)?).ok()?;
        let age = now_us.saturating_sub(issued);
        let early = issued.saturating_sub(now_us);
        (age <= crate::clock::micros(MAX_AGE) && early <= 60_000_000)
            .then(|| self.session(payload.to_owned()))
    }

    /// Whether `given` is the CSRF token of `session`, compared in constant time.
    pub(crate) fn csrf_matches(session: &Session, given: &str) -> bool {
        let (a, b) = (session.csrf.as_bytes(), given.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    fn session(&self, payload: String) -> Session {
        let csrf = hex(&mac(&self.key, format!("csrf.{payload}").as_bytes()));
        let cookie = format!("{payload}.{}", hex(&mac(&self.key, payload.as_bytes())));
        Session { cookie, csrf }
    }
}

/// HMAC-SHA256 of `data` under `key`.
fn mac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(m) => m,
        // HMAC takes keys of any length: this arm is never taken.
        Err(_) => return Vec::new(),
    };
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// Lowercase or uppercase hex to bytes; `None` for anything else.
fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000_000;

    fn sessions(token: &str) -> Sessions {
        Sessions::new(&Secret::new(token))
    }

    #[test]
    fn a_session_is_accepted_by_any_relay_with_the_same_token() {
        let s = sessions("admin-token").issue("alice", NOW);
        assert_eq!(Sessions::claimed(&s.cookie), Some("alice"));
        let other_relay = sessions("admin-token");
        assert_eq!(other_relay.verify("alice", &s.cookie, NOW + 1_000_000), Some(s));
    }

    #[test]
    fn a_changed_token_signs_its_holder_out() {
        let s = sessions("admin-token").issue("alice", NOW);
        assert_eq!(sessions("new-token").verify("alice", &s.cookie, NOW), None);
    }

    /// A cookie is its holder's only: another holder's key does not sign it, and a
    /// cookie renamed to another holder no longer matches its MAC.
    #[test]
    fn a_session_cannot_be_taken_for_another_holders() {
        let alice = sessions("alice-token").issue("alice", NOW);
        assert_eq!(sessions("bob-token").verify("bob", &alice.cookie, NOW), None);
        let renamed = alice.cookie.replacen("v2.alice.", "v2.bob.", 1);
        assert_eq!(Sessions::claimed(&renamed), Some("bob"));
        assert_eq!(sessions("alice-token").verify("bob", &renamed, NOW), None);
        assert_eq!(sessions("alice-token").verify("alice", &renamed, NOW), None);
    }

    #[test]
    fn the_cookie_never_holds_the_token() {
        let s = sessions("admin-token-xyz").issue("admin", NOW);
        assert!(!s.cookie.contains("admin-token-xyz") && !s.csrf.contains("admin-token-xyz"));
    }

    #[test]
    fn a_tampered_cookie_is_refused() {
        let keys = sessions("t");
        let s = keys.issue("ops", NOW);
        let (payload, mac) = s.cookie.rsplit_once('.').unwrap();
        let later = payload.replace(&NOW.to_string(), &(NOW + 10).to_string());
        for forged in [
            format!("{later}.{mac}"),
            format!("{payload}.{}", "0".repeat(mac.len())),
            format!("{payload}."),
            payload.to_owned(),
            String::new(),
            "v2.ops.1.2.3".into(),
            format!("v1{}", &s.cookie[2..]),
            format!("v3{}", &s.cookie[2..]),
        ] {
            assert_eq!(keys.verify("ops", &forged, NOW), None, "{forged}");
        }
    }

    #[test]
    fn a_session_ends_after_its_max_age() {
        let keys = sessions("t");
        let s = keys.issue("ops", NOW);
        let max = crate::clock::micros(MAX_AGE);
        assert!(keys.verify("ops", &s.cookie, NOW + max).is_some());
        assert!(keys.verify("ops", &s.cookie, NOW + max + 1).is_none());
        assert!(keys.verify("ops", &s.cookie, NOW - 30_000_000).is_some(), "skew tolerated");
        assert!(keys.verify("ops", &s.cookie, NOW - 120_000_000).is_none(), "not from the future");
    }

    #[test]
    fn each_session_has_its_own_csrf_token() {
        let keys = sessions("t");
        let (a, b) = (keys.issue("ops", NOW), keys.issue("ops", NOW));
        assert_ne!(a.cookie, b.cookie);
        assert_ne!(a.csrf, b.csrf);
        assert!(Sessions::csrf_matches(&a, &a.csrf.clone()));
        assert!(!Sessions::csrf_matches(&a, &b.csrf));
        assert!(!Sessions::csrf_matches(&a, ""));
    }
}
