//! A worker process's run: [`run_worker`] registers, receives the listening socket when
//! a hot upgrade spawned it, starts the Worker actor and its HTTP server (its routes,
//! uploads, with `--api` the API and the dashboard), takes over its predecessor's tasks,
//! and drains on shutdown.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::Supervisor;
use actix_web::{web, App, HttpServer};
use artex_actors::blackboard::Replica;
use artex_actors::supervisor::ActorStats;
use artex_actors::worker::metrics::WorkerMetrics;
use artex_actors::worker::{Drain, DrainReport, Registry, Worker, WorkerConfig};
use artex_actors::Blackboard;

use crate::config::{ms, WorkerArgs};
use crate::error::{Error, Result};
use crate::hot_upgrade::generation::remove_own_generation;
use crate::hot_upgrade::{self, NewSide, UpgradeSettings, Upgrader};
use crate::http::auth::Access;
use crate::process::{hostname, notify_service, worker_id, BinaryDigest};
use crate::uploads::Uploads;
use crate::{http, VERSION};
use artex_actors::error::retry_unreachable;

/// Runs a worker with `registry`'s handlers until `shutdown` resolves; then drains (see
/// [`Drain`]) and returns what the drain did. It serves HTTP on `listener`; with `None`
/// it must have been spawned by a hot upgrade (`ARTEX_HANDOVER_SOCKET`), and receives the
/// listening socket (the listener pass) and its predecessor's tasks (the task transfer)
/// over the upgrade channel. With `--api`, the API's reads come from `replica` when
/// there is one.
pub async fn run_worker(
    bb: Blackboard,
    replica: Option<Replica>,
    args: &WorkerArgs,
    registry: Registry,
    listener: Option<std::net::TcpListener>,
    stats: ActorStats,
    shutdown: impl Future<Output = ()>,
) -> Result<DrainReport> {
    let registry = kinds_to_run(with_programs(registry, args)?, args)?;
    if args.concurrency == 0 {
        return Err(Error::Invalid("--concurrency: must be at least 1".into()));
    }
    let upgrade = UpgradeSettings::from_args(args)?;
    let access = Access::from_args(&args.access)?;
    let mut new_side = NewSide::connect_if_spawned().await?;
    let http_addr = http_address(&mut new_side, &listener).await?;
    let config = worker_config(args, &http_addr);
    warn_if_out_of_reach(&config, &bb);
    // The database it just reached may go away before the registration (a failover, a
    // restart): the process waits for it rather than exiting. A hot upgrade's new process
    // waits within the time the old one gives it to be ready (or it is rolled back).
    let patience = Some(
        new_side
            .as_ref()
            .map_or(START_PATIENCE, |_| ms(args.upgrade_ready_ms)),
    );
    artex_actors::supervisor::delay_point("before_register").await;
    // Every read its start needs comes before its registration: once its row is there,
    // a database that goes away no longer stops the process.
    let facts = StartFacts::read(&bb, patience).await?;
    // A folder it cannot keep uploads in stops it before it is registered, and before
    // any actor starts (an actor started and never run panics as the runtime drops it).
    let uploads = open_uploads(&bb, args, &config, facts.blackboard)?;
    register(&bb, &config, &registry, new_side.is_some(), patience).await?;
    // Its connections' server processes read the tables and functions its writes use
    // now, not during its first burst.
    if let Err(e) = bb.worker().warm_connections(&config.id).await {
        tracing::debug!(error = %e, "warming the connections failed; the first writes will");
    }
    // A new process receives the socket only now, registered: one that cannot reach the
    // blackboard never accepts a connection.
    let listener = match (listener, &mut new_side) {
        (Some(l), _) => l,
        (None, Some(s)) => receive_listener(s, &bb, &config).await?,
        (None, None) => unreachable!("checked by http_address"),
    };
    access.watch(bb.operator()).await;
    tracing::info!(worker = %config.id, http = %http_addr, kinds = ?registry.kinds(),
        concurrency = config.concurrency, prefetch = ?config.prefetch, lease_ms = args.lease_ms,
        drain_ms = args.drain_ms, spawned_by_upgrade = new_side.is_some(), access = ?access,
        upgrades = upgrade.public_key.is_some() && upgrade.token.is_some(), "worker registered; listening");
    let metrics = Arc::new(WorkerMetrics::default());
    let worker = start_worker(&bb, &config, registry, &stats, &metrics).await;
    let passed = Arc::new(AtomicBool::new(false));
    let parts = (&worker, upgrade, access, stats, &listener, &passed, metrics);
    let app = WorkerApp::new(&bb, replica, args, &config, facts, uploads, parts)?;
    let sweeping = actix::spawn(sweep_uploads(
        app.uploads.clone(),
        ms(args.uploads.upload_sweep_ms),
    ));
    let server = app.serve(listener, &http_addr)?;
    let handle = server.handle();
    let serving = actix::spawn(server);
    if let Some(s) = new_side {
        s.take_tasks(&worker).await?;
        // The unstarted tasks moved here were announced on no channel it listens on.
        worker.do_send(artex_actors::worker::Wake);
    }
    notify_service(artex_upgrade::notify::ready());
    let serving_on = format!("serving on {http_addr}");
    notify_service(artex_upgrade::notify::status(&serving_on));
    shutdown.await;
    let passed = passed.load(Ordering::Acquire);
    let report = stop_worker(&worker, &config, args, &handle, passed).await?;
    let _ = serving.await;
    sweeping.abort();
    remove_own_generation();
    Ok(report)
}

/// Warns when planners elsewhere cannot reach the worker's wake address (see
/// [`loopback_wake_warning`]).
fn warn_if_out_of_reach(config: &WorkerConfig, bb: &Blackboard) {
    let warning = config
        .wake_addr
        .as_deref()
        .and_then(|a| loopback_wake_warning(a, bb.is_remote()));
    if let Some(warning) = warning {
        tracing::warn!(worker = %config.id, "{warning}");
    }
}

/// The address the worker serves HTTP on: its listener's, or, for a hot upgrade's new
/// process, the one its predecessor's welcome names.
async fn http_address(
    new_side: &mut Option<NewSide>,
    listener: &Option<std::net::TcpListener>,
) -> Result<String> {
    match (new_side, listener) {
        (Some(s), _) => Ok(s.welcome().await?.0),
        (None, Some(l)) => Ok(l
            .local_addr()
            .map_err(|e| Error::io("reading the HTTP listener's address", e))?
            .to_string()),
        (None, None) => Err(Error::Invalid(
            "no HTTP listener and no upgrade channel to receive one from".into(),
        )),
    }
}

/// How long a worker that reached the database at its start waits for it, should it go
/// away before the worker is registered.
const START_PATIENCE: Duration = Duration::from_secs(60);

/// Registers the worker (an upsert: again is fine), waiting `patience` for a database
/// that is away. A hot upgrade's new process registers without its wake address: until
/// the listener pass, pushes to it reach the old process (its poll finds what it is
/// given meanwhile).
async fn register(
    bb: &Blackboard,
    config: &WorkerConfig,
    registry: &Registry,
    spawned_by_upgrade: bool,
    patience: Option<Duration>,
) -> Result {
    let mut registration = Worker::registration(config, registry);
    if spawned_by_upgrade {
        registration.wake_addr = None;
    }
    let board = bb.worker();
    retry_unreachable(patience, "registering", || {
        board.register_worker(&registration)
    })
    .await?;
    Ok(())
}

/// A hot upgrade's new process receives the listening socket, then records where
/// planners push its wake-ups — not a reason to fail the upgrade if the database is away
/// (a failover): until it is recorded, the poll finds this worker's tasks.
async fn receive_listener(
    new_side: &mut NewSide,
    bb: &Blackboard,
    config: &WorkerConfig,
) -> Result<std::net::TcpListener> {
    let listener = new_side.receive_listener(&config.id).await?;
    let (board, id, addr) = (bb.worker(), config.id.clone(), config.wake_addr.clone());
    actix::spawn(async move {
        let recorded = retry_unreachable(
            Some(Duration::from_secs(60)),
            "recording where planners push wake-ups",
            || board.set_wake_addr(&id, addr.as_deref()),
        )
        .await;
        if let Err(e) = recorded {
            tracing::warn!(error = %e, "cannot record where planners push wake-ups; this worker polls for its tasks");
        }
    });
    Ok(listener)
}

/// Starts the Worker actor, supervised, with its kinds' retry policies read first: a
/// task that fails at once waits as its kind says (the worker reads them again every
/// few seconds while it holds tasks).
async fn start_worker(
    bb: &Blackboard,
    config: &WorkerConfig,
    registry: Registry,
    stats: &ActorStats,
    metrics: &Arc<WorkerMetrics>,
) -> actix::Addr<Worker> {
    let policies = match bb.worker().kind_policies(&registry.kinds()).await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the kinds' policies yet; the worker reads them again while it holds tasks");
            Default::default()
        }
    };
    let (b, c, r, s) = (bb.worker(), config.clone(), registry, stats.clone());
    let m = metrics.clone();
    Supervisor::start(move |_| {
        Worker::new(b.clone(), c.clone(), r.clone(), s.clone())
            .with_kind_policies(policies.clone())
            .with_metrics(m.clone())
    })
}

/// Stops the worker after `shutdown`: drains it (see [`Drain`]) and stops serving. After
/// a hot upgrade (`passed`: the successor serves the socket) it stops serving first, then
/// finishes its remaining tasks.
async fn stop_worker(
    worker: &actix::Addr<Worker>,
    config: &WorkerConfig,
    args: &WorkerArgs,
    handle: &actix_web::dev::ServerHandle,
    passed: bool,
) -> Result<DrainReport> {
    if passed {
        notify_service(artex_upgrade::notify::status(
            "upgraded; draining: finishing the last tasks",
        ));
        hot_upgrade::drain::stop_serving(handle).await;
        drain(worker, config, args).await
    } else {
        notify_service(artex_upgrade::notify::stopping());
        let report = drain(worker, config, args).await?;
        handle.stop(true).await;
        Ok(report)
    }
}

/// What a worker reads from the blackboard before it registers.
struct StartFacts {
    /// The bearer token planners' wake-up pushes carry.
    wake_secret: String,
    /// The blackboard's id, which keys the upload folder.
    blackboard: uuid::Uuid,
}

impl StartFacts {
    /// Reads them, waiting `patience` for a database that is away: a hot upgrade's new
    /// process may meet a failover, and waits as for its registration.
    async fn read(bb: &Blackboard, patience: Option<Duration>) -> Result<StartFacts> {
        let board = bb.worker();
        let wake_secret = retry_unreachable(patience, "reading the wake-ups' secret", || {
            board.wake_secret()
        })
        .await?;
        let blackboard = retry_unreachable(patience, "reading the blackboard's id", || {
            board.blackboard_id()
        })
        .await?;
        Ok(StartFacts {
            wake_secret,
            blackboard,
        })
    }
}

/// See [`WorkerApp::new`].
type AppParts<'a> = (
    &'a actix::Addr<Worker>,
    UpgradeSettings,
    Access,
    ActorStats,
    &'a std::net::TcpListener,
    &'a Arc<AtomicBool>,
    Arc<WorkerMetrics>,
);

/// What a worker's HTTP server serves: its own routes (health, status, metrics, events,
/// upgrade, wake), uploads, and with `--api` the API and the dashboard.
struct WorkerApp {
    state: http::AppState,
    access: Access,
    events: http::events::EventsState,
    upgrader: Arc<Upgrader>,
    uploads: Arc<Uploads>,
    wake_target: http::wake::WakeTarget,
    api: Option<http::api::ApiState>,
}

impl WorkerApp {
    /// `uploads`: the upload folder, opened before the worker registered. `parts`: the
    /// worker actor, the upgrade settings, the access rules, the actors' statistics, the
    /// listener (a duplicate serves the listener pass) and the flag the pass raises.
    fn new(
        bb: &Blackboard,
        replica: Option<Replica>,
        args: &WorkerArgs,
        config: &WorkerConfig,
        facts: StartFacts,
        uploads: Arc<Uploads>,
        parts: AppParts<'_>,
    ) -> Result<WorkerApp> {
        let (worker, upgrade, access, stats, listener, listener_passed, metrics) = parts;
        let binary_sha256 = BinaryDigest::start();
        record_binary(bb, &config.id, &binary_sha256);
        let upgrader = Arc::new(Upgrader {
            worker: worker.clone(),
            bb: bb.clone(),
            public_key: upgrade.public_key,
            token: upgrade.token,
            listener: listener
                .try_clone()
                .map_err(|e| Error::io("duplicating the HTTP listener for upgrades", e))?,
            dir: upgrade.dir,
            ready_deadline: ms(args.upgrade_ready_ms),
            body_timeout: ms(args.upgrade_body_timeout_ms),
            suspend_deadline: ms(args.transfer_suspend_ms),
            tasks_dir: args.tasks_dir.clone(),
            lease_secs: ms(args.lease_ms).as_secs_f64(),
            limits: artex_upgrade::Limits::default(),
            binary_sha256: binary_sha256.clone(),
            in_progress: AtomicBool::new(false),
            listener_passed: listener_passed.clone(),
        });
        let state = http::AppState {
            worker: worker.clone(),
            stats,
            version: VERSION.to_string(),
            binary_sha256,
            listener_passed: listener_passed.clone(),
            db: http::probe::DbProbe::start(bb.clone()),
            metrics,
        };
        let wake_target = http::wake::WakeTarget {
            worker: config.id.clone(),
            secret: facts.wake_secret,
        };
        Ok(WorkerApp {
            state,
            access,
            events: http::events::EventsState::start(
                bb.feed(),
                args.access.max_event_streams as usize,
            ),
            upgrader,
            uploads,
            wake_target,
            api: args.api.then(|| api_state(bb, replica, config)),
        })
    }

    /// The HTTP server on `listener`, one thread, stopped by the worker's own shutdown.
    fn serve(
        self,
        listener: std::net::TcpListener,
        http_addr: &str,
    ) -> Result<actix_web::dev::Server> {
        let server = HttpServer::new(move || {
            let api = self.api.clone();
            App::new()
                .app_data(web::Data::new(self.state.clone()))
                .app_data(web::Data::new(self.access.clone()))
                .app_data(web::Data::new(self.events.clone()))
                .app_data(web::Data::new(self.upgrader.clone()))
                .app_data(web::Data::new(self.uploads.clone()))
                .app_data(web::Data::new(self.wake_target.clone()))
                .configure(http::routes)
                .configure(move |cfg| {
                    if let Some(api) = api {
                        cfg.app_data(web::Data::new(api));
                        http::api::api_routes(cfg);
                        http::api::method_not_allowed(cfg, http::api::api_routes);
                    }
                })
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(10)
        .listen(listener)
        .map_err(|e| Error::io(format!("serving HTTP on {http_addr}"), e))?
        .run();
        Ok(server)
    }
}

/// With `--api`, what the API and the dashboard serve from (reads from `replica` when
/// there is one).
fn api_state(
    bb: &Blackboard,
    replica: Option<Replica>,
    config: &WorkerConfig,
) -> http::api::ApiState {
    tracing::info!(worker = %config.id, "serving the HTTP API on http://{}/api/v1",
        config.http_addr.as_deref().unwrap_or("-"));
    http::api::ApiState {
        bb: bb.operator(),
        reads: http::api::reads::Reads::new(&bb.operator(), replica),
        feed: bb.feed(),
        max_body_bytes: http::api::DEFAULT_MAX_BODY_BYTES as usize,
        // Not served by a worker (its /metrics is its own).
        fleet: http::fleet_metrics::FleetMetrics::new(std::time::Duration::from_secs(5)),
    }
}

/// The worker's upload folder. Uploads are this blackboard's only: its id keys the
/// default folder and every upload's meta.json (other deployments on this host keep
/// theirs apart).
fn open_uploads(
    bb: &Blackboard,
    args: &WorkerArgs,
    config: &WorkerConfig,
    blackboard: uuid::Uuid,
) -> Result<Arc<Uploads>> {
    let uploads = Uploads::open(
        crate::uploads::UploadSettings::from_args(&args.uploads),
        bb.worker(),
        config.host.clone(),
        config.id.clone(),
        blackboard,
    )?;
    tracing::info!(worker = %config.id, %blackboard, folder = %uploads.settings().dir.display(),
        "uploads kept in their folder");
    Ok(uploads)
}

/// Sweeps the upload folder every `every` (see [`Uploads::sweep`]).
async fn sweep_uploads(uploads: Arc<Uploads>, every: std::time::Duration) {
    loop {
        tokio::time::sleep(every).await;
        match uploads.sweep().await {
            Ok(r) if r != Default::default() => tracing::info!(report = ?r, "uploads swept"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "sweeping uploads"),
        }
    }
}

/// `registry` with the programs of `--tasks-dir` as kinds (or of the folder a hot upgrade
/// installed the bundle's programs in, for this process).
fn with_programs(mut registry: Registry, args: &WorkerArgs) -> Result<Registry> {
    if let Some(dir) = crate::hot_upgrade::programs::effective_dir(args.tasks_dir.as_deref()) {
        let kinds = crate::programs::register(
            &mut registry,
            &dir,
            &args.tasks_env,
            ms(args.cancel_grace_ms),
        )?;
        tracing::info!(dir = %dir.display(), ?kinds, "programs run as task kinds");
    }
    Ok(registry)
}

/// `registry` narrowed to `--kinds`, each of which must have a handler.
fn kinds_to_run(mut registry: Registry, args: &WorkerArgs) -> Result<Registry> {
    if args.kinds.is_empty() {
        return Ok(registry);
    }
    let known = registry.kinds();
    if let Some(k) = args.kinds.iter().find(|k| !known.contains(k)) {
        return Err(Error::Invalid(format!(
            "--kinds: '{k}' has no handler in this binary; it has: {}",
            known.join(", ")
        )));
    }
    registry.retain(|k| args.kinds.iter().any(|x| x == k));
    Ok(registry)
}

fn worker_config(args: &WorkerArgs, http_addr: &str) -> WorkerConfig {
    let host = hostname();
    WorkerConfig {
        id: worker_id(&host),
        host,
        version: VERSION.to_string(),
        http_addr: Some(http_addr.to_string()),
        wake_addr: Some(
            args.wake_addr
                .clone()
                .unwrap_or_else(|| wake_addr(http_addr, &hostname())),
        ),
        concurrency: args.concurrency,
        prefetch: args.prefetch,
        queue_max_bytes: usize::try_from(args.queue_max_bytes).unwrap_or(usize::MAX),
        lease: ms(args.lease_ms),
        heartbeat: ms(args.heartbeat_ms),
        poll: ms(args.worker_poll_ms),
        default_timeout: ms(args.task_timeout_ms),
        cancel_grace: ms(args.cancel_grace_ms),
        retry_base: ms(args.retry_base_ms),
        retry_cap: ms(args.retry_cap_ms),
    }
}

/// Where planners push a worker's wake-ups when `--wake-addr` is not given: its HTTP
/// address, with this host's name for an address that listens everywhere.
fn wake_addr(http_addr: &str, host: &str) -> String {
    match http_addr.parse::<std::net::SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => format!("{host}:{}", a.port()),
        _ => http_addr.to_string(),
    }
}

/// Why planners elsewhere cannot reach `wake_addr`, when it is a loopback address while
/// the database (and so, as a rule, the planners) is on another host: their pushes will
/// fail and the worker will take its tasks by polling.
pub fn loopback_wake_warning(wake_addr: &str, database_remote: bool) -> Option<String> {
    let host = wake_addr
        .rsplit_once(':')
        .map_or(wake_addr, |(host, _)| host);
    (database_remote && artex_actors::blackboard::is_loopback_name(host)).then(|| {
        format!(
            "this worker's wake-up address {wake_addr} is a loopback address while its \
             database is on another host: planners elsewhere cannot push to it, and it will \
             take its tasks by polling. Give --wake-addr (ARTEX_WAKE_ADDR) an address they \
             reach, with --http listening there."
        )
    })
}

async fn drain(
    worker: &actix::Addr<Worker>,
    config: &WorkerConfig,
    args: &WorkerArgs,
) -> Result<DrainReport> {
    tracing::info!(worker = %config.id, "draining: no new work; finishing what runs");
    let report = worker
        .send(Drain {
            deadline: ms(args.drain_ms),
        })
        .await
        .map_err(artex_actors::Error::from)?;
    tracing::info!(worker = %config.id, report = ?report, "drained");
    Ok(report)
}

/// Binds the worker's HTTP listener, unless this process was spawned by a hot upgrade
/// (it then receives its predecessor's listening socket: the listener pass).
pub fn bind_http_unless_spawned(addr: &str) -> Result<Option<std::net::TcpListener>> {
    if hot_upgrade::spawned_by_upgrade() {
        return Ok(None);
    }
    bind_http(addr).map(Some)
}

/// Binds the worker's HTTP listener.
pub fn bind_http(addr: &str) -> Result<std::net::TcpListener> {
    std::net::TcpListener::bind(addr).map_err(|e| Error::io(format!("binding HTTP on {addr}"), e))
}

/// Writes the running binary's sha256 into worker `id`'s row once it is computed (for
/// `/api/v1/workers`); a failure is logged, never fatal.
fn record_binary(bb: &Blackboard, id: &str, digest: &BinaryDigest) {
    let (bb, id, digest) = (bb.clone(), id.to_string(), digest.clone());
    actix::spawn(async move {
        let sha256 = digest.get().await;
        if sha256.is_empty() {
            return;
        }
        if let Err(e) = bb.worker().set_worker_binary(&id, &sha256).await {
            tracing::warn!(worker = %id, error = %e, "could not record the binary's sha256");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::loopback_wake_warning;

    #[test]
    fn a_loopback_wake_address_is_named_only_when_the_database_is_elsewhere() {
        let w = loopback_wake_warning("127.0.0.1:8080", true).expect("a warning");
        assert!(
            w.contains("127.0.0.1:8080") && w.contains("--wake-addr"),
            "{w}"
        );
        assert!(loopback_wake_warning("localhost:8080", true).is_some());
        assert!(loopback_wake_warning("[::1]:8080", true).is_some());
        assert!(loopback_wake_warning("127.0.0.1:8080", false).is_none());
        assert!(loopback_wake_warning("10.0.0.7:8080", true).is_none());
        assert!(loopback_wake_warning("web-3:8080", true).is_none());
    }
}
