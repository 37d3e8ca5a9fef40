//! `/sim/...`: the simulator's own controls (raise events, switch quirks, throttle,
//! expire or replace tokens, inspect), and the OAuth2 token endpoint.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::fire::{self, Occurrence};
use super::hooks::Quirks;
use super::state::{lock, SimState};
use crate::event_names;

/// Most occurrences one request may raise synchronously.
const MAX_COUNT: u64 = 10_000;
/// Deliveries `GET /sim/sink` keeps.
const SINK_KEEP: usize = 100;
/// Longest generated load.
const MAX_LOAD: Duration = Duration::from_secs(3600);

pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/sim/events", web::post().to(events))
        .route("/sim/hooks", web::get().to(hooks))
        .route("/sim/stats", web::get().to(stats))
        .route("/sim/quirks", web::get().to(get_quirks))
        .route("/sim/quirks", web::put().to(set_quirks))
        .route("/sim/throttle", web::post().to(throttle))
        .route("/sim/tokens/expire", web::post().to(expire_tokens))
        .route("/sim/users/{name}/token", web::put().to(set_user_token))
        .route("/sim/hooks/disable", web::post().to(disable_hooks))
        .route("/sim/sink-outage", web::post().to(sink_outage))
        .route("/sim/sink", web::get().to(sink_list))
        .route("/sim/sink", web::post().to(sink_receive))
        .route("/sim/sink/{rest:.*}", web::post().to(sink_receive))
        .route("/sim/sink/{rest:.*}", web::get().to(sink_list))
        .route("/oauth/token", web::post().to(token))
        .route("/healthz", web::get().to(|| async { HttpResponse::Ok().body("ok\n") }));
}

fn bad_request(message: impl Into<String>) -> HttpResponse {
    HttpResponse::BadRequest().json(json!({"error": message.into()}))
}

/// `POST /sim/events`: one occurrence, `count` of them, or `rate` per second for
/// `duration` in the background.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FireRequest {
    pub(crate) event: String,
    #[serde(default)]
    pub(crate) id: Option<String>,
    #[serde(default)]
    pub(crate) attributes: Option<Value>,
    #[serde(default)]
    pub(crate) count: Option<u64>,
    #[serde(default)]
    pub(crate) rate: Option<f64>,
    #[serde(default, with = "crate::config::duration::option")]
    pub(crate) duration: Option<Duration>,
}

async fn events(state: web::Data<SimState>, body: web::Json<FireRequest>) -> HttpResponse {
    let req = body.into_inner();
    if !event_names::KNOWN.contains(&req.event.as_str()) {
        return bad_request(format!("event {:?} is not one of the 21 event names", req.event));
    }
    let occurrence = Occurrence { event: req.event, id: req.id, attributes: req.attributes };
    let state: Arc<SimState> = state.into_inner();
    match (req.rate, req.duration) {
        (Some(rate), Some(duration)) => {
            if !(rate > 0.0 && rate <= 100_000.0) || duration > MAX_LOAD || duration.is_zero() {
                return bad_request(
                    "rate must be in (0, 100000] per second and duration in (0, 1h]",
                );
            }
            let total = (rate * duration.as_secs_f64()).round() as u64;
            tokio::spawn(load(state, occurrence, rate, total));
            HttpResponse::Accepted().json(json!({"scheduled": total, "rate": rate}))
        }
        (None, None) => {
            let count = req.count.unwrap_or(1);
            if count == 0 || count > MAX_COUNT {
                return bad_request(format!("count must be between 1 and {MAX_COUNT}"));
            }
            let mut reports = Vec::new();
            for i in 0..count {
                let mut occ = occurrence.clone();
                if count > 1 {
                    occ.id = occ.id.map(|id| format!("{id}-{i}"));
                }
                reports.push(fire::raise(&state, &occ).await);
            }
            HttpResponse::Ok().json(json!({"occurrences": reports}))
        }
        _ => bad_request("give both rate and duration, or neither"),
    }
}

/// Raises `total` occurrences at `rate` per second, each on its own task so that a slow
/// target does not slow the rate down.
async fn load(state: Arc<SimState>, occurrence: Occurrence, rate: f64, total: u64) {
    let started = Instant::now();
    let limit = Arc::new(tokio::sync::Semaphore::new(1024));
    for i in 0..total {
        let due = started + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
        let Ok(permit) = limit.clone().acquire_owned().await else { return };
        let (state, mut occ) = (state.clone(), occurrence.clone());
        occ.id = occ.id.map(|id| format!("{id}-{i}"));
        tokio::spawn(async move {
            fire::raise(&state, &occ).await;
            drop(permit);
        });
    }
    tracing::info!(total, rate, "generated load finished");
}

/// `POST /sim/hooks/disable`: which hooks to disable, as the upstream does when a
/// target does not answer 200: one by id, or every one of an event (of one user).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DisableRequest {
    id: Option<String>,
    event: Option<String>,
    user: Option<String>,
}

async fn disable_hooks(
    state: web::Data<SimState>,
    body: web::Json<DisableRequest>,
) -> HttpResponse {
    let DisableRequest { id, event, user } = body.into_inner();
    if id.is_none() && event.is_none() {
        return bad_request(
            "give \"id\" (a hook) or \"event\" (every hook of it, optionally of one \"user\")",
        );
    }
    let id = match id.map(|i| i.parse::<u64>()).transpose() {
        Ok(id) => id,
        Err(_) => {
            return bad_request("\"id\" is a hook's numeric id, as GET /sim/hooks lists them")
        }
    };
    let mut hooks = lock(&state.hooks);
    let chosen: Vec<u64> = hooks
        .all()
        .filter(|h| id.is_none_or(|i| h.id == i))
        .filter(|h| event.as_ref().is_none_or(|e| h.event_name == *e))
        .filter(|h| user.as_ref().is_none_or(|u| h.owner == *u))
        .filter(|h| h.status == super::hooks::Status::Active)
        .map(|h| h.id)
        .collect();
    if chosen.is_empty() {
        return HttpResponse::NotFound()
            .json(json!({ "error": "no Active hook matches (GET /sim/hooks lists them)" }));
    }
    for h in &chosen {
        hooks.disable(*h);
    }
    tracing::info!(hooks = ?chosen, "hooks disabled on command");
    HttpResponse::Ok()
        .json(json!({ "disabled": chosen.iter().map(u64::to_string).collect::<Vec<_>>() }))
}

/// `POST /sim/sink-outage`: the sink answers `status` (default 503) for `seconds`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutageRequest {
    seconds: u64,
    #[serde(default = "unavailable")]
    status: u16,
}

fn unavailable() -> u16 {
    503
}

async fn sink_outage(state: web::Data<SimState>, body: web::Json<OutageRequest>) -> HttpResponse {
    let OutageRequest { seconds, status } = body.into_inner();
    if seconds > MAX_LOAD.as_secs() || !(400..=599).contains(&status) {
        return bad_request("\"seconds\": at most 3600; \"status\": 400 to 599");
    }
    let until = Instant::now() + Duration::from_secs(seconds);
    *lock(&state.sink_down) = (seconds > 0).then_some((until, status));
    tracing::info!(seconds, status, "the sink fails on command");
    HttpResponse::Ok().json(json!({ "failing_for_seconds": seconds, "status": status }))
}

/// `POST /sim/sink[/...]`: a downstream consumer to point a destination at when trying
/// the relay; answers 200 (or, during an outage, its status) and keeps the last
/// requests it took for `GET /sim/sink`.
async fn sink_receive(
    req: HttpRequest,
    body: web::Bytes,
    state: web::Data<SimState>,
) -> HttpResponse {
    let down = *lock(&state.sink_down);
    if let Some((until, status)) = down.filter(|(until, _)| Instant::now() < *until) {
        let left = until.saturating_duration_since(Instant::now()).as_secs() + 1;
        let status = actix_web::http::StatusCode::from_u16(status)
            .unwrap_or(actix_web::http::StatusCode::SERVICE_UNAVAILABLE);
        return HttpResponse::build(status).body(format!("sink outage: {left}s left\n"));
    }
    let headers: serde_json::Map<String, Value> = req
        .headers()
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("webhook-") || k.as_str() == "content-type")
        .map(|(k, v)| (k.as_str().to_owned(), json!(v.to_str().unwrap_or(""))))
        .collect();
    let body = serde_json::from_slice::<Value>(&body)
        .unwrap_or_else(|_| json!(String::from_utf8_lossy(&body)));
    let webhook_id = headers.get("webhook-id").and_then(|v| v.as_str()).unwrap_or("-").to_owned();
    tracing::info!(path = %req.path(), %webhook_id, "sink received a delivery");
    let mut sink = lock(&state.sink);
    if sink.len() >= SINK_KEEP {
        sink.pop_front();
    }
    sink.push_back(json!({
        "at": crate::timefmt::format_utc(std::time::SystemTime::now()),
        "path": req.path(),
        "headers": headers,
        "body": body,
    }));
    HttpResponse::Ok().finish()
}

/// What the sink received: all of it at `/sim/sink`, and at `/sim/sink/gaps` (any
/// sub-path) only what was delivered there.
async fn sink_list(req: HttpRequest, state: web::Data<SimState>) -> HttpResponse {
    let path = req.path();
    let all = path == "/sim/sink";
    let received: Vec<Value> =
        lock(&state.sink).iter().filter(|d| all || d["path"] == path).cloned().collect();
    HttpResponse::Ok().json(json!({ "received": received }))
}

async fn hooks(state: web::Data<SimState>) -> HttpResponse {
    let quirks = Quirks::default();
    let all: Vec<Value> = lock(&state.hooks)
        .all()
        .map(|h| {
            let mut v = h.to_json(quirks);
            v["owner"] = json!(h.owner);
            v
        })
        .collect();
    HttpResponse::Ok().json(json!({ "resthooks": all }))
}

async fn stats(state: web::Data<SimState>) -> HttpResponse {
    HttpResponse::Ok().json(state.stats.to_json())
}

async fn get_quirks(state: web::Data<SimState>) -> HttpResponse {
    HttpResponse::Ok().json(*lock(&state.quirks))
}

async fn set_quirks(state: web::Data<SimState>, body: web::Json<Quirks>) -> HttpResponse {
    *lock(&state.quirks) = body.into_inner();
    tracing::info!(quirks = ?*lock(&state.quirks), "quirks set");
    HttpResponse::Ok().json(*lock(&state.quirks))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ThrottleRequest {
    requests: u32,
    #[serde(default = "one")]
    retry_after: u64,
}

fn one() -> u64 {
    1
}

async fn throttle(state: web::Data<SimState>, body: web::Json<ThrottleRequest>) -> HttpResponse {
    lock(&state.throttle).force(body.requests, body.retry_after);
    HttpResponse::Ok().json(json!({"requests": body.requests, "retry_after": body.retry_after}))
}

async fn expire_tokens(state: web::Data<SimState>) -> HttpResponse {
    lock(&state.users).expire_access_tokens();
    tracing::info!("issued access tokens expired");
    HttpResponse::Ok().json(json!({"expired": true}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenRequest {
    token: String,
}

async fn set_user_token(
    state: web::Data<SimState>,
    name: web::Path<String>,
    body: web::Json<TokenRequest>,
) -> HttpResponse {
    if body.token.is_empty() {
        return bad_request("token must not be empty");
    }
    lock(&state.users).set_token(&name, &body.token);
    tracing::info!(user = %name, "static token replaced");
    HttpResponse::Ok().json(json!({"user": name.into_inner()}))
}

/// The token request of the OAuth2 refresh flow (form-encoded).
#[derive(Deserialize)]
struct TokenForm {
    #[serde(default)]
    grant_type: String,
    #[serde(default)]
    refresh_token: String,
    #[serde(default)]
    client_id: String,
    #[serde(default)]
    client_secret: String,
}

/// `POST /oauth/token`: answers as the real token endpoint does, with `api_endpoint`
/// pointing back at this simulator.
async fn token(
    req: HttpRequest,
    state: web::Data<SimState>,
    form: web::Form<TokenForm>,
) -> HttpResponse {
    let f = form.into_inner();
    let granted = lock(&state.users).refresh(
        &f.grant_type,
        &f.client_id,
        &f.client_secret,
        &f.refresh_token,
        Instant::now(),
    );
    match granted {
        Ok(grant) => {
            let info = req.connection_info();
            let api_endpoint = format!("{}://{}/api", info.scheme(), info.host());
            tracing::info!("access token issued");
            HttpResponse::Ok().json(json!({
                "access_token": grant.access_token,
                "token_type": "bearer",
                "expires_in": grant.expires_in.as_secs(),
                "refresh_token": grant.refresh_token,
                "api_endpoint": api_endpoint,
                "orgkey": "SIMORG",
            }))
        }
        Err(e) => {
            let status = if e == super::users::GrantError::InvalidClient {
                actix_web::http::StatusCode::UNAUTHORIZED
            } else {
                actix_web::http::StatusCode::BAD_REQUEST
            };
            HttpResponse::build(status).json(json!({"error": e.code()}))
        }
    }
}
