//! `hookrelay.HookGap`: the event the relay raises when it re-creates a Disabled hook,
//! so that consumers can re-read the window whose callbacks the upstream dropped.
//!
//! The gap is written to the store before the Disabled hook is deleted and removed only
//! once the event is stored: a failure in between (the create refused, a crash) leaves
//! it pending, and it is raised when the hook is finally created.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::model::Hook;
use super::AccountId;
use crate::event_names::HOOK_GAP;
use crate::store::{unix_micros, EventMeta, EventNameOrigin, EventStatus, NewEvent};
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
}

impl PendingGap {
    /// The gap left by the Disabled `hooks` (merged into an earlier pending one).
    pub(crate) fn from_hooks(hooks: &[Hook], earlier: Option<PendingGap>, now: SystemTime) -> Self {
        let last = hooks.iter().filter_map(|h| h.last_triggered).max();
        let mut gap = earlier.unwrap_or_else(|| PendingGap {
            hook_ids: Vec::new(),
            window_start: None,
            triggered_count: 0,
            detected_at: format_utc(now),
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

    /// The store key of the pending gap of `event` for `account`.
    pub(crate) fn key(account: &AccountId, event: &str) -> String {
        format!("gap/{}/{}/{event}", account.source, account.account)
    }

    pub(crate) fn prefix(account: &AccountId) -> String {
        format!("gap/{}/{}/", account.source, account.account)
    }
}

/// The event reporting `gap`, closed by the re-creation of the hook as `new_hook` at
/// `now`. Its `data` names the old hooks, so a gap raised twice (a crash after storing
/// it) is deduplicated like any repeated occurrence.
pub(crate) fn event(
    account: &AccountId,
    event_name: &str,
    gap: &PendingGap,
    new_hook_id: &str,
    now: SystemTime,
) -> NewEvent {
    let window_end = format_utc(now);
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
    NewEvent {
        meta: EventMeta {
            source: account.source.clone(),
            event: HOOK_GAP.to_owned(),
            event_from: EventNameOrigin::Internal,
            received_at_us: unix_micros(now),
            size: body.len() as u64,
            content_type: Some("application/json".to_owned()),
            headers: Vec::new(),
            remote_addr: None,
            status: EventStatus::Received,
            flags: Vec::new(),
            reason: None,
            duplicate_of: None,
            destinations: Vec::new(),
            record: None,
        },
        body: Some(bytes::Bytes::from(body)),
    }
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
        let gap = PendingGap::from_hooks(&[disabled("46", 7, Some(1_900_000_000))], None, now);
        let account = AccountId { source: "demo".into(), account: "alice".into() };
        let e = event(&account, "ActionCreated", &gap, "51", now);
        assert_eq!((e.meta.event.as_str(), e.meta.source.as_str()), (HOOK_GAP, "demo"));
        let body: serde_json::Value = serde_json::from_slice(e.body.as_ref().unwrap()).unwrap();
        let a = &body["data"]["attributes"];
        assert_eq!(a["windowStart"], format_utc(UNIX_EPOCH + Duration::from_secs(1_900_000_000)));
        assert_eq!(a["windowEnd"], format_utc(now));
        assert_eq!((a["account"].as_str(), a["newHookId"].as_str()), (Some("alice"), Some("51")));
        assert_eq!(a["triggeredCount"], 7);
        assert_eq!(body["data"]["id"], "demo/alice/ActionCreated/46");
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
