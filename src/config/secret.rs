//! Secrets (tokens, signing keys): given inline, from a file or from an environment
//! variable, and never printed.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

/// What `check-config` and `Debug` print in place of a secret.
pub(crate) const MASK: &str = "********";

/// A secret value. `Debug`, `Display` and `Serialize` show only [`MASK`], so a secret
/// cannot leak through a log line, an error message or the printed config.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(String);

impl Secret {
    #[cfg(test)]
    pub(crate) fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the few places that must use it (comparison, signing).
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// Compares with `candidate` in time independent of where they differ and of the
    /// candidate's length: both sides are hashed first, then the digests compared
    /// without early exit.
    pub(crate) fn matches(&self, candidate: &[u8]) -> bool {
        let a = Sha256::digest(self.0.as_bytes());
        let b = Sha256::digest(candidate);
        a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(MASK)
    }
}

/// In the configuration reference: a string, never shown.
impl schemars::JsonSchema for Secret {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Secret".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "format": "secret" })
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// Query parameters whose values are shown: paging, format and version, which carry
/// no credential. Every other value is masked, whatever its name (an API key may travel
/// as `?k=`).
const HARMLESS_QUERY_KEYS: &[&str] = &[
    "page",
    "per_page",
    "page_size",
    "pagesize",
    "limit",
    "offset",
    "sort",
    "order",
    "format",
    "fields",
    "include",
    "lang",
    "locale",
    "v",
    "version",
    "api-version",
    "api_version",
    "pretty",
];

/// `url` fit to print: a userinfo password and every query value but those of
/// [`HARMLESS_QUERY_KEYS`] replaced by [`MASK`] (API keys travel there), the rest kept
/// so that the URL is recognisable. Something that does not parse as a URL is masked
/// after `://` up to an `@`, and after a `?`.
pub(crate) fn mask_url(url: &str) -> String {
    if let Ok(mut parsed) = reqwest::Url::parse(url) {
        if parsed.password().is_some() {
            let _ = parsed.set_password(Some(MASK));
        }
        if parsed.query().is_some() {
            let pairs: Vec<(String, String)> = parsed
                .query_pairs()
                .map(|(k, v)| {
                    let harmless = HARMLESS_QUERY_KEYS.contains(&k.to_ascii_lowercase().as_str());
                    let v = if harmless { v.into_owned() } else { MASK.to_owned() };
                    (k.into_owned(), v)
                })
                .collect();
            parsed.query_pairs_mut().clear().extend_pairs(pairs);
        }
        return parsed.to_string();
    }
    let mut text = url.to_owned();
    if let Some(q) = text.find('?') {
        text.truncate(q);
        text.push('?');
        text.push_str(MASK);
    }
    if let (Some(scheme), Some(at)) = (text.find("://"), text.rfind('@')) {
        if at > scheme + 3 {
            text.replace_range(scheme + 3..at, MASK);
        }
    }
    text
}

/// Serializes a URL masked ([`mask_url`]): config is only ever serialized to be shown.
pub(crate) fn serialize_url<S: Serializer>(url: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&mask_url(url))
}

/// Serializes an optional URL masked.
pub(crate) fn serialize_opt_url<S: Serializer>(
    url: &Option<String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match url {
        Some(url) => s.serialize_some(&mask_url(url)),
        None => s.serialize_none(),
    }
}

/// Serializes header values masked (names kept): `x-api-key` and the like.
pub(crate) fn serialize_headers<S: Serializer>(
    headers: &std::collections::BTreeMap<String, String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(headers.len()))?;
    for name in headers.keys() {
        map.serialize_entry(name, MASK)?;
    }
    map.end()
}

/// The three ways a secret may be configured: `<name>`, `<name>_file`, `<name>_env`.
/// Exactly one of them must be given where the secret is required.
#[derive(Debug, Clone, Default)]
pub(crate) struct SecretSpec<'a> {
    pub(crate) inline: Option<&'a Secret>,
    pub(crate) file: Option<&'a Path>,
    pub(crate) env: Option<&'a str>,
}

/// Looks up an environment variable; injected so that tests need not touch the
/// process environment.
pub(crate) type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

impl SecretSpec<'_> {
    /// Resolves the spec to a secret. `key` names the config key in error messages
    /// (`sources[0].token`); the messages never contain the secret itself.
    pub(crate) fn resolve(&self, key: &str, env: EnvLookup<'_>) -> Result<Option<Secret>, String> {
        let given = [self.inline.is_some(), self.file.is_some(), self.env.is_some()];
        match given.iter().filter(|g| **g).count() {
            0 => return Ok(None),
            1 => {}
            _ => {
                let leaf = key.rsplit('.').next().unwrap_or(key);
                return Err(format!(
                    "{key}: give only one of `{leaf}`, `{leaf}_file`, `{leaf}_env`"
                ));
            }
        }
        let value = if let Some(secret) = self.inline {
            secret.expose().to_owned()
        } else if let Some(path) = self.file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                format!("{key}_file: cannot read {}: {e}", PathBuf::from(path).display())
            })?;
            text.trim_end_matches(['\n', '\r']).to_owned()
        } else if let Some(var) = self.env {
            env(var).ok_or_else(|| format!("{key}_env: environment variable {var} is not set"))?
        } else {
            unreachable!("exactly one source was counted above")
        };
        if value.is_empty() {
            return Err(format!("{key}: is empty"));
        }
        Ok(Some(Secret(value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn urls_are_masked_for_display() {
        assert_eq!(
            mask_url("http://u:PASSWORD@host/in?key=KEY&x=1"),
            format!("http://u:{MASK}@host/in?key={MASK}&x={MASK}")
        );
        // Paging and format are shown; anything else, whatever its name, is not.
        assert_eq!(
            mask_url("https://host/in?page=2&Format=json&k=SECRET"),
            format!("https://host/in?page=2&Format=json&k={MASK}")
        );
        assert_eq!(mask_url("https://host/in"), "https://host/in");
        let odd = mask_url("ftp//u:PW@host?KEY");
        assert!(!odd.contains("PW") || !odd.contains("KEY"), "{odd}");
        let not_url = mask_url("weird://u:PW@[bad/x?key=KEY");
        assert!(!not_url.contains("PW") && !not_url.contains("KEY"), "{not_url}");
    }

    #[test]
    fn debug_and_serialize_mask_the_value() {
        let s = Secret::new("hunter2-hunter2-hunter2");
        assert_eq!(format!("{s:?}"), MASK);
        assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{MASK}\""));
    }

    #[test]
    fn matches_only_the_exact_value() {
        let s = Secret::new("abcdef0123456789");
        assert!(s.matches(b"abcdef0123456789"));
        assert!(!s.matches(b"abcdef012345678"));
        assert!(!s.matches(b"abcdef01234567890"));
        assert!(!s.matches(b""));
    }

    #[test]
    fn resolves_each_form() {
        let inline = Secret::new("inline-secret");
        let spec = SecretSpec { inline: Some(&inline), ..Default::default() };
        assert_eq!(spec.resolve("a.token", &no_env).unwrap(), Some(inline.clone()));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tok");
        std::fs::write(&path, "from-file\n").unwrap();
        let spec = SecretSpec { file: Some(&path), ..Default::default() };
        assert_eq!(spec.resolve("a.token", &no_env).unwrap(), Some(Secret::new("from-file")));

        let env = |name: &str| (name == "MY_TOKEN").then(|| "from-env".to_owned());
        let spec = SecretSpec { env: Some("MY_TOKEN"), ..Default::default() };
        assert_eq!(spec.resolve("a.token", &env).unwrap(), Some(Secret::new("from-env")));

        assert_eq!(SecretSpec::default().resolve("a.token", &no_env).unwrap(), None);
    }

    #[test]
    fn errors_name_the_key_and_never_the_value() {
        let inline = Secret::new("do-not-print-me");
        let path = PathBuf::from("/nonexistent/hookrelay/token");
        let both = SecretSpec { inline: Some(&inline), file: Some(&path), env: None };
        let err = both.resolve("sources[1].token", &no_env).unwrap_err();
        assert_eq!(err, "sources[1].token: give only one of `token`, `token_file`, `token_env`");

        let missing = SecretSpec { file: Some(&path), ..Default::default() };
        let err = missing.resolve("sources[1].token", &no_env).unwrap_err();
        assert!(err.starts_with("sources[1].token_file: cannot read /nonexistent"), "{err}");

        let unset = SecretSpec { env: Some("NOPE"), ..Default::default() };
        let err = unset.resolve("admin.token", &no_env).unwrap_err();
        assert_eq!(err, "admin.token_env: environment variable NOPE is not set");

        let empty = Secret::new("");
        let spec = SecretSpec { inline: Some(&empty), ..Default::default() };
        assert_eq!(spec.resolve("admin.token", &no_env).unwrap_err(), "admin.token: is empty");
        assert!(!err.contains("do-not-print-me"));
    }
}
