//! The upstream's error answers: a body whose only top-level key is `errors`.

use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use serde_json::json;

use super::api::JSON_API;

/// A refused request, rendered as `{ "errors": [ { status, title, detail } ] }`.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: u16,
    pub(crate) detail: String,
    /// Seconds, for 429.
    pub(crate) retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(status: u16, detail: impl Into<String>) -> Self {
        Self { status, detail: detail.into(), retry_after: None }
    }

    pub(crate) fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(400, detail)
    }

    pub(crate) fn not_found(id: u64) -> Self {
        Self::new(404, format!("resthook {id} not found"))
    }

    pub(crate) fn unauthorized() -> Self {
        Self::new(401, "missing, unknown or expired bearer token")
    }

    pub(crate) fn throttled(retry_after: u64) -> Self {
        Self { retry_after: Some(retry_after), ..Self::new(429, "rate limit exceeded") }
    }

    pub(crate) fn response(&self) -> HttpResponse {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut builder = HttpResponse::build(status);
        builder.content_type(JSON_API);
        if let Some(secs) = self.retry_after {
            builder.insert_header(("Retry-After", secs.to_string()));
        }
        if self.status == 401 {
            builder.insert_header(("WWW-Authenticate", "Bearer"));
        }
        builder.body(
            json!({"errors": [{
                "status": self.status.to_string(),
                "title": status.canonical_reason().unwrap_or("Error"),
                "detail": self.detail,
            }]})
            .to_string(),
        )
    }
}
