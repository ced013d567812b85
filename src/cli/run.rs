//! `artex up`, `artex planner`, `artex worker`, `artex serve`: the long-running commands. Each installs
//! the stop signals first (one [`Shutdown`] for the whole process: a SIGTERM during
//! start-up is a clean stop, not a kill), binds what it serves and passes control to
//! [`crate::runtime`].

use artex_actors::supervisor::ActorStats;
use artex_actors::worker::Registry;

use crate::config::{DbConfig, PlannerArgs, ServeArgs, WorkerArgs};
use crate::error::{Error, Result};
use crate::process::Shutdown;
use crate::runtime::{
    bind_http, bind_http_unless_spawned, connect, connect_replica, connect_unchecked, run_api,
    run_planner, run_worker,
};

/// Runs `artex planner`.
pub(crate) async fn planner(db: &DbConfig, planner: PlannerArgs) -> Result {
    let shutdown = Shutdown::on_signals()?;
    let bb = connect_within(db, start_wait(db)).await?;
    run_planner(bb, &planner, ActorStats::default(), shutdown.wait()).await
}

/// Runs `artex worker`.
pub(crate) async fn worker(db: &DbConfig, worker: WorkerArgs, registry: Registry) -> Result {
    let shutdown = Shutdown::on_signals()?;
    let bb = if crate::hot_upgrade::spawned_by_upgrade() {
        connect_within(db, crate::config::ms(worker.upgrade_ready_ms)).await?
    } else {
        connect_within(db, start_wait(db)).await?
    };
    let replica = connect_replica(db)?;
    let listener = bind_http_unless_spawned(&worker.http)?;
    run_worker(
        bb,
        replica,
        &worker,
        registry,
        listener,
        ActorStats::default(),
        shutdown.wait(),
    )
    .await
    .map(|_| ())
}

/// How long a long-running command waits at start for the database (`--db-start-wait-ms`).
fn start_wait(db: &DbConfig) -> std::time::Duration {
    crate::config::ms(db.db_start_wait_ms)
}

/// How often [`connect_within`] says it is still waiting.
const STILL_WAITING_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// [`connect`], tried again every 250 ms while the database is unreachable, until
/// `deadline`. A planner, worker or `serve` started before its database (a host's boot,
/// or a restart during PostgreSQL's) comes up with it rather than exiting at once, which
/// a supervisor would count against its start limit (`--db-start-wait-ms`). The new
/// process of a hot upgrade that meets a primary failover waits for the new primary
/// within the time the old process gives it to become ready, rather than being rolled
/// back.
async fn connect_within(
    db: &DbConfig,
    deadline: std::time::Duration,
) -> Result<artex_actors::Blackboard> {
    let start = tokio::time::Instant::now();
    let mut said: Option<tokio::time::Instant> = None;
    loop {
        match connect(db).await {
            Err(Error::Actors(e)) if e.is_connection() && start.elapsed() < deadline => {
                if said.is_none_or(|at| at.elapsed() >= STILL_WAITING_EVERY) {
                    tracing::warn!(error = %e, waited_ms = start.elapsed().as_millis() as u64,
                        deadline_ms = deadline.as_millis() as u64,
                        "the database is unreachable; trying again every 250 ms");
                    said = Some(tokio::time::Instant::now());
                }
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            other => return other,
        }
    }
}

/// Runs `artex serve`.
pub(crate) async fn serve(db: &DbConfig, serve: ServeArgs) -> Result {
    let shutdown = Shutdown::on_signals()?;
    let bb = connect_within(db, start_wait(db)).await?;
    let replica = connect_replica(db)?;
    let listener = bind_http(&serve.http)?;
    run_api(bb, replica, &serve, listener, shutdown.wait()).await
}

/// `artex up`'s HTTP address unless `--http` says otherwise: a port that stays the same
/// from one run to the next, so the dashboard's URL does too (a bookmark, a second
/// shell's `curl`). 27839 spells ARTEX on a phone keypad; it is in no /etc/services,
/// clear of the ports development servers take (3000, 5000, 8000, 8080 …), and below
/// Linux's ephemeral range (32768–60999), so no outgoing connection is ever given it.
/// `worker` and `master` keep a free port by default (several run on one host).
pub(crate) const UP_HTTP: &str = "127.0.0.1:27839";

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
    // The port first: taken, it fails at once, before any PostgreSQL is started.
    let listener = bind_http_unless_spawned(&worker.http).map_err(|e| port_taken(e, &worker))?;
    let bb = connect_unchecked(db).await?;
    let report = bb.maintenance().migrate().await?;
    if !report.applied.is_empty() {
        tracing::info!(applied = ?report.applied, "migrated the blackboard");
    }
    let http = match &listener {
        Some(l) => {
            let addr = l
                .local_addr()
                .map_err(|e| Error::io("reading the HTTP address", e))?;
            format!("http://{addr}/")
        }
        None => "the inherited socket's address (a hot upgrade's)".to_string(),
    };
    let stats = ActorStats::default();
    let (b, s, stop) = (bb.clone(), stats.clone(), shutdown.wait());
    let planner_task = actix::spawn(async move { run_planner(b, &planner, s, stop).await });
    // The binary's own path: `artex` is not on PATH after a build.
    let me = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "artex".into());
    // Ctrl-C stops this process, not the embedded cluster (one-shot commands and other
    // processes use it too): say how to stop that.
    let stop = if db.database_url.is_none() {
        format!(
            "Stop with Ctrl-C; the embedded PostgreSQL keeps running for the next start \
             (stop it with: {me} db stop)."
        )
    } else {
        "Stop with Ctrl-C.".to_string()
    };
    // The dashboard's URL first: it is what a newcomer opens.
    eprintln!(
        "artex is up: a planner and a worker, in this process.\n  \
           dashboard:  {http}\n  \
           HTTP also:  /health, /status, /metrics, and the API under /api/v1\n\
         Submit a task from another shell:  {me} submit echo --payload '{{\"hello\":\"world\"}}'\n\
         {stop}"
    );
    let replica = connect_replica(db)?;
    run_worker(
        bb,
        replica,
        &worker,
        registry,
        listener,
        stats,
        shutdown.wait(),
    )
    .await?;
    let _ = planner_task.await;
    Ok(())
}

/// A taken port said as such: most likely another `artex up` holds it, and `--http`
/// picks another (a second run on the same port would only give the dashboard's URL to
/// whichever bound first, so there is no quiet fallback).
fn port_taken(e: Error, worker: &WorkerArgs) -> Error {
    match e {
        Error::Io { source, .. } if source.kind() == std::io::ErrorKind::AddrInUse => Error::Io {
            what: format!(
                "{} is in use (another `artex up`?); choose another address with --http \
                 (--http 127.0.0.1:0 takes any free port)",
                worker.http
            ),
            source,
        },
        e => e,
    }
}
