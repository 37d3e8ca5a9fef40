//! `/api/rest/resthooks`: the simulated upstream's REST hook endpoints, as
//! `upstream-api.md` specifies them (and `upstream-notes.md` where it is silent).

use std::time::Instant;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};

use super::error::ApiError;
use super::hooks::{self, Hook, Page, Quirks, DEFAULT_PAGE_SIZE};
use super::state::{lock, SimState};

/// The media type of every request and answer.
pub(crate) const JSON_API: &str = "application/vnd.api+json";

const COLLECTION: &str = "/api/rest/resthooks";
const ALLOW: &str = "GET, POST, PUT, DELETE, OPTIONS";

/// Routes of the resthooks resource.
pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource(COLLECTION)
            .route(web::get().to(list))
            .route(web::post().to(create))
            .route(web::method(actix_web::http::Method::OPTIONS).to(options))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource(format!("{COLLECTION}/{{ids}}"))
            .route(web::get().to(get))
            .route(web::put().to(update))
            .route(web::delete().to(delete))
            .route(web::method(actix_web::http::Method::OPTIONS).to(options))
            .default_service(web::to(method_not_allowed)),
    );
}

/// Throttling first (rate limits apply to anyone), then the bearer token.
fn authenticate(req: &HttpRequest, state: &SimState) -> Result<String, ApiError> {
    if let Some(secs) = lock(&state.throttle).check() {
        return Err(ApiError::throttled(secs));
    }
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .ok_or_else(ApiError::unauthorized)?;
    lock(&state.users).user_for(token.trim(), Instant::now()).ok_or_else(ApiError::unauthorized)
}

fn answer(result: Result<Value, ApiError>) -> HttpResponse {
    match result {
        Ok(body) => HttpResponse::Ok().content_type(JSON_API).body(body.to_string()),
        Err(e) => e.response(),
    }
}

/// `{ resthooks: <hook> }` for one, `{ resthooks: [...] }` for several.
fn records(hooks: &[Hook], quirks: Quirks, single: bool) -> Value {
    let shown: Vec<Value> = hooks.iter().map(|h| h.to_json(quirks)).collect();
    match (single, shown.as_slice()) {
        (true, [one]) => json!({ "resthooks": one }),
        _ => json!({ "resthooks": shown }),
    }
}

fn page_link(page: u64, size: u64) -> String {
    format!("{COLLECTION}?page={page}&pageSize={size}")
}

fn collection(page: &Page, quirks: Quirks) -> Value {
    let count = page.page_count();
    let prev = (page.page > 1).then(|| page.page - 1);
    let next = (page.page < count).then(|| page.page + 1);
    let mut body = records(&page.hooks, quirks, quirks.single_object && page.record_count == 1);
    body["links"] = json!({
        "self": page_link(page.page, page.page_size),
        "first": page_link(1, page.page_size),
        "last": page_link(count.max(1), page.page_size),
        "prev": prev.map(|p| page_link(p, page.page_size)),
        "next": next.map(|p| page_link(p, page.page_size)),
    });
    body["meta"] = json!({"paging": {"resthooks": {
        "recordCount": page.record_count,
        "pageCount": count,
        "page": page.page,
        "pageSize": page.page_size,
        "prevPage": prev,
        "nextPage": next,
    }}});
    body
}

fn query_number(req: &HttpRequest, key: &str, default: u64) -> Result<u64, ApiError> {
    let query = web::Query::<Vec<(String, String)>>::from_query(req.query_string())
        .map_err(|_| ApiError::bad_request("malformed query string"))?;
    match query.iter().find(|(k, _)| k == key) {
        None => Ok(default),
        Some((_, v)) => {
            v.parse().map_err(|_| ApiError::bad_request(format!("{key} must be an integer")))
        }
    }
}

async fn list(req: HttpRequest, state: web::Data<SimState>) -> HttpResponse {
    answer((|| {
        let user = authenticate(&req, &state)?;
        let page = query_number(&req, "page", 1)?;
        let size = query_number(&req, "pageSize", DEFAULT_PAGE_SIZE)?;
        let page = lock(&state.hooks).list(&user, page, size)?;
        Ok(collection(&page, *lock(&state.quirks)))
    })())
}

async fn get(req: HttpRequest, ids: web::Path<String>, state: web::Data<SimState>) -> HttpResponse {
    answer((|| {
        let user = authenticate(&req, &state)?;
        let ids = hooks::parse_ids(&ids)?;
        let found = lock(&state.hooks).get(&user, &ids)?;
        let quirks = *lock(&state.quirks);
        Ok(records(&found, quirks, ids.len() == 1 || quirks.single_object))
    })())
}

/// The JSON body of a POST or PUT; 415 unless it is declared JSON.
fn json_body(req: &HttpRequest, body: &[u8]) -> Result<Value, ApiError> {
    let content_type =
        req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if essence != JSON_API && essence != "application/json" {
        return Err(ApiError::new(415, format!("Content-Type must be {JSON_API}")));
    }
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))
}

async fn create(req: HttpRequest, body: web::Bytes, state: web::Data<SimState>) -> HttpResponse {
    answer((|| {
        let user = authenticate(&req, &state)?;
        let body = json_body(&req, &body)?;
        let created = lock(&state.hooks).create(&user, &body)?;
        for hook in &created {
            tracing::info!(hook = hook.id, user = %user, event = %hook.event_name, "hook created");
        }
        let single = body.get("resthooks").is_some_and(Value::is_object);
        Ok(records(&created, *lock(&state.quirks), single))
    })())
}

async fn update(
    req: HttpRequest,
    ids: web::Path<String>,
    body: web::Bytes,
    state: web::Data<SimState>,
) -> HttpResponse {
    answer((|| {
        let user = authenticate(&req, &state)?;
        let ids = hooks::parse_ids(&ids)?;
        let body = json_body(&req, &body)?;
        let updated = lock(&state.hooks).update(&user, &ids, &body)?;
        let single = body.get("resthooks").is_some_and(Value::is_object);
        Ok(records(&updated, *lock(&state.quirks), single))
    })())
}

async fn delete(
    req: HttpRequest,
    ids: web::Path<String>,
    state: web::Data<SimState>,
) -> HttpResponse {
    let result = (|| {
        let user = authenticate(&req, &state)?;
        let ids = hooks::parse_ids(&ids)?;
        lock(&state.hooks).delete(&user, &ids)?;
        tracing::info!(hooks = ?ids, user = %user, "hooks deleted");
        Ok::<_, ApiError>(())
    })();
    match result {
        Ok(()) => HttpResponse::NoContent().finish(),
        Err(e) => e.response(),
    }
}

async fn options(req: HttpRequest, state: web::Data<SimState>) -> HttpResponse {
    match authenticate(&req, &state) {
        Ok(_) => {
            HttpResponse::Ok().insert_header((header::ALLOW, ALLOW)).content_type(JSON_API).body(
                json!({"meta": {"methods": ["GET", "POST", "PUT", "DELETE", "OPTIONS"]}})
                    .to_string(),
            )
        }
        Err(e) => e.response(),
    }
}

async fn method_not_allowed() -> HttpResponse {
    let mut response = ApiError::new(405, "method not allowed").response();
    if let Ok(allow) = header::HeaderValue::from_str(ALLOW) {
        response.headers_mut().insert(header::ALLOW, allow);
    }
    response
}
