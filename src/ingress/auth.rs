//! Which source a callback belongs to, and whether its token is right.

use std::collections::HashMap;

use crate::config::{Secret, SourceConfig};

/// Label value for callbacks naming a source that is not configured: the name in the
/// URL is arbitrary input and must not become a metric label.
pub(crate) const UNKNOWN_SOURCE: &str = "unknown";

/// The configured sources and their tokens.
pub(crate) struct Sources(HashMap<String, Secret>);

/// What a callback's source and token turned out to be.
pub(crate) enum Auth<'a> {
    /// A configured source with the right token.
    Valid(&'a str),
    /// A configured source with a wrong token.
    WrongToken(&'a str),
    /// No such source.
    UnknownSource,
}

impl Sources {
    /// Every source's token.
    pub(crate) fn secrets(&self) -> impl Iterator<Item = &Secret> {
        self.0.values()
    }

    pub(crate) fn from_config(sources: &[SourceConfig]) -> Self {
        Self(
            sources
                .iter()
                .filter_map(|s| Some((s.name.clone(), s.resolved_token.clone()?)))
                .collect(),
        )
    }

    /// Checks the token in constant time (see [`Secret::matches`]).
    pub(crate) fn authenticate(&self, source: &str, token: &str) -> Auth<'_> {
        match self.0.get_key_value(source) {
            None => Auth::UnknownSource,
            Some((name, secret)) if secret.matches(token.as_bytes()) => Auth::Valid(name),
            Some((name, _)) => Auth::WrongToken(name),
        }
    }
}
