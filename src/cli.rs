//! The `artex` command line: parsing (clap; usage errors exit 2 and name what was wrong)
//! and dispatch to the library. Output for people by default, `--json` for programs.

use std::process::ExitCode;

use artex_actors::blackboard::{NewTask, TaskRow, TaskStatus, TransitionRow};
use artex_actors::supervisor::ActorStats;
use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};
use serde_json::Value;
use uuid::Uuid;

use crate::config::{DbConfig, PlannerArgs, WorkerArgs};
use crate::dev_db::{Cluster, ClusterOptions, ClusterState};
use crate::error::{Error, Result};
use crate::Registry;

/// artex: an actor-model task runtime with PostgreSQL as the blackboard.
#[derive(Debug, Parser)]
#[command(
    name = "artex",
    version,
    about,
    propagate_version = true,
    args_override_self = true
)]
pub struct Cli {
    #[command(flatten)]
    db: DbConfig,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run everything locally: embedded PostgreSQL (unless --database-url), migrations, a
    /// planner and a worker with its HTTP port.
    Up {
        #[command(flatten)]
        worker: WorkerArgs,
        #[command(flatten)]
        planner: PlannerArgs,
    },
    /// Run a planner (Scanner, Assigner, Reaper).
    Planner {
        #[command(flatten)]
        planner: PlannerArgs,
    },
    /// Run a worker.
    Worker {
        #[command(flatten)]
        worker: WorkerArgs,
    },
    /// Run a stable parent for supervisord and runit: it holds the HTTP port and runs the
    /// worker (same flags) beneath it, hot upgrades included, under a PID that never
    /// changes; it respawns a worker that dies.
    Master {
        #[command(flatten)]
        worker: WorkerArgs,
    },
    /// Create or update the blackboard's schema.
    Migrate,
    /// Submit a task; prints its id.
    Submit {
        /// The handler kind, e.g. echo.
        kind: String,
        /// The handler's input, as JSON.
        #[arg(long, default_value = "{}", value_parser = parse_json)]
        payload: Value,
        /// Higher runs first.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        /// Not before this time (RFC 3339, e.g. 2026-12-01T08:00:00Z).
        #[arg(long, value_parser = parse_time)]
        run_at: Option<DateTime<Utc>>,
        /// Retries after the first attempt (default 3).
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(0..=1000))]
        max_retries: Option<i32>,
        /// Per-attempt handler timeout in milliseconds.
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..))]
        timeout_ms: Option<i32>,
        /// Business shard key: tasks with one key go to one planner shard.
        #[arg(long)]
        shard_key: Option<String>,
    },
    /// One task.
    Task {
        #[command(subcommand)]
        command: TaskCommand,
    },
    /// List tasks, newest first.
    Tasks {
        /// Only tasks in this status.
        #[arg(long, value_parser = parse_status)]
        status: Option<TaskStatus>,
        /// At most this many.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=100_000))]
        limit: i64,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Manage the embedded PostgreSQL cluster in --data-dir.
    Db {
        #[command(subcommand)]
        command: DbCommand,
    },
    /// Flows: DAGs of named tasks (submit, show).
    Flow {
        #[command(subcommand)]
        command: crate::cli_flows::FlowCommand,
    },
    /// Hold a task, or every pending/blocked task of a flow (running ones finish).
    Pause(crate::cli_flows::ControlArgs),
    /// Release a paused task, or the paused tasks of a flow (blocked again while an
    /// upstream task is unfinished).
    Resume(crate::cli_flows::ControlArgs),
    /// End a task, or every unfinished task of a flow; a running one is stopped.
    Cancel(crate::cli_flows::ControlArgs),
    /// The change feed: tail task events (outbox or logical decoding), retention.
    Events {
        #[command(subcommand)]
        command: crate::cli_flows::EventsCommand,
    },
    /// Make signing keys and signed upgrade bundles.
    Bundle {
        #[command(subcommand)]
        command: BundleCommand,
    },
}

#[derive(Debug, Subcommand)]
enum BundleCommand {
    /// Make an ed25519 key pair (hex files; the secret one mode 0600).
    Keygen {
        /// Where to write the secret key (refuses to overwrite).
        #[arg(long)]
        secret: std::path::PathBuf,
        /// Where to write the public key (give it to workers: --upgrade-public-key).
        #[arg(long)]
        public: std::path::PathBuf,
    },
    /// Package a binary with a signed manifest for `curl -T bundle.zip …/upgrade`.
    Create {
        /// The new artex binary (or a binary built on the artex crate).
        #[arg(long)]
        binary: std::path::PathBuf,
        /// The secret key from `artex bundle keygen`.
        #[arg(long)]
        key: std::path::PathBuf,
        /// Where to write the bundle.
        #[arg(long)]
        out: std::path::PathBuf,
        /// The version recorded in the manifest (default: this build's).
        #[arg(long)]
        manifest_version: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum TaskCommand {
    /// Status, attempts, worker, timestamps and the full transition history.
    Show {
        /// The task id (a UUID).
        #[arg(value_parser = parse_uuid)]
        id: Uuid,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum DbCommand {
    /// Create (first time) and start the cluster; prints its URL.
    Start {
        /// Also listen on this loopback TCP port.
        #[arg(long)]
        tcp_port: Option<u16>,
        /// Start with wal_level=logical (for the logical decoding feed).
        #[arg(long)]
        logical: bool,
    },
    /// Stop the cluster.
    Stop,
    /// Whether the cluster exists and runs.
    Status,
    /// Print a connection URL (for psql and ARTEX_DATABASE_URL).
    Url,
}

fn parse_json(s: &str) -> std::result::Result<Value, String> {
    serde_json::from_str(s).map_err(|e| format!("not valid JSON: {e}"))
}

fn parse_time(s: &str) -> std::result::Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("not an RFC 3339 time ({e}); expected e.g. 2026-12-01T08:00:00Z"))
}

fn parse_uuid(s: &str) -> std::result::Result<Uuid, String> {
    Uuid::parse_str(s).map_err(|e| {
        format!("not a task id ({e}); expected a UUID like 0192f3c4-5d6e-7f80-9a1b-2c3d4e5f6a7b")
    })
}

fn parse_status(s: &str) -> std::result::Result<TaskStatus, String> {
    s.parse().map_err(|e: artex_actors::Error| e.to_string())
}

/// Parses the command line and runs it with `registry`'s handlers; the whole `main` of a
/// worker binary.
pub fn main_with(registry: Registry) -> ExitCode {
    let cli = Cli::parse();
    // The local run shows every task flowing; servers log per-task lines only on demand.
    let default_log = match cli.command {
        Command::Up { .. } => "info,artex_actors::worker=debug",
        _ => "info",
    };
    init_logging(default_log);
    let code = match actix::System::new().block_on(dispatch(cli, registry)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("artex: error: {e}");
            e.exit_code()
        }
    };
    ExitCode::from(code as u8)
}

fn init_logging(default: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("ARTEX_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

async fn dispatch(cli: Cli, registry: Registry) -> Result {
    let db = cli.db;
    match cli.command {
        Command::Migrate => {
            let bb = crate::connect(&db).await?;
            let report = bb.migrate().await?;
            println!(
                "schema up to date (applied now: {:?}, already: {:?})",
                report.applied, report.already
            );
            Ok(())
        }
        Command::Submit {
            kind,
            payload,
            priority,
            run_at,
            max_retries,
            timeout_ms,
            shard_key,
        } => {
            let task = NewTask {
                kind,
                payload,
                priority,
                run_at,
                max_retries,
                timeout_ms,
                shard_key,
            };
            // Refuse bad input before touching (or starting) any database.
            task.validate()?;
            let bb = crate::connect(&db).await?;
            let id = bb.submit(&task, &cli_actor()).await?;
            println!("{id}");
            Ok(())
        }
        Command::Task {
            command: TaskCommand::Show { id, json },
        } => {
            let bb = crate::connect(&db).await?;
            let task = bb.task(id).await?;
            let history = bb.transitions(id).await?;
            if json {
                let out = serde_json::json!({ "task": task, "transitions": history });
                println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
            } else {
                print_task(&task, &history);
            }
            Ok(())
        }
        Command::Tasks {
            status,
            limit,
            json,
        } => {
            let bb = crate::connect(&db).await?;
            let tasks = bb.tasks(status, limit).await?;
            for t in &tasks {
                if json {
                    println!("{}", serde_json::to_string(t).unwrap_or_default());
                } else {
                    println!(
                        "{}  {:<9}  {:<12}  attempts {:<3}  {}",
                        t.id,
                        t.status,
                        t.kind,
                        attempts(t),
                        t.updated_at
                            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                    );
                }
            }
            if !json && tasks.is_empty() {
                eprintln!("no tasks");
            }
            Ok(())
        }
        Command::Db { command } => db_command(&db, command).await,
        Command::Flow { command } => crate::cli_flows::flow(&db, command, &cli_actor()).await,
        Command::Pause(args) => {
            use artex_actors::blackboard::Control;
            crate::cli_flows::control(&db, Control::Pause, args, &cli_actor()).await
        }
        Command::Resume(args) => {
            use artex_actors::blackboard::Control;
            crate::cli_flows::control(&db, Control::Resume, args, &cli_actor()).await
        }
        Command::Cancel(args) => {
            use artex_actors::blackboard::Control;
            crate::cli_flows::control(&db, Control::Cancel, args, &cli_actor()).await
        }
        Command::Events { command } => crate::cli_flows::events(&db, command).await,
        Command::Bundle {
            command: BundleCommand::Keygen { secret, public },
        } => {
            artex_upgrade::bundle::keygen(&secret, &public)?;
            println!(
                "secret key: {}\npublic key: {}",
                secret.display(),
                public.display()
            );
            Ok(())
        }
        Command::Bundle {
            command:
                BundleCommand::Create {
                    binary,
                    key,
                    out,
                    manifest_version,
                },
        } => {
            let key = artex_upgrade::bundle::load_secret_key(&key)?;
            let version = manifest_version.unwrap_or_else(|| crate::VERSION.to_string());
            let manifest = artex_upgrade::bundle::create(&binary, &key, &version, &out)?;
            println!(
                "{} (version {}, sha256 {})",
                out.display(),
                manifest.version,
                manifest.binary_sha256
            );
            Ok(())
        }
        Command::Planner { planner } => {
            let bb = crate::connect(&db).await?;
            let stop = stop_future()?;
            crate::run_planner(bb, &planner, ActorStats::default(), stop).await
        }
        Command::Worker { worker } => {
            let bb = crate::connect(&db).await?;
            let listener = crate::bind_http_unless_spawned(&worker.http)?;
            let stop = stop_future()?;
            crate::run_worker(bb, &worker, registry, listener, ActorStats::default(), stop)
                .await
                .map(|_| ())
        }
        Command::Master { worker } => {
            let listener = crate::bind_http(&worker.http)?;
            crate::master::run(&worker, listener).await
        }
        Command::Up { worker, planner } => {
            let bb = crate::connect(&db).await?;
            let listener = crate::bind_http_unless_spawned(&worker.http)?;
            let http = match &listener {
                Some(l) => l
                    .local_addr()
                    .map_err(|e| Error::io("reading the HTTP address", e))?
                    .to_string(),
                None => "the inherited socket".to_string(),
            };
            let (tx, rx) = tokio::sync::watch::channel(false);
            let mut signals = artex_upgrade::StopSignals::install()?;
            actix::spawn(async move {
                let sig = signals.next().await;
                tracing::info!(signal = ?sig, "stopping");
                let _ = tx.send(true);
            });
            let stats = ActorStats::default();
            let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
                let _ = rx.wait_for(|stop| *stop).await;
            };
            let planner_stop = wait(rx.clone());
            let (b, s) = (bb.clone(), stats.clone());
            let planner_task =
                actix::spawn(async move { crate::run_planner(b, &planner, s, planner_stop).await });
            eprintln!(
                "artex is up: worker HTTP on http://{http} (/health, /status, /metrics).\n\
                 Submit a task from another shell:  artex submit echo --payload '{{\"hello\":\"world\"}}'\n\
                 Stop with Ctrl-C."
            );
            crate::run_worker(bb, &worker, registry, listener, stats, wait(rx)).await?;
            let _ = planner_task.await;
            Ok(())
        }
    }
}

fn stop_future() -> Result<impl std::future::Future<Output = ()>> {
    let mut signals = artex_upgrade::StopSignals::install()?;
    Ok(async move {
        let sig = signals.next().await;
        tracing::info!(signal = ?sig, "stopping");
    })
}

async fn db_command(db: &DbConfig, command: DbCommand) -> Result {
    let opts = |tcp_port, logical| ClusterOptions {
        tcp_port,
        logical,
        ..ClusterOptions::new(&db.data_dir)
    };
    match command {
        DbCommand::Start { tcp_port, logical } => {
            let (cluster, started) = crate::start_embedded(opts(tcp_port, logical)).await?;
            let bb = artex_actors::Blackboard::connect(&cluster.url(crate::dev_db::DATABASE), 1)?;
            bb.migrate().await?;
            eprintln!(
                "{} PostgreSQL in {}",
                if started {
                    "started"
                } else {
                    "already running:"
                },
                cluster.data_dir().display()
            );
            println!("{}", cluster.url(crate::dev_db::DATABASE));
            Ok(())
        }
        DbCommand::Stop => {
            let cluster = Cluster::new(opts(None, false))?;
            if cluster.stop()? {
                println!("stopped");
            } else {
                println!("not running");
            }
            Ok(())
        }
        DbCommand::Status => {
            let cluster = Cluster::new(opts(None, false))?;
            match cluster.status()? {
                ClusterState::Absent => println!("absent: no cluster in {}", db.data_dir.display()),
                ClusterState::Stopped => println!("stopped: {}", cluster.data_dir().display()),
                ClusterState::Running(pid) => println!(
                    "running: pid {pid}, {}",
                    cluster.url(crate::dev_db::DATABASE)
                ),
            }
            Ok(())
        }
        DbCommand::Url => {
            let cluster = Cluster::new(opts(None, false))?;
            if cluster.status()? == ClusterState::Absent {
                return Err(Error::Cluster(format!(
                    "no cluster in {}; create it with: artex db start",
                    db.data_dir.display()
                )));
            }
            println!("{}", cluster.url(crate::dev_db::DATABASE));
            Ok(())
        }
    }
}

fn cli_actor() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    format!("cli:{user}@{}", crate::hostname())
}

fn attempts(t: &TaskRow) -> i32 {
    // Attempts that ran: counted failures, plus the one running or the one that ended it.
    let current = matches!(t.status, TaskStatus::Running | TaskStatus::Succeeded)
        || (t.status == TaskStatus::Canceled && t.started_at.is_some());
    t.retries.min(t.max_retries + 1) + i32::from(current)
}

fn print_task(t: &TaskRow, history: &[TransitionRow]) {
    let time = |d: Option<DateTime<Utc>>| {
        d.map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .unwrap_or_else(|| "-".into())
    };
    println!("id:          {}", t.id);
    println!("kind:        {}", t.kind);
    println!("status:      {}", t.status);
    println!(
        "attempts:    {} (failed {}, retries allowed {})",
        attempts(t),
        t.retries,
        t.max_retries
    );
    println!("worker:      {}", t.assigned_to.as_deref().unwrap_or("-"));
    println!(
        "lease:       epoch {}, until {}",
        t.lease_epoch,
        time(t.lease_until)
    );
    println!("priority:    {}", t.priority);
    println!("run_at:      {}", time(Some(t.run_at)));
    println!("created:     {}", time(Some(t.created_at)));
    println!("updated:     {}", time(Some(t.updated_at)));
    println!("started:     {}", time(t.started_at));
    println!("finished:    {}", time(t.finished_at));
    println!("payload:     {}", t.payload);
    if let Some(r) = &t.result {
        println!("result:      {r}");
    }
    if let Some(e) = &t.error {
        println!("error:       {e}");
    }
    if let Some(c) = &t.checkpoint {
        println!("checkpoint:  {c}");
    }
    if let Some(f) = t.flow_id {
        println!(
            "flow:        {f} ({})",
            t.flow_task.as_deref().unwrap_or("-")
        );
    }
    println!("history:");
    for h in history {
        println!(
            "  {}  {:>9} -> {:<9}  by {}{}{}",
            time(Some(h.at)),
            h.from_status.map(|s| s.as_str()).unwrap_or("(new)"),
            h.to_status,
            h.actor,
            h.worker
                .as_deref()
                .map(|w| format!(" on {w}"))
                .unwrap_or_default(),
            h.reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        );
    }
}
