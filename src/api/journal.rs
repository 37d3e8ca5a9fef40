//! The journal of changes made through the admin API or the console, and a reload's
//! answer.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Timestamp;

/// One change made through the admin API or the console, as the journal keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct JournalEntry {
    /// Its place in the journal: `before` of the next page takes it.
    pub(crate) id: String,
    #[schemars(with = "Timestamp")]
    pub(crate) at: String,
    /// The admin token's name (`admin` for `admin.token`); empty for a failed sign-in;
    /// `SIGHUP` for a reload the service manager asked (`systemctl reload`).
    pub(crate) who: String,
    /// The client's address.
    pub(crate) from: Option<String>,
    /// `replay`, `discard`, `pause`, `resume`, `hook_sync`, `reload`, `backup`,
    /// `sign_in`, `sign_out` or `sign_in_failed`.
    pub(crate) action: String,
    /// On what: event ids and destinations, a dead-letter query, a selection, accounts.
    pub(crate) target: serde_json::Value,
    /// How many deliveries, events, destinations or hooks it changed.
    pub(crate) count: u64,
    /// `ok`, or why it failed.
    pub(crate) result: String,
}

/// A page of the journal, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct JournalPage {
    pub(crate) entries: Vec<JournalEntry>,
    /// Pass as `before` for the next (older) page; absent on the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) next_before: Option<String>,
}

/// The answer to `POST /admin/reload`: what the configuration read again put in force.
/// A reload refused (a key only a restart changes) or failed (the file does not load)
/// is answered 409 and changes nothing.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Reloaded {
    /// `reloaded`, or `unchanged` when the file says what runs already.
    pub(crate) result: String,
    /// Destinations new in the file: their workers started.
    pub(crate) added: Vec<String>,
    /// Destinations whose settings changed: each takes them once its attempts in flight
    /// (made under the old ones) are recorded.
    pub(crate) changed: Vec<String>,
    /// Destinations gone from the file: their pending deliveries are held (made dead
    /// after `retention.removed_destinations` unless the destination comes back).
    pub(crate) removed: Vec<String>,
    /// Whether the sources or the upstream accounts changed (the reconciler started
    /// again on them).
    pub(crate) sources: bool,
    /// Whether the admin tokens or roles changed.
    pub(crate) tokens: bool,
    /// The fingerprint of the configuration in force (hex; the gauge
    /// `hookrelay_config_fingerprint` shows it as a number).
    pub(crate) fingerprint: String,
}
