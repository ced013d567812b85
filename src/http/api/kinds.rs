//! `/api/v1/kinds…`: the kinds workers declared, and each kind's fleet-wide limits
//! (`artex kinds`, `artex kind limit`).

use actix_web::{web, HttpRequest, HttpResponse};
use artex_actors::blackboard::{check_kind, parse_rate, LimitSpec};
use serde_json::{json, Value};

use super::{actor, field, only_fields, parse_json, query, read_body, ApiError, ApiState};
use crate::http::auth::{CanRead, CanWrite};

fn kind_of(path: &str) -> Result<String, ApiError> {
    check_kind(path)
        .map(|()| path.to_string())
        .map_err(|e| ApiError::bad("kind", format!("kind: {e}")))
}

/// `GET /api/v1/kinds`: `{"kinds": [...], "limits": [...]}`, every kind a worker
/// declared and every kind's limits (with the tasks they count now).
pub(super) async fn list(
    _: CanRead,
    req: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let kinds = state.bb.known_kinds().await?;
    let limits = state.bb.kind_limits(None).await?;
    Ok(HttpResponse::Ok().json(json!({ "kinds": kinds, "limits": limits })))
}

/// `GET /api/v1/kinds/{kind}/limits`: `{"limits": …}`, null when it has none.
pub(super) async fn limits(
    _: CanRead,
    req: HttpRequest,
    kind: web::Path<String>,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let kind = kind_of(&kind)?;
    let now = state.bb.kind_limits(Some(&kind)).await?.pop();
    Ok(HttpResponse::Ok().json(json!({ "limits": now })))
}

/// `PUT /api/v1/kinds/{kind}/limits`: `{"concurrency", "key_concurrency", "rate"}` (at
/// least one; `rate` as `100/s`, `30/m` or `1000/h`) replace the kind's limits; 200
/// `{"limits": …}`.
pub(super) async fn set_limits(
    _: CanWrite,
    req: HttpRequest,
    kind: web::Path<String>,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let kind = kind_of(&kind)?;
    let body = read_body(&req, body, state.max_body_bytes).await?;
    let v = parse_json(&body)?.unwrap_or(Value::Null);
    let Some(obj) = v.as_object() else {
        return Err(ApiError::bad(
            "body",
            format!(
                "expected a JSON object like {{\"concurrency\": 5, \"rate\": \"100/s\"}}, got {}",
                super::shown(&v)
            ),
        ));
    };
    only_fields(obj, "", &["concurrency", "key_concurrency", "rate"])?;
    let positive = "a positive 32-bit integer";
    let rate = match field::<String>(obj, "", "rate", "a rate such as \"100/s\"")? {
        None => None,
        Some(s) => Some(parse_rate(&s).map_err(|e| ApiError::bad("rate", format!("rate: {e}")))?),
    };
    let spec = LimitSpec {
        concurrency: field(obj, "", "concurrency", positive)?,
        key_concurrency: field(obj, "", "key_concurrency", positive)?,
        rate_per_sec: rate,
    };
    spec.check()
        .map_err(|(f, e)| ApiError::refused(f, format!("{f}: {e}")))?;
    let set = state.bb.set_kind_limit(&kind, &spec, &actor(&req)).await?;
    Ok(HttpResponse::Ok().json(json!({ "limits": set })))
}

/// `DELETE /api/v1/kinds/{kind}/limits`: `{"cleared": true}`, or false if it had none.
pub(super) async fn clear_limits(
    _: CanWrite,
    req: HttpRequest,
    kind: web::Path<String>,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let kind = kind_of(&kind)?;
    let cleared = state.bb.clear_kind_limit(&kind, &actor(&req)).await?;
    Ok(HttpResponse::Ok().json(json!({ "cleared": cleared })))
}
