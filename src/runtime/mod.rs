//! The long-running parts, each `run(…, shutdown)` like mini-redis's `server::run`: the
//! caller passes the blackboard, the settings, the listener and a shutdown future, so a
//! test (or a user's binary) can run a planner or a worker in-process and stop it.
//! [`run_planner`] starts the Scanner, Assigner, Reaper, Maintenance and Scheduler (and
//! with `--shards auto` the ShardKeeper); [`run_worker`] starts the Worker actor and its HTTP server, runs the new
//! side of a hot upgrade when one spawned it (`hot_upgrade::NewSide`: listener pass, task
//! transfer), and drains on shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use actix::Supervisor;
use actix_web::{web, App, HttpServer};
use artex_actors::assigner::{Assigner, AssignerConfig};
use artex_actors::blackboard::{ReapParams, Replica};
use artex_actors::maintenance::Maintenance;
use artex_actors::metrics::planner::PlannerMetrics;
use artex_actors::reaper::Reaper;
use artex_actors::scanner::Scanner;
use artex_actors::scheduler::Scheduler;
use artex_actors::shard_keeper::{KeeperConfig, Resign, ShardKeeper, ShardView};
use artex_actors::supervisor::ActorStats;
use artex_actors::waker::Waker;
use artex_actors::Blackboard;

use crate::config::{ms, DbConfig, PlannerArgs, ServeArgs};
use crate::error::{Error, Result};
use crate::http::auth::Access;
use crate::process::{hostname, notify_service, worker_id};
use crate::{dev_db, http};

mod worker;
pub use worker::{bind_http, bind_http_unless_spawned, loopback_wake_warning, run_worker};

/// How long a stopping planner tries to give its shards back (`--shards auto`).
const RESIGN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// The database URL to use: the one configured, or the embedded cluster's (created and
/// started on first use, reused afterwards).
pub async fn database_url(db: &DbConfig) -> Result<String> {
    if let Some(url) = &db.database_url {
        return Ok(url.clone());
    }
    let (cluster, _) = dev_db::start_embedded(dev_db::ClusterOptions::new(&db.data_dir)).await?;
    Ok(cluster.url(dev_db::DATABASE))
}

/// Connects to the blackboard and checks that its schema lies within this build's range
/// (every migration it knows applied, nothing contracted beyond it); refuses otherwise,
/// having written nothing. It never migrates: a process that migrated at start would
/// change the schema under the whole fleet whenever it was upgraded, and a rollback would
/// not undo it. Only `artex migrate`, `artex up` and `artex db start` migrate.
pub async fn connect(db: &DbConfig) -> Result<Blackboard> {
    let bb = connect_unchecked(db).await?;
    let schema = bb.maintenance().check_schema().await?;
    if !schema.unknown.is_empty() {
        tracing::info!(newer = ?schema.unknown,
            "the database has expansions by a newer build; this build runs on");
    }
    Ok(bb)
}

/// Connects to the blackboard without looking at its schema: for the commands that
/// migrate it first.
pub async fn connect_unchecked(db: &DbConfig) -> Result<Blackboard> {
    let url = database_url(db).await?;
    let limits = db.limits();
    tracing::info!(database = %artex_actors::blackboard::mask_password(&url),
        limits = ?limits, "blackboard");
    let bb = Blackboard::connect_with(&url, limits)?;
    Ok(match &db.listen_database_url {
        Some(listen) => {
            tracing::info!(listen = %artex_actors::blackboard::mask_password(listen),
                "LISTEN sessions");
            bb.listening_at(listen)?
        }
        None => bb,
    })
}

/// The streaming replica of `--read-database-url`, if one is given (no connection is
/// made until first use; the schema is the primary's, replicated).
pub fn connect_replica(db: &DbConfig) -> Result<Option<Replica>> {
    let Some(url) = &db.read_database_url else {
        return Ok(None);
    };
    let limits = db.limits();
    tracing::info!(replica = %artex_actors::blackboard::mask_password(url),
        "operators' reads come from the replica; writes and the feed from the primary");
    Ok(Some(
        Replica::connect_with(url, limits)?.with_max_lag(db.read_max_lag),
    ))
}

/// How often the planner's Maintenance actor keeps history bounded: often enough for
/// the shortest partition slice (a minute), and a few cheap statements when there is
/// nothing to do.
const MAINTENANCE_EVERY: Duration = Duration::from_secs(15);

/// How often the planner's Scheduler looks for due schedules: slots are minutes apart
/// at least, so a slot fires within about a second of its time; a look is one indexed
/// read when nothing is due.
const SCHEDULER_EVERY: Duration = Duration::from_secs(1);

/// Runs the planner's actors (Scanner, Assigner, Reaper, Maintenance, Scheduler, each
/// supervised) until
/// `shutdown` resolves.
pub async fn run_planner(
    bb: Blackboard,
    args: &PlannerArgs,
    stats: ActorStats,
    shutdown: impl Future<Output = ()>,
) -> Result {
    // Unique like a worker's id (`host:pid:suffix`): with `--shards auto` it owns shard
    // leases, and two planners sharing a name would each take the other's for its own.
    let name = format!("planner:{}", worker_id(&hostname()));
    // A connection to each worker it pushes wake-ups to.
    crate::process::raise_open_files_limit();
    let shards = match args.shard {
        Some((i, n)) => (n, vec![i]),
        None => (1, Vec::new()),
    };
    let assigner_cfg = AssignerConfig {
        actor: name.clone(),
        batch: args.batch,
        lease_secs: ms(args.assign_lease_ms).as_secs_f64(),
        // The roster leaves out suspects: silent for a while, not yet gone.
        suspect_after_secs: ms(args.worker_suspect_ms.min(args.worker_timeout_ms)).as_secs_f64(),
        shards,
    };
    tracing::info!(planner = %name, config = ?args, "planner starting");
    let planner = bb.planner();
    // `--shards auto`: the first round runs before anything is served, so a refused
    // shard count stops the start, saying why.
    let keeper = match args.shards {
        None => None,
        Some(auto) => {
            let config = KeeperConfig {
                planner: name.clone(),
                count: auto.count,
                lease: ms(args.shard_lease_ms),
                now: None,
            };
            let view = ShardView::new();
            ShardKeeper::run_once(&planner, &config, &view).await?;
            let (b, s, v) = (planner.clone(), stats.clone(), view.clone());
            let actor = Supervisor::start(move |_| ShardKeeper::new(b, config, v, s));
            Some((actor, view))
        }
    };
    // Wake-ups of workers of this build are pushed to their HTTP ports.
    let waker = Waker::start(planner.clone(), name.clone()).await?;
    let metrics = Arc::new(PlannerMetrics::default());
    let scrape = http::planner_metrics::PlannerScrape {
        metrics: metrics.clone(),
        waker: waker.clone(),
        stats: stats.clone(),
    };
    let metrics_server = match &args.metrics {
        None => None,
        Some(addr) => {
            let access = Access::metrics_only(args.metrics_token_file.as_deref())?;
            let open = args.metrics_token_file.is_none();
            let server = http::planner_metrics::serve(bind_http(addr)?, scrape, access, open)?;
            let handle = server.handle();
            Some((handle, actix::spawn(server)))
        }
    };
    let (b, s, w, m) = (
        planner.clone(),
        stats.clone(),
        waker.clone(),
        metrics.clone(),
    );
    let view = keeper.as_ref().map(|(_, v)| v.clone());
    let assigner = Supervisor::start(move |_| {
        let assigner = Assigner::new(b, assigner_cfg, s)
            .with_waker(w.clone())
            .with_metrics(m.clone());
        match view.clone() {
            Some(v) => assigner.with_leased_shards(v),
            None => assigner,
        }
    });
    // Started before the Scanner, which hands it the due times of flows' waits (V61).
    let (b, s, n) = (planner.clone(), stats.clone(), name.clone());
    let m = metrics.clone();
    let scheduler = Supervisor::start(move |_| {
        Scheduler::new(b, n, SCHEDULER_EVERY, s).with_metrics(m.clone())
    });
    let (b, s, a) = (planner.clone(), stats.clone(), assigner.clone());
    let poll = ms(args.planner_poll_ms);
    let waits = scheduler.clone().recipient();
    let scanner = Supervisor::start(move |_| {
        Scanner::new(b, a, poll, s)
            .with_waker(waker.clone())
            .with_scheduler(waits.clone())
    });
    let params = ReapParams {
        now: None,
        worker_timeout_secs: ms(args.worker_timeout_ms).as_secs_f64(),
        prune_after_secs: 3600.0,
        batch: 1000,
        retry_base_ms: args.reap_retry_base_ms as f64,
        retry_cap_ms: 300_000.0,
        judge_liveness: true,
        upload_host_deadline_secs: ms(args.upload_host_deadline_ms).as_secs_f64(),
    };
    let (b, s, n, every) = (
        planner.clone(),
        stats.clone(),
        name.clone(),
        ms(args.reap_ms),
    );
    let m = metrics.clone();
    let reaper =
        Supervisor::start(move |_| Reaper::new(b, every, n, params, s).with_metrics(m.clone()));
    if let Some(keep) = args.history_retention {
        bb.maintenance().set_event_retention(keep).await?;
        tracing::info!(retention = ?keep, "history retention set");
    }
    let (b, s) = (bb.maintenance(), stats.clone());
    let maintenance = Supervisor::start(move |_| Maintenance::new(b, MAINTENANCE_EVERY, s));
    shutdown.await;
    tracing::info!(planner = %name, "planner stopping");
    if let Some((keeper, _)) = keeper {
        // Given back at once, the shards move to the others now, not a lease later.
        let resign = tokio::time::timeout(RESIGN_DEADLINE, keeper.send(Resign)).await;
        match resign {
            Ok(Ok(Ok(n))) => {
                tracing::info!(planner = %name, shards = n, "planner shards: given back")
            }
            Ok(Ok(Err(e))) => tracing::warn!(planner = %name, error = %e,
                "planner shards: could not give them back; they lapse with their leases"),
            Ok(Err(_)) | Err(_) => tracing::warn!(planner = %name,
                "planner shards: not given back in time; they lapse with their leases"),
        }
    }
    drop((scanner, assigner, reaper, maintenance, scheduler));
    if let Some((handle, serving)) = metrics_server {
        handle.stop(true).await;
        let _ = serving.await;
    }
    Ok(())
}

/// Serves the HTTP API (`artex serve`: `/api/v1/…`, `/health`, `/events`) on `listener`
/// until `shutdown` resolves; then ends the open event streams and finishes the requests
/// in flight. Stateless: everything it answers is read from or written to `bb`, or read
/// from `replica` (lists, pages, statistics) when there is one.
pub async fn run_api(
    bb: Blackboard,
    replica: Option<Replica>,
    args: &ServeArgs,
    listener: std::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result {
    let access = Access::from_args(&args.access)?;
    access.watch(bb.operator()).await;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("reading the HTTP listener's address", e))?;
    let api = http::api::ApiState {
        bb: bb.operator(),
        reads: http::api::reads::Reads::new(&bb.operator(), replica),
        feed: bb.feed(),
        max_body_bytes: usize::try_from(args.max_body_bytes).unwrap_or(usize::MAX),
        fleet: http::fleet_metrics::FleetMetrics::new(args.metrics_every),
    };
    let probe = http::probe::DbProbe::start(bb.clone());
    let events =
        http::events::EventsState::start(bb.feed(), args.access.max_event_streams as usize);
    let streams = events.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(access.clone()))
            .app_data(web::Data::new(events.clone()))
            .app_data(web::Data::new(probe.clone()))
            .app_data(web::Data::new(api.clone()))
            .configure(http::api::serve_routes)
            .configure(|cfg| http::api::method_not_allowed(cfg, http::api::serve_routes))
            .default_service(web::to(http::api::no_route))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(10)
    .listen(listener)
    .map_err(|e| Error::io(format!("serving HTTP on {addr}"), e))?
    .run();
    let handle = server.handle();
    let serving = actix::spawn(server);
    tracing::info!(http = %addr, max_body_bytes = args.max_body_bytes,
        max_event_streams = args.access.max_event_streams, "serving the HTTP API");
    eprintln!("artex serve: the HTTP API on http://{addr}/api/v1 (/health, /events)");
    notify_service(artex_upgrade::notify::ready());
    shutdown.await;
    notify_service(artex_upgrade::notify::stopping());
    tracing::info!(http = %addr, "HTTP API stopping");
    streams.stop();
    handle.stop(true).await;
    let _ = serving.await;
    Ok(())
}
