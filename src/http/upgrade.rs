//! `PUT|POST /upgrade`: the route of a hot upgrade, and nothing more. It passes the
//! request's headers and body to [`Upgrader::run`] (`crate::hot_upgrade`, whose module
//! documentation walks the whole sequence) and turns its answer into a response: the
//! report (200), or what was refused or rolled back with the status that says so.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use crate::hot_upgrade::{UpgradeError, UpgradeRequest, Upgrader};

/// The route.
pub async fn upgrade(
    req: HttpRequest,
    body: web::Payload,
    upgrader: web::Data<Arc<Upgrader>>,
) -> HttpResponse {
    let header = |name: &str| req.headers().get(name).and_then(|h| h.to_str().ok());
    let request = UpgradeRequest {
        authorization: header("authorization"),
        content_length: header("content-length"),
        content_type: header("content-type"),
        traceparent: header("traceparent"),
    };
    match upgrader.run(request, body).await {
        Ok(report) => HttpResponse::Ok().json(report),
        Err(e) => error_response(e),
    }
}

fn error_response(e: UpgradeError) -> HttpResponse {
    let (status, body) = match e {
        UpgradeError::NotConfigured(m) => (StatusCode::FORBIDDEN, json!({ "error": m })),
        UpgradeError::Unauthorized => (
            StatusCode::UNAUTHORIZED,
            json!({ "error": "missing or wrong bearer token (Authorization: Bearer …)" }),
        ),
        UpgradeError::InProgress => (
            StatusCode::CONFLICT,
            json!({ "error": "another upgrade is in progress on this worker" }),
        ),
        UpgradeError::Schema(m) => (
            StatusCode::CONFLICT,
            json!({ "error": m, "status": "refused" }),
        ),
        UpgradeError::TooLarge(max) => (
            StatusCode::PAYLOAD_TOO_LARGE,
            json!({ "error": format!("bundle larger than {max} bytes") }),
        ),
        UpgradeError::Timeout(m) => {
            // The rest of the body may still come: this connection cannot carry another
            // request.
            return HttpResponse::build(StatusCode::REQUEST_TIMEOUT)
                .force_close()
                .json(json!({ "error": m, "status": "refused" }));
        }
        UpgradeError::BadBundle(m) => (
            StatusCode::BAD_REQUEST,
            json!({ "error": format!("bundle refused: {m}"), "status": "refused" }),
        ),
        UpgradeError::RolledBack {
            why,
            child_pid,
            elapsed_ms,
        } => (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({
                "status": "rolled_back",
                "error": why,
                "old_pid": std::process::id(),
                "new_pid": child_pid,
                "elapsed_ms": elapsed_ms,
            }),
        ),
        UpgradeError::Unavailable(m) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "error": m, "status": "not_started" }),
        ),
        UpgradeError::Internal(m) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({ "error": m, "status": "not_started" }),
        ),
    };
    HttpResponse::build(status).json(body)
}
