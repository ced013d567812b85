//! `/api/v1/workers` (the roster as the blackboard has it), `/api/v1/stats` (tasks by
//! status, recent throughput and latency), `/api/v1/events/head` (where the live feed
//! is now, so that a page follows it from there instead of replaying everything kept)
//! and `artex serve`'s `/health`.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use artex_actors::blackboard::RECENT_SAMPLE;

use super::{param, parse_int, query, ApiError, ApiState};
use crate::http::auth::CanRead;
use crate::http::probe::DbProbe;

/// `GET /api/v1/workers?limit=`: every worker row (gone ones too, until pruned), by id.
pub(super) async fn workers(
    _: CanRead,
    req: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let q = query(&req, &["limit"])?;
    let limit = param(&q, "limit", |s| parse_int(s, 1, 10_000))?.unwrap_or(1000);
    // One more than asked says whether there are more.
    let (mut workers, from) = state
        .reads
        .read(&req, |bb| async move { bb.workers(limit + 1).await })
        .await?;
    let more = workers.len() as i64 > limit;
    workers.truncate(limit as usize);
    Ok(HttpResponse::Ok()
        .insert_header(from.header())
        .json(json!({ "workers": workers, "more": more })))
}

/// `GET /api/v1/stats?window_minutes=&sample=`: see `OperatorBoard::stats_sampled` (bounded
/// reads only; the dashboard asks for a smaller sample than the default), with the
/// replica's lag (`replica`, null without one).
pub(super) async fn stats(
    _: CanRead,
    req: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let q = query(&req, &["window_minutes", "sample"])?;
    let window = param(&q, "window_minutes", |s| parse_int(s, 1, 60))?.unwrap_or(15);
    let sample = param(&q, "sample", |s| parse_int(s, 1, RECENT_SAMPLE))?.unwrap_or(RECENT_SAMPLE);
    let (stats, from) = state
        .reads
        .read(&req, |bb| async move {
            bb.stats_sampled(window as u32, None, sample).await
        })
        .await?;
    let replica = state.reads.lag().await?;
    let mut body = serde_json::to_value(&stats)
        .map_err(|e| ApiError::Internal(format!("encoding the statistics: {e}")))?;
    body["replica"] = json!(replica);
    Ok(HttpResponse::Ok().insert_header(from.header()).json(body))
}

/// `GET /api/v1/replica`: `{"replica": …, "health": …}`, how far the replica of
/// `--read-database-url` is behind the primary now (null without one, or when it does
/// not answer) and whether it serves reads (null without one).
pub(super) async fn replica(
    _: CanRead,
    req: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let replica = state.reads.lag().await?;
    Ok(HttpResponse::Ok().json(json!({ "replica": replica, "health": state.reads.health() })))
}

/// `GET /api/v1/events/head`: `{"after": "XID-ID"}`, the position of the newest event a
/// reader can be given now; `GET /api/v1/events?after=` it to follow from here.
pub(super) async fn events_head(
    _: CanRead,
    req: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let head = state.feed.events_head().await?;
    Ok(HttpResponse::Ok().json(json!({ "after": head.to_string() })))
}

/// `GET /health` of `artex serve` (open): 200 when the database answered a real round
/// trip recently, 503 with the reason otherwise; the replica's state beside.
pub(super) async fn health(probe: web::Data<DbProbe>, state: web::Data<ApiState>) -> HttpResponse {
    let replica = state.reads.health();
    let notes: Vec<String> = replica.iter().filter_map(|r| r.note()).collect();
    let (ready, reasons) = match probe.verdict() {
        Ok(()) => (true, Vec::new()),
        Err(why) => (false, vec![why]),
    };
    let body = json!({
        "ready": ready,
        "reasons": reasons,
        "notes": notes,
        "database_host": probe.host(),
        "replica": replica,
    });
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// `GET /metrics` of `artex serve` (read scope), in Prometheus' text format: the fleet
/// from the blackboard (tasks, waits, outcomes, workers, pauses and limits by kind; read
/// at most once per `--metrics-every` whatever the scrapers), and the replica's
/// state and the reads sent to the primary instead; and this process's trace spans
/// exported and dropped.
pub(super) async fn metrics(_: CanRead, state: web::Data<ApiState>) -> HttpResponse {
    let mut out = state.fleet.text(&state.bb).await.to_string();
    if let Some(replica) = state.reads.health() {
        out.push_str(&replica.metrics());
    }
    // This process's own spans (the submissions it traced).
    let mut spans = artex_actors::metrics::Exposition::new();
    artex_actors::trace::write_metrics(&mut spans);
    out.push_str(&spans.finish());
    HttpResponse::Ok()
        .content_type(artex_actors::metrics::CONTENT_TYPE)
        .body(out)
}
