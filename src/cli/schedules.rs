//! `artex schedule add|list|show|pause|resume|remove`: cron schedules, each submitting a
//! task at every slot of its expression in its time zone, fired by the planners once
//! per slot (see `artex_actors::schedule` and migrations/V20__schedules.sql). `list` and
//! `show` read from the replica of `--read-database-url` when one is given.

use artex_actors::blackboard::{NewTask, ScheduleRow};
use artex_actors::schedule::{check_name, CatchUp, NewSchedule};
use artex_actors::submission::{Refusal, Submission};
use clap::{Args, Subcommand};

use super::inputs::{check_submission, read_payload, refusal_text};
use super::stdout::outln;
use super::{cli_actor, connect_one_shot, connect_reads, print_json, time_text};
use crate::config::DbConfig;
use crate::error::{Error, Result};

/// `artex schedule …`
#[derive(Debug, Subcommand)]
pub(crate) enum ScheduleCommand {
    /// Add a schedule: a task of --kind at every slot of --cron in --timezone.
    Add(AddArgs),
    /// Every schedule: its expression, zone, kind, whether it is paused, its last and
    /// next slot.
    List {
        /// One JSON object, `{"schedules": [...]}`, as `GET /api/v1/schedules`.
        #[arg(long)]
        json: bool,
    },
    /// One schedule.
    Show {
        /// The schedule's name.
        #[arg(value_parser = parse_name)]
        name: String,
        /// As JSON, as `GET /api/v1/schedules/{name}`.
        #[arg(long)]
        json: bool,
    },
    /// Stop firing a schedule until it is resumed.
    Pause(ControlArgs),
    /// Fire a paused schedule again, from its first slot after now (the slots of the
    /// pause are skipped).
    Resume(ControlArgs),
    /// Remove a schedule (the tasks it submitted stay).
    Remove(ControlArgs),
}

/// The arguments of `artex schedule add`.
#[derive(Debug, Args)]
pub(crate) struct AddArgs {
    /// Its name, unique: letters, digits and . _ : - (starting with a letter or digit),
    /// at most 100 bytes.
    #[arg(value_parser = parse_name)]
    name: String,
    /// When: five fields, minute hour day-of-month month day-of-week (e.g. '*/5 * * * *',
    /// '0 9 * * MON-FRI'), or @hourly, @daily, @weekly, @monthly, @yearly.
    #[arg(long)]
    cron: String,
    /// The IANA time zone the expression is read in (e.g. Europe/Berlin).
    #[arg(long, default_value = "UTC")]
    timezone: String,
    /// The kind of the task each slot submits.
    #[arg(long)]
    kind: String,
    /// Its payload, as JSON (default {}); @FILE reads it from a file, - from standard
    /// input.
    #[arg(long)]
    payload: Option<String>,
    /// Slots missed while no planner ran: none (skip them; only a slot due now fires),
    /// last (fire the latest of them), all (fire each, oldest first).
    #[arg(long, default_value = "last", value_parser = parse_catch_up)]
    catch_up: CatchUp,
    /// Its priority: higher runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// Its retries after the first attempt, 0 to 1000 (default 3).
    #[arg(long, allow_negative_numbers = true)]
    max_retries: Option<i32>,
    /// Its per-attempt handler timeout in milliseconds (positive).
    #[arg(long, allow_negative_numbers = true)]
    timeout_ms: Option<i32>,
    /// Its business shard key.
    #[arg(long)]
    shard_key: Option<String>,
    /// Add it even if no worker has ever declared --kind (its tasks wait for one).
    #[arg(long)]
    allow_unregistered_kind: bool,
    /// Print the schedule as JSON (as `POST /api/v1/schedules`).
    #[arg(long)]
    json: bool,
}

/// The arguments of `artex schedule pause|resume|remove`.
#[derive(Debug, Args)]
pub(crate) struct ControlArgs {
    /// The schedule's name.
    #[arg(value_parser = parse_name)]
    name: String,
    /// Why; recorded with who did it (`artex.schedule_changes`).
    #[arg(long)]
    reason: Option<String>,
    /// Print the schedule as it is now as JSON (`{"removed": NAME}` for remove).
    #[arg(long)]
    json: bool,
}

fn parse_name(s: &str) -> std::result::Result<String, String> {
    check_name(s).map(|()| s.to_string())
}

fn parse_catch_up(s: &str) -> std::result::Result<CatchUp, String> {
    s.parse()
}

/// How `artex schedule add` names a field: its option (the name is the argument).
fn option_of(field: &str, payload: &str) -> String {
    match field {
        "name" => "NAME".into(),
        "payload" => payload.into(),
        other => format!("--{}", other.replace('_', "-")),
    }
}

/// Runs `artex schedule …`.
pub(crate) async fn schedule(db: &DbConfig, command: ScheduleCommand) -> Result {
    match command {
        ScheduleCommand::Add(args) => add(db, args).await,
        ScheduleCommand::List { json } => {
            let schedules = connect_reads(db).await?.schedules().await?;
            if json {
                return print_json(&serde_json::json!({ "schedules": schedules }));
            }
            print_list(&schedules)
        }
        ScheduleCommand::Show { name, json } => {
            let s = connect_reads(db).await?.schedule(&name).await?;
            if json {
                return print_json(&s);
            }
            print_one(&s)
        }
        ScheduleCommand::Pause(args) => {
            let bb = connect_one_shot(db).await?;
            let s = bb
                .operator()
                .pause_schedule(&args.name, &cli_actor(), args.reason.as_deref())
                .await?;
            if args.json {
                return print_json(&s);
            }
            outln!("paused schedule {}", s.name)
        }
        ScheduleCommand::Resume(args) => {
            let bb = connect_one_shot(db).await?;
            let s = bb
                .operator()
                .resume_schedule(&args.name, &cli_actor(), args.reason.as_deref())
                .await?;
            if args.json {
                return print_json(&s);
            }
            outln!(
                "resumed schedule {}: next slot {}",
                s.name,
                time_text(s.next_slot)
            )
        }
        ScheduleCommand::Remove(args) => {
            let bb = connect_one_shot(db).await?;
            bb.operator()
                .remove_schedule(&args.name, &cli_actor(), args.reason.as_deref())
                .await?;
            if args.json {
                return print_json(&serde_json::json!({ "removed": args.name }));
            }
            outln!("removed schedule {}", args.name)
        }
    }
}

async fn add(db: &DbConfig, args: AddArgs) -> Result {
    let payload = read_payload(args.payload.as_deref())?;
    let schedule = NewSchedule {
        name: args.name,
        cron: args.cron,
        timezone: args.timezone,
        task: NewTask {
            kind: args.kind,
            payload: payload.value,
            priority: args.priority,
            max_retries: args.max_retries,
            timeout_ms: args.timeout_ms,
            shard_key: args.shard_key,
            ..NewTask::default()
        },
        catch_up: args.catch_up,
    };
    // Refuse bad input before touching (or starting) any database: the schedule's own
    // rules, then its task's, as `submit` checks them.
    schedule
        .check()
        .map_err(|r| Error::Invalid(format!("{}: {}", option_of(r.field, &payload.name), r.why)))?;
    let submission = Submission::task(&schedule.task, args.allow_unregistered_kind);
    let refused = |r: Refusal| {
        Error::Invalid(refusal_text(
            &r,
            &option_of(r.field.as_str(), &payload.name),
        ))
    };
    submission.check_shape().map_err(refused)?;
    let bb = connect_one_shot(db).await?;
    check_submission(&bb, &submission, refused).await?;
    let s = bb.operator().add_schedule(&schedule, &cli_actor()).await?;
    if args.json {
        return print_json(&s);
    }
    outln!(
        "added schedule {}: {} ({}), next slot {}",
        s.name,
        s.cron,
        s.timezone,
        time_text(s.next_slot)
    )
}

fn print_list(schedules: &[ScheduleRow]) -> Result {
    if schedules.is_empty() {
        eprintln!("no schedules");
        return Ok(());
    }
    outln!(
        "{:<20}  {:<15}  {:<16}  {:<12}  {:<6}  {:<24}  NEXT SLOT",
        "NAME",
        "CRON",
        "TIMEZONE",
        "KIND",
        "PAUSED",
        "LAST SLOT"
    )?;
    for s in schedules {
        outln!(
            "{:<20}  {:<15}  {:<16}  {:<12}  {:<6}  {:<24}  {}",
            s.name,
            s.cron,
            s.timezone,
            s.kind,
            if s.paused { "yes" } else { "no" },
            time_text(s.last_slot),
            if s.paused {
                "(paused)".to_string()
            } else {
                time_text(s.next_slot)
            }
        )?;
    }
    Ok(())
}

fn print_one(s: &ScheduleRow) -> Result {
    outln!("name:        {}", s.name)?;
    outln!("cron:        {}", s.cron)?;
    outln!("timezone:    {}", s.timezone)?;
    outln!("catch-up:    {}", s.catch_up)?;
    outln!("paused:      {}", if s.paused { "yes" } else { "no" })?;
    outln!("next slot:   {}", time_text(s.next_slot))?;
    outln!("last slot:   {}", time_text(s.last_slot))?;
    match s.last_task {
        Some(t) => outln!("last task:   {t}")?,
        None => outln!("last task:   -")?,
    }
    outln!("fired:       {}", s.fired)?;
    outln!("kind:        {}", s.kind)?;
    outln!("payload:     {}", s.payload)?;
    outln!("priority:    {}", s.priority)?;
    outln!(
        "max retries: {}",
        s.max_retries
            .map(|n| n.to_string())
            .unwrap_or_else(|| "3 (default)".into())
    )?;
    if let Some(t) = s.timeout_ms {
        outln!("timeout:     {t} ms")?;
    }
    if let Some(k) = &s.shard_key {
        outln!("shard key:   {k}")?;
    }
    outln!(
        "created:     {} by {}",
        time_text(Some(s.created_at)),
        s.created_by
    )?;
    outln!(
        "updated:     {} by {}",
        time_text(Some(s.updated_at)),
        s.updated_by
    )
}
