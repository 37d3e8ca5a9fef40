//! The simulator's REST hooks: who owns which, validation, paging, and the two
//! state changes the upstream makes on its own (triggered, disabled).
//!
//! Pure data, no I/O: the HTTP layer (`api.rs`) and the caller (`fire.rs`) lock it.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::{json, Map, Value};

use super::error::ApiError;
use crate::event_names;

/// Largest `pageSize` the upstream accepts (`upstream-api.md`, "Limits").
pub(crate) const MAX_PAGE_SIZE: u64 = 200;
/// Page size when the request names none (the upstream's default is "not shown").
pub(crate) const DEFAULT_PAGE_SIZE: u64 = 20;

/// A hook's status, as the upstream spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Active,
    Disabled,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Active => "Active",
            Status::Disabled => "Disabled",
        }
    }
}

/// One registered hook.
#[derive(Debug, Clone)]
pub(crate) struct Hook {
    pub(crate) id: u64,
    pub(crate) owner: String,
    pub(crate) event_name: String,
    pub(crate) target_url: String,
    pub(crate) status: Status,
    pub(crate) triggered_count: u64,
    pub(crate) last_triggered: Option<SystemTime>,
}

/// Switchable real-world deviations from `upstream-api.md` (see `upstream-notes.md`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct Quirks {
    /// A collection holding exactly one record is answered as an object, not an array.
    pub(crate) single_object: bool,
    /// `triggeredLastTimestamp` (null when never) instead of `lastTriggered` ("" when never).
    pub(crate) triggered_last_timestamp: bool,
}

impl Hook {
    /// The hook as a GET shows it.
    pub(crate) fn to_json(&self, quirks: Quirks) -> Value {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id.to_string()));
        m.insert("eventName".into(), json!(self.event_name));
        m.insert("targetUrl".into(), json!(self.target_url));
        m.insert("status".into(), json!(self.status.as_str()));
        m.insert("triggeredCount".into(), json!(self.triggered_count));
        let last = self.last_triggered.map(crate::timefmt::format_utc);
        if quirks.triggered_last_timestamp {
            m.insert("triggeredLastTimestamp".into(), json!(last));
        } else {
            m.insert("lastTriggered".into(), json!(last.unwrap_or_default()));
        }
        Value::Object(m)
    }
}

/// A page of a user's hooks and where it sits.
#[derive(Debug)]
pub(crate) struct Page {
    pub(crate) hooks: Vec<Hook>,
    pub(crate) record_count: u64,
    pub(crate) page: u64,
    pub(crate) page_size: u64,
}

impl Page {
    pub(crate) fn page_count(&self) -> u64 {
        self.record_count.div_ceil(self.page_size)
    }
}

/// A hook call the simulator is about to make.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) hook_id: u64,
    pub(crate) owner: String,
    pub(crate) target_url: String,
    pub(crate) trigger_count: u64,
}

/// Every hook of every user.
#[derive(Debug, Default)]
pub(crate) struct Hooks {
    hooks: BTreeMap<u64, Hook>,
    last_id: u64,
}

impl Hooks {
    /// `owner`'s hooks, page `page` (from 1) of `page_size`.
    pub(crate) fn list(&self, owner: &str, page: u64, page_size: u64) -> Result<Page, ApiError> {
        if page == 0 {
            return Err(ApiError::bad_request("page starts at 1"));
        }
        if page_size == 0 || page_size > MAX_PAGE_SIZE {
            return Err(ApiError::bad_request(format!(
                "pageSize must be between 1 and {MAX_PAGE_SIZE}"
            )));
        }
        let own: Vec<&Hook> = self.hooks.values().filter(|h| h.owner == owner).collect();
        let skip = usize::try_from((page - 1).saturating_mul(page_size)).unwrap_or(usize::MAX);
        let hooks = own.iter().skip(skip).take(page_size as usize).map(|h| (*h).clone()).collect();
        Ok(Page { hooks, record_count: own.len() as u64, page, page_size })
    }

    /// `owner`'s hooks by id; a hook of another user is as absent as a missing one.
    pub(crate) fn get(&self, owner: &str, ids: &[u64]) -> Result<Vec<Hook>, ApiError> {
        ids.iter()
            .map(|id| {
                self.hooks
                    .get(id)
                    .filter(|h| h.owner == owner)
                    .cloned()
                    .ok_or_else(|| ApiError::not_found(*id))
            })
            .collect()
    }

    /// Creates one hook per record of `{ resthooks: <record> | [<record>, ...] }`; all
    /// records are validated before any is created.
    pub(crate) fn create(&mut self, owner: &str, body: &Value) -> Result<Vec<Hook>, ApiError> {
        let inputs = records(body)?
            .iter()
            .map(|r| HookInput::parse(r, true))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(inputs
            .into_iter()
            .map(|input| {
                self.last_id += 1;
                let hook = Hook {
                    id: self.last_id,
                    owner: owner.to_owned(),
                    event_name: input.event_name.unwrap_or_default(),
                    target_url: input.target_url.unwrap_or_default(),
                    status: Status::Active,
                    triggered_count: 0,
                    last_triggered: None,
                };
                self.hooks.insert(hook.id, hook.clone());
                hook
            })
            .collect())
    }

    /// Changes `eventName` and/or `targetUrl` of the hooks at `ids`. Each record names
    /// its `id` when several are updated; a single record may take it from the path.
    /// The status stays as it is: re-enabling is not part of the interface.
    pub(crate) fn update(
        &mut self,
        owner: &str,
        ids: &[u64],
        body: &Value,
    ) -> Result<Vec<Hook>, ApiError> {
        let records = records(body)?;
        let mut changes = Vec::new();
        for record in &records {
            let id = match (record.get("id"), ids) {
                (Some(id), _) => parse_id_value(id)?,
                (None, [only]) => *only,
                (None, _) => return Err(ApiError::bad_request("each record must carry its id")),
            };
            if !ids.contains(&id) {
                return Err(ApiError::bad_request(format!("record id {id} is not in the path")));
            }
            self.get(owner, &[id])?;
            changes.push((id, HookInput::parse(record, false)?));
        }
        let mut updated = Vec::new();
        for (id, input) in changes {
            if let Some(hook) = self.hooks.get_mut(&id) {
                if let Some(name) = input.event_name {
                    hook.event_name = name;
                }
                if let Some(url) = input.target_url {
                    hook.target_url = url;
                }
                updated.push(hook.clone());
            }
        }
        Ok(updated)
    }

    /// Deletes `owner`'s hooks at `ids`: all of them, or none if one is not theirs.
    pub(crate) fn delete(&mut self, owner: &str, ids: &[u64]) -> Result<(), ApiError> {
        self.get(owner, ids)?;
        for id in ids {
            self.hooks.remove(id);
        }
        Ok(())
    }

    /// Records an occurrence of `event` on every Active hook for it and returns the calls
    /// to make, one per hook (two users on the same event and URL: two calls).
    pub(crate) fn trigger(&mut self, event: &str, now: SystemTime) -> Vec<Call> {
        self.hooks
            .values_mut()
            .filter(|h| h.status == Status::Active && h.event_name == event)
            .map(|h| {
                h.triggered_count += 1;
                h.last_triggered = Some(now);
                Call {
                    hook_id: h.id,
                    owner: h.owner.clone(),
                    target_url: h.target_url.clone(),
                    trigger_count: h.triggered_count,
                }
            })
            .collect()
    }

    /// The target answered something other than 200: the hook stops being used.
    pub(crate) fn disable(&mut self, id: u64) {
        if let Some(hook) = self.hooks.get_mut(&id) {
            hook.status = Status::Disabled;
        }
    }

    /// Every hook of every user, by id.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Hook> {
        self.hooks.values()
    }

    #[cfg(test)]
    pub(crate) fn hook(&self, id: u64) -> Option<&Hook> {
        self.hooks.get(&id)
    }
}

/// The records of a `{ "resthooks": ... }` body, one or many.
fn records(body: &Value) -> Result<Vec<Map<String, Value>>, ApiError> {
    let payload = body.get("resthooks").ok_or_else(|| {
        ApiError::bad_request("the body must be { \"resthooks\": <record or array> }")
    })?;
    let items: Vec<&Value> = match payload {
        Value::Array(items) if !items.is_empty() => items.iter().collect(),
        Value::Array(_) => return Err(ApiError::bad_request("resthooks: empty array")),
        one => vec![one],
    };
    items
        .into_iter()
        .map(|item| {
            item.as_object()
                .cloned()
                .ok_or_else(|| ApiError::bad_request("resthooks: each record must be an object"))
        })
        .collect()
}

/// The writable fields of a hook record.
struct HookInput {
    event_name: Option<String>,
    target_url: Option<String>,
}

impl HookInput {
    fn parse(record: &Map<String, Value>, required: bool) -> Result<Self, ApiError> {
        let text = |key: &str| -> Result<Option<String>, ApiError> {
            match record.get(key) {
                None if required => Err(ApiError::bad_request(format!("{key} is required"))),
                None => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(ApiError::bad_request(format!("{key} must be a string"))),
            }
        };
        let event_name = text("eventName")?;
        if let Some(name) = &event_name {
            if !event_names::KNOWN.contains(&name.as_str()) {
                return Err(ApiError::bad_request(format!(
                    "eventName {name:?} is not one of the {} event names",
                    event_names::KNOWN.len()
                )));
            }
        }
        let target_url = text("targetUrl")?;
        if let Some(url) = &target_url {
            if !is_absolute_http_url(url) {
                return Err(ApiError::bad_request(format!(
                    "targetUrl {url:?} is not an absolute http(s) URL"
                )));
            }
        }
        Ok(Self { event_name, target_url })
    }
}

fn is_absolute_http_url(text: &str) -> bool {
    reqwest::Url::parse(text)
        .map(|u| {
            matches!(u.scheme(), "http" | "https") && u.host_str().is_some_and(|h| !h.is_empty())
        })
        .unwrap_or(false)
}

/// Parses `12` or `12,13` from a path segment.
pub(crate) fn parse_ids(segment: &str) -> Result<Vec<u64>, ApiError> {
    let ids = segment
        .split(',')
        .map(|s| {
            s.trim().parse::<u64>().map_err(|_| ApiError::bad_request(format!("bad id {s:?}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if ids.is_empty() {
        return Err(ApiError::bad_request("no id"));
    }
    Ok(ids)
}

fn parse_id_value(value: &Value) -> Result<u64, ApiError> {
    match value {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
    .ok_or_else(|| ApiError::bad_request(format!("bad id {value}")))
}

#[cfg(test)]
mod tests;
