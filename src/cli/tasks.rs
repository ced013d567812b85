//! `artex submit`, `artex task show`, `artex tasks`, and the operator controls `artex
//! pause|resume|cancel` (of a task or of a whole flow): read the input, ask the
//! blackboard, print.

use artex_actors::blackboard::{
    check_kind, BulkAction, Control, ControlTarget, NewTask, TaskFilter, TaskPreview, TaskRow,
    TaskStatus, TransitionRow,
};
use artex_actors::submission::{Field, Refusal, Submission};
use artex_actors::trace::{SubmitSpan, TraceParent};
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use uuid::Uuid;

use super::follow::{task_outcome, wait_task};
use super::inputs::{check_submission, read_payload, refusal_text};
use super::progress::step;
use super::stdout::outln;
use super::{
    cli_actor, connect_one_shot, connect_reads, parse_id, parse_task_id, parse_time, print_json,
    time_text,
};
use crate::config::{parse_duration, DbConfig};
use crate::error::{Error, Result};

/// Without `--full`, values longer than this many characters are cut when shown.
const CUT_CHARS: i32 = 1024;

/// The arguments of `artex submit`.
#[derive(Debug, Args)]
pub(crate) struct SubmitArgs {
    /// The handler kind, e.g. echo: letters, digits and . _ : - (starting with a letter
    /// or digit), at most 100 bytes, and declared by some worker (see `artex kinds`).
    kind: String,
    /// The handler's input, as JSON (default {}); @FILE reads it from a file, - from
    /// standard input.
    #[arg(long)]
    payload: Option<String>,
    /// Submit even if no worker has ever declared this kind (e.g. before the workers
    /// start).
    #[arg(long)]
    allow_unregistered_kind: bool,
    /// Higher runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// Not before this time (RFC 3339, e.g. 2026-12-01T08:00:00Z).
    #[arg(long, value_parser = parse_time)]
    run_at: Option<DateTime<Utc>>,
    /// Retries after the first attempt, 0 to 1000 (default 3).
    #[arg(long, allow_negative_numbers = true)]
    max_retries: Option<i32>,
    /// Per-attempt handler timeout in milliseconds (positive).
    #[arg(long, allow_negative_numbers = true)]
    timeout_ms: Option<i32>,
    /// Business shard key: tasks with one key go to one planner shard.
    #[arg(long)]
    shard_key: Option<String>,
    /// While a task with this key is unfinished, submit nothing and print that task's id
    /// (saying it is the existing one).
    #[arg(long)]
    unique_key: Option<String>,
    /// With --unique-key: a task with the key that finished within this long (e.g. 10m,
    /// 2h) counts too.
    #[arg(long, value_parser = parse_duration, requires = "unique_key")]
    unique_for: Option<std::time::Duration>,
    /// A label for search (`artex tasks --tag`); repeatable, at most 20, each 1 to 64
    /// bytes.
    #[arg(long = "tag")]
    tags: Vec<String>,
    /// Counted against the kind's per-key limit (`artex kind limit K
    /// --key-concurrency N`), e.g. a customer id.
    #[arg(long)]
    limit_key: Option<String>,
    /// The W3C trace context to submit the task in (00-<trace id>-<span id>-<flags>):
    /// its spans join that trace (docs/tracing.md).
    #[arg(long, env = "TRACEPARENT")]
    traceparent: Option<String>,
    /// Wait until the task has ended, telling each change on standard error; the exit
    /// code is its outcome: 0 succeeded, 4 failed or timed out, 5 canceled.
    #[arg(long)]
    wait: bool,
    /// Print `{"id": …}` (as `POST /api/v1/tasks`); with --wait, the ended task and its
    /// history instead, as `task show --json`.
    #[arg(long)]
    json: bool,
}

/// Which tasks `artex tasks` lists, or a bulk action changes: every filter given must
/// hold.
#[derive(Debug, Args)]
pub(crate) struct FilterArgs {
    /// Only tasks in this status.
    #[arg(long, value_parser = parse_status)]
    status: Option<TaskStatus>,
    /// Only tasks of this kind.
    #[arg(long, value_parser = parse_kind)]
    kind: Option<String>,
    /// Only the tasks of this flow.
    #[arg(long, value_parser = parse_id)]
    flow: Option<Uuid>,
    /// Only the tasks this worker holds (assigned or running) now (ids: `artex workers`).
    #[arg(long, value_parser = parse_worker)]
    worker: Option<String>,
    /// Only tasks carrying this tag (`submit --tag`).
    #[arg(long, value_parser = parse_tag)]
    tag: Option<String>,
    /// Only tasks created at or after this time (RFC 3339).
    #[arg(long, value_parser = parse_time)]
    since: Option<DateTime<Utc>>,
    /// Only tasks created before this time (RFC 3339).
    #[arg(long, value_parser = parse_time)]
    until: Option<DateTime<Utc>>,
    /// Only tasks whose payload contains this JSON, e.g. '{"customer":42}'.
    #[arg(long = "where", value_parser = parse_containment)]
    payload_contains: Option<serde_json::Value>,
}

impl FilterArgs {
    fn filter(self, after: Option<Uuid>, limit: i64) -> TaskFilter {
        TaskFilter {
            status: self.status,
            kind: self.kind,
            flow: self.flow,
            worker: self.worker,
            after,
            tag: self.tag,
            since: self.since,
            until: self.until,
            payload_contains: self.payload_contains,
            limit,
        }
    }

    fn is_empty(&self) -> bool {
        self.status.is_none()
            && self.kind.is_none()
            && self.flow.is_none()
            && self.worker.is_none()
            && self.tag.is_none()
            && self.since.is_none()
            && self.until.is_none()
            && self.payload_contains.is_none()
    }
}

fn parse_tag(s: &str) -> std::result::Result<String, String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    Ok(s.to_string())
}

fn parse_containment(s: &str) -> std::result::Result<serde_json::Value, String> {
    match serde_json::from_str(s) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v),
        Ok(_) => Err("expected a JSON object, e.g. '{\"customer\":42}'".into()),
        Err(e) => Err(format!(
            "not JSON ({e}); expected e.g. '{{\"customer\":42}}'"
        )),
    }
}

/// The arguments of `artex tasks`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct ListArgs {
    /// Retry, cancel or delete every task matching the filters instead of listing them.
    #[command(subcommand)]
    bulk: Option<BulkCommand>,
    #[command(flatten)]
    filter: FilterArgs,
    /// The next page: tasks older than this id (the `next` of the previous page).
    #[arg(long, value_parser = parse_task_id)]
    after: Option<Uuid>,
    /// At most this many.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    limit: i64,
    /// One JSON object, `{"tasks": [...], "next": …}`, as `GET /api/v1/tasks`.
    #[arg(long)]
    json: bool,
    /// Whole payloads, results, errors and checkpoints in --json (cut to 1 KiB otherwise).
    #[arg(long)]
    full: bool,
}

/// `artex tasks retry|cancel|delete`: in batches of 500, each its own short transaction,
/// each task's change recorded with who did it and why.
#[derive(Debug, Subcommand)]
pub(crate) enum BulkCommand {
    /// A new task for each failed, timed-out or canceled task matching (not of a flow).
    Retry(BulkArgs),
    /// Cancel each unfinished task matching (a running handler is told).
    Cancel(BulkArgs),
    /// Delete each finished task matching (not of a flow); the deletions are recorded
    /// in artex.task_deletions and the history stays.
    Delete(BulkArgs),
}

/// The arguments of a bulk action.
#[derive(Debug, Args)]
pub(crate) struct BulkArgs {
    #[command(flatten)]
    filter: FilterArgs,
    /// Act on every task (required when no filter is given).
    #[arg(long)]
    all: bool,
    /// Why; recorded with each change.
    #[arg(long)]
    reason: Option<String>,
    /// Only count the tasks that match; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print the report as one JSON object (as `POST /api/v1/tasks/bulk`).
    #[arg(long)]
    json: bool,
}

/// `artex task …`
#[derive(Debug, Subcommand)]
pub(crate) enum TaskCommand {
    /// Status, attempts, worker, timestamps and the full transition history.
    Show {
        /// The task id (a UUID).
        #[arg(value_parser = parse_task_id)]
        id: Uuid,
        /// As JSON.
        #[arg(long)]
        json: bool,
        /// Whole payload, result, error, checkpoint and reasons (cut to 1 KiB otherwise).
        #[arg(long)]
        full: bool,
    },
}

/// The arguments of `artex pause|resume|cancel`.
#[derive(Debug, Args)]
pub(crate) struct ControlArgs {
    /// A task id, or a flow id (every task of the flow).
    #[arg(value_parser = parse_id)]
    id: Uuid,
    /// Why; recorded in each task's history with who did it.
    #[arg(long)]
    reason: Option<String>,
    /// Print what changed as one JSON object (as the HTTP API's control routes).
    #[arg(long)]
    json: bool,
}

fn parse_status(s: &str) -> std::result::Result<TaskStatus, String> {
    s.parse().map_err(|e: artex_actors::Error| e.to_string())
}

fn parse_worker(s: &str) -> std::result::Result<String, String> {
    if s.is_empty() {
        return Err("must not be empty; expected a worker id (see `artex workers`)".into());
    }
    Ok(s.to_string())
}

fn parse_kind(s: &str) -> std::result::Result<String, String> {
    check_kind(s).map(|()| s.to_string())
}

/// How `artex submit` names a field: its option (the kind is the argument).
fn option_of(field: Field, payload: &str) -> String {
    match field {
        Field::Kind => "kind".into(),
        Field::Payload => payload.into(),
        Field::Tags => "--tag".into(),
        other => format!("--{}", other.as_str().replace('_', "-")),
    }
}

/// Runs `artex submit`.
pub(crate) async fn submit(db: &DbConfig, args: SubmitArgs) -> Result {
    let payload = read_payload(args.payload.as_deref())?;
    let task = NewTask {
        kind: args.kind,
        payload: payload.value,
        priority: args.priority,
        run_at: args.run_at,
        max_retries: args.max_retries,
        timeout_ms: args.timeout_ms,
        shard_key: args.shard_key,
        unique_key: args.unique_key,
        unique_for: args.unique_for,
        tags: args.tags,
        limit_key: args.limit_key,
        traceparent: args.traceparent,
    };
    let submission = Submission::task(&task, args.allow_unregistered_kind);
    let refused = |r: Refusal| Error::Invalid(refusal_text(&r, &option_of(r.field, &payload.name)));
    // Refuse bad input before touching (or starting) any database.
    submission.check_shape().map_err(refused)?;
    let bb = connect_one_shot(db).await?;
    check_submission(&bb, &submission, refused).await?;
    // With tracing on, the submission's span is the task's parent (the given context is
    // its own parent). The shape check above refused an invalid one already.
    let given = task
        .traceparent
        .as_deref()
        .map(TraceParent::parse)
        .transpose()
        .map_err(|e| Error::Invalid(format!("--traceparent: {e}")))?;
    let span = SubmitSpan::start(given.as_ref(), "cli", std::slice::from_ref(&task));
    let mut task = task;
    if let Some(tp) = span.as_ref().and_then(SubmitSpan::traceparent) {
        task.traceparent = Some(tp);
    }
    let submitted = bb
        .operator()
        .submit_all(std::slice::from_ref(&task), &cli_actor())
        .await;
    if let Some(span) = span {
        span.end(&submitted);
    }
    let submitted = submitted?[0];
    let id = submitted.id;
    if submitted.duplicate && !args.json {
        step(format!(
            "{id} is the existing task with unique key {:?}: nothing submitted",
            task.unique_key.as_deref().unwrap_or_default()
        ));
    }
    if !args.wait {
        return if args.json {
            print_json(&serde_json::json!({ "id": id, "duplicate": submitted.duplicate }))
        } else {
            outln!("{id}")
        };
    }
    if !args.json {
        // The id first (written out at once: standard output is line-buffered), so that a
        // script (or a person) has it while the task runs.
        outln!("{id}")?;
    }
    let ended = wait_task(&bb, id).await?;
    if args.json {
        let task = bb.operator().task_preview(id, CUT_CHARS).await?;
        let history = cut_reasons(bb.operator().transitions(id).await?);
        print_json(&serde_json::json!({ "task": task, "transitions": history }))?;
    } else if let Some(result) = &ended.result {
        let text = result.to_string();
        step(format!("result: {}", cut_text(&text)));
    }
    task_outcome(&ended)
}

/// History with each reason cut to [`CUT_CHARS`] (a failure's reason is its error: as
/// large as the error can be).
fn cut_reasons(mut history: Vec<TransitionRow>) -> Vec<TransitionRow> {
    for h in &mut history {
        if let Some(r) = &h.reason {
            h.reason = Some(cut_text(r));
        }
    }
    history
}

/// Runs `artex task …`.
pub(crate) async fn task(db: &DbConfig, command: TaskCommand) -> Result {
    match command {
        TaskCommand::Show { id, json, full } => {
            let bb = connect_reads(db).await?;
            let task = if full {
                TaskPreview {
                    task: bb.task(id).await?,
                    cut: Vec::new(),
                }
            } else {
                bb.task_preview(id, CUT_CHARS).await?
            };
            let mut history = bb.transitions(id).await?;
            if !full {
                history = cut_reasons(history);
            }
            if json {
                print_json(&serde_json::json!({ "task": task, "transitions": history }))?;
            } else {
                print_task(&task, &history)?;
            }
            Ok(())
        }
    }
}

/// Runs `artex tasks`.
pub(crate) async fn list(db: &DbConfig, args: ListArgs) -> Result {
    if let Some(bulk) = args.bulk {
        return bulk_action(db, bulk).await;
    }
    let bb = connect_reads(db).await?;
    let filter = args.filter.filter(args.after, args.limit);
    // The database sends at most 1 KiB of each value, however large it is; the table
    // shows no value, so it reads none (turning a large one into text is what costs).
    let cut = match (args.json, args.full) {
        (_, true) => i32::MAX,
        (true, false) => CUT_CHARS,
        (false, false) => 0,
    };
    let tasks = bb.tasks_page(&filter, cut).await?;
    // A full page may have more after it: its last id is where the next starts.
    let next = (tasks.len() as i64 == filter.limit)
        .then(|| tasks.last().map(|t| t.task.id))
        .flatten();
    if args.json {
        return print_json(&serde_json::json!({ "tasks": tasks, "next": next }));
    }
    if tasks.is_empty() {
        eprintln!("no tasks");
        return Ok(());
    }
    outln!(
        "{:<36}  {:<9}  {:<12}  {:<12}  UPDATED",
        "ID",
        "STATUS",
        "KIND",
        "ATTEMPTS"
    )?;
    for preview in &tasks {
        let t = &preview.task;
        outln!(
            "{}  {:<9}  {:<12}  {:<12}  {}",
            t.id,
            t.status.as_str(),
            t.kind,
            attempts(t),
            time_text(Some(t.updated_at))
        )?;
    }
    if let Some(next) = next {
        eprintln!("(more may follow: --after {next})");
    }
    Ok(())
}

/// Runs `artex tasks retry|cancel|delete`.
async fn bulk_action(db: &DbConfig, command: BulkCommand) -> Result {
    let (action, args) = match command {
        BulkCommand::Retry(a) => (BulkAction::Retry, a),
        BulkCommand::Cancel(a) => (BulkAction::Cancel, a),
        BulkCommand::Delete(a) => (BulkAction::Delete, a),
    };
    if args.filter.is_empty() && !args.all {
        return Err(Error::Invalid(format!(
            "tasks {}: no filter given; name the tasks (--status, --kind, --tag, …) or pass --all",
            action.as_str()
        )));
    }
    let bb = connect_one_shot(db).await?;
    let filter = args.filter.filter(None, 0);
    let report = bb
        .operator()
        .bulk(
            action,
            &filter,
            &cli_actor(),
            args.reason.as_deref(),
            args.dry_run,
        )
        .await?;
    if args.json {
        return print_json(&report);
    }
    if report.dry_run {
        return outln!("{} task(s) match", report.matched);
    }
    let done = match action {
        BulkAction::Retry => "retried",
        BulkAction::Cancel => "canceled",
        BulkAction::Delete => "deleted",
    };
    outln!(
        "{done} {} of {} matching task(s) in {} batch(es)",
        report.changed,
        report.matched,
        report.batches
    )
}

/// Runs `artex pause|resume|cancel`.
pub(crate) async fn control(
    db: &DbConfig,
    control: Control,
    args: ControlArgs,
    actor: &str,
) -> Result {
    let bb = connect_one_shot(db).await?;
    let report = bb
        .operator()
        .control(control, args.id, actor, args.reason.as_deref())
        .await?;
    if args.json {
        return print_json(&report);
    }
    let what = match report.target {
        ControlTarget::Task(id) => format!("task {id}"),
        ControlTarget::Flow(id) => format!("{} task(s) of flow {id}", report.changed.len()),
    };
    let verb = match control {
        Control::Pause => "paused",
        Control::Resume => "resumed",
        Control::Cancel => "canceled",
    };
    outln!("{verb} {what}")?;
    for (id, status) in &report.changed {
        outln!("  {id}  {status}")?;
    }
    Ok(())
}

fn attempts(t: &TaskRow) -> i32 {
    // Attempts that ran: counted failures, plus the one running or the one that ended it.
    let current = matches!(t.status, TaskStatus::Running | TaskStatus::Succeeded)
        || (t.status == TaskStatus::Canceled && t.started_at.is_some());
    t.retries.min(t.max_retries + 1) + i32::from(current)
}

/// `s`, or its first [`CUT_CHARS`] characters and how long it was.
fn cut_text(s: &str) -> String {
    match s.char_indices().nth(CUT_CHARS as usize) {
        Some((end, _)) => format!("{}{}", &s[..end], cut_note(Some(s.len() as i64))),
        None => s.to_string(),
    }
}

fn cut_note(bytes: Option<i64>) -> String {
    match bytes {
        Some(bytes) => format!("… ({bytes} bytes; --full to see all)"),
        None => "… (--full to see all)".into(),
    }
}

/// A task's progress as `task show` prints it: `42% [########------------] message (at
/// 2026-…)`.
fn progress_text(
    fraction: f32,
    message: Option<&str>,
    at: Option<chrono::DateTime<chrono::Utc>>,
) -> String {
    const WIDTH: usize = 20;
    let filled = ((fraction.clamp(0.0, 1.0) * WIDTH as f32).round() as usize).min(WIDTH);
    format!(
        "{:.0}% [{}{}]{} (at {})",
        fraction * 100.0,
        "#".repeat(filled),
        "-".repeat(WIDTH - filled),
        message.map(|m| format!(" {m}")).unwrap_or_default(),
        time_text(at)
    )
}

fn print_task(preview: &TaskPreview, history: &[TransitionRow]) -> Result {
    let t = &preview.task;
    // A cut value is its first characters (a JSON string standing in for it).
    let shown = |field: &str, v: &serde_json::Value| match (preview.cut_of(field), v) {
        (Some(cut), serde_json::Value::String(head)) => format!("{head}{}", cut_note(cut.bytes)),
        _ => v.to_string(),
    };
    let time = time_text;
    outln!("id:          {}", t.id)?;
    outln!("kind:        {}", t.kind)?;
    outln!("status:      {}", t.status)?;
    if let Some(p) = t.progress {
        outln!(
            "progress:    {}",
            progress_text(p, t.progress_message.as_deref(), t.progress_at)
        )?;
    }
    outln!(
        "attempts:    {} (failed {}, retries allowed {})",
        attempts(t),
        t.retries,
        t.max_retries
    )?;
    // Held: the worker holding it; finished: the one whose transition finished it.
    outln!("worker:      {}", t.worker.as_deref().unwrap_or("-"))?;
    outln!(
        "lease:       epoch {}, until {}",
        t.lease_epoch,
        time(t.lease_until)
    )?;
    outln!("priority:    {}", t.priority)?;
    outln!("run_at:      {}", time(Some(t.run_at)))?;
    outln!("created:     {}", time(Some(t.created_at)))?;
    outln!("updated:     {}", time(Some(t.updated_at)))?;
    outln!("started:     {}", time(t.started_at))?;
    outln!("finished:    {}", time(t.finished_at))?;
    outln!("payload:     {}", shown("payload", &t.payload))?;
    if let Some(r) = &t.result {
        outln!("result:      {}", shown("result", r))?;
    }
    if let Some(e) = &t.error {
        // A task that succeeded after failing keeps its last error: say it is history.
        let label = if t.status == TaskStatus::Succeeded {
            "last error:  "
        } else {
            "error:       "
        };
        match preview.cut_of("error") {
            Some(cut) => outln!("{label}{e}{}", cut_note(cut.bytes))?,
            None => outln!("{label}{e}")?,
        }
    }
    if let Some(c) = &t.checkpoint {
        outln!("checkpoint:  {}", shown("checkpoint", c))?;
    }
    if let Some(f) = t.flow_id {
        outln!(
            "flow:        {f} ({})",
            t.flow_task.as_deref().unwrap_or("-")
        )?;
    }
    if let Some(k) = &t.unique_key {
        outln!("unique key:  {k}")?;
    }
    if !t.tags.is_empty() {
        outln!("tags:        {}", t.tags.join(", "))?;
    }
    if let Some(k) = &t.limit_key {
        outln!("limit key:   {k}")?;
    }
    outln!("history:")?;
    for h in history {
        outln!(
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
        )?;
    }
    Ok(())
}
