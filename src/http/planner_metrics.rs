//! A planner's `/metrics` (`artex planner --metrics ADDR`): its rounds, assignments,
//! rescues, failed pushes and schedule slots ([`PlannerMetrics`]), and its actors'
//! restarts and errors, in Prometheus' text format. The only route it serves.

use std::sync::Arc;

use actix_web::{web, App, HttpResponse, HttpServer};
use artex_actors::metrics::planner::PlannerMetrics;
use artex_actors::metrics::{Exposition, Type, CONTENT_TYPE};
use artex_actors::supervisor::ActorStats;
use artex_actors::waker::Waker;

use super::auth::{Access, CanRead};
use crate::error::{Error, Result};

/// What a scrape reads.
#[derive(Clone)]
pub struct PlannerScrape {
    /// The planner's counters.
    pub metrics: Arc<PlannerMetrics>,
    /// Its pushes (the failed ones are counted there).
    pub waker: Waker,
    /// Its actors' restarts and errors.
    pub stats: ActorStats,
}

async fn metrics(_: CanRead, s: web::Data<PlannerScrape>) -> HttpResponse {
    let mut out = Exposition::new();
    s.metrics.write(&mut out);
    out.single(
        "artex_planner_pushes_failed_total",
        Type::Counter,
        "Wake-up pushes to workers' HTTP ports that failed.",
        s.waker.pushes_failed() as f64,
    );
    s.stats.write_metrics(&mut out);
    artex_actors::trace::write_metrics(&mut out);
    HttpResponse::Ok()
        .content_type(CONTENT_TYPE)
        .body(out.finish())
}

/// Serves `/metrics` on `listener` (open only on a loopback address unless `access`
/// asks for a token) until the returned server is stopped.
pub fn serve(
    listener: std::net::TcpListener,
    scrape: PlannerScrape,
    access: Access,
    open: bool,
) -> Result<actix_web::dev::Server> {
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("reading the metrics listener's address", e))?;
    if open && !addr.ip().is_loopback() {
        return Err(Error::Invalid(format!(
            "--metrics {addr}: without --metrics-token-file the planner serves /metrics on a loopback address only"
        )));
    }
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(access.clone()))
            .app_data(web::Data::new(scrape.clone()))
            .route("/metrics", web::get().to(metrics))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(2)
    .listen(listener)
    .map_err(|e| Error::io(format!("serving the planner's metrics on {addr}"), e))?
    .run();
    tracing::info!(metrics = %addr, "serving the planner's /metrics");
    eprintln!("artex planner: metrics on http://{addr}/metrics");
    Ok(server)
}
