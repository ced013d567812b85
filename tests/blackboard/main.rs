//! The blackboard at the database level (issue 2): the schema's defaults and constraints,
//! the status machine's trigger, the fencing token, retries, the outbox, NOTIFY and the
//! scanner's index — against a real PostgreSQL, one fresh database per test.
//!
//! # Layout
//! - `facts`: a task's and a worker's own facts checked where they are written (V59),
//!   under their constraints' names, and not at the hot writes.
//! - `inserts`: what a plain SQL insert gets: defaults, a time-ordered id, its audit row
//!   and a notification.
//! - `status_machine`: the status machine's trigger: legal moves applied and audited,
//!   illegal ones refused, and the history rows it writes.
//! - `status_model`: the same trigger against a model of it: random sequences of plain
//!   SQL and runtime writes, the row, history and held counters equal to the model's.
//! - `offers`: a task born assigned to an idle worker's offered slot (V62), and when
//!   not.
//! - `leases`: who holds a task: a holder and a lease when held, neither otherwise.
//! - `fencing`: the lease epoch, and writes with a stale one changing nothing.
//! - `retries`: failed and timed-out attempts retried until the budget is spent.
//! - `submit_sql`: `artex.submit` with random and mutated arguments: a valid task or an
//!   SQL error with a message, nothing written.
//! - `planners_hear`: what a worker's written batch asks for: its own claims, a round
//!   (V74), or nothing.
//! - `plans`: the scanner's claim on its index, the trigger's joins in bulk updates.

#[path = "../common/mod.rs"]
mod common;

mod facts;
mod fencing;
mod hot;
mod inserts;
mod leases;
mod offers;
mod planners_hear;
mod plans;
mod retries;
mod status_machine;
mod status_model;
mod submit_sql;
mod unique;
mod warm;

use artex_actors::blackboard::{AssignedTask, AttemptRecord, Outcome, ReapParams, Step};
use chrono::{DateTime, Utc};
use common::{start_assigned, status_of, TestDb};
use serde_json::Value;
use tokio_postgres::Client;
use uuid::Uuid;

/// Legal steps from `pending` to `status`.
fn path_to(status: &str) -> &'static [&'static str] {
    match status {
        "pending" => &[],
        "assigned" => &["assigned"],
        "running" => &["assigned", "running"],
        "succeeded" => &["assigned", "running", "succeeded"],
        "failed" => &["assigned", "running", "failed"],
        "timeout" => &["assigned", "running", "timeout"],
        "paused" => &["paused"],
        "blocked" => &["paused", "blocked"],
        "canceled" => &["canceled"],
        other => panic!("unknown status {other}"),
    }
}

/// A plain SQL status change; an assignment names a holder ('w1') and a lease.
const MOVE: &str = "update artex.tasks set status = $2::text::artex.task_status,
        assigned_to = case when $2::text = 'assigned' then 'w1' else assigned_to end,
        lease_until = case when $2::text = 'assigned' then now() + interval '5 minutes'
                           else lease_until end
    where id = $1";

async fn insert_task(c: &Client) -> Uuid {
    c.query_one(
        "insert into artex.tasks (kind, payload) values ('echo', '{}') returning id",
        &[],
    )
    .await
    .expect("inserting a task")
    .get(0)
}

async fn move_to(c: &Client, id: Uuid, to: &str) -> Result<u64, tokio_postgres::Error> {
    c.execute(MOVE, &[&id, &to]).await
}

/// A new task driven by legal plain SQL steps to `status`.
async fn task_in(c: &Client, status: &str) -> Uuid {
    let id = insert_task(c).await;
    for step in path_to(status) {
        let n = move_to(c, id, step)
            .await
            .unwrap_or_else(|e| panic!("driving a task to {status} ({step}): {}", msg(&e)));
        assert_eq!(n, 1);
    }
    assert_eq!(status_of(c, id).await, status);
    id
}

/// Assigns a pending task to `worker` by plain SQL, as the planner would.
async fn assign(c: &Client, id: Uuid, worker: &str) {
    let n = c
        .execute(
            "update artex.tasks set status = 'assigned', assigned_to = $2,
                 lease_until = now() + interval '5 minutes'
             where id = $1 and status = 'pending'",
            &[&id, &worker],
        )
        .await
        .unwrap_or_else(|e| panic!("assigning to {worker}: {}", msg(&e)));
    assert_eq!(n, 1, "task {id} was not pending");
}

/// The history rows the change feed shows: real status changes, not assignments nor
/// handovers (see `blackboard/feed/events.rs`).
const FEED_ROWS: &str = "to_status <> 'assigned' and from_status is distinct from to_status";

/// Everything a write could change: the row itself, the task's history rows, and those
/// of them the feed shows.
#[derive(Debug, PartialEq)]
struct Snapshot {
    row: Value,
    transitions: Value,
    events: Value,
}

async fn snapshot(c: &Client, id: Uuid) -> Snapshot {
    let r = c
        .query_one(
            &format!(
                "select to_jsonb(t),
                    (select coalesce(jsonb_agg(to_jsonb(x) order by x.at, x.id), '[]')
                     from artex.task_transitions x where x.task_id = t.id),
                    (select coalesce(jsonb_agg(to_jsonb(e) order by e.at, e.id), '[]')
                     from artex.task_transitions e where e.task_id = t.id and {FEED_ROWS})
             from artex.tasks t where t.id = $1"
            ),
            &[&id],
        )
        .await
        .expect("taking a snapshot");
    Snapshot {
        row: r.get(0),
        transitions: r.get(1),
        events: r.get(2),
    }
}

/// (from, to) of a task's history rows, oldest first.
async fn transitions(c: &Client, id: Uuid) -> Vec<(Option<String>, String)> {
    c.query(
        "select from_status::text, to_status::text from artex.task_transitions
         where task_id = $1 order by at, id",
        &[&id],
    )
    .await
    .expect("reading transitions")
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// (from, to) of a task's history rows that the feed shows, oldest first.
async fn events(c: &Client, id: Uuid) -> Vec<(Option<String>, String)> {
    c.query(
        &format!(
            "select from_status::text, to_status::text from artex.task_transitions
             where task_id = $1 and {FEED_ROWS} order by at, id"
        ),
        &[&id],
    )
    .await
    .expect("reading events")
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// The database's message, or the client's when there is none.
fn msg(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_else(|| e.to_string())
}

fn attempt_record(t: &AssignedTask, epoch: i64, step: Step) -> AttemptRecord {
    AttemptRecord {
        id: t.id,
        epoch,
        retries: t.retries,
        max_retries: t.max_retries,
        step,
        started_ago_ms: None,
        measured: None,
    }
}

fn finish(t: &AssignedTask, epoch: i64, outcome: Outcome) -> AttemptRecord {
    attempt_record(t, epoch, Step::Finish(outcome))
}

fn reap_params(now: DateTime<Utc>) -> ReapParams {
    ReapParams {
        now: Some(now),
        worker_timeout_secs: 30.0,
        prune_after_secs: 3600.0,
        batch: 100,
        retry_base_ms: 1000.0,
        retry_cap_ms: 60_000.0,
        judge_liveness: true,
        upload_host_deadline_secs: 600.0,
    }
}

fn pair(from: Option<&str>, to: &str) -> (Option<String>, String) {
    (from.map(str::to_string), to.to_string())
}

/// Assigns `id` to `worker` and starts it through the API.
async fn start(db: &TestDb, c: &Client, id: Uuid, worker: &str) -> AssignedTask {
    assign(c, id, worker).await;
    let mut started = start_assigned(&db.bb, worker, 10).await;
    assert_eq!(started.len(), 1);
    let t = started.pop().unwrap();
    assert_eq!(t.id, id);
    t
}
