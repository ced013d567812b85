//! Small reads the dashboard needs: `GET /api/v1/flows` (flows, newest first, keyset
//! pages) and `GET /api/v1/events/head` (where the live feed is now, so a page follows
//! it from here instead of replaying everything kept).

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::{param, parse_int, parse_uuid, query, ApiError, ApiState};
use crate::http::auth::CanRead;

/// `GET /api/v1/flows?limit=&after=`: flows newest first (ids are time-ordered); `next`
/// is the `after` of the next page (null on the last one).
pub(super) async fn flows(
    _: CanRead,
    req: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let q = query(&req, &["limit", "after"])?;
    let limit = param(&q, "limit", |s| parse_int(s, 1, 1000))?.unwrap_or(50);
    let after = param(&q, "after", parse_uuid)?;
    let flows = state.bb.flows_page(after, limit).await?;
    let next = (flows.len() as i64 == limit)
        .then(|| flows.last().map(|f| f.id))
        .flatten();
    Ok(HttpResponse::Ok().json(json!({ "flows": flows, "next": next })))
}

/// `GET /api/v1/events/head`: `{"after": "XID-ID"}`, the position of the newest event a
/// reader can be given now; `GET /api/v1/events?after=` it to follow from here.
pub(super) async fn events_head(
    _: CanRead,
    req: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let head = state.bb.events_head().await?;
    Ok(HttpResponse::Ok().json(json!({ "after": head.to_string() })))
}
