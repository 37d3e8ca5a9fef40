//! `GET /admin/hooks`, `POST /admin/hooks/sync`: the upstream accounts and their hooks.

use crate::api::Accounts;
use actix_web::{web, HttpResponse};

use super::AdminState;

/// Every account as of its last reconcile by any relay sharing the store (target URLs
/// with the source token masked), with its age and whether it is stale.
pub(super) async fn list(state: web::Data<AdminState>) -> HttpResponse {
    HttpResponse::Ok().json(Accounts { accounts: state.upstream.load().shared_statuses().await })
}

/// Reconciles every account now (after any pass already running) and answers with the
/// result, changes included; journalled with the hooks it changed.
pub(super) async fn sync(state: web::Data<AdminState>, who: super::Who) -> HttpResponse {
    let accounts = state.upstream.load().sync().await;
    let changes: usize = accounts.iter().map(|a| a.changes.len()).sum();
    let errors: Vec<&str> =
        accounts.iter().flat_map(|a| a.errors.iter().map(String::as_str)).collect();
    let names: Vec<String> =
        accounts.iter().map(|a| format!("{}/{}", a.source, a.account)).collect();
    let result = if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) };
    let target = serde_json::json!({ "accounts": names });
    who.record(crate::access::journal::Action::HookSync, target, changes as u64, result).await;
    HttpResponse::Ok().json(Accounts { accounts })
}
