//! The worker's HTTP surface: `/health` (ready or not, and why), `/status` (who this
//! process is and what it runs), `/metrics` (Prometheus text), `/upgrade` (hot upgrade),
//! `/events` (the change feed as Server-Sent Events), `/wake` (planners' pushes), `/api/v1/uploads` (chunked
//! uploads, [`api::worker_routes`]), and with `--api` the HTTP API ([`api`], which
//! `artex serve` serves on its own) with the web dashboard ([`dashboard`], at `/`).
//! Routes hold no SQL: they ask the Worker actor, or the blackboard.

pub mod api;
pub mod auth;
pub mod dashboard;
pub mod events;
pub mod fleet_metrics;
pub mod planner_metrics;
pub mod probe;
pub mod upgrade;
pub mod wake;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use actix::Addr;
use actix_web::{web, HttpResponse, ResponseError};
use artex_actors::metrics::{Exposition, Type};
use artex_actors::supervisor::ActorStats;
use artex_actors::worker::{GetStatus, Worker};
use serde_json::json;

/// What the routes need.
#[derive(Clone)]
pub struct AppState {
    /// The worker actor.
    pub worker: Addr<Worker>,
    /// Actor counters.
    pub stats: ActorStats,
    /// Build version.
    pub version: String,
    /// sha256 of the running binary.
    pub binary_sha256: crate::process::BinaryDigest,
    /// Set once the listener pass of a hot upgrade is done: a successor serves the
    /// socket too, and this process drains.
    pub listener_passed: Arc<AtomicBool>,
    /// The database's health, from a recent real round trip.
    pub db: probe::DbProbe,
    /// The worker's counters and histograms (`/metrics`).
    pub metrics: Arc<artex_actors::worker::metrics::WorkerMetrics>,
}

/// An HTTP error: a status code and a JSON body saying what was wrong.
#[derive(Debug)]
pub struct ApiError {
    status: actix_web::http::StatusCode,
    message: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> actix_web::http::StatusCode {
        self.status
    }
    fn error_response(&self) -> HttpResponse {
        // The API's Error shape (docs/openapi.json): `field` is always there.
        HttpResponse::build(self.status).json(json!({ "error": self.message, "field": null }))
    }
}

impl ApiError {
    fn unavailable(message: impl Into<String>) -> Self {
        ApiError {
            status: actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
        }
    }
}

/// Registers the routes.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/health", web::get().to(health))
        .route("/status", web::get().to(status))
        .route("/metrics", web::get().to(metrics))
        .route("/events", web::get().to(events::events))
        .route("/upgrade", web::put().to(upgrade::upgrade))
        .route("/upgrade", web::post().to(upgrade::upgrade))
        .service(
            web::resource("/wake")
                .app_data(web::PayloadConfig::new(wake::MAX_WAKE_BYTES))
                .route(web::post().to(wake::wake)),
        );
    api::worker_routes(cfg);
    api::method_not_allowed(cfg, api::worker_routes);
}

async fn health(
    state: web::Data<AppState>,
    api: Option<web::Data<api::ApiState>>,
) -> Result<HttpResponse, ApiError> {
    let s = state
        .worker
        .send(GetStatus)
        .await
        .map_err(|e| ApiError::unavailable(format!("worker actor unavailable: {e}")))?;
    let mut reasons = Vec::new();
    if let Err(why) = state.db.verdict() {
        reasons.push(why);
    } else if !s.database_ok {
        reasons.push(format!(
            "database unreachable: {}",
            s.database_error.as_deref().unwrap_or("unknown error")
        ));
    }
    let listener_passed = state.listener_passed.load(Ordering::Acquire);
    // After a hot upgrade the service is the successor's, which serves this same socket;
    // this process only finishes its last requests and tasks, so it stays "ready".
    if s.state != artex_actors::worker::WorkerState::Online && !listener_passed {
        reasons.push(format!("worker is {}", s.state));
    }
    // What an operator should know that does not make the worker unready.
    let mut notes = Vec::new();
    if s.wake_ups == artex_actors::worker::WAKE_UPS_POLLING {
        notes.push(format!(
            "wake-ups: {}: planners cannot push to {} (see --wake-addr); it polls for its tasks",
            s.wake_ups,
            s.wake_addr.as_deref().unwrap_or("-")
        ));
    }
    // With --api and a replica: its state, which never makes the worker unready.
    let replica = api.as_ref().and_then(|a| a.reads.health());
    notes.extend(replica.as_ref().and_then(|r| r.note()));
    let body = json!({
        "ready": reasons.is_empty(),
        "reasons": reasons,
        "notes": notes,
        "wake_ups": s.wake_ups,
        "worker": s.id,
        "pid": std::process::id(),
        "version": state.version,
        // The key keeps its first name: monitors of `/health` read it.
        "handed_over": listener_passed,
        // Which server the process writes to: after a failover, the new primary.
        "database_host": state.db.host(),
        "replica": replica,
    });
    Ok(if reasons.is_empty() {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    })
}

async fn status(_: auth::CanRead, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let s = state
        .worker
        .send(GetStatus)
        .await
        .map_err(|e| ApiError::unavailable(format!("worker actor unavailable: {e}")))?;
    Ok(HttpResponse::Ok().json(json!({
        "worker": s.id,
        "pid": std::process::id(),
        "version": state.version,
        "binary_sha256": state.binary_sha256.get().await,
        "state": s.state,
        "database_ok": s.database_ok,
        "running": s.running,
        "queued": s.queued,
        "prefetch": s.prefetch,
        "prefetch_auto": s.prefetch_auto,
        "finished_per_s": (s.finished_per_s * 10.0).round() / 10.0,
        "refill_ms": (s.refill_ms * 10.0).round() / 10.0,
        "payload_bytes": s.payload_bytes,
        "unwritten_outcomes": s.unwritten_outcomes,
        "finished": s.finished,
        "fenced_off": s.fenced_off,
        "self_fenced": s.self_fenced,
        "actors": state.stats.snapshot(),
    })))
}

async fn metrics(
    _: auth::CanRead,
    state: web::Data<AppState>,
    api: Option<web::Data<api::ApiState>>,
    uploads: Option<web::Data<Arc<crate::uploads::Uploads>>>,
) -> Result<HttpResponse, ApiError> {
    let s = state
        .worker
        .send(GetStatus)
        .await
        .map_err(|e| ApiError::unavailable(format!("worker actor unavailable: {e}")))?;
    let mut out = Exposition::new();
    for (name, kind, help, value) in [
        ("artex_tasks_running", Type::Gauge, "Tasks running in this worker.", s.running.len() as f64),
        ("artex_tasks_queued", Type::Gauge, "Tasks held in this worker's local queue, waiting for a free slot.", s.queued as f64),
        ("artex_queue_depth", Type::Gauge, "Tasks this worker may hold in its local queue now (--prefetch, or sized from its pace).", s.prefetch as f64),
        ("artex_tasks_finished_total", Type::Counter, "Outcomes written by this worker.", s.finished as f64),
        ("artex_tasks_fenced_off_total", Type::Counter, "Outcomes discarded after a lost lease.", s.fenced_off as f64),
        ("artex_tasks_self_fenced_total", Type::Counter, "Tasks this worker stopped itself, unable to renew their lease in time.", s.self_fenced as f64),
        ("artex_outcomes_unwritten", Type::Gauge, "Outcomes waiting to be written.", s.unwritten_outcomes as f64),
        ("artex_database_up", Type::Gauge, "1 if the last database call succeeded.", f64::from(u8::from(s.database_ok))),
    ] {
        out.single(name, kind, help, value);
    }
    state.stats.write_metrics(&mut out);
    state.metrics.write(&mut out);
    artex_actors::trace::write_metrics(&mut out);
    if let Some(uploads) = &uploads {
        out.single(
            "artex_worker_upload_bytes_total",
            Type::Counter,
            "Bytes of upload chunks received and checked by this worker.",
            uploads.received_bytes() as f64,
        );
    }
    if let Some(api) = &api {
        out.raw(&api.reads.health().map(|r| r.metrics()).unwrap_or_default());
    }
    Ok(HttpResponse::Ok()
        .content_type(artex_actors::metrics::CONTENT_TYPE)
        .body(out.finish()))
}
