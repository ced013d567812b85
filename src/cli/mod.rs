//! The `artex` command line: parsing (clap; usage errors exit 2 and name what was wrong)
//! and dispatch, one file per command group. Output for people by default; `--json` for
//! programs on every command that prints data (one JSON document, or JSON lines for what
//! follows a feed), with the HTTP API's field names where both exist. Progress and
//! messages go to standard error, results to standard output. Exit codes
//! ([`crate::error::Error::exit_code`]): 0 success, 1 failure (database, network, files,
//! a failed upgrade channel), 2 bad input (the message names the option or value), 3 not running
//! (`db status`), 4 the task or flow waited for failed or timed out, 5 it was canceled,
//! 141 standard output was closed before the result was all written (`| head`: quietly).
//!
//! # Layout
//! - `tasks`: `submit`, `task show`, `tasks`, `pause|resume|cancel`.
//! - `flows`: `flow submit|show|list`, `flow show --follow`.
//! - `follow`: the change feed followed until a task or flow ends (`submit --wait`, and
//!   what `flow show --follow` is made of).
//! - `events`: `events tail|retention|prune|forget|drop-slot`.
//! - `db`: `migrate`, `schema`, `db start|stop|status|url`.
//! - `inputs`: `limits`, `kinds`, and the payload reading and checks `submit` and
//!   `flow submit` share.
//! - `kind`: `kind retry` (a kind's retry policy).
//! - `bundle`: `bundle keygen|create|info`.
//! - `docs`: `docs cli|configuration|man`, the reference pages made from these definitions.
//! - `run`: `up`, `planner`, `worker`, `serve`.
//! - `master`: `master`.
//! - `upload`: `upload`, a file sent to a worker in chunks (its own HTTP/1.1 client).
//! - `cluster`: `workers`, `stats`.
//! - `schedules`: `schedule add|list|show|pause|resume|remove`.
//! - `progress`: progress on standard error, shared by the commands that take time.
//! - `stdout`: results on standard output, a closed pipe an error (not a panic), and the
//!   watch for a reader going away.

mod bundle;
mod cluster;
mod db;
pub mod docs;
mod events;
mod flows;
mod follow;
mod inputs;
mod kind;
mod master;
mod progress;
mod run;
mod schedules;
mod stdout;
mod tasks;
mod token;
mod upload;

use std::io::Write;
use std::process::ExitCode;

use artex_actors::blackboard::{Control, ReadBoard};
use artex_actors::worker::Registry;
use artex_actors::Blackboard;
use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};
use uuid::Uuid;

use crate::config::{DbConfig, PlannerArgs, ServeArgs, WorkerArgs};
use crate::dev_db::ClusterOptions;
use crate::error::{Error, Result};
use crate::runtime::{connect, connect_unchecked};
use stdout::{print_json, print_json_line};

/// artex: an actor-model task runtime with PostgreSQL as the blackboard.
#[derive(Debug, Parser)]
// No `args_override_self`: an option given twice (`--payload a --payload b`) is an
// error, not a silent choice of the last one.
#[command(name = "artex", version, about, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    db: DbConfig,
    /// Log what one-shot commands do (they print only their result and errors by
    /// default; `ARTEX_LOG` sets the filter outright).
    // Shown after each command's own options, which a reader of `--help` came for.
    #[arg(short, long, global = true, display_order = 900)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run everything locally: embedded PostgreSQL (unless --database-url), migrations, a
    /// planner and a worker with its HTTP port (the dashboard, the API, /health …).
    // Its own default port (the worker's is any free one): the dashboard's URL stays put.
    #[command(mut_arg("http", |a| a
        .default_value(run::UP_HTTP)
        .help("HTTP address: the dashboard, the API, /health, /status, /metrics; port 0 \
               picks a free port")))]
    Up {
        #[command(flatten)]
        worker: WorkerArgs,
        #[command(flatten)]
        planner: PlannerArgs,
    },
    /// Run a planner (Scanner, Assigner, Reaper, Maintenance, Scheduler).
    Planner {
        #[command(flatten)]
        planner: PlannerArgs,
    },
    /// Run a worker.
    Worker {
        #[command(flatten)]
        worker: WorkerArgs,
    },
    /// Serve the HTTP API (`/api/v1/…`), `/health` and `/events`: stateless, any number
    /// per cluster; reads and writes only the blackboard.
    Serve {
        #[command(flatten)]
        serve: ServeArgs,
    },
    /// Run a stable parent for supervisord and runit: it holds the HTTP port and runs the
    /// worker (same flags) beneath it, hot upgrades included, under a PID that never
    /// changes; it respawns a worker that dies.
    Master {
        #[command(flatten)]
        worker: WorkerArgs,
    },
    /// Create or update the blackboard's schema (the only command besides `up` and
    /// `db start` that changes it; see migrations/README.md for rolling upgrades).
    Migrate {
        /// Print `{"applied": [...], "already": [...], "newer": [...]}`.
        #[arg(long)]
        json: bool,
    },
    /// Print the migrations this build needs and whether each expands or contracts the
    /// schema; connects to nothing.
    Schema {
        /// One JSON object, as an upgrade bundle's manifest records it.
        #[arg(long)]
        json: bool,
    },
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
    /// Flows: DAGs of named tasks (submit, show, signal, list).
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
    /// Cron schedules: a task at every slot of an expression, fired once per slot by the
    /// planners (add, list, show, pause, resume, remove).
    Schedule {
        #[command(subcommand)]
        command: schedules::ScheduleCommand,
    },
    /// The change feed: tail task changes (history table or logical decoding), retention.
    Events {
        #[command(subcommand)]
        command: events::EventsCommand,
    },
    /// Show or set what the blackboard accepts (the payload size limit).
    Limits(inputs::LimitsArgs),
    /// Every task kind a worker has declared (what `submit` accepts without
    /// --allow-unregistered-kind), with its retry policy.
    Kinds {
        /// One JSON object, `{"kinds": [...]}`.
        #[arg(long)]
        json: bool,
    },
    /// Settings of one task kind: its fleet-wide limits (`artex kind limit K
    /// --concurrency 5 --key-concurrency 2 --rate 100/s`) and its retry policy (`artex
    /// kind retry K --backoff exponential --base 1s --cap 10m`).
    Kind {
        #[command(subcommand)]
        command: kind::KindCommand,
    },
    /// Named bearer tokens of the HTTP API and the dashboard: `artex token create NAME
    /// --scope read|write|admin [--expires 30d]` prints the secret once; `token list`,
    /// `token revoke NAME`.
    Token {
        #[command(subcommand)]
        command: token::TokenCommand,
    },
    /// The workers the blackboard knows: state, pid, version, binary, tasks held.
    Workers(cluster::WorkersArgs),
    /// Tasks by status, and recent throughput and latency.
    Stats(cluster::StatsArgs),
    /// Send a file to a worker in chunks, resumably; prints the id of the task submitted
    /// with it once it is whole (the task runs on that worker's host).
    Upload(upload::SendArgs),
    /// Make signing keys and signed upgrade bundles, and verify a bundle.
    Bundle {
        #[command(subcommand)]
        command: bundle::BundleCommand,
    },
    /// The reference pages made from these definitions: docs/cli.md, docs/configuration.md
    /// and man pages (`artex docs man DIR`); connects to nothing.
    Docs {
        #[command(subcommand)]
        command: docs::DocsCommand,
    },
}

/// Parses the command line and runs it with `registry`'s handlers; the whole `main` of a
/// worker binary.
pub fn main_with(registry: Registry) -> ExitCode {
    artex_upgrade::malloc::tune();
    let cli = Cli::parse();
    // The local run shows every task flowing; servers log per-task lines only on demand.
    let default_log = match cli.command {
        Command::Up { .. } => "info,artex_actors::worker=debug",
        Command::Planner { .. } | Command::Worker { .. } | Command::Master { .. } => "info",
        // One-shot commands are quiet: their output is their result.
        _ if cli.verbose => "info",
        _ => "warn",
    };
    init_logging(default_log);
    let _flush = init_traces(&cli.command);
    let code = match actix::System::new().block_on(dispatch(cli, registry)) {
        Ok(()) => 0,
        // The reader of our output went away (`| head -1` has its line): no failure to
        // tell, and a pipe's exit code (141, as SIGPIPE would have it) says it.
        Err(e @ Error::OutputClosed) => e.exit_code(),
        Err(e) => {
            // Standard error may be gone too (`|& head`): then there is nobody to tell.
            let _ = writeln!(std::io::stderr(), "artex: error: {e}");
            e.exit_code()
        }
    };
    ExitCode::from(code as u8)
}

/// Turns OpenTelemetry traces on for the commands that make spans, when the environment
/// names a collector (docs/tracing.md). A configuration artex cannot use is said once
/// and the command runs untraced: traces never stop work.
fn init_traces(command: &Command) -> Option<artex_actors::trace::Flush> {
    let role = match command {
        Command::Up { .. } => "up",
        Command::Planner { .. } => "planner",
        Command::Worker { .. } => "worker",
        Command::Serve { .. } => "serve",
        Command::Submit(_) => "cli",
        _ => return None,
    };
    artex_actors::trace::init(role).unwrap_or_else(|e| {
        tracing::warn!("{e}; running without traces");
        None
    })
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
    check_database_url(db)?;
    match cli.command {
        Command::Up { worker, planner } => run::up(db, worker, planner, registry).await,
        Command::Planner { planner } => run::planner(db, planner).await,
        Command::Worker { worker } => run::worker(db, worker, registry).await,
        Command::Serve { serve } => run::serve(db, serve).await,
        Command::Master { worker } => master::master(&worker).await,
        Command::Migrate { json } => db::migrate(db, json).await,
        Command::Schema { json } => db::schema(json),
        Command::Submit(args) => tasks::submit(db, args).await,
        Command::Task { command } => tasks::task(db, command).await,
        Command::Tasks(args) => tasks::list(db, args).await,
        Command::Pause(args) => tasks::control(db, Control::Pause, args, &cli_actor()).await,
        Command::Resume(args) => tasks::control(db, Control::Resume, args, &cli_actor()).await,
        Command::Cancel(args) => tasks::control(db, Control::Cancel, args, &cli_actor()).await,
        Command::Db { command } => db::db(db, command).await,
        Command::Flow { command } => flows::flow(db, command, &cli_actor()).await,
        Command::Schedule { command } => schedules::schedule(db, command).await,
        Command::Events { command } => events::events(db, command).await,
        Command::Limits(args) => inputs::limits(db, args).await,
        Command::Kinds { json } => inputs::kinds(db, json).await,
        Command::Kind { command } => kind::kind(db, command).await,
        Command::Token { command } => token::token(db, command).await,
        Command::Workers(args) => cluster::workers(db, args).await,
        Command::Stats(args) => cluster::stats(db, args).await,
        Command::Bundle { command } => bundle::bundle(command),
        Command::Upload(args) => upload::upload(args).await,
        Command::Docs { command } => docs::docs(command),
    }
}

/// Refuses a `--database-url` or `--read-database-url` that is no PostgreSQL URL before
/// anything runs: bad input (exit 2) naming the option, not a connection failure later.
/// Accepts `postgres://`, `postgresql://` and libpq's `key=value` form.
fn check_database_url(db: &DbConfig) -> Result {
    for (option, url) in [
        ("--database-url", &db.database_url),
        ("--read-database-url", &db.read_database_url),
    ] {
        if let Some(url) = url {
            check_url(option, url)?;
        }
    }
    Ok(())
}

/// Refuses `url`, given as `option`, unless it is a PostgreSQL URL.
fn check_url(option: &str, url: &str) -> Result {
    if let Some((scheme, _)) = url.split_once("://") {
        if !matches!(scheme, "postgres" | "postgresql") {
            // Only a plain scheme is echoed: whatever else precedes "://" may be a secret.
            let plain = !scheme.is_empty()
                && scheme.len() <= 20
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
            let shown = if plain {
                format!("'{scheme}://'")
            } else {
                "its scheme".into()
            };
            return Err(Error::Invalid(format!(
                "{option}: {shown} is not PostgreSQL; expected \
                 postgresql://user:password@host:port/database"
            )));
        }
    }
    // Parsing builds the pools' settings and connects nothing.
    match Blackboard::connect(url, 1) {
        Err(artex_actors::Error::Url(e)) => Err(Error::Invalid(format!(
            "{option}: {e}; expected postgresql://user:password@host:port/database \
             (several hosts: host1:port1,host2:port2 with ?target_session_attrs=read-write) \
             or key=value pairs"
        ))),
        _ => Ok(()),
    }
}

/// Connects a one-shot command (submit, task, tasks, flow, pause|resume|cancel, schedule,
/// events, migrate, limits, kinds): to --database-url, or else to the embedded cluster in
/// --data-dir only when one was created there (started if it is stopped). Creating a
/// cluster is left to `artex up` and `artex db start`: a command run in the wrong folder
/// must not leave a new PostgreSQL server running behind it.
/// Like every process but the migrating ones, it checks the schema first (see
/// [`connect`]).
pub(crate) async fn connect_one_shot(db: &DbConfig) -> Result<Blackboard> {
    existing_database(db)?;
    connect(db).await
}

/// Connects a command that only reads (tasks, task show, flow list|show, schedule
/// list|show, stats, workers): to the replica of --read-database-url when one is given, without touching
/// the primary (its schema is checked there: it is the primary's, replicated); else as
/// [`connect_one_shot`].
/// A replica that cannot be reached is said so on standard error, and the primary
/// reads instead.
pub(crate) async fn connect_reads(db: &DbConfig) -> Result<ReadBoard> {
    if let Some(replica) = crate::runtime::connect_replica(db)? {
        match replica.check_schema().await {
            Ok(_) => return Ok(replica.reads()),
            Err(e) if e.is_connection() => {
                eprintln!("artex: the replica of --read-database-url is unreachable ({e}); reading the primary");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(connect_one_shot(db).await?.operator().reads())
}

/// As [`connect_one_shot`], without the schema check: for `artex migrate`.
pub(crate) async fn connect_to_migrate(db: &DbConfig) -> Result<Blackboard> {
    existing_database(db)?;
    connect_unchecked(db).await
}

fn existing_database(db: &DbConfig) -> Result {
    if db.database_url.is_none() && !ClusterOptions::new(&db.data_dir).cluster_exists() {
        return Err(Error::Cluster(format!(
            "no --database-url and no cluster in {}; start one with `artex up` or \
             `artex db start`, or give --database-url (or ARTEX_DATABASE_URL)",
            db.data_dir.display()
        )));
    }
    Ok(())
}

/// Who the history records for changes made from the command line.
fn cli_actor() -> String {
    format!("cli:{}@{}", cli_user(), crate::process::hostname())
}

/// `USER` when it is set (a login shell), else the name of the process's uid (cron,
/// systemd units, CI and `sudo -i`-less root shells set no `USER`), else the uid itself.
fn cli_user() -> String {
    user_name(
        std::env::var("USER").ok(),
        nix::unistd::Uid::current(),
        |uid| {
            nix::unistd::User::from_uid(uid)
                .ok()
                .flatten()
                .map(|u| u.name)
        },
    )
}

/// The rule of [`cli_user`], fed its facts.
fn user_name(
    env: Option<String>,
    uid: nix::unistd::Uid,
    lookup: impl FnOnce(nix::unistd::Uid) -> Option<String>,
) -> String {
    env.filter(|u| !u.is_empty())
        .or_else(|| lookup(uid))
        .unwrap_or_else(|| format!("uid{uid}"))
}

/// A time as the CLI shows it (RFC 3339, milliseconds, UTC), or `-`.
fn time_text(d: Option<DateTime<Utc>>) -> String {
    d.map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| "-".into())
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

#[cfg(test)]
mod tests {
    use super::user_name;
    use nix::unistd::Uid;

    #[test]
    fn the_audit_name_is_user_else_the_uid_s_name_else_the_uid() {
        let root = Uid::from_raw(0);
        let named = |_: Uid| Some("root".to_string());
        let nameless = |_: Uid| None;
        assert_eq!(user_name(Some("ana".into()), root, named), "ana");
        assert_eq!(user_name(None, root, named), "root");
        assert_eq!(user_name(Some(String::new()), root, named), "root");
        assert_eq!(user_name(None, Uid::from_raw(4242), nameless), "uid4242");
    }
}
