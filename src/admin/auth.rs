//! Bearer-token guard of the `/admin` scope.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{header, StatusCode};
use actix_web::middleware::Next;
use actix_web::web;

use super::{error, AdminState};

/// Lets a request through only with `Authorization: Bearer <admin.token>`.
pub(super) async fn require_token<B: MessageBody>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let token = req.app_data::<web::Data<AdminState>>().and_then(|s| s.token.clone());
    let refusal = match token {
        None => Some(error(
            StatusCode::FORBIDDEN,
            "the admin API is disabled: set admin.token (or admin.token_file / admin.token_env)",
        )),
        Some(token) => {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            match given {
                Some(given) if token.matches(given.trim().as_bytes()) => None,
                _ => {
                    let mut resp = error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
                    resp.headers_mut().insert(
                        header::WWW_AUTHENTICATE,
                        header::HeaderValue::from_static("Bearer realm=\"hookrelay\""),
                    );
                    Some(resp)
                }
            }
        }
    };
    match refusal {
        None => next.call(req).await.map(ServiceResponse::map_into_left_body),
        Some(resp) => Ok(req.into_response(resp).map_into_right_body()),
    }
}
