//! Secrets masked out of every callback body before it is stored.
//!
//! The upstream puts the hook's whole target URL in each callback body
//! (`meta.debug.resthook.target`, upstream-notes.md), and that URL ends in the
//! source's secret token (`/hooks/{source}/{token}`). Stored as received, the body
//! would hand the token to every consumer, to the console and to the CLI: anyone
//! downstream could forge callbacks. So every secret the relay knows (the sources'
//! tokens, the admin token) is replaced by `***` wherever it stands in a body, before
//! the body is stored: what is stored is what is signed, sent, shown and logged.
//! Secrets are at least 16 characters (config validation), so ordinary text never
//! matches one by chance. Dedup keys on `data`, which the target URL is not part of.

use bytes::Bytes;
use memchr::memmem::Finder;

/// What a secret becomes.
pub(crate) const MASK: &[u8] = b"***";
/// Shorter strings are not masked (they would match ordinary text).
const SHORTEST: usize = 8;

/// The secrets to mask, each with its searcher built once.
#[derive(Default)]
pub(crate) struct Masker {
    finders: Vec<Finder<'static>>,
}

impl Masker {
    /// Masks each of `secrets` (empty and short ones are left out).
    pub(crate) fn new(secrets: impl IntoIterator<Item = Vec<u8>>) -> Self {
        let mut secrets: Vec<Vec<u8>> =
            secrets.into_iter().filter(|s| s.len() >= SHORTEST).collect();
        // A secret that contains another is masked first, whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Self { finders: secrets.into_iter().map(|s| Finder::new(&s).into_owned()).collect() }
    }

    /// `body` with every secret replaced by [`MASK`]; the same bytes, uncopied, when it
    /// holds none (the common case: one search per secret).
    pub(crate) fn mask(&self, body: Bytes) -> Bytes {
        let mut current = body;
        for finder in &self.finders {
            if finder.find(&current).is_none() {
                continue;
            }
            let needle = finder.needle().len();
            let mut out = Vec::with_capacity(current.len());
            let mut last = 0;
            for at in finder.find_iter(&current) {
                out.extend_from_slice(&current[last..at]);
                out.extend_from_slice(MASK);
                last = at + needle;
            }
            out.extend_from_slice(&current[last..]);
            current = Bytes::from(out);
        }
        current
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TOKEN: &str = "source-token-0123456789abcdef";

    #[test]
    fn the_target_url_in_a_body_loses_its_token_in_any_json_spelling() {
        let m = Masker::new([TOKEN.as_bytes().to_vec(), b"short".to_vec()]);
        let body = format!(
            r#"{{"meta":{{"debug":{{"resthook":{{"target":"https://relay.example.com/hooks/demo/{TOKEN}","escaped":"https:\/\/relay\/hooks\/demo\/{TOKEN}\/ActionCreated"}}}}}},"note":"short"}}"#
        );
        let masked = m.mask(Bytes::from(body));
        let text = std::str::from_utf8(&masked).unwrap();
        assert!(!text.contains(TOKEN), "{text}");
        assert!(text.contains("/hooks/demo/***\""), "{text}");
        assert!(text.contains(r"\/hooks\/demo\/***\/ActionCreated"), "{text}");
        assert!(text.contains("\"short\""), "short strings are left alone");
        serde_json::from_str::<serde_json::Value>(text).unwrap();
    }

    #[test]
    fn a_body_without_a_secret_is_not_copied() {
        let m = Masker::new([TOKEN.as_bytes().to_vec()]);
        let body = Bytes::from_static(br#"{"data":{"id":"1"}}"#);
        let out = m.mask(body.clone());
        assert_eq!(out.as_ptr(), body.as_ptr());
    }

    proptest! {
        /// Whatever surrounds them, no secret survives, and a body without one comes
        /// back unchanged.
        #[test]
        fn no_secret_survives(parts in proptest::collection::vec("[a-z/\"{}:]{0,12}", 0..8), admin in "[A-Z0-9]{16,24}") {
            let m = Masker::new([TOKEN.as_bytes().to_vec(), admin.as_bytes().to_vec()]);
            let body = parts.join(TOKEN) + &admin;
            let masked = m.mask(Bytes::from(body.clone()));
            let text = String::from_utf8(masked.to_vec()).unwrap();
            prop_assert!(!text.contains(TOKEN) && !text.contains(&admin));
            let plain = parts.concat();
            prop_assert_eq!(m.mask(Bytes::from(plain.clone())), Bytes::from(plain));
        }
    }
}
