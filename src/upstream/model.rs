//! The upstream's resthook records as they arrive, in both shapes seen in the wild:
//! `lastTriggered` ("" when never) or `triggeredLastTimestamp` (null when never), and a
//! collection of one returned as an object rather than an array.

use std::time::SystemTime;

use serde_json::Value;

use super::UpstreamError;

/// A hook as the upstream reports it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Hook {
    pub(crate) id: String,
    pub(crate) event_name: String,
    pub(crate) target_url: String,
    /// `Active`, `Disabled`, `Deleted` (or whatever else the upstream says).
    pub(crate) status: String,
    pub(crate) triggered_count: u64,
    pub(crate) last_triggered: Option<SystemTime>,
}

impl Hook {
    pub(crate) fn is_active(&self) -> bool {
        self.status == "Active"
    }

    fn parse(v: &Value) -> Result<Self, UpstreamError> {
        let text = |key: &str| match v.get(key) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        let id = text("id").ok_or_else(|| bad("a resthook without an id"))?;
        let count = match v.get("triggeredCount") {
            Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
            Some(Value::String(s)) => s.parse().unwrap_or(0),
            _ => 0,
        };
        let last = text("lastTriggered")
            .or_else(|| text("triggeredLastTimestamp"))
            .and_then(|t| crate::timefmt::parse(&t));
        Ok(Self {
            id,
            event_name: text("eventName").unwrap_or_default(),
            target_url: text("targetUrl").unwrap_or_default(),
            status: text("status").unwrap_or_default(),
            triggered_count: count,
            last_triggered: last,
        })
    }
}

fn bad(what: &str) -> UpstreamError {
    UpstreamError::Unexpected(what.to_owned())
}

/// The hooks of a `{ "resthooks": <hook> | [<hook>, ...] }` body.
pub(crate) fn parse_hooks(body: &[u8]) -> Result<Vec<Hook>, UpstreamError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| UpstreamError::Unexpected(format!("answer is not JSON: {e}")))?;
    match v.get("resthooks") {
        Some(Value::Array(items)) => items.iter().map(Hook::parse).collect(),
        Some(one @ Value::Object(_)) => Ok(vec![Hook::parse(one)?]),
        Some(Value::Null) | None => Err(bad("answer has no `resthooks`")),
        Some(_) => Err(bad("`resthooks` is neither an object nor an array")),
    }
}

/// `meta.paging.resthooks.nextPage` of a collection page: `None` on the last page (or
/// when the upstream sends no paging block at all).
pub(crate) fn next_page(body: &[u8]) -> Option<u64> {
    let v: Value = serde_json::from_slice(body).ok()?;
    match &v["meta"]["paging"]["resthooks"]["nextPage"] {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_specified_shape() {
        let body = br#"{"resthooks":[
            {"id":"7","eventName":"ActionCreated","targetUrl":"https://r/h","status":"Active","triggeredCount":3,"lastTriggered":"2026-06-12T13:23:34+12:00"},
            {"id":"8","eventName":"TaskCreated","targetUrl":"https://r/h","status":"Disabled","triggeredCount":0,"lastTriggered":""}],
            "meta":{"paging":{"resthooks":{"nextPage":2}}}}"#;
        let hooks = parse_hooks(body).unwrap();
        assert_eq!(hooks.len(), 2);
        assert_eq!(hooks[0].triggered_count, 3);
        assert_eq!(hooks[0].last_triggered, crate::timefmt::parse("2026-06-12T01:23:34Z"));
        assert!(hooks[0].is_active() && !hooks[1].is_active());
        assert_eq!(hooks[1].last_triggered, None);
        assert_eq!(next_page(body), Some(2));
    }

    #[test]
    fn parses_the_real_world_quirks() {
        let body = br#"{"resthooks":{"id":9,"eventName":"ActionCreated","targetUrl":"https://r/h","status":"Active","triggeredCount":"4","triggeredLastTimestamp":"2026-06-12T01:23:34+00:00"},
            "meta":{"paging":{"resthooks":{"nextPage":null}}}}"#;
        let hooks = parse_hooks(body).unwrap();
        assert_eq!(hooks.len(), 1);
        assert_eq!((hooks[0].id.as_str(), hooks[0].triggered_count), ("9", 4));
        assert!(hooks[0].last_triggered.is_some());
        assert_eq!(next_page(body), None);
        let never = br#"{"resthooks":{"id":"1","triggeredLastTimestamp":null}}"#;
        assert_eq!(parse_hooks(never).unwrap()[0].last_triggered, None);
    }

    #[test]
    fn refuses_what_is_not_a_resthooks_answer() {
        assert!(parse_hooks(b"<html>").is_err());
        assert!(parse_hooks(br#"{"errors":[{"status":"500"}]}"#).is_err());
        assert!(parse_hooks(br#"{"resthooks":[{"eventName":"x"}]}"#).is_err());
        assert!(parse_hooks(br#"{"resthooks":[]}"#).unwrap().is_empty());
    }
}
