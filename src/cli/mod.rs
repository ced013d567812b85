//! The `artex` command line: parsing (clap; usage errors exit 2 and name what was wrong)
//! and dispatch, one file per command group. Output for people by default, `--json` for
//! programs. Exit codes: 0 success, 1 failure (database, network, files, a handover),
//! 2 bad input (the message names the option or value).
//!
//! # Layout
//! - `tasks`: `submit`, `task show`, `tasks`, `pause|resume|cancel`.
//! - `flows`: `flow submit|show`.
//! - `events`: `events tail|retention|prune|forget|drop-slot`.
//! - `db`: `migrate`, `db start|stop|status|url`.
//! - `bundle`: `bundle keygen|create`.
//! - `run`: `up`, `planner`, `worker`.
//! - `master`: `master`.

mod bundle;
mod db;
mod events;
mod flows;
mod master;
mod run;
mod tasks;

use std::process::ExitCode;

use artex_actors::blackboard::Control;
use artex_actors::worker::Registry;
use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};
use serde_json::Value;
use uuid::Uuid;

use crate::config::{DbConfig, PlannerArgs, WorkerArgs};
use crate::error::Result;

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
    Submit(tasks::SubmitArgs),
    /// One task.
    Task {
        #[command(subcommand)]
        command: tasks::TaskCommand,
    },
    /// List tasks, newest first.
    Tasks(tasks::ListArgs),
    /// Manage the embedded PostgreSQL cluster in --data-dir.
    Db {
        #[command(subcommand)]
        command: db::DbCommand,
    },
    /// Flows: DAGs of named tasks (submit, show).
    Flow {
        #[command(subcommand)]
        command: flows::FlowCommand,
    },
    /// Hold a task, or every pending/blocked task of a flow (running ones finish).
    Pause(tasks::ControlArgs),
    /// Release a paused task, or the paused tasks of a flow (blocked again while an
    /// upstream task is unfinished).
    Resume(tasks::ControlArgs),
    /// End a task, or every unfinished task of a flow; a running one is stopped.
    Cancel(tasks::ControlArgs),
    /// The change feed: tail task events (outbox or logical decoding), retention.
    Events {
        #[command(subcommand)]
        command: events::EventsCommand,
    },
    /// Make signing keys and signed upgrade bundles.
    Bundle {
        #[command(subcommand)]
        command: bundle::BundleCommand,
    },
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
    let db = &cli.db;
    match cli.command {
        Command::Up { worker, planner } => run::up(db, worker, planner, registry).await,
        Command::Planner { planner } => run::planner(db, planner).await,
        Command::Worker { worker } => run::worker(db, worker, registry).await,
        Command::Master { worker } => master::master(&worker).await,
        Command::Migrate => db::migrate(db).await,
        Command::Submit(args) => tasks::submit(db, args).await,
        Command::Task { command } => tasks::task(db, command).await,
        Command::Tasks(args) => tasks::list(db, args).await,
        Command::Pause(args) => tasks::control(db, Control::Pause, args, &cli_actor()).await,
        Command::Resume(args) => tasks::control(db, Control::Resume, args, &cli_actor()).await,
        Command::Cancel(args) => tasks::control(db, Control::Cancel, args, &cli_actor()).await,
        Command::Db { command } => db::db(db, command).await,
        Command::Flow { command } => flows::flow(db, command, &cli_actor()).await,
        Command::Events { command } => events::events(db, command).await,
        Command::Bundle { command } => bundle::bundle(command),
    }
}

/// Who the history records for changes made from the command line.
fn cli_actor() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    format!("cli:{user}@{}", crate::process::hostname())
}

fn parse_json(s: &str) -> std::result::Result<Value, String> {
    serde_json::from_str(s).map_err(|e| format!("not valid JSON: {e}"))
}

fn parse_time(s: &str) -> std::result::Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("not an RFC 3339 time ({e}); expected e.g. 2026-12-01T08:00:00Z"))
}

fn id_error(what: &str, e: uuid::Error) -> String {
    format!("not {what} ({e}); expected a UUID like 0192f3c4-5d6e-7f80-9a1b-2c3d4e5f6a7b")
}

/// A task id.
fn parse_task_id(s: &str) -> std::result::Result<Uuid, String> {
    Uuid::parse_str(s).map_err(|e| id_error("a task id", e))
}

/// A task or flow id.
fn parse_id(s: &str) -> std::result::Result<Uuid, String> {
    Uuid::parse_str(s).map_err(|e| id_error("an id", e))
}
