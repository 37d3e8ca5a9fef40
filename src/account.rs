//! The name of an upstream account: a leaf, so that the layers below `upstream`
//! (the internal events, the metrics) can name an account without importing the
//! room that talks to the upstream.

/// Names an account: the source it serves and its own name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct AccountId {
    pub(crate) source: String,
    pub(crate) account: String,
}
