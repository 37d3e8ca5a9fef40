//! The journal: every change made through the admin API or the console (who, when,
//! from where, what, on what, how many, the result), kept durably in the store, so
//! that every relay sharing it shows the same one, and pruned after
//! `retention.audit`.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::store::StoreError;

/// One change, as the journal keeps it. `at_us` and `tie` are its place: the journal
/// reads newest first by `(at_us, tie)`, and two relays writing in the same
/// microsecond keep both (each draws its `tie` at random).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct JournalEntry {
    /// When, in µs since the Unix epoch.
    pub(crate) at_us: u64,
    /// Orders entries of the same microsecond; random.
    pub(crate) tie: u64,
    /// The admin token's name (`admin` for `admin.token`), or what was typed at a
    /// failed sign-in's place: nothing.
    pub(crate) who: String,
    /// The client's address, when known.
    pub(crate) from: Option<String>,
    /// `replay`, `discard`, `pause`, `resume`, `hook_sync`, `sign_in`, `sign_out`,
    /// `sign_in_failed`...
    pub(crate) action: String,
    /// On what: event ids, a destination, a selection's filters (JSON text).
    pub(crate) target: String,
    /// How many deliveries, events or hooks it changed.
    pub(crate) count: u64,
    /// `ok`, or why it failed.
    pub(crate) result: String,
}

/// Which entries a reading takes: newest first, at most `limit`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct JournalFilter {
    /// Only those at or after this time (µs).
    pub(crate) since_us: Option<u64>,
    /// Only those before this place (`(at_us, tie)`, exclusive): the previous page's
    /// last entry, or a time with `tie` 0.
    pub(crate) before: Option<(u64, u64)>,
    pub(crate) who: Option<String>,
    pub(crate) action: Option<String>,
    pub(crate) limit: usize,
}

impl JournalFilter {
    /// Whether `entry` matches the filter's `who`, `action` and `since` (the backends
    /// apply `before` and the limit by the order they read in).
    pub(crate) fn takes(&self, entry: &JournalEntry) -> bool {
        self.since_us.is_none_or(|s| entry.at_us >= s)
            && self.before.is_none_or(|b| (entry.at_us, entry.tie) < b)
            && self.who.as_ref().is_none_or(|w| *w == entry.who)
            && self.action.as_ref().is_none_or(|a| *a == entry.action)
    }
}

/// The admin changes, shared by the relays on the store.
#[async_trait]
pub(crate) trait Journal: Send + Sync {
    /// Adds `entry`; durable when it returns.
    async fn journal_append(&self, entry: JournalEntry) -> Result<(), StoreError>;
    /// The entries `filter` takes, newest first.
    async fn journal_list(&self, filter: JournalFilter) -> Result<Vec<JournalEntry>, StoreError>;
    /// Removes the entries older than `before_us`; how many. Like
    /// [`super::EventLog::prune`], durable with the next durable write.
    async fn journal_prune(&self, before_us: u64) -> Result<usize, StoreError>;
}
