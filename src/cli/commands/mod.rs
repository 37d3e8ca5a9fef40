//! Each admin command against the API: its request, and its answer read into the
//! API's types (`crate::api`) and printed as a table.

use anyhow::Context;
use serde_json::Value;

mod audit;
mod backup;
mod destinations;
mod events;
mod journal;
mod reload;

pub(in crate::cli) use audit::audit;
pub(in crate::cli) use backup::{backup_to, verify};
pub(in crate::cli) use destinations::{destinations, hooks};
pub(in crate::cli) use events::{dead_letters, events};
pub(in crate::cli) use journal::journal;
pub(in crate::cli) use reload::reload;

use super::client::{query, AdminClient};
use super::table;
use crate::api;

/// The answer as this CLI's build of the API types (`crate::api`): a relay of another
/// version that answers differently is named, not misprinted.
pub(super) fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> anyhow::Result<T> {
    T::deserialize(v).context(
        "the relay's answer does not match this hookrelay's admin API (a different version?); --json prints it as is",
    )
}

/// An optional value, or `-`.
fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".into(), ToString::to_string)
}

/// A queue's number, `≥n` while the relay still counts the queue after a restart.
fn at_least(n: u64, counting: bool) -> String {
    if counting {
        format!("≥{n}")
    } else {
        n.to_string()
    }
}

/// A value as its JSON word (`dispatched`, `half_open`).
fn word<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

/// Comma-separated words, or `-` for none.
fn words<T: serde::Serialize>(v: &[T]) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.iter().map(word).collect::<Vec<_>>().join(",")
    }
}

/// `crm=delivered,erp=retrying`, or `-` for none.
fn delivery_states(v: Option<&[api::DeliveryStatus]>) -> String {
    let states: Vec<String> = v
        .unwrap_or_default()
        .iter()
        .map(|d| format!("{}={}", d.destination, word(&d.state)))
        .collect();
    if states.is_empty() {
        "-".into()
    } else {
        states.join(",")
    }
}

/// A time as the CLI takes it: RFC 3339 as is, or a duration (`6h`, `7d`) ago.
fn time_arg(name: &str, text: Option<String>) -> anyhow::Result<Option<String>> {
    let Some(text) = text else { return Ok(None) };
    if crate::timefmt::parse(&text).is_some() {
        return Ok(Some(text));
    }
    let ago = humantime::parse_duration(text.trim()).map_err(|_| {
        anyhow::anyhow!(
            "--{name} {text:?}: give a time such as 2026-06-12T00:00:00Z, or how long ago such as 6h or 7d"
        )
    })?;
    let at = crate::clock::now().checked_sub(ago).unwrap_or(std::time::UNIX_EPOCH);
    Ok(Some(crate::timefmt::format_admin(at)))
}
