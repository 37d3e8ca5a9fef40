//! Standard Webhooks signatures: `v1,` + base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}")),
//! the key being the base64 part of a `whsec_` secret.

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::config::Secret;

/// Signs requests for one destination. Holds the decoded key; never printed.
pub(crate) struct Signer {
    key: Vec<u8>,
}

impl Signer {
    /// `None` if the secret is not `whsec_` + base64 (config validation rejects that).
    pub(crate) fn from_secret(secret: &Secret) -> Option<Self> {
        let encoded = secret.expose().strip_prefix("whsec_")?;
        let key = base64::engine::general_purpose::STANDARD.decode(encoded).ok()?;
        Some(Self { key })
    }

    /// The `webhook-signature` header value.
    pub(crate) fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        // HMAC accepts keys of any length: new_from_slice cannot fail for it.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.key) else {
            return String::new();
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        format!("v1,{sig}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification.
    #[test]
    fn matches_the_specification_example() {
        let secret = Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let signer = Signer::from_secret(&secret).unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            signer.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn rejects_other_formats() {
        assert!(Signer::from_secret(&Secret::new("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")).is_none());
        assert!(Signer::from_secret(&Secret::new("whsec_***")).is_none());
    }
}
