//! Raising events: every matching Active hook is called once, with a JSON:API body
//! like the real service's; transient network errors are retried, any answer but 200
//! disables the hook.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::hooks::Call;
use super::state::{lock, SimState};

/// One occurrence to raise (the body of `POST /sim/events`, without the load part).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Occurrence {
    /// One of the 21 event names.
    pub(crate) event: String,
    /// `data.id`; generated when absent.
    #[serde(default)]
    pub(crate) id: Option<String>,
    /// `data.attributes`; generated when absent.
    #[serde(default)]
    pub(crate) attributes: Option<Value>,
}

/// How one hook call ended.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum CallOutcome {
    /// Answered 200.
    Delivered,
    /// Answered something else: the hook is Disabled now.
    Disabled,
    /// Network errors on every attempt: lost, but the hook stays Active.
    Failed,
}

/// The report of one call.
#[derive(Debug, Serialize)]
pub(crate) struct CallReport {
    pub(crate) hook: String,
    pub(crate) user: String,
    pub(crate) outcome: CallOutcome,
    pub(crate) attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

/// The report of one occurrence.
#[derive(Debug, Serialize)]
pub(crate) struct OccurrenceReport {
    pub(crate) event: String,
    pub(crate) resource: Value,
    pub(crate) calls: Vec<CallReport>,
}

/// Totals since the simulator started (`GET /sim/stats`).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    occurrences: AtomicU64,
    delivered: AtomicU64,
    disabled: AtomicU64,
    failed: AtomicU64,
}

impl Stats {
    pub(crate) fn to_json(&self) -> Value {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        json!({
            "occurrences": get(&self.occurrences),
            "calls": {
                "delivered": get(&self.delivered),
                "disabled": get(&self.disabled),
                "failed": get(&self.failed),
            }
        })
    }

    fn count(&self, outcome: &CallOutcome) {
        let counter = match outcome {
            CallOutcome::Delivered => &self.delivered,
            CallOutcome::Disabled => &self.disabled,
            CallOutcome::Failed => &self.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The resource type an event is about (`data.type`).
pub(crate) fn resource_type(event: &str) -> &'static str {
    const TYPES: [(&str, &str); 10] = [
        ("ActionDocument", "actiondocuments"),
        ("ActionParticipant", "actionparticipants"),
        ("Action", "actions"),
        ("DataCollectionRecord", "datacollectionrecords"),
        ("Disbursement", "disbursements"),
        ("FileNote", "filenotes"),
        ("Participant", "participants"),
        ("StepChanged", "steps"),
        ("Task", "tasks"),
        ("TimeEntry", "timeentries"),
    ];
    TYPES.iter().find(|(prefix, _)| event.starts_with(prefix)).map_or("records", |(_, t)| t)
}

/// Raises `occ`: records the trigger on every matching Active hook, then calls them
/// all concurrently.
pub(crate) async fn raise(state: &Arc<SimState>, occ: &Occurrence) -> OccurrenceReport {
    let now = SystemTime::now();
    let id = occ
        .id
        .clone()
        .unwrap_or_else(|| state.next_resource.fetch_add(1, Ordering::Relaxed).to_string());
    let kind = resource_type(&occ.event);
    let attributes = occ.attributes.clone().unwrap_or_else(|| {
        json!({"name": format!("{kind} {id}"), "updatedTimestamp": crate::timefmt::format_utc(now)})
    });
    let data = json!({"type": kind, "id": id, "attributes": attributes});
    let calls = lock(&state.hooks).trigger(&occ.event, now);
    let sends = calls.into_iter().map(|call| {
        let body = body(&data, &occ.event, &call, now);
        call_hook(state, call, body)
    });
    let calls = futures_util::future::join_all(sends).await;
    state.stats.occurrences.fetch_add(1, Ordering::Relaxed);
    for call in &calls {
        state.stats.count(&call.outcome);
    }
    OccurrenceReport { event: occ.event.clone(), resource: json!({"type": kind, "id": id}), calls }
}

/// The callback body of `upstream-notes.md`: the record, plus a debug block naming the
/// hook (which differs between the copies several users' hooks receive).
fn body(data: &Value, event: &str, call: &Call, now: SystemTime) -> Vec<u8> {
    let time = crate::timefmt::format_utc(now).replacen('T', " ", 1).replace("+00:00", " +0000");
    json!({
        "jsonapi": {"version": "1.0"},
        "data": data,
        "meta": {"debug": {
            "time": time,
            "resthook": {
                "id": call.hook_id.to_string(),
                "target": call.target_url,
                "trigger_count": call.trigger_count,
                "event_name": event,
                "resource_type": data["type"],
                "resource_id": data["id"],
            }
        }}
    })
    .to_string()
    .into_bytes()
}

async fn call_hook(state: &Arc<SimState>, call: Call, body: Vec<u8>) -> CallReport {
    let config = &state.config;
    let mut report = CallReport {
        hook: call.hook_id.to_string(),
        user: call.owner.clone(),
        outcome: CallOutcome::Failed,
        attempts: 0,
        status: None,
        error: None,
    };
    let mut backoff = config.callback_retry_backoff;
    loop {
        report.attempts += 1;
        let sent = state
            .http
            .post(&call.target_url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(response) if response.status().as_u16() == 200 => {
                report.outcome = CallOutcome::Delivered;
                report.status = Some(200);
                return report;
            }
            Ok(response) => {
                let status = response.status().as_u16();
                lock(&state.hooks).disable(call.hook_id);
                // The target URL carries the registrant's secret: only the id is logged.
                tracing::warn!(
                    hook = call.hook_id,
                    status,
                    "target did not answer 200; hook disabled"
                );
                report.outcome = CallOutcome::Disabled;
                report.status = Some(status);
                return report;
            }
            Err(e) => {
                report.error = Some(describe(&e));
                if report.attempts > config.callback_retries {
                    tracing::warn!(
                        hook = call.hook_id,
                        attempts = report.attempts,
                        error = report.error.as_deref().unwrap_or(""),
                        "target unreachable; call lost, hook stays Active"
                    );
                    return report;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// A network error in a few words, without the URL (it carries a secret).
fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".into()
    } else if e.is_connect() {
        "connection failed".into()
    } else {
        "connection error".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_map_to_resource_types() {
        assert_eq!(resource_type("ActionCreated"), "actions");
        assert_eq!(resource_type("ActionDocumentDeleted"), "actiondocuments");
        assert_eq!(resource_type("ActionParticipantAdded"), "actionparticipants");
        assert_eq!(resource_type("ParticipantUpdated"), "participants");
        assert_eq!(resource_type("TimeEntryUpdated"), "timeentries");
        for name in crate::event_names::KNOWN {
            assert_ne!(resource_type(name), "records", "{name}");
        }
    }

    #[test]
    fn body_names_the_hook_and_keeps_data_identical_across_hooks() {
        let data = json!({"type": "actions", "id": "5", "attributes": {"name": "x"}});
        let now = SystemTime::now();
        let call = |id| Call {
            hook_id: id,
            owner: "u".into(),
            target_url: "http://t/".into(),
            trigger_count: 3,
        };
        let a: Value =
            serde_json::from_slice(&body(&data, "ActionCreated", &call(1), now)).unwrap();
        let b: Value =
            serde_json::from_slice(&body(&data, "ActionCreated", &call(2), now)).unwrap();
        assert_eq!(a["data"], b["data"]);
        assert_ne!(a["meta"], b["meta"]);
        let hook = &a["meta"]["debug"]["resthook"];
        assert_eq!(
            (hook["id"].as_str(), hook["event_name"].as_str()),
            (Some("1"), Some("ActionCreated"))
        );
        assert_eq!(
            (hook["trigger_count"].as_u64(), hook["resource_id"].as_str()),
            (Some(3), Some("5"))
        );
        assert_eq!(a["jsonapi"]["version"], "1.0");
    }
}
