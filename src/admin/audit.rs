//! `GET /admin/audit`: the audit ledger over a window of receive time.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde::Deserialize;

use super::events::store_error;
use super::views::query_time;
use super::{error, AdminState};

/// Query of the audit.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AuditQuery {
    /// Events received at or after this time (RFC 3339); default: a day before `until`.
    since: Option<String>,
    /// Events received before this time (RFC 3339); default: now.
    until: Option<String>,
    /// Only this source's events (destinations are counted over every source).
    source: Option<String>,
}

/// The audit of the window, widened to whole hours; a scoped holder's, of its
/// destinations only.
pub(super) async fn show(
    state: web::Data<AdminState>,
    who: super::Who,
    query: Result<web::Query<AuditQuery>, actix_web::Error>,
) -> HttpResponse {
    let query = match query {
        Ok(q) => q.into_inner(),
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad query: {e}")),
    };
    let window = query_time("until", query.until.as_deref()).and_then(|until| {
        let until = until.unwrap_or_else(crate::clock::now);
        let since = query_time("since", query.since.as_deref())?.unwrap_or_else(|| {
            until.checked_sub(crate::audit::DEFAULT_WINDOW).unwrap_or(std::time::UNIX_EPOCH)
        });
        crate::audit::hours(since, until)
    });
    let (from, to) = match window {
        Ok(w) => w,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match crate::audit::read(&state.store, from, to, query.source.as_deref()).await {
        Ok(mut report) => {
            crate::audit::report::scoped(&mut report, |d| who.sees(d));
            HttpResponse::Ok().json(report)
        }
        Err(e) => store_error(&e),
    }
}
