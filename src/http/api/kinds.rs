//! `/api/v1/kinds…`: the kinds workers declared, each with its retry policy, every
//! kind's fleet-wide limits and the paused kinds; one kind's limits and retry policy
//! read, set (`PUT`) or removed (`DELETE`), one kind paused or resumed — what `artex
//! kinds`, `artex kind limit`, `artex kind retry` and `artex kind pause|resume` do.

use actix_web::{web, HttpRequest, HttpResponse};
use artex_actors::blackboard::{check_kind, parse_rate, LimitSpec};
use artex_actors::retry::{Backoff, RetryPolicy, MAX_BACKOFF_MS};
use serde_json::json;

use super::{
    actor, changed, field, object_body, only_fields, parse_json, query, read_body, ApiError,
    ApiState,
};
use crate::http::auth::{CanRead, CanWrite};

/// The fields of a policy in `PUT /api/v1/kinds/{kind}/retry`.
const POLICY_FIELDS: &[&str] = &["backoff", "base_ms", "cap_ms", "max_attempts"];

/// `GET /api/v1/kinds`: `{"kinds": [...], "limits": [...], "paused": [...]}`, the kinds
/// workers declared by name, each with its `retry` policy (null: the fleet's default),
/// every kind's limits with the tasks they count now, and the paused kinds.
pub(super) async fn list(
    _: CanRead,
    req: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let kinds = state.bb.known_kinds().await?;
    let limits = state.bb.kind_limits(None).await?;
    let paused = state.bb.paused_kinds(None).await?;
    Ok(HttpResponse::Ok().json(json!({ "kinds": kinds, "limits": limits, "paused": paused })))
}

/// `POST /api/v1/kinds/{kind}/pause` (an optional `{"reason": …}`): its tasks stay
/// pending until it is resumed; 200 `{"kind", "changed", "paused"}` (`changed` false: it
/// was paused already, and keeps that pause).
pub(super) async fn pause(
    _: CanWrite,
    req: HttpRequest,
    kind: web::Path<String>,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    pause_or_resume(req, kind, body, state, true).await
}

/// `POST /api/v1/kinds/{kind}/resume` (an optional `{"reason": …}`): its tasks are
/// handed out again; 200 `{"kind", "changed", "paused": null}` (`changed` false: it was
/// not paused).
pub(super) async fn resume(
    _: CanWrite,
    req: HttpRequest,
    kind: web::Path<String>,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    pause_or_resume(req, kind, body, state, false).await
}

async fn pause_or_resume(
    req: HttpRequest,
    kind: web::Path<String>,
    body: web::Payload,
    state: web::Data<ApiState>,
    pausing: bool,
) -> Result<HttpResponse, ApiError> {
    let kind = kind_of(&kind)?;
    let reason = super::tasks::read_reason(&req, body, &state).await?;
    let who = actor(&req);
    let changed_now = if pausing {
        state.bb.pause_kind(&kind, reason.as_deref(), &who).await?
    } else {
        state.bb.resume_kind(&kind, reason.as_deref(), &who).await?
    };
    let paused = state.bb.paused_kinds(Some(&kind)).await?.pop();
    changed(
        &state,
        json!({ "kind": kind, "changed": changed_now, "paused": paused }),
    )
    .await
}

/// `GET /api/v1/kinds/{kind}/retry`: the kind with its policy (404 for a kind no worker
/// declared).
pub(super) async fn show_retry(
    _: CanRead,
    req: HttpRequest,
    kind: web::Path<String>,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let kinds = state.bb.known_kinds().await?;
    let kind = kinds
        .into_iter()
        .find(|k| k.kind == *kind)
        .ok_or_else(|| not_declared(&kind))?;
    Ok(HttpResponse::Ok().json(kind))
}

/// `PUT /api/v1/kinds/{kind}/retry` with `{"backoff", "base_ms", "cap_ms"?,
/// "max_attempts"?}`: sets the policy (`cap_ms` defaults to `base_ms`); answers the kind.
/// A value out of range is a 400 naming its field, a cap below the base a 422; nothing is
/// written.
pub(super) async fn set_retry(
    _: CanWrite,
    req: HttpRequest,
    kind: web::Path<String>,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let body = read_body(&req, body, state.max_body_bytes).await?;
    let policy = parse_policy(parse_json(&body)?)?;
    let kind = state
        .bb
        .set_retry_policy(&kind, Some(&policy))
        .await?
        .ok_or_else(|| not_declared(&kind))?;
    changed(&state, kind).await
}

/// `DELETE /api/v1/kinds/{kind}/retry`: removes the policy (the fleet's default applies
/// again); answers the kind.
pub(super) async fn clear_retry(
    _: CanWrite,
    req: HttpRequest,
    kind: web::Path<String>,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let kind = state
        .bb
        .set_retry_policy(&kind, None)
        .await?
        .ok_or_else(|| not_declared(&kind))?;
    changed(&state, kind).await
}

fn not_declared(kind: &str) -> ApiError {
    ApiError::NotFound(format!(
        "kind '{kind}': no worker has declared it (GET /api/v1/kinds lists those that are)"
    ))
}

/// A policy from the request's body; each wrong or missing field a 400 naming it.
fn parse_policy(v: Option<serde_json::Value>) -> Result<RetryPolicy, ApiError> {
    let example =
        r#"{"backoff": "exponential", "base_ms": 1000, "cap_ms": 600000, "max_attempts": 5}"#;
    let Some(obj) = v.as_ref().and_then(|v| v.as_object()) else {
        return Err(ApiError::bad(
            "body",
            format!("expected a retry policy, a JSON object like {example}"),
        ));
    };
    only_fields(obj, "", POLICY_FIELDS)?;
    let backoff: String =
        field(obj, "", "backoff", "exponential, linear or fixed")?.ok_or_else(|| {
            ApiError::bad(
                "backoff",
                "backoff: missing; expected exponential, linear or fixed",
            )
        })?;
    let backoff: Backoff = backoff
        .parse()
        .map_err(|e: String| ApiError::bad("backoff", format!("backoff: {e}")))?;
    let ms = "a whole number of milliseconds";
    let base_ms: i64 = field(obj, "", "base_ms", ms)?
        .ok_or_else(|| ApiError::bad("base_ms", format!("base_ms: missing; expected {ms}")))?;
    let policy = RetryPolicy {
        backoff,
        base_ms,
        cap_ms: field(obj, "", "cap_ms", ms)?.unwrap_or(base_ms),
        max_attempts: field(obj, "", "max_attempts", "an integer from 1 to 1001")?,
    };
    policy.check().map_err(|r| {
        let name = match r.field {
            "base" => "base_ms",
            "cap" => "cap_ms",
            f => f,
        };
        let message = format!("{name}: {}", r.message);
        // A cap below the base, each in range, breaks a rule across two fields, which
        // docs/openapi.json cannot state: refused (422), not malformed (400).
        if r.field == "cap" && (1..=MAX_BACKOFF_MS).contains(&policy.cap_ms) {
            ApiError::refused(name, message)
        } else {
            ApiError::bad(name, message)
        }
    })?;
    Ok(policy)
}

fn kind_of(path: &str) -> Result<String, ApiError> {
    check_kind(path)
        .map(|()| path.to_string())
        .map_err(|e| ApiError::bad("kind", format!("kind: {e}")))
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

/// `PUT /api/v1/kinds/{kind}/limits`: `{"concurrency", "key_concurrency", "rate",
/// "fair"}` (at least one; `rate` as `100/s`, `30/m` or `1000/h`; `fair`: round-robin
/// across limit keys) replace the kind's limits; 200 `{"limits": …}`.
pub(super) async fn set_limits(
    _: CanWrite,
    req: HttpRequest,
    kind: web::Path<String>,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let kind = kind_of(&kind)?;
    let example = r#"{"concurrency": 5, "rate": "100/s", "fair": true}"#;
    let known = ["concurrency", "key_concurrency", "rate", "fair"];
    let obj = &object_body(&req, body, &state, example, &known).await?;
    let positive = "a positive 32-bit integer";
    let rate = match field::<String>(obj, "", "rate", "a rate such as \"100/s\"")? {
        None => None,
        Some(s) => Some(parse_rate(&s).map_err(|e| ApiError::bad("rate", format!("rate: {e}")))?),
    };
    let spec = LimitSpec {
        concurrency: field(obj, "", "concurrency", positive)?,
        key_concurrency: field(obj, "", "key_concurrency", positive)?,
        rate_per_sec: rate,
        fair: field(obj, "", "fair", "true or false")?.unwrap_or(false),
    };
    spec.check()
        .map_err(|(f, e)| ApiError::refused(f, format!("{f}: {e}")))?;
    let set = state.bb.set_kind_limit(&kind, &spec, &actor(&req)).await?;
    changed(&state, json!({ "limits": set })).await
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
    changed(&state, json!({ "cleared": cleared })).await
}
