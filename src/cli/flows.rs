//! `artex flow submit|show|signal|list`: flows are DAGs of named tasks; what a flow does lives
//! in the blackboard (`artex_actors::blackboard::flows`), this file reads the file and
//! prints, and follows a flow's changes until it has finished (`show --follow`).

use std::collections::HashMap;
use std::path::PathBuf;

use artex_actors::blackboard::{
    FlowSpec, FlowState, FlowView, SignalOutcome, TaskStatus, WaitView,
};
use artex_actors::submission::{Refusal, Submission};
use artex_actors::Blackboard;
use clap::Subcommand;
use uuid::Uuid;

use super::follow::{feed_from_now, next_events, transition};
use super::inputs::{check_submission, read_payload, refusal_text};
use super::stdout::{outln, Reader};
use super::{connect_one_shot, connect_reads, parse_id, print_json, print_json_line, time_text};
use crate::config::DbConfig;
use crate::error::{Error, Result};

/// `artex flow …`
#[derive(Debug, Subcommand)]
pub(crate) enum FlowCommand {
    /// Submit a flow (a JSON file; `-` reads standard input); prints the flow id.
    ///
    /// {"name": "nightly-etl", "tasks": [{"name": "extract", "kind": "echo", "payload": {},
    /// "depends_on": []}, {"name": "load", "kind": "echo", "depends_on": ["extract"]}]}
    /// Each task may also set priority, max_retries, timeout_ms and shard_key. A task may
    /// be a wait instead of a kind: {"name": "approval", "wait": {"signal": "approved",
    /// "timeout": "24h"}}, {"wait": {"until": "2026-12-24T18:00:00Z"}} or {"wait": {"for":
    /// "1h"}}.
    Submit {
        /// The flow file.
        file: PathBuf,
        /// Submit even if no worker has ever declared some task's kind (e.g. before the
        /// workers start).
        #[arg(long)]
        allow_unregistered_kind: bool,
        /// Print `{"id": …}` (as `POST /api/v1/flows`).
        #[arg(long)]
        json: bool,
    },
    /// Each task's name, id and status, and the flow's overall state.
    Show {
        /// The flow id.
        #[arg(value_parser = parse_id)]
        id: Uuid,
        /// As one JSON object (as `GET /api/v1/flows/{id}`); with --follow, a JSON line of
        /// the whole flow at the start and after each change.
        #[arg(long)]
        json: bool,
        /// Keep showing each change of the flow's tasks as it happens, until the flow has
        /// finished; the exit code is its outcome: 0 succeeded, 4 failed, 5 canceled.
        #[arg(long)]
        follow: bool,
    },
    /// Send a signal to a flow: its wait for NAME completes now (its result the payload,
    /// its downstream tasks promoted), or, not reached yet, the signal is kept until it
    /// is. A flow takes one signal of a name.
    Signal {
        /// The flow id.
        #[arg(value_parser = parse_id)]
        flow: Uuid,
        /// The signal's name, as the wait names it ({"wait": {"signal": NAME}}).
        name: String,
        /// The signal's payload, as JSON (none by default): the wait's result, which
        /// downstream tasks read as an upstream result. @FILE reads it from a file, -
        /// from standard input.
        #[arg(long)]
        payload: Option<String>,
        /// Print the answer as JSON (as `POST /api/v1/flows/{id}/signals/{name}`).
        #[arg(long)]
        json: bool,
    },
    /// Flows, newest first: each one's state and its tasks' counts by status.
    List {
        /// The next page: flows older than this id (the `next` of the previous page).
        #[arg(long, value_parser = parse_id)]
        after: Option<Uuid>,
        /// At most this many.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=10_000))]
        limit: i64,
        /// One JSON object, `{"flows": [...], "next": …}`; each flow has the fields of
        /// `flow show --json` but its tasks.
        #[arg(long)]
        json: bool,
    },
}

fn read_flow_file(file: &PathBuf) -> Result<FlowSpec> {
    let text = if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
            .map_err(|e| Error::io("reading the flow from standard input", e))?;
        s
    } else {
        // A flow file that is not there is bad input (exit 2), like a bad flow.
        std::fs::read_to_string(file).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                Error::Invalid(format!("{}: no such flow file", file.display()))
            }
            _ => Error::io(format!("reading {}", file.display()), e),
        })?
    };
    FlowSpec::from_json(&text).map_err(|e| Error::Invalid(format!("{}: {e}", file.display())))
}

/// Runs `artex flow …`.
pub(crate) async fn flow(db: &DbConfig, command: FlowCommand, actor: &str) -> Result {
    match command {
        FlowCommand::Submit {
            file,
            allow_unregistered_kind,
            json,
        } => {
            let spec = read_flow_file(&file)?;
            let submission = Submission::Flow {
                spec: &spec,
                allow_unregistered_kind,
            };
            // A flow file's faults are named after the file as the library names them.
            let refused = |r: Refusal| {
                Error::Invalid(format!(
                    "{}: {}",
                    file.display(),
                    refusal_text(&r, &r.place())
                ))
            };
            // Refuse bad input before touching (or starting) any database.
            submission.check_shape().map_err(refused)?;
            let bb = connect_one_shot(db).await?;
            check_submission(&bb, &submission, refused).await?;
            let id = bb.operator().submit_flow(&spec, actor).await?;
            if json {
                return print_json(&serde_json::json!({ "id": id }));
            }
            outln!("{id}")
        }
        FlowCommand::Signal {
            flow,
            name,
            payload,
            json,
        } => {
            let payload = match payload {
                Some(arg) => Some(read_payload(Some(&arg))?.value),
                None => None,
            };
            let bb = connect_one_shot(db).await?;
            let report = bb
                .operator()
                .signal_flow(flow, &name, payload.as_ref(), actor)
                .await?;
            if json {
                return print_json(&report);
            }
            match report.outcome {
                SignalOutcome::Completed => outln!(
                    "signal '{name}': wait '{}' ({}) completed",
                    report.task_name,
                    report.task
                ),
                SignalOutcome::Stored => outln!(
                    "signal '{name}': kept; wait '{}' ({}) completes when it is reached",
                    report.task_name,
                    report.task
                ),
            }
        }
        FlowCommand::List { after, limit, json } => {
            let bb = connect_reads(db).await?;
            let flows = bb.flows_page(after, limit).await?;
            let next = (flows.len() as i64 == limit)
                .then(|| flows.last().map(|f| f.id))
                .flatten();
            if json {
                return print_json(&serde_json::json!({ "flows": flows, "next": next }));
            }
            if flows.is_empty() {
                eprintln!("no flows");
                return Ok(());
            }
            let width = flows.iter().map(|f| f.name.len()).max().unwrap_or(4).max(4);
            outln!(
                "{:<36}  {:<width$}  {:<9}  {:<24}  TASKS",
                "ID",
                "NAME",
                "STATE",
                "CREATED"
            )?;
            for f in &flows {
                let counts: Vec<String> =
                    f.counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
                outln!(
                    "{}  {:<width$}  {:<9}  {:<24}  {}",
                    f.id,
                    f.name,
                    f.state.to_string(),
                    time_text(Some(f.created_at)),
                    counts.join(", ")
                )?;
            }
            if let Some(next) = next {
                eprintln!("(more may follow: --after {next})");
            }
            Ok(())
        }
        FlowCommand::Show { id, json, follow } => {
            if follow {
                // Followed on the feed, which is the primary's: read beside it there.
                let bb = connect_one_shot(db).await?;
                return follow_flow(&bb, id, json).await;
            }
            let flow = connect_reads(db).await?.flow(id).await?;
            if json {
                print_json(&flow)?;
            } else {
                print_flow(&flow)?;
            }
            Ok(())
        }
    }
}

/// The flow as `artex flow show` prints it for people.
fn print_flow(f: &FlowView) -> Result {
    let time = time_text;
    outln!("flow:     {} ({})", f.id, f.name)?;
    outln!("state:    {}", f.state)?;
    outln!("created:  {}", time(Some(f.created_at)))?;
    let counts: Vec<String> = f.counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    outln!("tasks:    {}", counts.join(", "))?;
    let width = f
        .tasks
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    outln!(
        "  {:<width$}  {:<36}  {:<9}  {:<24}  {:<24}  DEPENDS ON",
        "NAME",
        "ID",
        "STATUS",
        "STARTED",
        "FINISHED"
    )?;
    for t in &f.tasks {
        outln!(
            "  {:<width$}  {}  {:<9}  {:<24}  {:<24}  {}",
            t.name,
            t.id,
            t.status.as_str(),
            time(t.started_at),
            time(t.finished_at),
            t.depends_on.join(", ")
        )?;
        if let Some(w) = &t.wait {
            outln!("  {:<width$}  {}", "", wait_text(w))?;
        }
    }
    Ok(())
}

/// A wait as `flow show` tells it: what it waits for and where it stands.
fn wait_text(w: &WaitView) -> String {
    let spec = |k: &str| w.spec.get(k).and_then(|v| v.as_str());
    let what = match (spec("signal"), spec("until"), spec("for")) {
        (Some(signal), _, _) => {
            let mut s = format!("waits for signal '{signal}'");
            if let Some(t) = spec("timeout") {
                let then = if spec("on_timeout") == Some("succeed") {
                    "then succeeds"
                } else {
                    "then fails"
                };
                s += &format!(" (timeout {t}, {then})");
            }
            s
        }
        (_, Some(until), _) => format!("waits until {until}"),
        (_, _, Some(d)) => format!("waits for {d}"),
        _ => "waits".to_string(),
    };
    let mut parts = vec![what];
    match (w.reached_at, w.due_at) {
        (None, _) => parts.push("not reached yet".into()),
        (Some(at), due) => {
            parts.push(format!("reached {}", time_text(Some(at))));
            if let Some(due) = due {
                parts.push(format!("due {}", time_text(Some(due))));
            }
        }
    }
    if let Some(at) = w.signal_received_at {
        let from = w.signal_from.as_deref().unwrap_or("?");
        parts.push(format!(
            "signal received {} from {from}",
            time_text(Some(at))
        ));
    }
    parts.join("; ")
}

fn flow_finished(state: FlowState) -> bool {
    matches!(
        state,
        FlowState::Succeeded | FlowState::Failed | FlowState::Canceled
    )
}

fn statuses(f: &FlowView) -> Vec<TaskStatus> {
    f.tasks.iter().map(|t| t.status).collect()
}

/// `artex flow show --follow`: flow `id` (as `flow show` shows it), then each change of
/// its tasks as it happens, until the flow has finished: people get a line per change
/// and a summary, `json` a JSON line of the whole flow at the start and after every
/// change. The result is the flow's outcome (docs/command-line.md, "Exit codes"),
/// or [`Error::OutputClosed`] once the reader of standard output has gone.
async fn follow_flow(bb: &Blackboard, id: Uuid, json: bool) -> Result {
    let reader = Reader::watch();
    let mut feed = feed_from_now(bb).await?;
    let mut flow = bb.operator().flow(id).await?;
    if json {
        print_json_line(&flow)?;
    } else {
        print_flow(&flow)?;
    }
    let names: HashMap<Uuid, String> = flow.tasks.iter().map(|t| (t.id, t.name.clone())).collect();
    let width = names.values().map(String::len).max().unwrap_or(1);
    // What the feed has told of each task: the follow ends once the flow has finished
    // and the feed has told every task's last change (or stayed quiet for a while after
    // it finished: the table has the last word).
    let mut told: HashMap<Uuid, TaskStatus> = flow.tasks.iter().map(|t| (t.id, t.status)).collect();
    let caught_up = |flow: &FlowView, told: &HashMap<Uuid, TaskStatus>| {
        flow.tasks
            .iter()
            .all(|t| told.get(&t.id) == Some(&t.status))
    };
    while !(flow_finished(flow.state) && caught_up(&flow, &told)) {
        let events = next_events(&mut feed, &reader, |e| e.flow_id == Some(id)).await?;
        for e in &events {
            told.insert(e.task_id, e.to);
            if !json {
                outln!(
                    "  {}  {:<width$}  {}",
                    time_text(Some(e.at)),
                    names.get(&e.task_id).map(String::as_str).unwrap_or("?"),
                    transition(e.from, e.to, e.reason.as_deref())
                )?;
            }
        }
        let now = bb.operator().flow(id).await?;
        if json && (statuses(&now) != statuses(&flow) || now.state != flow.state) {
            print_json_line(&now)?;
        }
        flow = now;
        if events.is_empty() && flow_finished(flow.state) {
            break;
        }
    }
    if !json {
        let counts: Vec<String> = flow
            .counts
            .iter()
            .map(|(s, n)| format!("{n} {s}"))
            .collect();
        outln!("flow {id}: {} ({})", flow.state, counts.join(", "))?;
    }
    match flow.state {
        FlowState::Failed => Err(Error::EndedFailed(format!("flow {id} failed"))),
        FlowState::Canceled => Err(Error::EndedCanceled(format!("flow {id} canceled"))),
        _ => Ok(()),
    }
}
