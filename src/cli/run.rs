//! `artex up`, `artex planner`, `artex worker`, `artex serve`: the long-running commands. Each installs
//! the stop signals first (one [`Shutdown`] for the whole process: a SIGTERM during
//! start-up is a clean stop, not a kill), binds what it serves and hands over to
//! [`crate::runtime`].

use artex_actors::supervisor::ActorStats;
use artex_actors::worker::Registry;

use crate::config::{DbConfig, PlannerArgs, ServeArgs, WorkerArgs};
use crate::error::{Error, Result};
use crate::process::Shutdown;
use crate::runtime::{
    bind_http, bind_http_unless_spawned, connect, connect_unchecked, run_api, run_planner,
    run_worker,
};

/// Runs `artex planner`.
pub(crate) async fn planner(db: &DbConfig, planner: PlannerArgs) -> Result {
    let shutdown = Shutdown::on_signals()?;
    let bb = connect(db).await?;
    run_planner(bb, &planner, ActorStats::default(), shutdown.wait()).await
}

/// Runs `artex worker`.
pub(crate) async fn worker(db: &DbConfig, worker: WorkerArgs, registry: Registry) -> Result {
    let shutdown = Shutdown::on_signals()?;
    let bb = connect(db).await?;
    let listener = bind_http_unless_spawned(&worker.http)?;
    run_worker(
        bb,
        &worker,
        registry,
        listener,
        ActorStats::default(),
        shutdown.wait(),
    )
    .await
    .map(|_| ())
}

/// Runs `artex serve`.
pub(crate) async fn serve(db: &DbConfig, serve: ServeArgs) -> Result {
    let shutdown = Shutdown::on_signals()?;
    let bb = connect(db).await?;
    let listener = bind_http(&serve.http)?;
    run_api(bb, &serve, listener, shutdown.wait()).await
}

/// Runs `artex up`: a planner and a worker (serving the HTTP API too) in this process,
/// stopping together. The one long-running command that migrates: it is the local,
/// single-process run, where nothing else shares the schema.
pub(crate) async fn up(
    db: &DbConfig,
    mut worker: WorkerArgs,
    planner: PlannerArgs,
    registry: Registry,
) -> Result {
    let shutdown = Shutdown::on_signals()?;
    worker.api = true;
    let bb = connect_unchecked(db).await?;
    let report = bb.maintenance().migrate().await?;
    if !report.applied.is_empty() {
        tracing::info!(applied = ?report.applied, "migrated the blackboard");
    }
    let listener = bind_http_unless_spawned(&worker.http)?;
    let http = match &listener {
        Some(l) => l
            .local_addr()
            .map_err(|e| Error::io("reading the HTTP address", e))?
            .to_string(),
        None => "the inherited socket".to_string(),
    };
    let stats = ActorStats::default();
    let (b, s, stop) = (bb.clone(), stats.clone(), shutdown.wait());
    let planner_task = actix::spawn(async move { run_planner(b, &planner, s, stop).await });
    // The binary's own path: `artex` is not on PATH after a build.
    let me = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "artex".into());
    eprintln!(
        "artex is up: worker HTTP on http://{http} (/health, /status, /metrics).\n\
         Submit a task from another shell:  {me} submit echo --payload '{{\"hello\":\"world\"}}'\n\
         Stop with Ctrl-C."
    );
    run_worker(bb, &worker, registry, listener, stats, shutdown.wait()).await?;
    let _ = planner_task.await;
    Ok(())
}
