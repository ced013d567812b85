//! artex: an actor-model task runtime with PostgreSQL as the blackboard. This crate is the
//! app shell (CLI, configuration, HTTP, embedded PostgreSQL) and the library API users
//! build their own worker binaries on:
//!
//! ```no_run
//! use artex::{Registry, TaskContext};
//! use serde_json::json;
//!
//! fn main() -> std::process::ExitCode {
//!     let mut handlers = Registry::new();
//!     handlers.register("resize", |ctx: TaskContext| async move {
//!         let width = ctx.payload()["width"].as_u64().unwrap_or(100);
//!         Ok(json!({ "resized_to": width }))
//!     });
//!     // The same CLI as the stock binary (`worker`, `up`, `submit`, …), with these kinds.
//!     artex::cli::main_with(handlers)
//! }
//! ```
//!
//! # Layout
//! - [`cli`]: the `artex` command line and its dispatch.
//! - `cli_flows`: the flow, operator control and change feed subcommands.
//! - [`config`]: flags and `ARTEX_*` variables, with defaults.
//! - [`dev_db`]: the embedded PostgreSQL cluster (also the tests' and benchmark's).
//! - [`handlers`]: the stock binary's task kinds.
//! - [`hot_upgrade`]: both sides of a hot upgrade's handover.
//! - [`http`]: the worker's HTTP routes.
//! - [`master`]: `artex master`, the stable parent for supervisord and runit.
//! - [`error`]: the app's error type and exit codes.
#![forbid(unsafe_code)]

pub mod cli;
mod cli_flows;
pub mod config;
pub mod dev_db;
pub mod error;
pub mod handlers;
pub mod hot_upgrade;
pub mod http;
pub mod master;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use actix::Supervisor;
use actix_web::{web, App, HttpServer};
use artex_actors::assigner::{Assigner, AssignerConfig};
use artex_actors::blackboard::{admin, ReapParams};
use artex_actors::reaper::Reaper;
use artex_actors::scanner::Scanner;
use artex_actors::supervisor::ActorStats;
use artex_actors::worker::{Drain, DrainReport, Worker, WorkerConfig};
use sha2::Digest;

pub use artex_actors::worker::{Registry, TaskContext, TaskError};
pub use artex_actors::Blackboard;
pub use error::{Error, Result};

use config::{ms, DbConfig, PlannerArgs, WorkerArgs};

/// After a handover, how long accepted connections get to send their request before
/// the old process stops serving HTTP.
const HANDOVER_ACCEPT_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// This build's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The database URL to use: the one configured, or the embedded cluster's (created and
/// started on first use, reused afterwards).
pub async fn database_url(db: &DbConfig) -> Result<String> {
    if let Some(url) = &db.database_url {
        return Ok(url.clone());
    }
    let (cluster, _) = start_embedded(dev_db::ClusterOptions::new(&db.data_dir)).await?;
    Ok(cluster.url(dev_db::DATABASE))
}

/// Creates (first time) and starts the embedded cluster unless it runs, and creates its
/// database. Returns the cluster and whether it had to start the server.
pub async fn start_embedded(opts: dev_db::ClusterOptions) -> Result<(dev_db::Cluster, bool)> {
    let cluster = dev_db::Cluster::new(opts)?;
    let c = cluster.clone();
    let started = tokio::task::spawn_blocking(move || c.start())
        .await
        .map_err(|e| Error::Cluster(format!("starting the cluster: {e}")))??;
    if started {
        tracing::info!(data_dir = %cluster.data_dir().display(), "started the embedded PostgreSQL cluster");
    }
    admin::create_database(&cluster.url("postgres"), dev_db::DATABASE, None).await?;
    Ok((cluster, started))
}

/// Connects to the blackboard and brings its schema up to date.
pub async fn connect(db: &DbConfig) -> Result<Blackboard> {
    let url = database_url(db).await?;
    tracing::info!(database = %artex_actors::blackboard::mask_password(&url),
        pool_size = db.pool_size, "blackboard");
    let bb = Blackboard::connect(&url, db.pool_size)?;
    let report = bb.migrate().await?;
    if !report.applied.is_empty() {
        tracing::info!(applied = ?report.applied, "migrated the blackboard");
    }
    Ok(bb)
}

/// Runs the planner's actors (Scanner, Assigner, Reaper, each supervised) until
/// `shutdown` resolves.
pub async fn run_planner(
    bb: Blackboard,
    args: &PlannerArgs,
    stats: ActorStats,
    shutdown: impl Future<Output = ()>,
) -> Result {
    let name = format!("planner:{}:{}", hostname(), std::process::id());
    let shards = match args.shard {
        Some((i, n)) => (n, vec![i]),
        None => (1, Vec::new()),
    };
    let assigner_cfg = AssignerConfig {
        actor: name.clone(),
        batch: args.batch,
        lease_secs: ms(args.assign_lease_ms).as_secs_f64(),
        worker_timeout_secs: ms(args.worker_timeout_ms).as_secs_f64(),
        shards,
    };
    tracing::info!(planner = %name, config = ?args, "planner starting");
    let (b, s) = (bb.clone(), stats.clone());
    let assigner = Supervisor::start(move |_| Assigner::new(b, assigner_cfg, s));
    let (b, s, a) = (bb.clone(), stats.clone(), assigner.clone());
    let poll = ms(args.planner_poll_ms);
    let scanner = Supervisor::start(move |_| Scanner::new(b, a, poll, s));
    let params = ReapParams {
        now: None,
        worker_timeout_secs: ms(args.worker_timeout_ms).as_secs_f64(),
        prune_after_secs: 3600.0,
        batch: 1000,
        retry_base_ms: args.reap_retry_base_ms as f64,
        retry_cap_ms: 300_000.0,
    };
    let (b, s, n, every) = (bb.clone(), stats.clone(), name.clone(), ms(args.reap_ms));
    let reaper = Supervisor::start(move |_| Reaper::new(b, every, n, params, s));
    shutdown.await;
    tracing::info!(planner = %name, "planner stopping");
    drop((scanner, assigner, reaper));
    Ok(())
}

/// Runs a worker with `registry`'s handlers until `shutdown` resolves; then drains (see
/// [`Drain`]) and returns what the drain did. It serves HTTP on `listener`; with `None`
/// it must have been spawned by a hot upgrade (`ARTEX_HANDOVER_SOCKET`), and receives the
/// listening socket and its predecessor's tasks through the handover.
pub async fn run_worker(
    bb: Blackboard,
    args: &WorkerArgs,
    mut registry: Registry,
    listener: Option<std::net::TcpListener>,
    stats: ActorStats,
    shutdown: impl Future<Output = ()>,
) -> Result<DrainReport> {
    if !args.kinds.is_empty() {
        let known = registry.kinds();
        for k in &args.kinds {
            if !known.contains(k) {
                return Err(Error::Invalid(format!(
                    "--kinds: '{k}' has no handler in this binary; it has: {}",
                    known.join(", ")
                )));
            }
        }
        registry.retain(|k| args.kinds.iter().any(|x| x == k));
    }
    if args.concurrency == 0 {
        return Err(Error::Invalid("--concurrency: must be at least 1".into()));
    }
    let upgrade = upgrade_settings(args)?;
    let mut handover = hot_upgrade::successor::connect_if_spawned().await?;
    let http_addr = match (&mut handover, &listener) {
        (Some(ch), _) => hot_upgrade::successor::welcome(ch).await?.0,
        (None, Some(l)) => l
            .local_addr()
            .map_err(|e| Error::io("reading the HTTP listener's address", e))?
            .to_string(),
        (None, None) => {
            return Err(Error::Invalid(
                "no HTTP listener and no handover socket to receive one from".into(),
            ))
        }
    };
    let host = hostname();
    let config = WorkerConfig {
        id: format!("{host}:{}:{:012x}", std::process::id(), id_suffix()),
        host,
        version: VERSION.to_string(),
        http_addr: Some(http_addr.clone()),
        concurrency: args.concurrency,
        prefetch: args.prefetch,
        lease: ms(args.lease_ms),
        heartbeat: ms(args.heartbeat_ms),
        poll: ms(args.worker_poll_ms),
        default_timeout: ms(args.task_timeout_ms),
        retry_base: ms(args.retry_base_ms),
        retry_cap: ms(args.retry_cap_ms),
    };
    Worker::register(&bb, &config, &registry).await?;
    let listener = match (listener, &mut handover) {
        (Some(l), _) => l,
        (None, Some(ch)) => hot_upgrade::successor::ready(ch, &config.id).await?,
        (None, None) => unreachable!("checked above"),
    };
    tracing::info!(worker = %config.id, http = %http_addr, kinds = ?registry.kinds(),
        concurrency = config.concurrency, prefetch = config.prefetch,
        lease_ms = args.lease_ms, drain_ms = args.drain_ms, successor = handover.is_some(),
        upgrades = upgrade.public_key.is_some() && upgrade.token.is_some(),
        "worker registered; listening");
    let (b, c, r, s) = (bb.clone(), config.clone(), registry, stats.clone());
    let worker = Supervisor::start(move |_| Worker::new(b, c, r, s));
    let handed_over = Arc::new(AtomicBool::new(false));
    let binary_sha256 = BinaryDigest::start();
    let upgrader = Arc::new(hot_upgrade::Upgrader {
        worker: worker.clone(),
        bb: bb.clone(),
        public_key: upgrade.public_key,
        token: upgrade.token,
        listener: listener
            .try_clone()
            .map_err(|e| Error::io("duplicating the HTTP listener for upgrades", e))?,
        dir: upgrade.dir,
        ready_deadline: ms(args.upgrade_ready_ms),
        suspend_deadline: ms(args.handover_suspend_ms),
        lease_secs: ms(args.lease_ms).as_secs_f64(),
        limits: artex_upgrade::Limits::default(),
        binary_sha256: binary_sha256.clone(),
        in_progress: AtomicBool::new(false),
        handed_over: handed_over.clone(),
    });
    let state = http::AppState {
        worker: worker.clone(),
        stats,
        version: VERSION.to_string(),
        binary_sha256,
        handed_over: handed_over.clone(),
    };
    let events = http::events::EventsState::new(bb.clone());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(state.clone()))
            .app_data(web::Data::new(events.clone()))
            .app_data(web::Data::new(upgrader.clone()))
            .configure(http::routes)
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(10)
    .listen(listener)
    .map_err(|e| Error::io(format!("serving HTTP on {http_addr}"), e))?
    .run();
    let handle = server.handle();
    let serving = actix::spawn(server);
    if let Some(mut ch) = handover {
        let report = hot_upgrade::successor::take_over(&mut ch, &worker).await?;
        tracing::info!(
            resumed = report.resumed.len(),
            conflicts = report.conflicts.len(),
            "took over from the previous generation"
        );
        // Under systemd (Type=notify, NotifyAccess=all) this process is the service now.
        notify(artex_upgrade::notify::mainpid(std::process::id()));
    }
    notify(artex_upgrade::notify::ready());
    notify(artex_upgrade::notify::status(&format!(
        "serving on {http_addr}"
    )));
    shutdown.await;
    let report = if handed_over.load(Ordering::Acquire) {
        // The successor serves the socket: stop accepting here first (in-flight requests
        // finish, idle keep-alive connections close), then finish the remaining tasks.
        notify(artex_upgrade::notify::status(
            "handed over; finishing the last tasks",
        ));
        // Stop accepting first: the successor takes every new connection from the shared
        // queue. Connections this process accepted a moment ago may not have sent their
        // request yet, and a graceful stop would close them as idle; give them a grace
        // period to arrive, then stop (in-flight requests finish).
        handle.pause().await;
        tokio::time::sleep(HANDOVER_ACCEPT_GRACE).await;
        handle.stop(true).await;
        let report = drain(&worker, &config, args).await?;
        let _ = serving.await;
        report
    } else {
        notify(artex_upgrade::notify::stopping());
        let report = drain(&worker, &config, args).await?;
        handle.stop(true).await;
        let _ = serving.await;
        report
    };
    remove_own_generation();
    Ok(report)
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

fn notify(r: std::result::Result<bool, artex_upgrade::Error>) {
    if let Err(e) = r {
        tracing::warn!(error = %e, "cannot notify the service manager");
    }
}

struct UpgradeSettings {
    public_key: Option<artex_upgrade::VerifyingKey>,
    token: Option<String>,
    dir: std::path::PathBuf,
}

fn upgrade_settings(args: &WorkerArgs) -> Result<UpgradeSettings> {
    let public_key = args
        .upgrade_public_key
        .as_deref()
        .map(artex_upgrade::bundle::load_public_key)
        .transpose()?;
    let token = match (&args.upgrade_token_file, &args.upgrade_token) {
        (Some(f), _) => {
            let t = std::fs::read_to_string(f).map_err(|e| {
                Error::io(format!("reading --upgrade-token-file {}", f.display()), e)
            })?;
            Some(t.trim().to_string())
        }
        (None, Some(t)) => Some(t.trim().to_string()),
        (None, None) => None,
    };
    if token.as_deref() == Some("") {
        return Err(Error::Invalid("the upgrade token is empty".into()));
    }
    let dir = args.upgrade_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("artex-upgrade-{}", nix::unistd::geteuid()))
    });
    Ok(UpgradeSettings {
        public_key,
        token,
        dir,
    })
}

/// A generation unpacked by an upgrade runs from its own folder; once it exits, the
/// folder has no further use (Linux keeps the running binary alive until then).
fn remove_own_generation() {
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with("gen-") && dir.join(".artex-generation").exists() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// Binds the worker's HTTP listener, unless this process was spawned by a hot upgrade
/// (it then receives its predecessor's listening socket through the handover).
pub fn bind_http_unless_spawned(addr: &str) -> Result<Option<std::net::TcpListener>> {
    if std::env::var_os(artex_upgrade::HANDOVER_ENV).is_some() {
        return Ok(None);
    }
    bind_http(addr).map(Some)
}

/// Binds the worker's HTTP listener.
pub fn bind_http(addr: &str) -> Result<std::net::TcpListener> {
    std::net::TcpListener::bind(addr).map_err(|e| Error::io(format!("binding HTTP on {addr}"), e))
}

/// This host's name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

fn id_suffix() -> u64 {
    // 48 random bits: unique among the processes a fleet runs at once.
    uuid::Uuid::new_v4().as_u64_pair().0 & 0xffff_ffff_ffff
}

/// sha256 of the running binary, computed once on a background thread: hashing a large
/// binary must not delay serving (nor a successor's readiness).
#[derive(Clone, Default)]
pub struct BinaryDigest(Arc<std::sync::OnceLock<String>>);

impl BinaryDigest {
    /// Starts hashing now.
    pub fn start() -> Self {
        let d = BinaryDigest::default();
        let bg = d.clone();
        std::thread::spawn(move || {
            bg.0.get_or_init(binary_sha256);
        });
        d
    }

    /// The digest, waiting for it if it is still being computed.
    pub async fn get(&self) -> String {
        if let Some(v) = self.0.get() {
            return v.clone();
        }
        let d = self.clone();
        tokio::task::spawn_blocking(move || d.0.get_or_init(binary_sha256).clone())
            .await
            .unwrap_or_default()
    }
}

/// sha256 of the running binary, as `/status` reports it (empty if unreadable).
pub fn binary_sha256() -> String {
    // Streamed: reading the whole binary at once would set the worker's peak memory.
    let mut hasher = sha2::Sha256::new();
    match std::fs::File::open("/proc/self/exe").and_then(|mut f| std::io::copy(&mut f, &mut hasher))
    {
        Ok(_) => hex::encode(hasher.finalize()),
        Err(_) => String::new(),
    }
}

/// Resolves when a stop signal (SIGTERM, SIGINT, SIGUSR2) arrives.
pub async fn stop_signal() -> Result<artex_upgrade::StopSignal> {
    let mut signals = artex_upgrade::StopSignals::install()?;
    Ok(signals.next().await)
}
