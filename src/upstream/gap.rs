//! `hookrelay.HookGap`: the event the relay raises when it re-creates a Disabled hook,
//! so that consumers can re-read the window whose callbacks the upstream dropped.
//!
//! The gap is written to the store before the Disabled hook is deleted and removed only
//! once the event is stored: a failure in between (the create refused, a crash) leaves
//! it pending, and it is raised when the hook is finally created. Once the new hook
//! exists the gap is **closed** in the store (its window's end and the new hook's id)
//! before the event is stored, so the event's body is fixed: a crash between storing
//! the event and forgetting the gap raises it again with the same body, which dedup
//! drops as a copy (if the source deduplicates, within its `dedup_window`), and a closed gap is never
//! merged into a later one (that widened the later gap's window).

use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::model::Hook;
use super::status::GapView;
use super::AccountId;
use crate::event_names::HOOK_GAP;
use crate::store::{EventId, NewEvent};
use crate::timefmt::format_utc;

/// A gap found but not yet reported.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct PendingGap {
    /// The Disabled hooks found.
    pub(crate) hook_ids: Vec<String>,
    /// Their last trigger (the call that failed): callbacks may be missing from here.
    pub(crate) window_start: Option<String>,
    /// Calls the upstream counted on them.
    pub(crate) triggered_count: u64,
    /// When the relay noticed.
    pub(crate) detected_at: String,
    /// Set once the new hook exists: the gap is then only to be reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) closed: Option<ClosedGap>,
}

/// The end of a gap: the hook that replaced the Disabled ones, and when.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ClosedGap {
    pub(crate) window_end: String,
    pub(crate) new_hook_id: String,
}

impl PendingGap {
    /// The gap left by the Disabled `hooks` (merged into an earlier pending one that
    /// is still open; a closed one is another gap, reported on its own).
    pub(crate) fn from_hooks(hooks: &[Hook], earlier: Option<PendingGap>, now: SystemTime) -> Self {
        let last = hooks.iter().filter_map(|h| h.last_triggered).max();
        let mut gap = earlier.filter(|g| g.closed.is_none()).unwrap_or_else(|| PendingGap {
            hook_ids: Vec::new(),
            window_start: None,
            triggered_count: 0,
            detected_at: format_utc(now),
            closed: None,
        });
        for h in hooks {
            if !gap.hook_ids.contains(&h.id) {
                gap.hook_ids.push(h.id.clone());
                gap.triggered_count += h.triggered_count;
            }
        }
        // The earliest known start wins: the window must cover every lost callback.
        if gap.window_start.is_none() {
            gap.window_start = last.map(format_utc);
        }
        gap
    }

    /// The gap ended by `new_hook_id` at `now` (an already closed gap keeps its end).
    pub(crate) fn close(mut self, new_hook_id: &str, now: SystemTime) -> Self {
        self.closed.get_or_insert_with(|| ClosedGap {
            window_end: format_utc(now),
            new_hook_id: new_hook_id.to_owned(),
        });
        self
    }

    /// The store key of the pending gap of `event` for `account`.
    pub(crate) fn key(account: &AccountId, event: &str) -> String {
        format!("gap/{}/{}/{event}", account.source, account.account)
    }

    pub(crate) fn prefix(account: &AccountId) -> String {
        format!("gap/{}/{}/", account.source, account.account)
    }

    /// What is kept of the gap once reported as `reported_by` (None before it is
    /// closed).
    pub(crate) fn view(&self, event: &str, reported_by: EventId) -> Option<GapView> {
        let closed = self.closed.as_ref()?;
        Some(GapView {
            event: event.to_owned(),
            window_start: self.window_start.clone().unwrap_or_else(|| self.detected_at.clone()),
            window_end: closed.window_end.clone(),
            triggered_count: self.triggered_count,
            disabled_hook_ids: self.hook_ids.clone(),
            new_hook_id: closed.new_hook_id.clone(),
            hook_gap_event: reported_by.to_string(),
        })
    }
}

/// The store key of the last gap reported for `event` of `account` (shown by
/// `GET /admin/hooks`; not under `gap/`, which holds the gaps still to report).
pub(crate) fn last_key(account: &AccountId, event: &str) -> String {
    format!("lastgap/{}/{}/{event}", account.source, account.account)
}

/// The prefix of [`last_key`] for `account`.
pub(crate) fn last_prefix(source: &str, account: &str) -> String {
    format!("lastgap/{source}/{account}/")
}

/// The event reporting the closed `gap`, stored at `now`. Its body depends on the
/// gap alone, so the same gap raised twice (a crash after storing it) has the same
/// body: dropped as a copy when the source deduplicates and the second comes within
/// its `dedup_window`; otherwise delivered twice, which a consumer can tell by the
/// body.
pub(crate) fn event(
    account: &AccountId,
    event_name: &str,
    gap: &PendingGap,
    closed: &ClosedGap,
    now: SystemTime,
) -> NewEvent {
    let (window_end, new_hook_id) = (&closed.window_end, &closed.new_hook_id);
    let body = json!({
        "data": {
            "type": "hookgaps",
            "id": format!("{}/{}/{event_name}/{}", account.source, account.account, gap.hook_ids.join(",")),
            "attributes": {
                "source": account.source,
                "account": account.account,
                "eventName": event_name,
                "windowStart": gap.window_start.as_deref().unwrap_or(&gap.detected_at),
                "windowEnd": window_end,
                "disabledHookIds": gap.hook_ids,
                "newHookId": new_hook_id,
                "triggeredCount": gap.triggered_count,
                "detectedAt": gap.detected_at,
            }
        },
        "meta": {"hookrelay": {"event": HOOK_GAP}}
    })
    .to_string();
    NewEvent::internal(&account.source, HOOK_GAP, body, None, now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn disabled(id: &str, count: u64, last: Option<u64>) -> Hook {
        Hook {
            id: id.into(),
            event_name: "ActionCreated".into(),
            target_url: "https://r/h".into(),
            status: "Disabled".into(),
            triggered_count: count,
            last_triggered: last.map(|s| UNIX_EPOCH + Duration::from_secs(s)),
        }
    }

    #[test]
    fn the_window_starts_at_the_last_trigger_and_ends_at_recreation() {
        let now = UNIX_EPOCH + Duration::from_secs(2_000_000_000);
        let gap = PendingGap::from_hooks(&[disabled("46", 7, Some(1_900_000_000))], None, now)
            .close("51", now);
        let account = AccountId { source: "demo".into(), account: "alice".into() };
        let e = event(&account, "ActionCreated", &gap, gap.closed.as_ref().unwrap(), now);
        assert_eq!((e.meta.event.as_str(), e.meta.source.as_str()), (HOOK_GAP, "demo"));
        let body: serde_json::Value = serde_json::from_slice(e.body.as_ref().unwrap()).unwrap();
        let a = &body["data"]["attributes"];
        assert_eq!(a["windowStart"], format_utc(UNIX_EPOCH + Duration::from_secs(1_900_000_000)));
        assert_eq!(a["windowEnd"], format_utc(now));
        assert_eq!((a["account"].as_str(), a["newHookId"].as_str()), (Some("alice"), Some("51")));
        assert_eq!(a["triggeredCount"], 7);
        assert_eq!(body["data"]["id"], "demo/alice/ActionCreated/46");
    }

    /// A gap raised again after a crash (stored, not yet forgotten) is the same
    /// occurrence: byte for byte the same body, whenever it is raised.
    #[test]
    fn a_closed_gap_raised_twice_has_the_same_body() {
        let t0 = UNIX_EPOCH + Duration::from_secs(2_000_000_000);
        let gap = PendingGap::from_hooks(&[disabled("46", 7, Some(1_900_000_000))], None, t0)
            .close("51", t0)
            .close("52", t0 + Duration::from_secs(99));
        let closed = gap.closed.clone().unwrap();
        assert_eq!(closed.new_hook_id, "51", "closing twice keeps the first end");
        let account = AccountId { source: "demo".into(), account: "alice".into() };
        let first = event(&account, "ActionCreated", &gap, &closed, t0);
        let again = event(&account, "ActionCreated", &gap, &closed, t0 + Duration::from_secs(600));
        assert_eq!(first.body, again.body);
        // Stored and read back (as after the crash), still the same.
        let read: PendingGap = serde_json::from_slice(&serde_json::to_vec(&gap).unwrap()).unwrap();
        assert_eq!(event(&account, "ActionCreated", &read, &closed, t0).body, first.body);
    }

    /// A closed gap left pending by a crash is not merged into the next one: the next
    /// window starts at the next Disabled hook's last trigger, not at the old one's.
    #[test]
    fn a_closed_gap_is_never_merged_into_the_next() {
        let t0 = UNIX_EPOCH + Duration::from_secs(2_000_000_000);
        let old =
            PendingGap::from_hooks(&[disabled("46", 7, Some(1_000))], None, t0).close("51", t0);
        let next = PendingGap::from_hooks(&[disabled("51", 3, Some(5_000))], Some(old), t0);
        assert_eq!(next.hook_ids, ["51"]);
        assert_eq!(next.triggered_count, 3);
        assert_eq!(next.window_start, Some(format_utc(UNIX_EPOCH + Duration::from_secs(5_000))));
        assert!(next.closed.is_none());
    }

    #[test]
    fn a_pending_gap_keeps_its_start_when_merged() {
        let now = SystemTime::now();
        let first = PendingGap::from_hooks(&[disabled("1", 2, Some(100))], None, now);
        let merged = PendingGap::from_hooks(
            &[disabled("1", 2, Some(100)), disabled("2", 3, Some(200))],
            Some(first.clone()),
            now,
        );
        assert_eq!(merged.window_start, first.window_start);
        assert_eq!(merged.hook_ids, vec!["1", "2"]);
        assert_eq!(merged.triggered_count, 5);
    }
}
