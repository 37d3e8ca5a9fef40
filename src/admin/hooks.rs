//! `GET /admin/hooks`, `POST /admin/hooks/sync`: the upstream accounts and their hooks.

use crate::api::Accounts;
use actix_web::{web, HttpResponse};

use super::AdminState;

/// Every account as of its last reconcile by any relay sharing the store (target URLs
/// with the source token masked), with its age and whether it is stale.
pub(super) async fn list(state: web::Data<AdminState>) -> HttpResponse {
    HttpResponse::Ok().json(Accounts { accounts: state.upstream.shared_statuses().await })
}

/// Reconciles every account now (after any pass already running) and answers with the
/// result, changes included.
pub(super) async fn sync(state: web::Data<AdminState>) -> HttpResponse {
    HttpResponse::Ok().json(Accounts { accounts: state.upstream.sync().await })
}
