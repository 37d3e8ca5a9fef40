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
use crate::store::{JournalEntry, QueueChange, SharedStore, StoreError};

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

/// Writes entries to the store's journal.
pub(crate) struct Recorder {
    store: SharedStore,
    metrics: Arc<Metrics>,
}

/// An entry of `who`'s (from `from`) `action` on `target`, changing `count` things,
/// with `result`, placed now.
fn entry(
    who: &str,
    from: Option<IpAddr>,
    action: Action,
    target: &Value,
    count: u64,
    result: Result<(), String>,
) -> JournalEntry {
    JournalEntry {
        at_us: crate::clock::now_us(),
        // Below 2⁶³: a PostgreSQL bigint holds it.
        tie: fastrand::u64(..1 << 63),
        who: who.to_owned(),
        from: from.map(|a| a.to_string()),
        action: action.name().to_owned(),
        target: target.to_string(),
        count,
        result: result.err().unwrap_or_else(|| "ok".into()),
    }
}

impl Recorder {
    pub(crate) fn new(store: SharedStore, metrics: Arc<Metrics>) -> Self {
        Self { store, metrics }
    }

    /// Exports `entry` as the operational event `hookrelay.AdminAction`.
    fn raise(&self, entry: &JournalEntry, action: Action) {
        self.metrics.operational.raise(&OperationalEvent::AdminAction {
            who: &entry.who,
            from: entry.from.as_deref(),
            action: action.name(),
            target: &entry.target,
            count: entry.count,
            result: &entry.result,
        });
    }

    /// Records that `who` (from `from`) did `action` on `target`, changing `count`
    /// things, with `result` (`Ok`, or why it failed): a change outside the store (a
    /// reload, a hook sync, a sign-in) or one that failed. A journal the store cannot
    /// write to is counted as an admin error and logged, and the change stands; the
    /// operational event is raised even then (it is the only trace).
    pub(crate) async fn record(
        &self,
        who: &str,
        from: Option<IpAddr>,
        action: Action,
        target: Value,
        count: u64,
        result: Result<(), String>,
    ) {
        let entry = entry(who, from, action, &target, count, result);
        self.raise(&entry, action);
        if let Err(e) = self.store.journal_append(entry).await {
            let what = format!("cannot write {who}'s {} to the journal", action.name());
            taxonomy::failed(&self.metrics, Stage::Admin, ErrorType::Storage, &what, &e);
        }
    }

    /// Makes `change` in the store and journals it in the same transaction
    /// ([`crate::store::DeliveryQueue::change`]); how many things it changed. On an
    /// error nothing was changed nor journalled: the caller records the failure.
    pub(crate) async fn change(
        &self,
        who: &str,
        from: Option<IpAddr>,
        action: Action,
        target: &Value,
        change: QueueChange,
    ) -> Result<u64, StoreError> {
        let mut entry = entry(who, from, action, target, 0, Ok(()));
        entry.count = self.store.change(change, Some(entry.clone())).await?;
        self.raise(&entry, action);
        Ok(entry.count)
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

    /// Makes this caller's `action` on `target`, `change`, journalled with it (see
    /// [`Recorder::change`]).
    pub(crate) async fn change(
        &self,
        action: Action,
        target: &Value,
        change: QueueChange,
    ) -> Result<u64, StoreError> {
        self.journal.change(&self.principal.name, self.from, action, target, change).await
    }
}

impl Deref for Caller {
    type Target = Principal;
    fn deref(&self) -> &Principal {
        &self.principal
    }
}
