//! `GET /admin/journal`: every change made through the admin API or the console, by
//! any relay sharing the store, newest first.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde::Deserialize;

use super::events::store_error;
use super::{error, views, AdminState};
use crate::access::journal::Action;
use crate::api;
use crate::store::{JournalEntry, JournalFilter};

const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 1000;

/// The listing's query.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Query {
    /// Only changes at or after this time (RFC 3339).
    since: Option<String>,
    /// Only changes before this time (RFC 3339).
    until: Option<String>,
    /// Only this token's.
    who: Option<String>,
    action: Option<String>,
    /// Continue after this entry (the previous page's `next_before`).
    before: Option<String>,
    limit: Option<usize>,
}

/// An entry's id: its place, `{at_us:016x}-{tie:016x}`.
fn id_of(e: &JournalEntry) -> String {
    format!("{:016x}-{:016x}", e.at_us, e.tie)
}

/// The place an id names, or what is wrong with it.
fn place(id: &str) -> Result<(u64, u64), String> {
    let bad = || format!("before: {id:?} is not a journal entry's id (a page's next_before)");
    let (at, tie) = id.split_once('-').ok_or_else(bad)?;
    let hex = |t: &str| u64::from_str_radix(t, 16).map_err(|_| bad());
    Ok((hex(at)?, hex(tie)?))
}

/// The store's filter of a query, or what is wrong with it.
fn filter(q: Query) -> Result<JournalFilter, String> {
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(format!("limit: must be between 1 and {MAX_LIMIT}"));
    }
    if let Some(action) = &q.action {
        if !Action::ALL.iter().any(|a| a.name() == action) {
            let known: Vec<&str> = Action::ALL.iter().map(|a| a.name()).collect();
            return Err(format!("action: {action:?} is none of {}", known.join(", ")));
        }
    }
    if let Some(who) = &q.who {
        // A token's name, or "" (a failed sign-in's): anything else matches nothing,
        // and is said (a database would refuse some bytes of it).
        if !(who.is_empty() || crate::config::valid_name(who)) {
            return Err("who: not an admin token's name (A-Z a-z 0-9 _ -)".into());
        }
    }
    let micros = |t: std::time::SystemTime| crate::clock::unix_micros(t);
    let since_us = views::query_time("since", q.since.as_deref())?.map(micros);
    let until = views::query_time("until", q.until.as_deref())?.map(|t| (micros(t), 0));
    let before = q.before.as_deref().map(place).transpose()?;
    let before = match (before, until) {
        (Some(b), Some(u)) => Some(b.min(u)),
        (b, u) => b.or(u),
    };
    Ok(JournalFilter { since_us, before, who: q.who, action: q.action, limit })
}

/// Lists the journal, newest first, with `next_before` for the following page.
pub(super) async fn list(
    state: web::Data<AdminState>,
    query: Result<web::Query<Query>, actix_web::Error>,
) -> HttpResponse {
    let query = match query {
        Ok(q) => q.into_inner(),
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad query: {e}")),
    };
    let filter = match filter(query) {
        Ok(f) => f,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let limit = filter.limit;
    let entries = match state.store.journal_list(filter).await {
        Ok(entries) => entries,
        Err(e) => return store_error(&e),
    };
    let next_before = (entries.len() == limit).then(|| entries.last().map(id_of)).flatten();
    let entries = entries
        .iter()
        .map(|e| api::JournalEntry {
            id: id_of(e),
            at: views::time(e.at_us),
            who: e.who.clone(),
            from: e.from.clone(),
            action: e.action.clone(),
            target: serde_json::from_str(&e.target).unwrap_or(serde_json::Value::Null),
            count: e.count,
            result: e.result.clone(),
        })
        .collect();
    HttpResponse::Ok().json(api::JournalPage { entries, next_before })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_names_its_place_and_nothing_else_is_one() {
        let e = JournalEntry {
            at_us: 1_795_000_000_000_000,
            tie: 42,
            who: "a".into(),
            from: None,
            action: "replay".into(),
            target: "{}".into(),
            count: 1,
            result: "ok".into(),
        };
        assert_eq!(place(&id_of(&e)), Ok((e.at_us, e.tie)));
        for bad in ["", "x", "12", "12-", "-12", "zz-12", "1-2-3"] {
            assert!(place(bad).is_err(), "{bad}");
        }
    }
}
