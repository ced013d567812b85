//! `/api/v1/tokens…` and `/api/v1/whoami`: the named tokens, as `artex token` manages
//! them (the admin scope: create, list, revoke), and who the caller's token says it is
//! (any token that may read: what the dashboard shows and hides by).

use actix_web::http::header::LOCATION;
use actix_web::{web, HttpRequest, HttpResponse};
use artex_actors::blackboard::{check_token_name, TokenScope};
use serde_json::json;

use super::{actor, changed, field, object_body, param, parse_bool, query};
use super::{ApiError, ApiState};
use crate::config::parse_duration;
use crate::http::auth::{caller, CanAdmin, CanRead};
use crate::tokens;

/// `GET /api/v1/whoami`: the caller as its token says, `{"name", "scope", "by",
/// "expires_at"}` (`name` null for a token file or a public read).
pub(super) async fn whoami(_: CanRead, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let who = caller(&req).ok_or_else(|| ApiError::Internal("no caller recorded".into()))?;
    Ok(HttpResponse::Ok().json(who))
}

/// `GET /api/v1/tokens[?revoked=true]`: `{"tokens": [...]}` by name, never a secret.
pub(super) async fn list(
    _: CanAdmin,
    req: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let q = query(&req, &["revoked"])?;
    let revoked = param(&q, "revoked", parse_bool)?.unwrap_or(false);
    let tokens = state.bb.tokens(revoked).await?;
    Ok(HttpResponse::Ok().json(json!({ "tokens": tokens })))
}

/// `POST /api/v1/tokens` with `{"name", "scope", "expires"?}` (`expires`: e.g. `30d`):
/// 201 with the token and its `secret`, shown this once.
pub(super) async fn create(
    _: CanAdmin,
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let example = r#"{"name": "ci", "scope": "write", "expires": "30d"}"#;
    let obj = object_body(&req, body, &state, example, &["name", "scope", "expires"]).await?;
    let name: String = field(&obj, "", "name", "a string")?
        .ok_or_else(|| ApiError::bad("name", "name: required"))?;
    check_token_name(&name).map_err(|e| ApiError::bad("name", e.to_string()))?;
    let scope: String = field(&obj, "", "scope", "a string")?
        .ok_or_else(|| ApiError::bad("scope", "scope: required (read, write or admin)"))?;
    let scope = TokenScope::parse(&scope).map_err(|e| ApiError::bad("scope", e.to_string()))?;
    let expires_at = match field::<String>(&obj, "", "expires", "a duration such as 30d")? {
        Some(text) => {
            let d = parse_duration(&text)
                .map_err(|e| ApiError::bad("expires", format!("expires: {e}")))?;
            let at =
                tokens::expiry(d).map_err(|e| ApiError::bad("expires", format!("expires: {e}")))?;
            Some(at)
        }
        None => None,
    };
    let secret = tokens::new_secret().map_err(|e| ApiError::Internal(e.to_string()))?;
    state
        .bb
        .create_token(
            &name,
            scope,
            &tokens::secret_sha256(&secret),
            expires_at,
            &actor(&req),
        )
        .await?;
    let mut answer = HttpResponse::Created();
    state.reads.written(&mut answer).await;
    Ok(answer
        .insert_header((LOCATION, format!("/api/v1/tokens/{name}")))
        .json(json!({ "name": name, "scope": scope, "secret": secret, "expires_at": expires_at })))
}

/// `DELETE /api/v1/tokens/{name}`: revokes it; 200 `{"name", "revoked_at"}`, 404 when
/// no live token has that name.
pub(super) async fn revoke(
    _: CanAdmin,
    req: HttpRequest,
    name: web::Path<String>,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    check_token_name(&name).map_err(|e| ApiError::bad("name", e.to_string()))?;
    match state.bb.revoke_token(&name, &actor(&req)).await? {
        Some(at) => changed(&state, json!({ "name": *name, "revoked_at": at })).await,
        None => Err(ApiError::NotFound(format!(
            "no live token named {:?} (GET /api/v1/tokens?revoked=true lists the revoked)",
            *name
        ))),
    }
}
