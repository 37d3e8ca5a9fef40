//! Writing the journal: every change made through the admin API or the console is
//! recorded with who made it, from where, on what, how many and the result
//! (`store::Journal` keeps it, shared by the fleet). A [`Caller`] is what the guard
//! puts in each admin request: the holder, its address and the journal, so a handler
//! records its change in one call.

use std::net::IpAddr;
use std::ops::Deref;
use std::sync::Arc;

use serde_json::Value;

use super::Principal;
use crate::internal_events::taxonomy::{self, ErrorType, Stage};
use crate::metrics::Metrics;
use crate::operational::OperationalEvent;
use crate::store::{JournalEntry, SharedStore};

/// What a change is, in the journal's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Replay,
    Discard,
    Pause,
    Resume,
    HookSync,
    SignIn,
    SignOut,
    SignInFailed,
    Reload,
    Backup,
}

impl Action {
    /// As the journal and its filter write it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Action::Replay => "replay",
            Action::Discard => "discard",
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::HookSync => "hook_sync",
            Action::SignIn => "sign_in",
            Action::SignOut => "sign_out",
            Action::SignInFailed => "sign_in_failed",
            Action::Reload => "reload",
            Action::Backup => "backup",
        }
    }

    /// Every action (the API's filter takes these).
    pub(crate) const ALL: [Action; 10] = [
        Action::Replay,
        Action::Discard,
        Action::Pause,
        Action::Resume,
        Action::HookSync,
        Action::SignIn,
        Action::SignOut,
        Action::SignInFailed,
        Action::Reload,
        Action::Backup,
    ];
}

/// Writes entries to the store's journal; without a store (unit tests), nowhere.
pub(crate) struct Recorder {
    store: Option<SharedStore>,
    metrics: Arc<Metrics>,
}

impl Recorder {
    pub(crate) fn new(store: Option<SharedStore>, metrics: Arc<Metrics>) -> Self {
        Self { store, metrics }
    }

    /// Records that `who` (from `from`) did `action` on `target`, changing `count`
    /// things, with `result` (`Ok`, or why it failed). The change is made already: a
    /// journal the store cannot write to is counted as an admin error and logged,
    /// and the change stands.
    pub(crate) async fn record(
        &self,
        who: &str,
        from: Option<IpAddr>,
        action: Action,
        target: Value,
        count: u64,
        result: Result<(), String>,
    ) {
        let Some(store) = &self.store else { return };
        let entry = JournalEntry {
            at_us: crate::clock::now_us(),
            // Below 2⁶³: a PostgreSQL bigint holds it.
            tie: fastrand::u64(..1 << 63),
            who: who.to_owned(),
            from: from.map(|a| a.to_string()),
            action: action.name().to_owned(),
            target: target.to_string(),
            count,
            result: result.err().unwrap_or_else(|| "ok".into()),
        };
        let raised = OperationalEvent::AdminAction {
            who,
            from: entry.from.as_deref(),
            action: action.name(),
            target: &entry.target,
            count,
            result: &entry.result,
        };
        // Raised even when the journal cannot be written: it is then the only trace.
        self.metrics.operational.raise(&raised);
        if let Err(e) = store.journal_append(entry).await {
            let what = format!("cannot write {who}'s {} to the journal", action.name());
            taxonomy::failed(&self.metrics, Stage::Admin, ErrorType::Storage, &what, &e);
        }
    }
}

/// Who is calling an admin route: the holder, from where, and the journal to record
/// its changes in. Reads as its [`Principal`].
#[derive(Clone)]
pub(crate) struct Caller {
    pub(crate) principal: Arc<Principal>,
    pub(crate) from: Option<IpAddr>,
    pub(crate) journal: Arc<Recorder>,
}

impl Caller {
    /// Records this caller's `action` on `target` (see [`Recorder::record`]).
    pub(crate) async fn record(
        &self,
        action: Action,
        target: Value,
        count: u64,
        result: Result<(), String>,
    ) {
        let name = &self.principal.name;
        self.journal.record(name, self.from, action, target, count, result).await;
    }
}

impl Deref for Caller {
    type Target = Principal;
    fn deref(&self) -> &Principal {
        &self.principal
    }
}
