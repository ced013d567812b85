//! Flows and operator controls end to end (issue 6), with real planner and worker
//! processes and the real CLI on real PostgreSQL: a diamond runs in order and its join
//! sees its upstream results; killed workers and a PostgreSQL restart mid-flow; a failing
//! task cancels exactly its downstream; bad flows are refused with nothing inserted;
//! pause, resume and cancel (a running handler included); concurrent completions of
//! siblings; a flow canceled while an upload's task joins it; a 10,000-task flow; waits
//! for signals and time.
//!
//! # Layout
//! - `runs`: a diamond, killed workers and a PostgreSQL restart, a 10,000-task flow.
//! - `failures`: a failing task's downstream canceled; bad flows refused.
//! - `controls`: pause, resume and cancel.
//! - `races`: concurrent completions; uploads' tasks joining flows that end or pause.
//! - `waits`: waits for signals (issue 37): a signal completes a reached wait, or is kept
//!   for it; a wait is never handed to a worker; bad waits and signals refused; SQL.
//! - `wait_timers`: timers and timeouts; two planners end each due wait once; a wait
//!   survives its planner's kill.

#[path = "../common/mod.rs"]
mod common;

mod controls;
mod failures;
mod races;
mod runs;
mod wait_timers;
mod waits;

use common::count;
use common::run_cli as artex;

use std::time::Duration;

use artex_actors::blackboard::{FlowState, FlowView, NewTask, TaskStatus};
use artex_actors::Blackboard;
use common::procs::{wait_for, wait_status};
use common::TestDb;
use serde_json::{json, Value};
use tokio_postgres::Client;
use uuid::Uuid;

/// Writes `flow` to a file and submits it with `artex flow submit`; returns the flow id.
fn submit_cli(url: &str, flow: &Value) -> Uuid {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flow.json");
    std::fs::write(&file, flow.to_string()).unwrap();
    // Some tests submit before their workers start (or register).
    let (code, out, err) = artex(
        url,
        &[
            "flow",
            "submit",
            file.to_str().unwrap(),
            "--allow-unregistered-kind",
        ],
    );
    assert_eq!(code, 0, "flow submit failed: {err}");
    Uuid::parse_str(out.trim()).unwrap_or_else(|e| panic!("flow id '{out}': {e}"))
}

async fn wait_flow(bb: &Blackboard, id: Uuid, state: FlowState, timeout: Duration) -> FlowView {
    // Polls the cheap summary (the full view of a 10,000-task flow is not free).
    wait_for(
        &format!("flow {id} to be {state}"),
        timeout,
        || async move { (bb.operator().flow(id).await.ok()?.state == state).then_some(()) },
    )
    .await;
    bb.operator().flow(id).await.unwrap()
}

/// Submits an `echo` task and waits for it to succeed: the runtime dispatches new work.
async fn probe_runs(db: &TestDb, timeout: Duration) {
    let probe = db
        .bb
        .operator()
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    wait_status(&db.bb, probe, TaskStatus::Succeeded, timeout).await;
}

fn task<'a>(f: &'a FlowView, name: &str) -> &'a artex_actors::blackboard::FlowTaskView {
    f.tasks
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no task {name} in {f:?}"))
}

/// No downstream task ever started before an upstream task had succeeded: its every
/// `running` transition comes after the upstream's `succeeded` one (transition ids are
/// drawn in real time, and the downstream task only becomes runnable once the upstream's
/// success committed).
async fn assert_started_after_upstream(c: &Client) {
    let early = count(
        c,
        "select count(*) from artex.task_dependencies d
         join artex.task_transitions r on r.task_id = d.task_id and r.to_status = 'running'
         left join artex.task_transitions s on s.task_id = d.depends_on
              and s.to_status = 'succeeded'
         where s.id is null or r.id < s.id",
    )
    .await;
    assert_eq!(
        early, 0,
        "downstream attempts that started before their upstream succeeded"
    );
}

async fn assert_no_double_success(c: &Client) {
    let twice = count(
        c,
        "select count(*) from (select task_id from artex.task_transitions
         where to_status = 'succeeded' group by task_id having count(*) > 1) x",
    )
    .await;
    assert_eq!(twice, 0, "tasks that succeeded twice");
}
